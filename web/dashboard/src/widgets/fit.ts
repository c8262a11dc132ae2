// Text that fits its box: a value with its units, a state word, a label, a stale value's age.
// Text is scaled down to fit, never cut.
//
// Widths come from per-character advances measured once per font (at 100 px, scaled linearly),
// so a new value costs a few table lookups and nothing is measured per frame (measureText on
// every redraw is what makes text-heavy canvases slow). A sum of advances ignores kerning and
// ligatures, which only narrow text, so the estimate errs wide: on the side of fitting.

/** The size advances are measured at, px. */
const REF_PX = 100;
/** Room left for the estimate's error (hinting and rounding at small sizes). */
const SLACK = 1.04;
const SLACK_PX = 1;
/** Height of a line of text in em: room for the tallest glyphs and the deepest descenders. */
const LINE = 1.2;
/** Baseline below a line's middle, em: digits and capitals stand centred on the middle. */
const BASELINE = 0.33;
/** Units are drawn at this fraction of the number's size. */
export const UNIT_SCALE = 0.6;
/** Space between a number and its units, em of the number. */
const UNIT_GAP = 0.28;

/** One piece of text placed in its box: `x` its left edge and `y` its baseline (canvas
 * `textBaseline = 'alphabetic'`), relative to the box's top left; `w` the estimated width. */
export interface TextRun {
  text: string;
  font: string;
  px: number;
  x: number;
  y: number;
  w: number;
}

const tables = new Map<string, Map<string, number>>();
let measurer: CanvasRenderingContext2D | null | undefined;

/** The width of `text` at 1 px in `weight` and `family` (multiply by the size in px). */
export function emWidth(text: string, weight: number, family: string): number {
  const key = `${weight} ${REF_PX}px ${family}`;
  let table = tables.get(key);
  if (!table) tables.set(key, (table = new Map()));
  let sum = 0;
  for (const ch of text) {
    let a = table.get(ch);
    if (a === undefined) {
      if (measurer === undefined) measurer = document.createElement('canvas').getContext('2d');
      if (measurer) {
        measurer.font = key;
        a = measurer.measureText(ch).width;
      } else a = REF_PX * 0.7;
      table.set(ch, a);
    }
    sum += a;
  }
  return (sum / REF_PX) * SLACK;
}

/** The largest size (≤ `maxPx`) at which `text` is at most `width` px wide. */
export function fitPx(text: string, width: number, maxPx: number, weight: number, family: string): number {
  const em = emWidth(text, weight, family);
  return em === 0 ? maxPx : Math.max(0, Math.min(maxPx, (width - SLACK_PX) / em));
}

function font(weight: number, px: number, family: string): string {
  return `${weight} ${Math.floor(px * 10) / 10}px ${family}`;
}

/** A run of `text` at `px`, its left edge at `x` and its line centred at `cy`. */
function run(text: string, px: number, weight: number, family: string, x: number, cy: number): TextRun {
  px = Math.floor(px * 10) / 10;
  return { text, font: font(weight, px, family), px, x, y: cy + BASELINE * px, w: emWidth(text, weight, family) * px };
}

/**
 * A value and its units laid out to fit a `w` × `h` box, centred: on one line (units smaller,
 * on the number's baseline) or, when that lets the number be larger, the units on a line of
 * their own below it. The number is at most `maxPx`; the text shrinks as far as the box needs.
 */
export function fitValue(main: string, units: string, w: number, h: number, maxPx: number, weight: number, family: string): TextRun[] {
  if (w <= 0 || h <= 0) return [];
  const em = emWidth(main, weight, family);
  if (!units) {
    const px = Math.min(maxPx, h / LINE, (w - SLACK_PX) / (em || 1));
    // Words (a state such as "EMERGENCY STOP") take two lines where that makes them larger.
    const split = main.includes(' ') ? splitLines(main, weight, family) : null;
    if (split) {
      const px2 = Math.min(maxPx, h / (2 * LINE), (w - SLACK_PX) / split.em);
      if (px2 > px * 1.15) {
        const top = (h - 2 * LINE * px2) / 2;
        const rs = [run(split.lines[0], px2, weight, family, 0, top + (LINE * px2) / 2), run(split.lines[1], px2, weight, family, 0, top + (LINE * px2 * 3) / 2)];
        for (const r of rs) r.x = (w - r.w) / 2;
        return rs;
      }
    }
    const r = run(main, px, weight, family, 0, h / 2);
    r.x = (w - r.w) / 2;
    return [r];
  }
  const uem = emWidth(units, weight, family) * UNIT_SCALE;
  const one = Math.min(maxPx, h / LINE, (w - SLACK_PX) / (em + UNIT_GAP + uem));
  const two = Math.min(maxPx, h / (LINE * (1 + UNIT_SCALE)), (w - SLACK_PX) / (Math.max(em, uem) || 1));
  if (two > one * 1.15) {
    const px = two;
    const top = (h - LINE * px * (1 + UNIT_SCALE)) / 2;
    const a = run(main, px, weight, family, 0, top + (LINE * px) / 2);
    const b = run(units, px * UNIT_SCALE, weight, family, 0, top + LINE * px + (LINE * px * UNIT_SCALE) / 2);
    a.x = (w - a.w) / 2;
    b.x = (w - b.w) / 2;
    return [a, b];
  }
  const px = one;
  const a = run(main, px, weight, family, 0, h / 2);
  const b = run(units, px * UNIT_SCALE, weight, family, 0, h / 2);
  // The units share the number's baseline.
  b.y = a.y;
  const total = a.w + UNIT_GAP * px + b.w;
  a.x = Math.max(0, (w - total) / 2);
  b.x = a.x + a.w + UNIT_GAP * px;
  return [a, b];
}

/** Below this size a label takes two lines where that makes it larger, px. */
const LABEL_COMFORT_PX = 9;

/**
 * A widget's label in its header, `w` px wide: at `maxPx`, smaller when long; below 9 px on two
 * lines (split at the space that leaves the longer line shortest) when that makes it larger and
 * the header may grow to `maxH` px; never below `minPx`. Past that it is cut with an ellipsis,
 * the one place text is cut: a label names the widget, it is not its value.
 */
export function fitLabel(label: string, w: number, maxH: number, maxPx: number, minPx: number, family: string): TextRun[] {
  if (!label || w <= 0) return [];
  const one = fitPx(label, w, maxPx, 400, family);
  if (one >= Math.min(maxPx, LABEL_COMFORT_PX)) return [run(label, one, 400, family, 0, (LINE * one) / 2)];
  const split = splitLines(label, 400, family);
  if (split && maxH >= 2 * LINE * minPx) {
    const px = Math.min(maxPx, maxH / (2 * LINE), (w - SLACK_PX) / split.em);
    if (px >= minPx && px > one * 1.15) {
      return [run(split.lines[0], px, 400, family, 0, (LINE * px) / 2), run(split.lines[1], px, 400, family, 0, (LINE * px * 3) / 2)];
    }
  }
  if (one >= minPx) return [run(label, one, 400, family, 0, (LINE * one) / 2)];
  let text = label;
  while (text.length > 1 && fitPx(`${text}…`, w, maxPx, 400, family) < minPx) text = text.slice(0, -1);
  return [run(`${text.trimEnd()}…`, minPx, 400, family, 0, (LINE * minPx) / 2)];
}

/** `text` split at the space that leaves the longer of two lines shortest, and that line's
 * width at 1 px; null for a single word. */
function splitLines(text: string, weight: number, family: string): { lines: [string, string]; em: number } | null {
  const words = text.split(' ');
  if (words.length < 2) return null;
  let best: { lines: [string, string]; em: number } | null = null;
  for (let i = 1; i < words.length; i++) {
    const lines: [string, string] = [words.slice(0, i).join(' '), words.slice(i).join(' ')];
    const em = Math.max(emWidth(lines[0], weight, family), emWidth(lines[1], weight, family));
    if (!best || em < best.em) best = { lines, em };
  }
  return best;
}

/** The height `runs` take from their top (the lines' boxes), px. */
export function runsHeight(runs: TextRun[]): number {
  let h = 0;
  for (const r of runs) h = Math.max(h, r.y - BASELINE * r.px + (LINE * r.px) / 2);
  return h;
}

/** Draws `runs` with their top left at (x, y) on a canvas. */
export function drawRuns(ctx: CanvasRenderingContext2D, runs: TextRun[], x: number, y: number): void {
  ctx.textAlign = 'left';
  ctx.textBaseline = 'alphabetic';
  for (const r of runs) {
    ctx.font = r.font;
    ctx.fillText(r.text, x + r.x, y + r.y);
  }
}
