// The GPU side panel: one bar per GPU split by who holds its memory, then the kernels of this
// server that hold some, each with Open and Shut down.
//
// Drawn with plain DOM from a small view model.  Each part of the panel (a GPU's card, a
// kernel's row, the "updated" line) is redrawn only when its own part of the model changes,
// and nodes that did not change stay in place: a poll that brings a new time or a new figure
// for one GPU must not sweep away the button under the pointer (a click whose mousedown and
// mouseup land on different nodes is lost) or the keyboard focus.

import { Dialog, showDialog } from '@jupyterlab/apputils';
import { refreshIcon } from '@jupyterlab/ui-components';
import { CommandRegistry } from '@lumino/commands';
import { Message } from '@lumino/messaging';

import { IGpu, IKernel, IMigInstance, IProcess, IStatusReply, Reading, StatusPoller } from './api';
import {
  formatActivity,
  formatBytes,
  formatPerGpu,
  gpuFigures,
  holdsGpuMemory,
  kernelDetails,
  kernelLabel,
  kernelTotal,
  perGpu,
  utilizationFigures
} from './format';
import { gpuIcon } from './icons';
import { PolledWidget } from './polled';

export const PANEL_ID = 'tfgpu-magic-panel';

export interface IGpuPanelOptions {
  poller: StatusPoller;
  commands: CommandRegistry;
  /** Shuts a kernel down (the app's kernel manager, so its sessions hear of it). */
  shutdownKernel: (id: string) => Promise<void>;
  /** The kernel of the notebook in front, marked in the list; null when there is none. */
  currentKernelId?: () => string | null;
}

// The parts of a GPU's memory, in bar order; `free` is drawn last, as the rest of the bar.
type Part = 'kernels' | 'my_other' | 'others' | 'unattributed' | 'free';
const PARTS: ReadonlyArray<{ part: Part; key: keyof NonNullable<IGpu['split']>; label: string }> = [
  { part: 'kernels', key: 'kernels_bytes', label: "this server's kernels" },
  { part: 'my_other', key: 'my_other_bytes', label: 'my other processes' },
  { part: 'others', key: 'others_bytes', label: 'other users' },
  { part: 'unattributed', key: 'unattributed_bytes', label: 'unattributed' },
  { part: 'free', key: 'free_bytes', label: 'free' }
];
const MAX_LISTED = 8; // processes named in a segment's tooltip

interface ISegment {
  part: Part;
  percent: number;
  title: string;
}

interface IGpuView {
  index: number;
  name: string | null;
  usage: string;
  segments: ISegment[];
  message: string | null; // instead of a bar: lost, or no readings
  notes: string[];
  mig: IMigRow[] | null; // a MIG-enabled GPU's instances, as nvitop lists them under the GPU
  share: string | null; // "share 4.0 GiB, soft (HAMi)": the platform's share and whether it holds
  shareTitle: string; // where it came from and who enforces it
}

interface IMigRow {
  label: string; // "MIG 3:1  instance 2/0"
  usage: string; // "4.8 GiB of 9.8 GiB used"
  percent: number | null; // used of total, for the instance's own small bar
  who: string; // "2 processes · a.ipynb"
  title: string; // UUID, notes
}

interface IKernelRow {
  id: string;
  name: string;
  path: string | null;
  openable: boolean;
  memory: string[]; // "GPU 1: 6.1 GiB", one per GPU it holds memory on
  utilization: string[]; // "GPU 1: 0%", the driver's, one per GPU it holds memory on
  notice: string | null; // memory it holds at 0% past the server's thresholds: what, how long, what to do
  activity: string;
  title: string;
  current: boolean;
}

interface IView {
  updated: string;
  message: string | null;
  user: string | null;
  gpus: IGpuView[];
  kernels: IKernelRow[];
  quiet: string | null; // "2 other kernels hold no GPU memory"
  unattributable: string[];
  notes: string[];
}

export class GpuPanel extends PolledWidget {
  constructor(options: IGpuPanelOptions) {
    super(options.poller);
    this._options = options;
    this.id = PANEL_ID;
    this.addClass('tfgpu-lab-panel');
    this.title.icon = gpuIcon;
    this.title.caption = 'GPU memory: who holds what';
    this.node.addEventListener('click', this._onClick);
  }

  /** Redraw now (the notebook in front changed, or a kernel was shut down). */
  refresh(): void {
    this.update();
  }

  override dispose(): void {
    this.node.removeEventListener('click', this._onClick);
    super.dispose();
  }

  /** Opening the panel shows fresh figures at once, not the last interval's. */
  protected override onHold(): void {
    void this.poller.refresh();
  }

  protected override onReading(): void {
    if (this.isVisible) {
      this.update();
    }
  }

  // -- drawing ---------------------------------------------------------------------------
  protected override onUpdateRequest(msg: Message): void {
    super.onUpdateRequest(msg);
    this._draw(this._view(this._options.poller.reading));
  }

  private _view(reading: Reading | null): IView {
    const empty: IView = {
      updated: '',
      message: null,
      user: null,
      gpus: [],
      kernels: [],
      quiet: null,
      unattributable: [],
      notes: []
    };
    if (reading === null) {
      return { ...empty, message: 'Reading GPU memory…' };
    }
    if (!reading.ok) {
      return { ...empty, message: reading.error, updated: `failed ${clock(reading.receivedAt / 1000)}` };
    }
    const reply = reading.reply;
    const view: IView = { ...empty, updated: reply.generated_at === null ? 'updated at an unknown time' : `updated ${clock(reply.generated_at)}`, user: reply.user, notes: reply.notes ?? [] };
    const current = this._options.currentKernelId?.() ?? null;
    const kernels = reply.kernels.filter(k => !this._gone.has(k.id));
    this._forgetGone(reply);
    if (!reply.driver.available) {
      // Nothing is known about any kernel's GPU memory: say so rather than list them as holding none.
      view.message = `No GPU readings: ${reply.driver.reason ?? 'the NVIDIA driver cannot be reached'}`;
      view.quiet = kernels.length
        ? `${plural(kernels.length, 'kernel')} running; ${kernels.length === 1 ? 'its' : 'their'} GPU memory cannot be read.`
        : 'No kernel of this server is running.';
      return view;
    }
    if (reply.gpus.length === 0) {
      view.message = 'This server has no NVIDIA GPU.';
    }
    view.gpus = reply.gpus.map(gpu => gpuView(gpu, reply));
    const holding = kernels.filter(holdsGpuMemory).sort((a, b) => kernelTotal(b) - kernelTotal(a));
    view.kernels = holding.map(k => kernelRow(k, reply.generated_at ?? NaN, k.id === current));
    const rest = kernels.filter(k => !holdsGpuMemory(k));
    const unattributable = rest.filter(k => k.note);
    view.unattributable = unattributable.map(k => `${kernelLabel(k)}: ${k.note}`);
    const quiet = rest.length - unattributable.length;
    if (quiet > 0) {
      const other = holding.length ? ' other' : '';
      view.quiet = quiet === 1 ? `1${other} kernel holds no GPU memory.` : `${quiet}${other} kernels hold no GPU memory.`;
    } else if (!holding.length && !unattributable.length) {
      view.quiet = 'No kernel of this server is running.';
    }
    return view;
  }

  private _draw(view: IView): void {
    const parts: IPart[] = [
      { key: 'header', data: null, draw: drawHeader },
      { key: 'updated', data: view.updated, draw: () => h('div', 'tfgpu-lab-updated', view.updated) }
    ];
    if (view.message) {
      const message = view.message;
      parts.push({ key: 'message', data: message, draw: () => h('div', 'tfgpu-lab-message', message) });
    }
    for (const gpu of view.gpus) {
      parts.push({ key: `gpu-${gpu.index}`, data: gpu, draw: () => drawGpu(gpu) });
    }
    if (view.gpus.some(g => g.segments.length)) {
      parts.push({ key: 'legend', data: view.user, draw: () => drawLegend(view.user) });
    }
    parts.push({ key: 'kernels', data: null, draw: () => this._kernelSection });
    if (view.notes.length) {
      parts.push({ key: 'notes', data: view.notes, draw: () => drawNotes(view.notes) });
    }
    this._parts.sync(this.node, parts);
    this._drawKernels(view);
  }

  /** The kernels' section: a row per kernel holding GPU memory, kept by kernel id. */
  private _drawKernels(view: IView): void {
    const parts: IPart[] = [
      { key: 'heading', data: null, draw: () => h('h3', 'tfgpu-lab-subheading', 'Kernels holding GPU memory') }
    ];
    if (view.kernels.length) {
      parts.push({ key: 'list', data: null, draw: () => this._kernelList });
    }
    if (view.quiet) {
      const quiet = view.quiet;
      parts.push({ key: 'quiet', data: quiet, draw: () => h('p', 'tfgpu-lab-quiet', quiet) });
    }
    view.unattributable.forEach((line, i) => {
      parts.push({ key: `unattributable-${i}`, data: line, draw: () => h('p', 'tfgpu-lab-quiet tfgpu-lab-unattributable', line) });
    });
    this._sectionParts.sync(this._kernelSection, parts);
    this._rows.sync(
      this._kernelList,
      view.kernels.map(row => {
        // What ticks (the idle time) or follows the focus (current) is set in place, not redrawn.
        const { activity, title, current, ...drawn } = row;
        return { key: row.id, data: drawn, draw: () => drawKernel(row), refresh: node => refreshKernel(node, row) };
      })
    );
  }

  // -- actions (one listener: rows are redrawn, the panel's node stays) ----------------------
  private _onClick = (event: MouseEvent): void => {
    const button = (event.target as HTMLElement).closest<HTMLButtonElement>('button[data-action]');
    if (!button || button.disabled) {
      return;
    }
    const row = button.closest<HTMLElement>('[data-kernel-id]');
    const action = button.dataset.action;
    if (action === 'refresh') {
      void this._options.poller.refresh();
    } else if (action === 'open' && row?.dataset.path) {
      void this._options.commands.execute('docmanager:open', { path: row.dataset.path });
    } else if (action === 'shutdown' && row?.dataset.kernelId) {
      void this._shutdown(row.dataset.kernelId, button);
    }
  };

  private async _shutdown(id: string, button: HTMLButtonElement): Promise<void> {
    const reading = this._options.poller.reading;
    const kernel = reading?.ok ? reading.reply.kernels.find(k => k.id === id) : undefined;
    const name = kernel ? kernelLabel(kernel) : `kernel ${id.slice(0, 8)}`;
    const held = kernel ? formatPerGpu(kernel) : '';
    const body =
      `Shut down the kernel of ${name}${held ? `, which holds ${held}` : ''}? ` +
      'Its variables are lost, and the GPU memory it holds is freed.';
    const result = await showDialog({
      title: 'Shut down kernel?',
      body,
      buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Shut Down' })]
    });
    if (!result.button.accept) {
      return;
    }
    button.disabled = true;
    try {
      await this._options.shutdownKernel(id);
    } catch (err) {
      button.disabled = false;
      await showDialog({
        title: 'The kernel was not shut down',
        body: String(err),
        buttons: [Dialog.okButton()]
      });
      return;
    }
    // The server may answer from its cache for up to one interval: keep the kernel out of the
    // list until a reply taken after the shutdown no longer has it.
    this._gone.set(id, Date.now() / 1000);
    this.update();
    await this._options.poller.refresh();
  }

  private _forgetGone(reply: IStatusReply): void {
    for (const [id, since] of this._gone) {
      if (reply.generated_at !== null && reply.generated_at > since && !reply.kernels.some(k => k.id === id)) {
        this._gone.delete(id);
      }
    }
  }

  private _options: IGpuPanelOptions;
  private _parts = new KeptNodes();
  private _kernelSection = h('div', 'tfgpu-lab-kernels');
  private _sectionParts = new KeptNodes();
  private _kernelList = h('ul', 'tfgpu-lab-kernel-list');
  private _rows = new KeptNodes();
  private _gone = new Map<string, number>(); // kernel id -> when it was shut down (unix s)
}

// -- view model ------------------------------------------------------------------------------
function gpuView(gpu: IGpu, reply: IStatusReply): IGpuView {
  const view: IGpuView = {
    index: gpu.index,
    name: gpu.name,
    usage: '',
    segments: [],
    message: null,
    notes: gpu.notes ?? [],
    mig: gpu.mig_instances ? gpu.mig_instances.map(m => migRow(gpu.index, m, reply)) : null,
    share: gpu.share ? `share ${formatBytes(gpu.share.bytes)}, ${gpu.share.label}` : null,
    shareTitle: gpu.share ? `set by ${gpu.share.source}: ${gpu.share.evidence}\nenforced by ${gpu.share.enforced_by}` : ''
  };
  if (gpu.lost) {
    view.message = 'This GPU stopped answering (lost): no readings until it does.';
    return view;
  }
  const total = gpu.memory_total_bytes;
  view.usage =
    gpu.memory_used_bytes !== null && total !== null
      ? `${formatBytes(gpu.memory_used_bytes)} of ${formatBytes(total)} used`
      : `${formatBytes(gpu.memory_used_bytes)} used`;
  if (gpu.utilization_percent !== null) {
    view.usage += ` · ${gpu.utilization_percent}%\u00a0busy`;
  }
  const split = gpu.split;
  if (!split) {
    view.message = 'No breakdown of this GPU’s memory.';
    return view;
  }
  const whole = total ?? PARTS.reduce((sum, p) => sum + (split[p.key] ?? 0), 0);
  if (!whole) {
    return view;
  }
  for (const { part, key, label } of PARTS) {
    const bytes = split[key];
    if (!bytes || bytes <= 0) {
      continue;
    }
    const listed = processesOf(part, gpu.index, reply);
    view.segments.push({
      part,
      percent: Math.min((bytes / whole) * 100, 100),
      title: [`${label}: ${formatBytes(bytes)}`, ...listed].join('\n')
    });
  }
  return view;
}

function migRow(index: number, instance: IMigInstance, reply: IStatusReply): IMigRow {
  if (instance.mig_index === null) {
    const why = instance.notes.join('; ') || 'NVML did not list them';
    return { label: `MIG ${index}:?`, usage: 'instances unknown', percent: null, who: '', title: why };
  }
  const ids = `${instance.gpu_instance_id ?? '?'}/${instance.compute_instance_id ?? '?'}`;
  const used = instance.memory_used_bytes;
  const total = instance.memory_total_bytes;
  const kernels = (instance.kernel_ids ?? []).map(id => {
    const kernel = reply.kernels.find(k => k.id === id);
    return kernel ? kernelLabel(kernel) : `kernel ${id.slice(0, 8)}`;
  });
  const count = instance.process_count;
  const processes = count === null ? 'processes: n/a' : count === 1 ? '1 process' : `${count} processes`;
  const who = [processes, ...kernels].join(' · ');
  return {
    label: `MIG ${index}:${instance.mig_index}  instance ${ids}`,
    usage: total !== null ? `${formatBytes(used)} of ${formatBytes(total)} used` : `${formatBytes(used)} used`,
    percent: used !== null && total ? Math.min((used / total) * 100, 100) : null,
    who,
    title: [instance.uuid ?? 'UUID n/a', ...instance.notes].join('\n')
  };
}

function processesOf(part: Part, index: number, reply: IStatusReply): string[] {
  let lines: string[] = [];
  if (part === 'kernels') {
    lines = reply.kernels
      .filter(k => perGpu(k).some(([gpu]) => gpu === index))
      .map(k => `  ${kernelLabel(k)}: ${formatBytes(k.gpu_memory_bytes[String(index)])}`);
  } else if (part === 'my_other' || part === 'others' || part === 'unattributed') {
    const source: IProcess[] =
      part === 'my_other' ? reply.my_other_processes : part === 'others' ? reply.other_users : reply.unattributed;
    lines = (source ?? [])
      .filter(p => p.gpu === index)
      .map(p => {
        const who = p.user ? `${p.user} ` : '';
        const what = p.command || p.note || '';
        return `  ${who}pid ${p.pid}: ${formatBytes(p.used_memory_bytes)}${what ? ` (${what})` : ''}`;
      });
  }
  if (lines.length > MAX_LISTED) {
    lines = [...lines.slice(0, MAX_LISTED), `  … and ${lines.length - MAX_LISTED} more`];
  }
  return lines;
}

function kernelRow(kernel: IKernel, generatedAt: number, current: boolean): IKernelRow {
  const notebook = kernel.session_type === 'notebook' || Boolean(kernel.path?.endsWith('.ipynb'));
  const activity = formatActivity(kernel, generatedAt);
  return {
    id: kernel.id,
    name: kernelLabel(kernel),
    path: kernel.path,
    openable: notebook && Boolean(kernel.path),
    memory: gpuFigures(kernel),
    utilization: utilizationFigures(kernel),
    notice: kernel.gpu_idle_notice ?? null,
    activity,
    title: kernelDetails(kernel, activity),
    current
  };
}

// -- DOM -------------------------------------------------------------------------------------
/** A part of the panel: drawn by `draw`, again only when `data` changes; `refresh` sets the rest in place. */
interface IPart {
  key: string;
  data: unknown;
  draw: () => HTMLElement;
  refresh?: (node: HTMLElement) => void;
}

/** The nodes drawn for a parent's parts, kept (not redrawn, not moved) while their data is unchanged. */
class KeptNodes {
  sync(parent: HTMLElement, parts: IPart[]): void {
    const drawn = new Map<string, { signature: string; node: HTMLElement }>();
    const nodes = parts.map(({ key, data, draw, refresh }) => {
      const signature = JSON.stringify(data);
      const old = this._drawn.get(key);
      const node = old && old.signature === signature ? old.node : draw();
      refresh?.(node);
      drawn.set(key, { signature, node });
      return node;
    });
    this._drawn = drawn;
    nodes.forEach((node, i) => {
      const there = parent.children[i] ?? null;
      if (there !== node) {
        parent.insertBefore(node, there);
      }
    });
    while (parent.children.length > nodes.length) {
      parent.lastElementChild!.remove();
    }
  }

  private _drawn = new Map<string, { signature: string; node: HTMLElement }>();
}

function drawHeader(): HTMLElement {
  const header = h('div', 'tfgpu-lab-header');
  const refresh = h('button', 'tfgpu-lab-icon-button tfgpu-lab-refresh');
  refresh.title = 'Read again now';
  refresh.dataset.action = 'refresh';
  refresh.append(refreshIcon.element({ tag: 'span' }));
  header.append(h('h2', 'tfgpu-lab-heading', 'GPU memory'), refresh);
  return header;
}

function drawNotes(lines: string[]): HTMLElement {
  const notes = h('ul', 'tfgpu-lab-notes');
  notes.append(...lines.map(n => h('li', null, n)));
  return notes;
}

function h<K extends keyof HTMLElementTagNameMap>(tag: K, className: string | null, text?: string): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (className) {
    node.className = className;
  }
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

function drawGpu(gpu: IGpuView): HTMLElement {
  const card = h('div', 'tfgpu-lab-gpu');
  card.dataset.index = String(gpu.index);
  const head = h('div', 'tfgpu-lab-gpu-head');
  head.append(h('span', 'tfgpu-lab-gpu-title', `GPU ${gpu.index}`));
  if (gpu.name) {
    head.append(h('span', 'tfgpu-lab-gpu-name', gpu.name));
  }
  card.append(head, h('div', 'tfgpu-lab-gpu-usage', gpu.usage));
  if (gpu.share) {
    const share = h('div', 'tfgpu-lab-gpu-share', gpu.share);
    share.title = gpu.shareTitle;
    card.append(share);
  }
  if (gpu.message) {
    card.append(h('div', 'tfgpu-lab-gpu-message', gpu.message));
  }
  if (gpu.segments.length) {
    const bar = h('div', 'tfgpu-lab-bar');
    for (const segment of gpu.segments) {
      const piece = h('span', `tfgpu-lab-segment tfgpu-lab-${segment.part}`);
      piece.dataset.part = segment.part;
      piece.style.width = `${segment.percent.toFixed(3)}%`;
      piece.title = segment.title;
      bar.append(piece);
    }
    card.append(bar);
  }
  for (const note of gpu.notes) {
    card.append(h('div', 'tfgpu-lab-gpu-note', note));
  }
  if (gpu.mig) {
    card.append(drawMig(gpu.mig));
  }
  return card;
}

function drawMig(rows: IMigRow[]): HTMLElement {
  const list = h('ul', 'tfgpu-lab-mig');
  if (!rows.length) {
    list.append(h('li', 'tfgpu-lab-mig-row tfgpu-lab-quiet', 'MIG mode: no instance created'));
  }
  for (const row of rows) {
    const item = h('li', 'tfgpu-lab-mig-row');
    item.title = row.title;
    const head = h('div', 'tfgpu-lab-mig-head');
    head.append(h('span', 'tfgpu-lab-mig-label', row.label), h('span', 'tfgpu-lab-mig-usage', row.usage));
    item.append(head);
    if (row.percent !== null) {
      const bar = h('div', 'tfgpu-lab-mig-bar');
      const used = h('span', 'tfgpu-lab-mig-used');
      used.style.width = `${row.percent.toFixed(3)}%`;
      bar.append(used);
      item.append(bar);
    }
    if (row.who) {
      item.append(h('div', 'tfgpu-lab-mig-who', row.who));
    }
    list.append(item);
  }
  return list;
}

function drawLegend(user: string | null): HTMLElement {
  const legend = h('div', 'tfgpu-lab-legend');
  for (const { part, label } of PARTS) {
    const item = h('span', 'tfgpu-lab-legend-item');
    item.append(h('span', `tfgpu-lab-swatch tfgpu-lab-${part}`));
    item.append(document.createTextNode(part === 'my_other' && user ? `${label} (${user})` : label));
    legend.append(item);
  }
  return legend;
}

function drawKernel(row: IKernelRow): HTMLElement {
  const item = h('li', 'tfgpu-lab-kernel');
  item.dataset.kernelId = row.id;
  if (row.path) {
    item.dataset.path = row.path;
  }
  const top = h('div', 'tfgpu-lab-kernel-top');
  const memory = h('span', 'tfgpu-lab-kernel-memory');
  memory.append(...row.memory.map(text => h('span', 'tfgpu-lab-kernel-gpu', text)));
  top.append(h('span', 'tfgpu-lab-kernel-name', row.name), memory);
  const bottom = h('div', 'tfgpu-lab-kernel-bottom');
  const use = row.utilization.length ? `utilization ${row.utilization.join(' · ')}` : '';
  bottom.append(h('span', 'tfgpu-lab-kernel-activity'), h('span', 'tfgpu-lab-kernel-utilization', use));
  const actions = h('span', 'tfgpu-lab-kernel-actions');
  const open = h('button', 'tfgpu-lab-button', 'Open');
  open.dataset.action = 'open';
  open.disabled = !row.openable;
  open.title = row.openable ? `Open ${row.path}` : 'Not a notebook of this server';
  const shutdown = h('button', 'tfgpu-lab-button tfgpu-lab-warn', 'Shut down kernel');
  shutdown.dataset.action = 'shutdown';
  shutdown.title = 'Shut this kernel down (asks first); its GPU memory goes back';
  actions.append(open, shutdown);
  bottom.append(actions);
  item.append(top, bottom);
  if (row.notice) {
    item.append(h('div', 'tfgpu-lab-kernel-idle', row.notice));
  }
  return item;
}

function refreshKernel(item: HTMLElement, row: IKernelRow): void {
  item.classList.toggle('tfgpu-lab-current', row.current);
  item.title = row.title;
  const activity = item.querySelector('.tfgpu-lab-kernel-activity');
  if (activity && activity.textContent !== row.activity) {
    activity.textContent = row.activity;
  }
}

function plural(n: number, noun: string): string {
  return n === 1 ? `1 ${noun}` : `${n} ${noun}s`;
}

function clock(unixSeconds: number): string {
  return new Date(unixSeconds * 1000).toLocaleTimeString();
}
