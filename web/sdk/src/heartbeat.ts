// The client's watch over a silent connection. The browser answers the server's WebSocket pings
// without telling the page, so a dead network path is noticed here: a `ping` command when
// nothing arrived for an interval, and `silent` when that stays unanswered for another one.

export class Heartbeat {
  private timer: ReturnType<typeof setInterval> | null = null;
  private lastRx = 0;
  private pingSentAt = 0;

  /** `ping` sends a ping command (any message back proves the path alive); `silent` gives the
   * connection up. */
  constructor(
    private readonly ping: () => void,
    private readonly silent: () => void,
  ) {}

  /** Something arrived: the path is alive. */
  received(): void {
    this.lastRx = Date.now();
    this.pingSentAt = 0;
  }

  /** Watches with the server's ping interval (ms). */
  start(intervalMs: number): void {
    this.stop();
    this.pingSentAt = 0;
    this.timer = setInterval(
      () => {
        const now = Date.now();
        if (now - this.lastRx < intervalMs) {
          this.pingSentAt = 0;
          return;
        }
        if (this.pingSentAt && now - this.pingSentAt >= intervalMs) {
          this.silent();
          return;
        }
        if (!this.pingSentAt) {
          this.pingSentAt = now;
          this.ping();
        }
      },
      Math.max(1000, intervalMs / 2),
    );
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
  }
}
