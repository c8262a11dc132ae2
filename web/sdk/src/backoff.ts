// Reconnect delays: exponential backoff with full jitter. Each delay is drawn uniformly from
// [0, min(max, min * factor^attempt)], so clients cut off together by a server restart spread
// their reconnects over the window instead of arriving as one storm.

export interface BackoffOptions {
  /** Upper bound of the first delay, ms (default 250). */
  minDelayMs?: number;
  /** Cap of the window, ms (default 10,000). */
  maxDelayMs?: number;
  /** Growth of the window per failed attempt (default 2). */
  factor?: number;
}

export class Backoff {
  private attempt = 0;
  private readonly min: number;
  private readonly max: number;
  private readonly factor: number;

  constructor(
    opts: BackoffOptions = {},
    private readonly random: () => number = Math.random,
  ) {
    this.min = opts.minDelayMs ?? 250;
    this.max = opts.maxDelayMs ?? 10_000;
    this.factor = opts.factor ?? 2;
  }

  /** The window of the next delay. */
  window(): number {
    return Math.min(this.max, this.min * Math.pow(this.factor, this.attempt));
  }

  /** Draws the next delay and widens the window. */
  next(): number {
    const delay = Math.floor(this.random() * this.window());
    this.attempt = Math.min(this.attempt + 1, 60);
    return delay;
  }

  reset(): void {
    this.attempt = 0;
  }

  get attempts(): number {
    return this.attempt;
  }
}
