// Publications of `delta: 'fossil'` subscriptions: every live push of such a channel carries
// the publication's JSON text, whole (`delta: false`) or as a Fossil delta (`delta: true`, the
// format of the Fossil SCM's delta.c) that turns the previous push's text of the channel into
// this one's. In JSON the text or delta is a string, in MessagePack bytes; a delta counts bytes
// of the UTF-8 text either way. `DeltaChains` keeps each channel's last text on one connection
// and hands back plain publications, so the application never sees a text or a delta.
//
// The npm package `fossil-delta` applies deltas and checks their checksum; the declared output
// size is checked here first, so a tiny delta declaring gigabytes is refused before any work.

import { applyDelta, getDeltaTargetSize } from 'fossil-delta';
import type { WirePub } from './types.js';

/** The largest text a push may declare unless the client says otherwise (1 MiB): well above a
 * node's largest publication (`limits.max_publication_bytes`, 64 KiB by default). */
export const DEFAULT_MAX_DELTA_BYTES = 1 << 20;

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** The bytes of a push's data: a string's UTF-8, or the bytes MessagePack carried. */
function bytesOf(data: unknown): Uint8Array {
  if (typeof data === 'string') return encoder.encode(data);
  if (data instanceof Uint8Array) return data;
  throw new Error('the data of a delta publication is neither text nor bytes');
}

export class DeltaChains {
  /** Each channel's last rebuilt text. A subscription's first push (and the first after each
   * resubscription) is whole, so a text is only ever replaced; a failed push removes its
   * channel's, so nothing is built on a text that was never delivered. */
  private readonly texts = new Map<string, Uint8Array>();

  constructor(private readonly maxBytes: number = DEFAULT_MAX_DELTA_BYTES) {}

  /** The publication `p` carries, its data parsed from the rebuilt text; `p` itself when it
   * is not a delta subscription's. Throws (and forgets the channel's text) when it cannot be
   * rebuilt: no text to apply a delta to, a declared size past the bound, a bad checksum, or
   * a result that is not JSON. */
  decode(p: WirePub): WirePub {
    if (p.delta === undefined) return p;
    try {
      const text = this.rebuild(p);
      const data: unknown = JSON.parse(decoder.decode(text));
      this.texts.set(p.ch, text);
      const out: WirePub = { ch: p.ch, off: p.off, data };
      if (p.hist !== undefined) out.hist = p.hist;
      if (p.tags) out.tags = p.tags;
      return out;
    } catch (err) {
      this.texts.delete(p.ch);
      throw err;
    }
  }

  /** Forgets every text (the connection closed: a new one starts whole). */
  clear(): void {
    this.texts.clear();
  }

  private rebuild(p: WirePub): Uint8Array {
    const bytes = bytesOf(p.data);
    const base = this.texts.get(p.ch);
    if (p.delta && !base) throw new Error('a delta with no previous publication of the channel to apply it to');
    const size = p.delta ? getDeltaTargetSize(bytes) : bytes.length;
    if (size > this.maxBytes) throw new Error(`the publication declares ${size} bytes, more than the ${this.maxBytes} allowed`);
    return p.delta ? applyDelta(base!, bytes) : bytes;
  }
}
