// Dashboards as stored by the server (`/api/dashboards/{id}`), and widget defaults.

export const WIDGET_TYPES = ['value', 'led', 'gauge', 'trend', 'spectrum', 'scatter', 'control', 'writes', 'alarm-journal'] as const;
export type WidgetType = (typeof WIDGET_TYPES)[number];

/** Widget options; every key is optional and kind-specific (see OPTION_FIELDS). */
export type WidgetOptions = Record<string, unknown>;

export interface WidgetSpec {
  type: WidgetType;
  /** The channel shown; `""` while unbound. */
  channel: string;
  /** Place and size in grid cells of `CELL` pixels. */
  x: number;
  y: number;
  w: number;
  h: number;
  options: WidgetOptions;
}

export interface DashboardSpec {
  id?: string;
  title: string;
  widgets: WidgetSpec[];
  updated?: number;
}

/** Pixels per grid cell. */
export const CELL = 20;

export const DEFAULT_SIZE: Record<WidgetType, { w: number; h: number }> = {
  value: { w: 8, h: 4 },
  led: { w: 4, h: 4 },
  gauge: { w: 8, h: 8 },
  trend: { w: 16, h: 8 },
  spectrum: { w: 16, h: 8 },
  scatter: { w: 8, h: 8 },
  control: { w: 8, h: 4 },
  writes: { w: 16, h: 8 },
  'alarm-journal': { w: 24, h: 10 },
};

export interface OptionField {
  key: string;
  label: string;
  kind: 'text' | 'number' | 'channel';
  hint?: string;
}

const label: OptionField = { key: 'label', label: 'Label', kind: 'text' };
const field: OptionField = {
  key: 'field',
  label: 'Field',
  kind: 'text',
  hint: 'path into the data; default: v when present, else the whole value',
};

/** Colouring limits of the widgets that show one number (value, gauge): colour only — the
 * alarms operators acknowledge are the server's (`[[alarms]]`, docs/alarms.md). */
const alarmLimits: OptionField[] = [
  { key: 'lolo', label: 'LoLo', kind: 'number', hint: 'red at or below' },
  { key: 'lo', label: 'Lo', kind: 'number', hint: 'amber at or below' },
  { key: 'hi', label: 'Hi', kind: 'number', hint: 'amber at or above' },
  { key: 'hihi', label: 'HiHi', kind: 'number', hint: 'red at or above' },
];
const stale: OptionField = { key: 'stale_s', label: 'Stale after (s)', kind: 'number', hint: 'empty: never' };

/** The options each kind understands, in form order. */
export const OPTION_FIELDS: Record<WidgetType, OptionField[]> = {
  value: [
    label,
    ...alarmLimits,
    stale,
    { key: 'units', label: 'Units', kind: 'text' },
    { key: 'decimals', label: 'Decimals', kind: 'number' },
    field,
  ],
  led: [
    label,
    stale,
    { key: 'threshold', label: 'On above', kind: 'number', hint: 'empty: the value is a boolean' },
    { key: 'on_color', label: 'On colour', kind: 'text' },
    { key: 'off_color', label: 'Off colour', kind: 'text' },
    field,
  ],
  gauge: [
    label,
    ...alarmLimits,
    stale,
    { key: 'min', label: 'Min', kind: 'number' },
    { key: 'max', label: 'Max', kind: 'number' },
    { key: 'units', label: 'Units', kind: 'text' },
    { key: 'decimals', label: 'Decimals', kind: 'number' },
    field,
  ],
  trend: [
    label,
    { key: 'window_s', label: 'Window (s)', kind: 'number' },
    { key: 'min', label: 'Min', kind: 'number', hint: 'empty: automatic' },
    { key: 'max', label: 'Max', kind: 'number', hint: 'empty: automatic' },
    field,
  ],
  spectrum: [
    label,
    { key: 'min', label: 'Min', kind: 'number', hint: 'empty: 0' },
    { key: 'max', label: 'Max', kind: 'number', hint: 'empty: automatic' },
    field,
  ],
  scatter: [
    label,
    { key: 'x_channel', label: 'X channel', kind: 'channel', hint: 'empty: x is the previous value' },
    { key: 'points', label: 'Points kept', kind: 'number' },
    field,
  ],
  control: [
    label,
    { key: 'control', label: 'Kind', kind: 'text', hint: 'button, toggle or setpoint' },
    { key: 'value', label: 'Sends', kind: 'text', hint: 'button: the value sent (default true)' },
    { key: 'button_label', label: 'Button', kind: 'text' },
    { key: 'min', label: 'Min', kind: 'number', hint: 'setpoint' },
    { key: 'max', label: 'Max', kind: 'number', hint: 'setpoint' },
    { key: 'units', label: 'Units', kind: 'text' },
    field,
  ],
  writes: [label],
  'alarm-journal': [
    label,
    { key: 'alarm', label: 'Alarm', kind: 'text', hint: 'an alarm or definition id; empty: every alarm' },
    { key: 'kind', label: 'Kind', kind: 'text', hint: 'raised, acked, shelved, …; empty: every kind' },
    { key: 'limit', label: 'Page', kind: 'number', hint: 'entries per page (50)' },
  ],
};

export function isWidgetType(t: unknown): t is WidgetType {
  return typeof t === 'string' && (WIDGET_TYPES as readonly string[]).includes(t);
}

/** Checks the shape of an imported dashboard; the server validates the details on save. */
export function parseDashboard(json: unknown): DashboardSpec {
  if (!json || typeof json !== 'object') throw new Error('not a dashboard: expected a JSON object');
  const d = json as Record<string, unknown>;
  if (typeof d.title !== 'string') throw new Error('not a dashboard: "title" must be a string');
  if (!Array.isArray(d.widgets)) throw new Error('not a dashboard: "widgets" must be an array');
  const widgets = d.widgets.map((w: unknown, i: number): WidgetSpec => {
    const o = (w ?? {}) as Record<string, unknown>;
    if (!isWidgetType(o.type)) throw new Error(`widgets[${i}].type must be one of ${WIDGET_TYPES.join(', ')}`);
    const num = (k: string, min: number) => {
      const v = o[k];
      if (typeof v !== 'number' || !Number.isInteger(v) || v < min) throw new Error(`widgets[${i}].${k} must be an integer >= ${min}`);
      return v;
    };
    return {
      type: o.type,
      channel: typeof o.channel === 'string' ? o.channel : '',
      x: num('x', 0),
      y: num('y', 0),
      w: num('w', 1),
      h: num('h', 1),
      options: o.options && typeof o.options === 'object' && !Array.isArray(o.options) ? { ...(o.options as WidgetOptions) } : {},
    };
  });
  return { id: typeof d.id === 'string' ? d.id : undefined, title: d.title, widgets };
}

/** The body `PUT /api/dashboards/{id}` takes. */
export function toBody(d: DashboardSpec): { title: string; widgets: WidgetSpec[] } {
  return { title: d.title, widgets: d.widgets };
}

export const ID_PATTERN = /^[A-Za-z0-9_-]{1,64}$/;
