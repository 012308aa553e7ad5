// Words and figures shown by the status bar and the panel, in one place so both say the same.

import { IKernel, IStatusReply, Reading } from './api';

const MIB = 2 ** 20;
const GIB = 2 ** 30;

/** "512 MiB" below a GiB, "6.1 GiB" from there; "n/a" for a missing reading (never "0"). */
export function formatBytes(bytes: number | null | undefined): string {
  if (bytes === null || bytes === undefined || !Number.isFinite(bytes)) {
    return 'n/a';
  }
  const mib = bytes / MIB;
  if (bytes > 0 && mib < 0.5) {
    return '<1 MiB'; // something is held: "0 MiB" would say nothing is
  }
  if (Math.round(mib) < 1024) {
    return `${Math.round(mib)} MiB`;
  }
  return `${(bytes / GIB).toFixed(1)} GiB`;
}

/** The GPUs a kernel holds memory on, lowest index first: [[1, bytes], ...]; bytes null: unknown. */
export function perGpu(kernel: IKernel): Array<[number, number | null]> {
  return Object.entries(kernel.gpu_memory_bytes ?? {})
    .map(([index, bytes]): [number, number | null] => [Number(index), bytes])
    .filter(([index, bytes]) => Number.isFinite(index) && (bytes === null || bytes > 0))
    .sort((a, b) => a[0] - b[0]);
}

/** True when the kernel holds memory on some GPU, even an amount NVML cannot tell. */
export function holdsGpuMemory(kernel: IKernel): boolean {
  return perGpu(kernel).length > 0;
}

/** ["GPU 0: 1.0 GiB", "GPU 1: 2.0 GiB"]: one figure per GPU the kernel holds memory on. */
export function gpuFigures(kernel: IKernel): string[] {
  return perGpu(kernel).map(([index, bytes]) => `GPU ${index}: ${formatBytes(bytes)}`);
}

/** "GPU 1: 6.1 GiB", or "GPU 0: 1.0 GiB · GPU 1: 2.0 GiB"; "" when it holds none. */
export function formatPerGpu(kernel: IKernel): string {
  return gpuFigures(kernel).join(' · ');
}

/**
 * ["GPU 1: 0%", "GPU 3: 12% per device"]: the kernel's utilization of each GPU it holds memory on
 * (the driver's figures; "per device" where the driver gives none per process, e.g. MIG); "n/a"
 * where it could not be read.  [] from a server that does not send it.
 */
export function utilizationFigures(kernel: IKernel): string[] {
  return Object.entries(kernel.gpu_utilization ?? {})
    .map(([index, figure]): [number, string] => {
      const percent = figure.percent === null ? 'n/a' : `${Math.round(figure.percent)}%`;
      return [Number(index), `GPU ${index}: ${percent}${figure.scope === 'device' ? ' per device' : ''}`];
    })
    .sort((a, b) => a[0] - b[0])
    .map(([, text]) => text);
}

/** Why a utilization figure is per device or missing, one line each (the tooltip's). */
export function utilizationNotes(kernel: IKernel): string[] {
  return Object.entries(kernel.gpu_utilization ?? {})
    .filter(([, figure]) => figure.note)
    .map(([index, figure]) => `GPU ${index} utilization: ${figure.note}`);
}

/** Bytes a kernel holds over all GPUs, for sorting: the server's total, else what is known. */
export function kernelTotal(kernel: IKernel): number {
  return kernel.total_gpu_memory_bytes ?? perGpu(kernel).reduce((sum, [, bytes]) => sum + (bytes ?? 0), 0);
}

/** A kernel's name for people: the notebook's file name, else its session's, else its id. */
export function kernelLabel(kernel: IKernel): string {
  if (kernel.path) {
    return kernel.path.split('/').pop() || kernel.path;
  }
  return kernel.session_name || `kernel ${kernel.id.slice(0, 8)}`;
}

/** A kernel row's tooltip: what it is, its spec and activity, its pid, why it is not attributed. */
export function kernelDetails(kernel: IKernel, activity: string): string {
  // The kernel spec's name only when the server knows it: never "kernel null".
  const spec = kernel.name ? `kernel ${kernel.name}, ` : '';
  const details = [kernel.path ?? kernel.session_name ?? kernel.id, `${spec}${activity}`];
  if (kernel.pid !== null) {
    details.push(`pid ${kernel.pid}`);
  }
  if (kernel.note) {
    details.push(kernel.note);
  }
  details.push(...utilizationNotes(kernel));
  return details.join('\n');
}

/**
 * "idle 12 min", "busy", "starting": the state, and for an idle kernel how long since its
 * last activity, measured on the server's clock (the reply's time), so a browser whose clock
 * is off still shows the right figure.
 */
export function formatActivity(kernel: IKernel, generatedAt: number): string {
  const state = kernel.execution_state || 'unknown';
  if (state !== 'idle') {
    return state;
  }
  const last = kernel.last_activity ? Date.parse(kernel.last_activity) / 1000 : NaN;
  const seconds = generatedAt - last;
  const idle = Number.isFinite(seconds) ? `idle ${formatDuration(seconds)}` : 'idle';
  return idle + formatCulling(kernel, generatedAt);
}

/**
 * " · culled in 40 min if idle", " · culling due": what the server's GPU idle culler will do to
 * this kernel (from the reply's cull_due_at, on the server's clock); "" when it will not.
 */
export function formatCulling(kernel: IKernel, generatedAt: number): string {
  const due = kernel.cull_due_at ? Date.parse(kernel.cull_due_at) / 1000 : NaN;
  const left = due - generatedAt; // NaN when either time is unknown (a reply without its time)
  if (!Number.isFinite(left)) {
    return '';
  }
  return left > 0 ? ` · culled in ${formatDuration(left)} if idle` : ' · culling due';
}

export function formatDuration(seconds: number): string {
  const minutes = Math.floor(Math.max(seconds, 0) / 60);
  if (minutes < 1) {
    return '<1 min';
  }
  if (minutes < 60) {
    return `${minutes} min`;
  }
  const hours = Math.floor(minutes / 60);
  if (hours < 24) {
    return minutes % 60 ? `${hours} h ${minutes % 60} min` : `${hours} h`;
  }
  const days = Math.floor(hours / 24);
  return hours % 24 ? `${days} d ${hours % 24} h` : `${days} d`;
}

/** What the status bar says for one kernel: its text, and the reason or detail on hover. */
export interface IStatusText {
  text: string;
  title: string;
  idle?: boolean; // it holds memory at 0% past the server's thresholds (gpu_idle_notice)
}

const CLICK = 'Click for the GPU panel.';

export function statusText(reading: Reading | null, kernelId: string | null): IStatusText {
  if (reading === null) {
    return { text: 'GPU …', title: `Reading GPU memory… ${CLICK}` };
  }
  if (!reading.ok) {
    return { text: 'GPU n/a', title: `${reading.error} ${CLICK}` };
  }
  const reply: IStatusReply = reading.reply;
  if (!reply.driver.available) {
    const reason = reply.driver.reason ?? 'the NVIDIA driver cannot be reached';
    return { text: 'GPU n/a', title: `No GPU readings: ${reason}\n${CLICK}` };
  }
  if (kernelId === null) {
    return { text: 'GPU n/a', title: `This notebook has no running kernel. ${CLICK}` };
  }
  const kernel = reply.kernels.find(k => k.id === kernelId);
  if (!kernel) {
    return { text: 'GPU n/a', title: `This notebook's kernel is not among the server's kernels yet. ${CLICK}` };
  }
  const held = formatPerGpu(kernel);
  if (!held) {
    if (kernel.note) {
      return { text: 'GPU n/a', title: `${kernel.note} ${CLICK}` };
    }
    return { text: 'no GPU memory', title: `This notebook's kernel holds no GPU memory. ${CLICK}` };
  }
  const notes = [kernel.note];
  if (perGpu(kernel).some(([, bytes]) => bytes === null)) {
    notes.push('n/a: NVML lists its processes there but not how much memory they hold');
  }
  const note = notes.filter(Boolean).length ? ` (${notes.filter(Boolean).join('; ')})` : '';
  const title = `${kernelLabel(kernel)}: its kernel holds ${held}${note}. ${CLICK}`;
  if (kernel.gpu_idle_notice) {
    // Memory nobody uses: said in the item itself, the whole line on hover.
    return { text: `${held} · unused`, title: `${kernel.gpu_idle_notice}.\n${title}`, idle: true };
  }
  return { text: held, title };
}
