// A subscription handle. Several handles may share one channel; the client keeps one server
// subscription per channel and drops it when the last handle unsubscribes.

import { Emitter } from './emitter.js';
import type { Position, Publication } from './types.js';
import type { GapEvent, SubscribedEvent } from './events.js';
import { SwitchboardError } from './types.js';

export type SubscriptionState = 'pending' | 'subscribed' | 'error' | 'unsubscribed';

export interface SubscriptionEvents {
  /** A publication of this channel, delivered in the client's per-frame batch. */
  publication: Publication;
  /** The server confirmed the subscription (again after each reconnect). */
  subscribed: SubscribedEvent;
  /** Recovery could not reach back far enough (`complete: false`). */
  gap: GapEvent;
  /** The server refused the subscription. */
  error: SwitchboardError;
}

/** The client's side of a handle. */
export interface SubscriptionOwner {
  release(sub: Subscription): void;
  positionOf(channel: string): Position | null;
  stateOf(channel: string): SubscriptionState;
}

export class Subscription {
  readonly channel: string;
  /** Resolves on the first confirmation, rejects when the server refuses the channel. */
  readonly ready: Promise<SubscribedEvent>;
  private readonly events: Emitter<SubscriptionEvents>;
  private resolveReady!: (e: SubscribedEvent) => void;
  private rejectReady!: (e: SwitchboardError) => void;
  private settled = false;
  private released = false;

  /** @internal Use `Client.subscribe`. */
  constructor(
    private readonly owner: SubscriptionOwner,
    channel: string,
    onListenerError: (e: unknown) => void,
  ) {
    this.channel = channel;
    this.events = new Emitter(onListenerError);
    this.ready = new Promise((resolve, reject) => {
      this.resolveReady = resolve;
      this.rejectReady = reject;
    });
    // An unobserved refusal is reported through the `error` event, not as an unhandled rejection.
    this.ready.catch(() => {});
  }

  on<K extends keyof SubscriptionEvents>(event: K, fn: (v: SubscriptionEvents[K]) => void): () => void {
    return this.events.on(event, fn);
  }

  /** The position of the latest publication received for the channel. */
  get position(): Position | null {
    return this.owner.positionOf(this.channel);
  }

  get state(): SubscriptionState {
    return this.released ? 'unsubscribed' : this.owner.stateOf(this.channel);
  }

  unsubscribe(): void {
    if (this.released) return;
    this.released = true;
    this.events.clear();
    this.owner.release(this);
  }

  /** @internal */
  wantsPublications(): boolean {
    return this.events.has('publication');
  }

  /** @internal */
  emit<K extends keyof SubscriptionEvents>(event: K, value: SubscriptionEvents[K]): void {
    if (event === 'subscribed' && !this.settled) {
      this.settled = true;
      this.resolveReady(value as SubscribedEvent);
    } else if (event === 'error' && !this.settled) {
      this.settled = true;
      this.rejectReady(value as SwitchboardError);
    }
    this.events.emit(event, value);
  }
}
