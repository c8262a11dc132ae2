// How commands are cut into frames under the server's frame limit (`limits.max_frame_bytes`,
// 64 KiB): channel lists of subscribes and unsubscribes chunked by a byte budget and a count,
// other commands sharing frames up to a budget of their own.

import type { Command } from './types.js';

/** Channels per subscribe or unsubscribe at most. */
export const MAX_CHANNELS_PER_SUBSCRIBE = 5_000;
/** Bytes of commands sharing one frame (their data estimated), well under the frame limit. */
const COMMANDS_PER_FRAME_BYTES = 32_000;

/** `channels` in order, cut into lists of at most `most` channels whose names (plus `extra`
 * bytes each, e.g. a recovery position) fit `budget` bytes; one channel alone may exceed it. */
export function chunkChannels(
  channels: string[],
  budget: number,
  extra: (ch: string) => number = () => 0,
  most = MAX_CHANNELS_PER_SUBSCRIBE,
): string[][] {
  return pack(channels, (ch) => ch.length + 4 + extra(ch), budget, most);
}

/** `commands` in order, several per frame up to the frame budget. */
export function shareFrames(commands: Command[]): Command[][] {
  const size = (c: Command) => (c.publish ? JSON.stringify(c.publish.data ?? null).length + 64 : 256);
  return pack(commands, size, COMMANDS_PER_FRAME_BYTES, Infinity);
}

/** `items` in order, in groups of at most `most` items whose sizes add up to `budget` at most;
 * an item larger than the budget goes alone. */
function pack<T>(items: T[], size: (item: T) => number, budget: number, most: number): T[][] {
  const groups: T[][] = [];
  let group: T[] = [];
  let bytes = 0;
  for (const item of items) {
    const n = size(item);
    if (group.length > 0 && (bytes + n > budget || group.length >= most)) {
      groups.push(group);
      group = [];
      bytes = 0;
    }
    group.push(item);
    bytes += n;
  }
  if (group.length > 0) groups.push(group);
  return groups;
}
