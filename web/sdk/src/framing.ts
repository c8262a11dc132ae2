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
  const out: string[][] = [];
  let chunk: string[] = [];
  let bytes = 0;
  for (const ch of channels) {
    const size = ch.length + 4 + extra(ch);
    if (chunk.length > 0 && (bytes + size > budget || chunk.length >= most)) {
      out.push(chunk);
      chunk = [];
      bytes = 0;
    }
    chunk.push(ch);
    bytes += size;
  }
  if (chunk.length > 0) out.push(chunk);
  return out;
}

/** `commands` in order, several per frame up to the frame budget. */
export function shareFrames(commands: Command[]): Command[][] {
  const frames: Command[][] = [];
  let frame: Command[] = [];
  let bytes = 0;
  for (const c of commands) {
    const size = c.publish ? JSON.stringify(c.publish.data ?? null).length + 64 : 256;
    if (frame.length > 0 && bytes + size > COMMANDS_PER_FRAME_BYTES) {
      frames.push(frame);
      frame = [];
      bytes = 0;
    }
    frame.push(c);
    bytes += size;
  }
  if (frame.length > 0) frames.push(frame);
  return frames;
}
