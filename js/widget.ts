// Front end of `%gpu monitor`: one uPlot chart per device, fed by the kernel's sampler.
//
// The kernel sends each sample once, as a custom message holding only the new points
// ({kind: "samples"}, their numbers in binary buffers: lab/wire.ts); a sample equal to the last one sent comes only as a heartbeat, every 2 s
// so the time axis and "last sample" go as far as the newest point held (the kernel's
// widget.py HEARTBEAT_S).  A view asks for the whole history once when it is rendered
// ({kind: "history"}).  Arrays are trimmed to the time window, so memory stays bounded
// however long the panel runs.  Pause is handled here alone: the kernel may be busy with a
// cell and would only see the click when the cell ends.
import type { AnyModel, RenderProps } from "@anywidget/types";
import uPlot from "uplot";
import "uplot/dist/uPlot.min.css";
import "./widget.css";
import { type IPackedLayout, unpackSamples } from "./lab/wire";

// -- the kernel's side (tfgpu_magic/kernel/widget.py) ------------------------------------------

/** The widget's synced traits. */
export interface IMonitorState {
  interval: number; // seconds between samples, shared by every panel of the kernel
  window: number; // seconds shown
  devices: IDeviceDescription[]; // in chart order
  running: boolean; // false once stopped: no more points come
  note: string; // the kernel's word on the shared interval
  limit_label: string; // who holds the limit line: "soft (TensorFlow's allocator)", "hard (MPS)"; "" without one
}

export interface IDeviceDescription {
  key: string; // "gpu0", "tf:CPU:0"
  label: string;
  gpu: boolean;
  gone: string | null; // why a chart is frozen (hidden from the kernel by %gpu use)
}

/** A reading, or null where there is none (a gap in the chart). */
export type Value = number | null;
export type Column = Value[];

/** One framework allocator figure (a framework started): its legend label says whose number it is. */
export interface IFigure {
  framework: string;
  series: string;
  label: string;
}

/** One device's columns in a message: the fixed series by key, and the frameworks' figures. */
export interface IIncomingDevice {
  [series: string]: unknown; // a Column under each key of SERIES an older kernel may leave out
  frameworks?: Record<string, Record<string, Column | undefined> | undefined>;
}

/** A batch of samples ({kind: "samples"}) or the whole history ({kind: "history"}): widget.py's batch(),
 * read back from binary buffers where new samples came in them (lab/wire.ts). */
export interface ISamples {
  kind: "samples" | "history";
  packed?: IPackedLayout;
  t: number[];
  d: Record<string, IIncomingDevice>;
  errors?: Record<string, string | null>; // the latest message per device; null clears it
  status?: string | null;
  figures?: IFigure[];
  figure_notes?: string[];
  figures_read_at?: number | null;
}

type Model = AnyModel<IMonitorState>;

const MAX_POINTS = 20000; // per series, whatever the window: bounds memory at 0.1 s x 30 min
const SLACK = 1.1; // trim when 10% over the window, not on every sample
const CHART_HEIGHT = 130; // px, plot and axes; the legend comes below
const NARROW_HEIGHT = 110; // px, in a side bar: more charts fit above the fold
const NARROW = 480; // px: below this the panel is laid out for a side bar (smaller fonts and axes)
const MIN_WIDTH = 200; // px
const PX_PER_POINT = 2; // finer than this is not visible, and drawing cost grows with points

function maxPoints(chartWidth: number): number {
  return Math.max(Math.floor(chartWidth / PX_PER_POINT), 50);
}

// Wire names from the kernel (tfgpu_magic/widget.py SERIES), in drawing order.  Memory
// series are bytes, on the left axis; utilization is percent, on its own axis at the right.
// "tf" and "peak" (TensorFlow's allocator under its older wire names) are kept, not drawn: every
// framework's allocator figures are drawn from the message's "figures" (see figureSeries).
interface ISeries {
  key: string;
  label: string;
  color: string; // a theme variable (a key of FALLBACK)
  width?: number;
  fill?: number; // alpha of the area under the line
  dash?: number[];
  hidden?: boolean;
  scale?: string; // its own axis ("pct"); else bytes, on the left
}

const SERIES: ISeries[] = [
  { key: "total", label: "Total", color: "--jp-ui-font-color2", width: 1.5 },
  { key: "used", label: "Used (all)", color: "--jp-warn-color1", fill: 0.12 },
  { key: "mine", label: "This kernel", color: "--jp-brand-color1", fill: 0.3 },
  { key: "tf", label: "TF in use", color: "--jp-success-color1", width: 2, hidden: true },
  { key: "peak", label: "TF peak", color: "--jp-success-color1", dash: [2, 3], hidden: true },
  { key: "limit", label: "Limit", color: "--jp-error-color1", dash: [6, 4], width: 1.5 },
  { key: "util", label: "GPU util", color: "--tfgpu-util-color", width: 1, scale: "pct" },
];
// One colour per framework, in the order the kernel lists them; its first figure is a solid
// line, the others dashed.
const FRAMEWORK_COLORS = ["--jp-success-color1", "--tfgpu-framework2-color", "--tfgpu-framework3-color"];
const FIGURE_DASHES: (number[] | undefined)[] = [undefined, [6, 3], [2, 3]];
const FALLBACK: Record<string, string> = {
  "--tfgpu-framework2-color": "#00897b",
  "--tfgpu-framework3-color": "#6d4c41",
  "--jp-ui-font-color1": "#212121",
  "--jp-ui-font-color2": "#616161",
  "--tfgpu-util-color": "#8e24aa",
  "--jp-border-color2": "#e0e0e0",
  "--jp-warn-color1": "#f57c00",
  "--jp-brand-color1": "#1976d2",
  "--jp-success-color1": "#388e3c",
  "--jp-error-color1": "#d32f2f",
  "--jp-ui-font-family": "system-ui, sans-serif",
};

// ---------------------------------------------------------------------------------------
// Data: one time axis, and per device one array per series (bytes or percent, null = gap).

/** What a panel holds: the time axis, per device one array per series, the latest words. */
export interface IStore {
  t: number[];
  dev: Map<string, Record<string, Column>>;
  errors: Record<string, string | null>;
  status: string | null;
  received: number;
  figures: Map<string, IFigure>;
  figureNotes: string[];
  figuresAt: number | null;
  figuresChanged: boolean;
}

export function createStore(): IStore {
  return {
    t: [], dev: new Map(), errors: {}, status: null, received: 0,
    // Every framework figure seen: column key -> {framework, series, label}, in the kernel's order.
    figures: new Map(), figureNotes: [], figuresAt: null, figuresChanged: false,
  };
}

function figureKey(framework: string, series: string): string {
  return `fw:${framework}.${series}`;
}

/** Every column a device holds: the fixed series, then each framework figure seen. */
function columnKeys(store: IStore): string[] {
  return [...SERIES.map((s) => s.key), ...store.figures.keys()];
}

function deviceColumns(store: IStore, key: string): Record<string, Column> {
  let cols = store.dev.get(key);
  if (!cols) {
    // A device seen for the first time: null before it existed, so arrays stay aligned.
    cols = {};
    for (const c of columnKeys(store)) cols[c] = new Array<Value>(store.t.length).fill(null);
    store.dev.set(key, cols);
  }
  return cols;
}

/** New framework figures (a framework started): a column of nulls on every device, and a redraw of the legends. */
function addFigures(store: IStore, described: IFigure[] | undefined): void {
  for (const f of described || []) {
    const key = figureKey(f.framework, f.series);
    if (store.figures.has(key)) continue;
    store.figures.set(key, { framework: f.framework, series: f.series, label: f.label });
    for (const cols of store.dev.values()) cols[key] = new Array<Value>(store.t.length).fill(null);
    store.figuresChanged = true;
  }
}

function incomingColumn(incoming: IIncomingDevice | undefined, key: string, store: IStore): Column | undefined {
  const figure = store.figures.get(key);
  if (!figure) return incoming?.[key] as Column | undefined;
  return incoming?.frameworks?.[figure.framework]?.[figure.series];
}

/** Append a batch of new samples (the kernel never resends old ones). */
export function ingest(store: IStore, msg: ISamples): void {
  const n = msg.t.length;
  const start = store.t.length;
  addFigures(store, msg.figures);
  for (const key of Object.keys(msg.d)) deviceColumns(store, key);
  for (let i = 0; i < n; i++) store.t.push(msg.t[i]);
  const keys = columnKeys(store);
  for (const [key, cols] of store.dev) {
    const incoming = msg.d[key];
    for (const c of keys) {
      const col = cols[c];
      col.length = start; // a device absent from this batch: nulls below
      const values = incomingColumn(incoming, c, store); // an older kernel may not send every series
      for (let i = 0; i < n; i++) col.push(values ? values[i] ?? null : null);
    }
  }
  if (n > 0) {
    store.errors = msg.errors || {};
    store.status = msg.status ?? null;
    store.figureNotes = msg.figure_notes || [];
    store.figuresAt = msg.figures_read_at ?? null;
  }
  store.received += n;
}

/** Replace with the kernel's history, keeping points that arrived after it was taken. */
export function replaceWithHistory(store: IStore, msg: ISamples): void {
  const last = msg.t.length ? msg.t[msg.t.length - 1] : -Infinity;
  const later = store.t.findIndex((t) => t > last);
  const fresh = createStore();
  ingest(fresh, msg);
  if (later >= 0) {
    const tail: ISamples = {
      kind: "samples",
      t: store.t.slice(later), d: {}, errors: store.errors, status: store.status,
      figures: [...store.figures.values()], figure_notes: store.figureNotes, figures_read_at: store.figuresAt,
    };
    for (const [key, cols] of store.dev) {
      const frameworks: Record<string, Record<string, Column>> = {};
      const device: IIncomingDevice = (tail.d[key] = { frameworks });
      for (const s of SERIES) device[s.key] = cols[s.key].slice(later);
      for (const [c, f] of store.figures) {
        (frameworks[f.framework] ||= {})[f.series] = cols[c].slice(later);
      }
    }
    ingest(fresh, tail);
  }
  const changed = fresh.figures.size !== store.figures.size || [...fresh.figures.keys()].some((k) => !store.figures.has(k));
  store.t = fresh.t;
  store.dev = fresh.dev;
  store.errors = fresh.errors;
  store.status = fresh.status;
  store.figures = fresh.figures;
  store.figureNotes = fresh.figureNotes;
  store.figuresAt = fresh.figuresAt;
  store.figuresChanged = store.figuresChanged || changed;
}

/** Drop points older than the window (with some slack, so trimming is not per sample). */
export function trim(store: IStore, windowS: number): void {
  const n = store.t.length;
  if (n === 0) return;
  const oldest = store.t[n - 1] - windowS;
  const overTime = store.t[0] < oldest - windowS * (SLACK - 1);
  if (!overTime && n <= MAX_POINTS) return;
  let cut = 0;
  while (cut < n && store.t[cut] < oldest) cut++;
  cut = Math.max(cut, n - MAX_POINTS);
  store.t.splice(0, cut);
  for (const cols of store.dev.values()) for (const col of Object.values(cols)) col.splice(0, cut);
}

// ---------------------------------------------------------------------------------------
// Colours follow JupyterLab's theme through its --jp-* variables.

function themeColors(el: HTMLElement): Record<string, string> {
  const style = getComputedStyle(el);
  const colors: Record<string, string> = {};
  for (const name of Object.keys(FALLBACK)) {
    colors[name] = style.getPropertyValue(name).trim() || FALLBACK[name];
  }
  return colors;
}

/** The chart grid's colour: the theme's secondary text at 15 % (shown on the root for tests). */
function gridColor(colors: Record<string, string>, root: HTMLElement): string {
  const color = withAlpha(colors["--jp-ui-font-color2"], 0.15);
  root.dataset.gridColor = color;
  return color;
}

const probe = document.createElement("canvas").getContext("2d");

function withAlpha(color: string, alpha: number): string {
  if (!probe) return color; // no 2D canvas (no browser has none): the colour as the theme gave it
  probe.fillStyle = "#000";
  probe.fillStyle = color; // the canvas normalises any CSS colour to #rrggbb or rgba()
  const c = typeof probe.fillStyle === "string" ? probe.fillStyle : color;
  if (c.startsWith("#")) {
    const [r, g, b] = [1, 3, 5].map((i) => parseInt(c.slice(i, i + 2), 16));
    return `rgba(${r},${g},${b},${alpha})`;
  }
  return c.replace(/rgba?\(([^)]+?)(,\s*[\d.]+)?\)/, `rgba($1,${alpha})`);
}

// ---------------------------------------------------------------------------------------
// Units and clocks: one of each per chart, shared by its axis ticks and its legend.

/** A size unit: its name and its bytes. */
export type Unit = [name: string, bytes: number];

const UNITS: Unit[] = [
  ["GiB", 2 ** 30],
  ["MiB", 2 ** 20],
  ["KiB", 2 ** 10],
  ["B", 1],
];
// Tick steps in units of the chosen size: the axis then reads 0, 0.5, 1 MiB, never 0.47 MiB.
const STEPS = [0.01, 0.02, 0.05, 0.1, 0.2, 0.25, 0.5, 1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000];

/** The unit for a chart whose largest value in view is `top` bytes: the largest one it reaches. */
export function unitFor(top: number): Unit {
  for (const unit of UNITS) if (top >= unit[1]) return unit;
  return UNITS[UNITS.length - 1];
}

/** A size in the chart's unit: 3 significant figures (4.00 MiB, 10.5 GiB, 80 GiB). */
export function formatSize(bytes: number | null | undefined, unit: Unit): string {
  if (bytes == null) return "—";
  const v = bytes / unit[1];
  const digits = unit[1] === 1 ? 0 : v < 10 ? 2 : v < 100 ? 1 : 0;
  return `${v.toFixed(digits)} ${unit[0]}`;
}

/** An axis tick: no trailing zeros (0.5 GiB, 1 GiB). */
function formatTick(bytes: number, unit: Unit): string {
  return `${+(bytes / unit[1]).toFixed(2)} ${unit[0]}`;
}

function chartUnit(u: uPlot): Unit {
  return unitFor((u.scales.y.max ?? 0) / Y_HEADROOM); // the largest value in view, as the range was made
}

// One clock everywhere (header, axis ticks, legend): the browser's locale, with seconds.
const CLOCK = new Intl.DateTimeFormat(undefined, { hour: "numeric", minute: "2-digit", second: "2-digit" });

export function clock(seconds: number | null | undefined): string {
  return seconds == null ? "—" : CLOCK.format(new Date(seconds * 1000));
}

function percent(v: number | null | undefined): string {
  return v == null ? "—" : `${Math.round(v)} %`;
}

// ---------------------------------------------------------------------------------------
// Charts

const Y_HEADROOM = 1.08;
const TIME_STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 28800, 86400];
const MIN_TOP = 2 ** 20; // bytes: an empty chart still has a 1 MiB axis

/** The visible time range: the last window, or from the first sample while younger than it. */
export function timeRange(
  first: number | null | undefined,
  last: number | null | undefined,
  windowS: number,
): [number, number] {
  if (first == null || last == null) return [0, 1];
  const start = Math.max(first, last - windowS);
  return [Math.min(start, last - 1), last]; // one sample: a second, not an empty range
}

/** What a chart draws, in order: the driver's series, then each framework figure seen (its own
 * label says whose number it is: "PyTorch allocator: reserved"). */
export function drawnSeries(store: IStore): ISeries[] {
  const drawn = SERIES.filter((s) => !s.hidden);
  const frameworks = [...new Set([...store.figures.values()].map((f) => f.framework))];
  const seen = new Map<string, number>();
  const figures = [...store.figures].map(([key, f]): ISeries => {
    const k = frameworks.indexOf(f.framework);
    const nth = seen.get(f.framework) || 0;
    seen.set(f.framework, nth + 1);
    return {
      key, label: f.label, color: FRAMEWORK_COLORS[k % FRAMEWORK_COLORS.length],
      width: nth === 0 ? 2 : 1.5, dash: FIGURE_DASHES[nth % FIGURE_DASHES.length],
    };
  });
  const util = drawn.filter((s) => s.scale);
  return [...drawn.filter((s) => !s.scale), ...figures, ...util];
}

function chartOptions(panel: Panel, width: number, gpu = true): uPlot.Options {
  const c = panel.colors;
  const narrow = panel.narrow;
  const font = `${narrow ? 10 : 11}px ${c["--jp-ui-font-family"]}`;
  const axis: uPlot.Axis = {
    stroke: c["--jp-ui-font-color2"],
    // Faint in every theme: the text colour at low alpha (a theme's border colour can be bright).
    grid: { stroke: panel.gridColor, width: 1 },
    ticks: { stroke: panel.gridColor, width: 1, size: narrow ? 3 : 6 },
    font,
  };
  return {
    width,
    height: narrow ? NARROW_HEIGHT : CHART_HEIGHT,
    // Without the utilization axis the last time label would be cut at the right edge.
    padding: [null, gpu ? null : 28, null, null],
    cursor: { sync: { key: panel.syncKey }, drag: { x: false, y: false } },
    legend: { live: true },
    scales: {
      // A strip chart: the whole window once full, newest point at the right edge.
      x: { time: true, range: (u, _min, max) => timeRange(u.data[0][0], max, panel.windowS) },
      y: { range: (_u, _min, max) => [0, Math.max(max || 0, MIN_TOP) * Y_HEADROOM] },
      pct: { range: [0, 100] },
    },
    axes: [
      // Whole seconds at least: the clock shows seconds, so finer ticks would repeat a label.
      { ...axis, space: narrow ? 64 : 80, size: narrow ? 20 : 24, incrs: TIME_STEPS, values: (_u, splits) => splits.map(clock) },
      {
        ...axis,
        size: narrow ? 50 : 60,
        incrs: (_u, _axisIdx, _min, max) => STEPS.map((k) => k * unitFor(max / Y_HEADROOM)[1]),
        values: (u, splits) => splits.map((v) => formatTick(v, chartUnit(u))),
      },
      {
        ...axis,
        scale: "pct",
        side: 1,
        show: gpu, // TensorFlow's CPU has no utilization
        size: narrow ? 34 : 42,
        grid: { show: false },
        incrs: [25, 50],
        values: (_u, splits) => splits.map((v) => `${v}%`),
      },
    ],
    series: [
      { label: "Time", value: (u, v, _si, idx) => clock(idx == null ? lastValue(u.data[0]) : v) },
      ...drawnSeries(panel.store).map((s, i): uPlot.Series => ({
        label: s.label,
        scale: s.scale || "y",
        stroke: c[s.color],
        width: s.width ?? 1.5,
        dash: s.dash,
        fill: s.fill ? withAlpha(c[s.color], s.fill) : undefined,
        points: { show: false },
        // Not hovering: show the latest reading, as nvidia-smi would.
        value: (u, v, _si, idx) => {
          const shown = idx == null ? lastValue(u.data[i + 1]) : v;
          return s.scale ? percent(shown) : formatSize(shown, chartUnit(u));
        },
      })),
    ],
  };
}

function lastValue(arr: ArrayLike<number | null | undefined> | undefined): number | null | undefined {
  return arr && arr.length ? arr[arr.length - 1] : null;
}

/** Times, then one column per drawn series: the data uPlot draws. */
export type Columns = [number[], ...Column[]];

function seriesData(store: IStore, key: string, maxPoints = Infinity): Columns {
  const cols = store.dev.get(key);
  const data: Columns = [store.t, ...drawnSeries(store).map((s) => (cols ? cols[s.key] || [] : []))];
  return store.t.length > maxPoints ? decimate(data, maxPoints) : data;
}

/**
 * More points than the plot has room for: one point per bucket, at the bucket's last time,
 * holding each series' highest value (memory peaks must not vanish), or null if the bucket
 * holds a gap (a failed reading must stay visible).  Keeps drawing cost bounded by the
 * chart's width, not by the interval and window.
 */
export function decimate(data: Columns, buckets: number): Columns {
  const n = data[0].length;
  const size = Math.ceil(n / buckets);
  const times: number[] = [];
  const columns = data.slice(1).map((): Column => []);
  for (let start = 0; start < n; start += size) {
    const end = Math.min(start + size, n);
    times.push(data[0][end - 1]);
    for (let s = 1; s < data.length; s++) {
      const col = data[s];
      let high = -Infinity;
      let gap = false;
      for (let i = start; i < end; i++) {
        const v = col[i];
        if (v == null) {
          gap = true;
          break;
        }
        if (v > high) high = v;
      }
      columns[s - 1].push(gap ? null : high);
    }
  }
  return [times, ...columns];
}

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className?: string | null,
  text?: string | null,
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text != null) node.textContent = text;
  return node;
}

// ---------------------------------------------------------------------------------------
// The panel: header with controls, then one card per device.

const INTERVALS = [0.1, 0.2, 0.5, 1, 2, 5];
const WINDOWS: [number, string][] = [
  [60, "1 min"],
  [300, "5 min"],
  [900, "15 min"],
  [3600, "1 h"],
];

/** One device's card: its title, notes and chart. */
interface ICard {
  card: HTMLDivElement;
  title: HTMLDivElement;
  note: HTMLDivElement;
  error: HTMLDivElement;
  plot: HTMLDivElement;
  chart: uPlot | null;
}

interface ISelect {
  label: HTMLLabelElement;
  select: HTMLSelectElement;
}

export class Panel {
  readonly model: Model;
  readonly root: HTMLElement;
  readonly store: IStore = createStore();
  readonly cards = new Map<string, ICard>();
  paused = false;
  stopped = false;
  pending = false;
  draws = 0;
  readonly syncKey = `tfgpu-${Math.random().toString(36).slice(2)}`;
  windowS: number;
  colors: Record<string, string>;
  gridColor: string;
  narrow = false;
  // The header and the body, made by build().
  stateText!: HTMLSpanElement;
  intervalSelect!: ISelect;
  windowSelect!: ISelect;
  pauseButton!: HTMLButtonElement;
  stopButton!: HTMLButtonElement;
  statusText!: HTMLDivElement;
  figuresText!: HTMLDivElement;
  body!: HTMLDivElement;

  constructor(root: HTMLElement, model: Model) {
    this.model = model;
    this.root = root;
    this.windowS = model.get("window");
    this.colors = themeColors(root);
    this.gridColor = gridColor(this.colors, root);
    this.build();
  }

  build(): void {
    const r = this.root;
    r.classList.add("tfgpu-monitor");
    const head = el("div", "tfgpu-head");
    head.append(el("span", "tfgpu-title", "GPU memory"));
    this.stateText = el("span", "tfgpu-state", "waiting for the first sample…");
    head.append(this.stateText);
    const controls = el("span", "tfgpu-controls");
    this.intervalSelect = this.select("Sample every", INTERVALS.map((v) => [v, `${v} s`]), this.model.get("interval"));
    this.windowSelect = this.select("Window", WINDOWS, this.model.get("window"));
    this.pauseButton = el("button", "tfgpu-button tfgpu-pause", "Pause");
    this.stopButton = el("button", "tfgpu-button tfgpu-stop", "Stop");
    this.pauseButton.title = "Freeze the chart (sampling goes on); hover to read values";
    this.stopButton.title = "Stop sampling for this panel; the last panel stops the sampler";
    controls.append(this.intervalSelect.label, this.windowSelect.label, this.pauseButton, this.stopButton);
    head.append(controls);
    this.statusText = el("div", "tfgpu-status");
    // Whose figures the allocator series are, when they were read, and which framework has none.
    this.figuresText = el("div", "tfgpu-figures");
    this.figuresText.hidden = true;
    this.body = el("div", "tfgpu-devices");
    r.append(head, this.statusText, this.figuresText, this.body);

    this.intervalSelect.select.addEventListener("change", () => {
      this.model.set("interval", Number(this.intervalSelect.select.value));
      this.model.save_changes();
    });
    this.windowSelect.select.addEventListener("change", () => {
      this.model.set("window", Number(this.windowSelect.select.value));
      this.model.save_changes();
    });
    this.pauseButton.addEventListener("click", () => this.setPaused(!this.paused));
    this.stopButton.addEventListener("click", () => {
      this.model.send({ kind: "stop" });
      this.showStopped();
    });
    this.syncDevices();
    this.showRunning();
  }

  select(text: string, options: [number, string][], current: number): ISelect {
    const label = el("label", "tfgpu-field", `${text} `);
    const select = el("select", "tfgpu-select");
    const values = options.map(([v]) => v);
    if (!values.includes(current)) options = [...options, [current, `${current} s`]];
    for (const [value, name] of options) {
      const option = el("option", null, name);
      option.value = String(value);
      option.selected = value === current;
      select.append(option);
    }
    label.append(select);
    return { label, select };
  }

  /** The kernel's sampler serves every panel: show the interval another panel chose. */
  showInterval(seconds: number): void {
    const select = this.intervalSelect.select;
    if (![...select.options].some((o) => Number(o.value) === seconds)) {
      const option = el("option", null, `${seconds} s`);
      option.value = String(seconds);
      select.append(option);
    }
    select.value = [...select.options].find((o) => Number(o.value) === seconds)?.value ?? select.value;
  }

  setPaused(paused: boolean): void {
    this.paused = paused;
    this.pauseButton.textContent = paused ? "Resume" : "Pause";
    this.root.classList.toggle("tfgpu-paused", paused);
    if (!paused) this.schedule();
    this.updateText();
  }

  showRunning(): void {
    if (!this.model.get("running")) this.showStopped();
  }

  showStopped(): void {
    this.stopped = true;
    for (const node of [this.intervalSelect.select, this.windowSelect.select, this.pauseButton, this.stopButton]) {
      node.disabled = true;
    }
    this.root.classList.add("tfgpu-stopped");
    this.updateText();
  }

  // -- devices ---------------------------------------------------------------------------
  syncDevices(): void {
    const described = this.model.get("devices") || [];
    for (const d of described) {
      const entry = this.card(d.key, d.label);
      // A GPU hidden by `%gpu use`: its chart stays, frozen, and says why (not a silent stop).
      const gone = d.gone || "";
      if (entry.note.textContent !== gone) entry.note.textContent = gone;
      entry.card.classList.toggle("tfgpu-gone", Boolean(gone));
    }
    this.updateText();
  }

  card(key: string, label?: string | null): ICard {
    let entry = this.cards.get(key);
    if (!entry) {
      const card = el("div", "tfgpu-device");
      card.dataset.key = key;
      const title = el("div", "tfgpu-device-title", label || key);
      const note = el("div", "tfgpu-device-note");
      const error = el("div", "tfgpu-device-error");
      const plot = el("div", "tfgpu-plot");
      card.append(title, note, error, plot);
      this.body.append(card);
      entry = { card, title, note, error, plot, chart: null };
      this.cards.set(key, entry);
      this.makeChart(entry, key);
    } else if (label && entry.title.textContent !== label) {
      entry.title.textContent = label;
    }
    return entry;
  }

  makeChart(entry: ICard, key: string): void {
    if (entry.chart) entry.chart.destroy();
    const width = Math.max(entry.plot.clientWidth || this.root.clientWidth || 600, MIN_WIDTH);
    const gpu = key.startsWith("gpu"); // a framework's own device (TensorFlow's CPU:0) has no utilization
    entry.card.classList.toggle("tfgpu-no-util", !gpu);
    entry.chart = new uPlot(chartOptions(this, width, gpu), seriesData(this.store, key, maxPoints(width)), entry.plot);
  }

  rethemed(): void {
    this.colors = themeColors(this.root);
    this.gridColor = gridColor(this.colors, this.root);
    for (const [key, entry] of this.cards) this.makeChart(entry, key);
  }

  resized(): void {
    // A side bar (~300-400 px) gets smaller fonts, axes and charts: rebuild the charts when the
    // panel crosses that width, since uPlot fixes fonts and axis sizes when it is made.
    const narrow = this.root.clientWidth > 0 && this.root.clientWidth < NARROW;
    if (narrow !== this.narrow) {
      this.narrow = narrow;
      this.root.classList.toggle("tfgpu-narrow", narrow);
      for (const [key, entry] of this.cards) this.makeChart(entry, key);
      return;
    }
    // Cards sit in a grid (two columns on a wide panel): each chart takes its card's width.
    const height = narrow ? NARROW_HEIGHT : CHART_HEIGHT;
    for (const entry of this.cards.values()) {
      const width = Math.max(entry.plot.clientWidth, MIN_WIDTH);
      if (entry.chart && entry.chart.width !== width) entry.chart.setSize({ width, height });
    }
  }

  // -- data --------------------------------------------------------------------------------
  receive(sent: ISamples, buffers?: DataView[]): void {
    const msg = unpackSamples(sent, buffers); // new samples' numbers come in binary buffers
    if (msg.kind === "history") replaceWithHistory(this.store, msg);
    else if (msg.kind === "samples") ingest(this.store, msg);
    else return;
    trim(this.store, this.windowS);
    this.root.dataset.received = String(this.store.received);
    this.schedule();
  }

  setWindow(seconds: number): void {
    this.windowS = seconds;
    trim(this.store, seconds);
    this.schedule();
  }

  schedule(): void {
    if (this.paused || this.pending) return;
    this.pending = true;
    // One draw per frame however many messages came in; none while the tab is hidden.
    requestAnimationFrame(() => {
      this.pending = false;
      if (!this.paused) this.draw();
    });
  }

  /** Redraw every chart from the store (exported for the draw-time benchmark). */
  draw(): void {
    if (this.store.figuresChanged) {
      // A framework's figures appeared: uPlot fixes its series when made, so the charts are remade.
      this.store.figuresChanged = false;
      for (const [key, entry] of this.cards) this.makeChart(entry, key);
    }
    for (const key of this.store.dev.keys()) {
      const entry = this.card(key);
      const chart = entry.chart;
      if (!chart) continue; // (never: a card is made with its chart)
      const limit = maxPoints(chart.width);
      chart.batch(() => chart.setData(seriesData(this.store, key, limit)));
      const error = this.store.errors[key] || "";
      if (entry.error.textContent !== error) {
        entry.error.textContent = error; // only on change: a DOM write costs a style pass
        entry.card.classList.toggle("tfgpu-has-error", Boolean(error));
      }
    }
    this.draws += 1;
    this.root.dataset.points = String(this.store.t.length);
    this.root.dataset.draws = String(this.draws);
    this.updateText();
  }

  updateText(): void {
    const n = this.store.t.length;
    let state: string;
    if (this.stopped) state = "stopped: no new samples (run %gpu monitor for a new panel)";
    else if (this.paused) state = "paused: sampling goes on; resume to catch up";
    else if (n === 0) state = "waiting for the first sample…";
    else state = `last sample ${clock(this.store.t[n - 1])}`;
    // The kernel's word on the interval all panels share (joined it, or changed it for all).
    const note = this.stopped ? "" : this.model.get("note");
    this.stateText.textContent = note ? `${state} · ${note}` : state;
    const status = this.store.status;
    const noDevices = n > 0 && this.store.dev.size === 0;
    this.statusText.textContent =
      status || (noDevices ? "Nothing to chart: no NVIDIA GPU and no framework's allocator figures." : "");
    this.statusText.hidden = !this.statusText.textContent;
    const figures = [figuresLine(this.store), limitLine(this.model.get("limit_label"))].filter(Boolean).join(" · ");
    if (this.figuresText.textContent !== figures) this.figuresText.textContent = figures;
    this.figuresText.hidden = !figures;
  }

  destroy(): void {
    for (const entry of this.cards.values()) entry.chart?.destroy();
    this.cards.clear();
  }
}

/** The line under the header: when the allocator figures were read (after each cell and each
 * %gpu, on the kernel's own thread: they stand still while a cell runs), and which framework
 * has none and why.  Empty before any framework is imported. */
export function figuresLine(store: IStore): string {
  const parts: string[] = [];
  if (store.figures.size && store.figuresAt != null) {
    parts.push(`Allocator figures (each framework's own count) read ${clock(store.figuresAt)}, after the last cell or %gpu`);
  }
  parts.push(...store.figureNotes);
  return parts.join(" · ");
}

/** Who holds the dashed limit line: a soft limit caps the frameworks' pools only. */
export function limitLine(label: string | undefined): string {
  return label ? `Limit line: ${label}` : "";
}

// ---------------------------------------------------------------------------------------
// anywidget entry point

function render({ model, el: root }: RenderProps<IMonitorState>): () => void {
  const panel = new Panel(root, model);
  (root as HTMLElement & { __tfgpuPanel?: Panel }).__tfgpuPanel = panel; // for the browser test and the draw-time benchmark
  // What the panel follows: the kernel's messages, and each trait it shows.
  const handlers: [string, (msg: ISamples, buffers?: DataView[]) => void][] = [
    ["msg:custom", (msg, buffers) => panel.receive(msg, buffers)],
    ["change:devices", () => panel.syncDevices()],
    ["change:window", () => panel.setWindow(model.get("window"))],
    ["change:interval", () => panel.showInterval(model.get("interval"))],
    ["change:running", () => panel.showRunning()],
    ["change:note", () => panel.updateText()],
    ["change:limit_label", () => panel.updateText()],
  ];
  for (const [event, handler] of handlers) model.on(event, handler);
  model.send({ kind: "history" });

  const resize = new ResizeObserver(() => panel.resized());
  resize.observe(root);
  // JupyterLab marks its theme on <body>; the canvas colours must be re-read when it changes.
  // The new theme's stylesheet may land after the attribute changes: read again shortly after.
  let retheme: ReturnType<typeof setTimeout> | undefined;
  const theme = new MutationObserver(() => {
    panel.rethemed();
    clearTimeout(retheme);
    retheme = setTimeout(() => panel.rethemed(), 500);
  });
  theme.observe(document.body, { attributes: true, attributeFilter: ["data-jp-theme-name", "data-jp-theme-light"] });

  return () => {
    for (const [event, handler] of handlers) model.off(event, handler);
    resize.disconnect();
    theme.disconnect();
    clearTimeout(retheme);
    panel.destroy();
  };
}

export default { render };
