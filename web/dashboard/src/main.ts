// Entry point: builds the app and exposes the hooks benchmarks and tests read.

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
