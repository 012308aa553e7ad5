// The server extension's reply (`GET {base_url}tfgpu/api/status`, version 1) and the one
// poller that every view of this page shares.
//
// The shape is fixed by the contract between the server extension and this front end: bytes
// are integers, a missing reading is null (never a made-up 0), strings from other processes
// are already neutralised by the server.  Views never fetch on their own: they hold the
// poller while they are shown, so a page with the panel closed and no status bar asks nothing.

import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import { DisposableDelegate, IDisposable } from '@lumino/disposable';
import { ISignal, Signal } from '@lumino/signaling';

export const STATUS_PATH = 'tfgpu/api/status';
export const CONTRACT_VERSION = 1;

/** Memory of one GPU split by who holds it (bytes; null where NVML could not say). */
export interface IGpuSplit {
  kernels_bytes: number | null;
  my_other_bytes: number | null;
  others_bytes: number | null;
  unattributed_bytes: number | null;
  free_bytes: number | null;
}

export interface IGpu {
  index: number;
  name: string | null;
  uuid: string | null;
  memory_used_bytes: number | null;
  memory_total_bytes: number | null;
  utilization_percent: number | null;
  lost: boolean;
  notes: string[];
  split: IGpuSplit | null;
}

export interface IKernel {
  id: string;
  name: string;
  path: string | null;
  session_name: string | null;
  session_type: string | null;
  execution_state: string | null;
  last_activity: string | null; // ISO 8601, the server's clock
  pid: number | null;
  child_pids: number[];
  // nvidia-smi index (as a string) -> bytes, only GPUs it holds memory on; null where NVML lists
  // its processes there but cannot say how much they hold.
  gpu_memory_bytes: Record<string, number | null>;
  total_gpu_memory_bytes: number | null;
  note: string | null; // why it cannot be attributed, when it cannot
}

export interface IProcess {
  gpu: number;
  pid: number;
  used_memory_bytes: number | null;
  command?: string | null;
  user?: string | null;
  note?: string | null;
}

export interface IStatusReply {
  version: number;
  generated_at: number; // unix seconds, the server's clock
  refresh_interval_s: number;
  driver: { available: boolean; reason: string | null };
  user: string | null;
  gpus: IGpu[];
  kernels: IKernel[];
  my_other_processes: IProcess[];
  other_users: IProcess[];
  unattributed: IProcess[];
  notes: string[];
}

/** What the last poll gave: a reply, or one line saying why there is none. */
export type Reading =
  | { ok: true; reply: IStatusReply; receivedAt: number }
  | { ok: false; error: string; receivedAt: number };

const DEFAULT_INTERVAL_S = 2;
const MIN_INTERVAL_S = 0.5; // whatever the server says, a page never polls faster
const MAX_INTERVAL_S = 60;
const MAX_BACKOFF_S = 60; // a server that fails is asked less and less often, up to this

/**
 * Polls the status endpoint every `refresh_interval_s` (the server's setting) while at least
 * one view holds it and the page is visible.  A hidden browser tab, or a page where nothing
 * that shows GPU memory is on screen, costs the server nothing.
 */
export class StatusPoller implements IDisposable {
  constructor(settings: ServerConnection.ISettings = ServerConnection.makeSettings()) {
    this._settings = settings;
    document.addEventListener('visibilitychange', this._onVisibility);
  }

  /** The latest reading, or null before the first answer. */
  get reading(): Reading | null {
    return this._reading;
  }

  /** Emitted with every new reading (replies and failures alike). */
  get changed(): ISignal<this, Reading> {
    return this._changed;
  }

  get isDisposed(): boolean {
    return this._disposed;
  }

  /** Keep polling while the returned handle is not disposed (a shown panel, a visible item). */
  hold(): IDisposable {
    this._holders += 1;
    this._schedule();
    return new DisposableDelegate(() => {
      this._holders -= 1;
      this._schedule();
    });
  }

  /** Ask now, whatever the schedule; calls made while a request runs share it. */
  refresh(): Promise<Reading> {
    if (!this._inFlight) {
      this._inFlight = this._fetch().then(reading => {
        this._inFlight = null;
        this._failures = reading.ok ? 0 : this._failures + 1;
        this._reading = reading;
        if (!this._disposed) {
          this._changed.emit(reading);
          this._schedule();
        }
        return reading;
      });
    }
    return this._inFlight;
  }

  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    window.clearTimeout(this._timer);
    document.removeEventListener('visibilitychange', this._onVisibility);
    Signal.clearData(this);
  }

  private _onVisibility = (): void => this._schedule();

  /** Seconds between polls: the server's interval, longer after failures. */
  private _interval(): number {
    const reading = this._reading;
    const asked = reading?.ok ? reading.reply.refresh_interval_s : DEFAULT_INTERVAL_S;
    const base = Number.isFinite(asked) ? Math.min(Math.max(asked, MIN_INTERVAL_S), MAX_INTERVAL_S) : DEFAULT_INTERVAL_S;
    return this._failures ? Math.min(base * 2 ** this._failures, MAX_BACKOFF_S) : base;
  }

  private _schedule(): void {
    window.clearTimeout(this._timer);
    this._timer = undefined;
    if (this._disposed || this._holders <= 0 || document.hidden || this._inFlight) {
      return;
    }
    const last = this._reading?.receivedAt ?? -Infinity;
    const wait = Math.max(last + this._interval() * 1000 - Date.now(), 0);
    this._timer = window.setTimeout(() => void this.refresh(), wait);
  }

  private async _fetch(): Promise<Reading> {
    const url = URLExt.join(this._settings.baseUrl, STATUS_PATH);
    const failed = (error: string): Reading => ({ ok: false, error, receivedAt: Date.now() });
    let response: Response;
    try {
      response = await ServerConnection.makeRequest(url, { method: 'GET' }, this._settings);
    } catch (err) {
      return failed(`The Jupyter server did not answer (${String(err)}).`);
    }
    if (response.status === 404) {
      return failed(
        'The tfgpu_magic server extension is not enabled on this Jupyter server (no tfgpu/api/status): ' +
          'install tfgpu_magic in the environment that runs the server, then restart it.'
      );
    }
    if (!response.ok) {
      return failed(`The GPU status request failed: HTTP ${response.status} ${response.statusText}.`);
    }
    let body: unknown;
    try {
      body = await response.json();
    } catch (err) {
      return failed(`The GPU status reply is not JSON (${String(err)}).`);
    }
    const reply = body as Partial<IStatusReply> | null;
    if (!reply || reply.version !== CONTRACT_VERSION || !Array.isArray(reply.gpus) || !Array.isArray(reply.kernels)) {
      return failed(
        `The GPU status reply has version ${String(reply?.version)}, this page understands ${CONTRACT_VERSION}: ` +
          'the server extension and the JupyterLab extension come from different tfgpu_magic versions.'
      );
    }
    return { ok: true, reply: reply as IStatusReply, receivedAt: Date.now() };
  }

  private _settings: ServerConnection.ISettings;
  private _reading: Reading | null = null;
  private _changed = new Signal<this, Reading>(this);
  private _holders = 0;
  private _failures = 0;
  private _timer: number | undefined = undefined;
  private _inFlight: Promise<Reading> | null = null;
  private _disposed = false;
}
