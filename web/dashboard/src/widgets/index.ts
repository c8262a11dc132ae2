import type { WidgetSpec } from '../model.js';
import type { Widget } from './base.js';
import { GaugeWidget, LedWidget, ValueWidget } from './simple.js';
import { ScatterWidget, SpectrumWidget } from './plots.js';
import { TrendWidget } from './trend.js';
import { ControlWidget } from './control.js';
import { WritesWidget } from './writes.js';
import { AlarmJournalWidget } from './journal.js';

export { Widget, THEME } from './base.js';
export type { Rect } from './base.js';

export function createWidget(spec: WidgetSpec): Widget {
  const w = construct(spec);
  w.layout();
  return w;
}

function construct(spec: WidgetSpec): Widget {
  switch (spec.type) {
    case 'value':
      return new ValueWidget(spec);
    case 'led':
      return new LedWidget(spec);
    case 'gauge':
      return new GaugeWidget(spec);
    case 'trend':
      return new TrendWidget(spec);
    case 'spectrum':
      return new SpectrumWidget(spec);
    case 'scatter':
      return new ScatterWidget(spec);
    case 'control':
      return new ControlWidget(spec);
    case 'writes':
      return new WritesWidget(spec);
    case 'alarm-journal':
      return new AlarmJournalWidget(spec);
  }
}
