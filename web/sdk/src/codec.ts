// Frame codecs: the JSON and MessagePack forms of protocol v1. Several commands may share one
// frame (JSON: `\n`-separated; MessagePack: concatenated maps), and the server batches several
// messages per frame under load, so both directions work on lists.

import { decodeMulti, Encoder } from '@msgpack/msgpack';
import type { Command, ServerMessage } from './types.js';

export type Format = 'json' | 'msgpack';

export interface Codec {
  readonly format: Format;
  /** The WebSocket subprotocol that selects this codec. */
  readonly subprotocol: string;
  /** Encodes commands into one frame. */
  encode(commands: Command[]): string | Uint8Array;
  /** Decodes one frame into the messages it carries. Throws on a malformed frame. */
  decode(frame: string | ArrayBuffer | Uint8Array): ServerMessage[];
}

export class JsonCodec implements Codec {
  readonly format = 'json' as const;
  readonly subprotocol = 'switchboard.v1.json';

  encode(commands: Command[]): string {
    if (commands.length === 1) return JSON.stringify(commands[0]);
    return commands.map((c) => JSON.stringify(c)).join('\n');
  }

  decode(frame: string | ArrayBuffer | Uint8Array): ServerMessage[] {
    const text = typeof frame === 'string' ? frame : new TextDecoder().decode(frame);
    let end = text.length;
    while (end > 0 && text.charCodeAt(end - 1) === 10) end--;
    const body = end === text.length ? text : text.slice(0, end);
    if (body.indexOf('\n') < 0) return [JSON.parse(body) as ServerMessage];
    // Raw newlines never occur inside the server's JSON (strings escape them), so a batch of
    // messages parses as one array: one parser call instead of one per message.
    try {
      return JSON.parse('[' + body.replaceAll('\n', ',') + ']') as ServerMessage[];
    } catch {
      return body
        .split('\n')
        .filter((l) => l.trim() !== '')
        .map((l) => JSON.parse(l) as ServerMessage);
    }
  }
}

export class MsgpackCodec implements Codec {
  readonly format = 'msgpack' as const;
  readonly subprotocol = 'switchboard.v1.msgpack';
  // Undefined-valued keys are left out, as JSON.stringify would do.
  private readonly encoder = new Encoder({ ignoreUndefined: true });

  encode(commands: Command[]): Uint8Array {
    if (commands.length === 1) return this.encoder.encode(commands[0]);
    const parts = commands.map((c) => this.encoder.encode(c));
    const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
    let at = 0;
    for (const p of parts) {
      out.set(p, at);
      at += p.length;
    }
    return out;
  }

  decode(frame: string | ArrayBuffer | Uint8Array): ServerMessage[] {
    if (typeof frame === 'string') throw new Error('text frame on the MessagePack subprotocol');
    const bytes = frame instanceof Uint8Array ? frame : new Uint8Array(frame);
    const out: ServerMessage[] = [];
    for (const m of decodeMulti(bytes)) out.push(m as ServerMessage);
    return out;
  }
}

export function codecFor(format: Format): Codec {
  return format === 'msgpack' ? new MsgpackCodec() : new JsonCodec();
}
