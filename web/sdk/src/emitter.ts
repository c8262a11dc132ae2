// A small typed event emitter. A listener that throws does not stop the others; the error is
// reported to `onListenerError` (the client routes it to its `error` event).

export type Listener<T> = (value: T) => void;

export class Emitter<Events extends { [K in keyof Events]: unknown }> {
  private listeners: { [K in keyof Events]?: Set<Listener<Events[K]>> } = {};

  constructor(private readonly onListenerError: (e: unknown) => void = (e) => console.error(e)) {}

  /** Adds a listener; returns the function that removes it. */
  on<K extends keyof Events>(event: K, fn: Listener<Events[K]>): () => void {
    let set = this.listeners[event];
    if (!set) {
      set = new Set();
      this.listeners[event] = set;
    }
    set.add(fn);
    return () => this.off(event, fn);
  }

  off<K extends keyof Events>(event: K, fn: Listener<Events[K]>): void {
    this.listeners[event]?.delete(fn);
  }

  has<K extends keyof Events>(event: K): boolean {
    const set = this.listeners[event];
    return set !== undefined && set.size > 0;
  }

  emit<K extends keyof Events>(event: K, value: Events[K]): void {
    const set = this.listeners[event];
    if (!set) return;
    for (const fn of set) {
      try {
        fn(value);
      } catch (e) {
        this.onListenerError(e);
      }
    }
  }

  clear(): void {
    this.listeners = {};
  }
}
