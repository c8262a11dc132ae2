// Axes of a trend painted on the board canvas: "nice" value ticks (1, 2, 5 × 10^k), time ticks
// on round clock steps, and wall-clock labels.

/** Time steps a time axis may use, seconds. */
const TIME_STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400];

/** A round step (1, 2 or 5 × 10^k) of at least `raw`. */
export function niceStep(raw: number): number {
  if (!(raw > 0) || !Number.isFinite(raw)) return 1;
  const p = 10 ** Math.floor(Math.log10(raw));
  const f = raw / p;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * p;
}

/** The multiples of `step` within [lo, hi]. */
export function ticks(lo: number, hi: number, step: number): number[] {
  const out: number[] = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9 && out.length < 64; v += step) out.push(v);
  return out;
}

/** A clock step (seconds) giving ticks at least `minGapS` apart. */
export function timeStep(minGapS: number): number {
  return TIME_STEPS.find((s) => s >= minGapS) ?? niceStep(minGapS / 86400) * 86400;
}

/** `HH:MM:SS` of a unix time in seconds, local time. */
export function clock(s: number): string {
  const d = new Date(s * 1000);
  const p = (n: number) => String(n).padStart(2, '0');
  return `${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
}

/** A tick label of a value axis: as many decimals as the step needs. */
export function valueLabel(v: number, step: number): string {
  const decimals = Math.max(0, Math.min(6, -Math.floor(Math.log10(step) + 1e-9)));
  return v.toFixed(decimals);
}
