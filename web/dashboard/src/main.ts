// Entry point: builds the app and exposes the hooks benchmarks and tests read.
//
// # Layout
// - app.ts: loads and saves dashboards, keeps the SDK subscribed to the board's channels
//   (trends with their history), run and edit modes; api.ts is the server's HTTP API.
// - board.ts: every widget on one canvas, drawn in one pass per animation frame.
// - widgets/: base.ts (what every widget shares), fit.ts (text that fits its box), simple.ts
//   (value, LED, gauge), trend.ts (with axes.ts), plots.ts (spectrum, scatter), control.ts
//   (operator controls), writes.ts (the write audit), journal.ts (the alarm journal); index.ts
//   makes a widget from its spec.
// - model.ts: stored dashboards and widget defaults; editor.ts, channels.ts and dom.ts: edit
//   mode's form and channel browser; alarms.ts: the server's alarm list; login.ts: signing in.

import 'uplot/dist/uPlot.min.css';
import './styles.css';
import { App, type LogEntry } from './app.js';
import type { BoardStats } from './board.js';

declare global {
  interface Window {
    /** Counters of the board: widgets, widgets with a value, updates applied, frames rendered. */
    switchboardStats: () => BoardStats & { sdk: { received: number; delivered: number; frames: number; reconnects: number } };
    /** The page's event log: non-point publications, gaps, (re)connects, refused channels. */
    switchboardLog: () => LogEntry[];
    /** One widget's state and its panel in page coordinates. */
    switchboardWidget: (i: number) => unknown;
    switchboardApp: App;
  }
}

performance.mark('sb:script');
const app = new App(document.getElementById('app') ?? document.body);
window.switchboardApp = app;
window.switchboardStats = () => ({ ...app.board.stats(), sdk: { ...app.client.stats } });
window.switchboardLog = () => app.events();
window.switchboardWidget = (i: number) => {
  const s = app.widgetState(i);
  return s ? { ...s, ...app.board.widgetRect(i) } : null;
};
void app.start();
