// The one poller that every view of this page shares, and the reply it reads (its types and
// checks are in reply.ts).  Views never fetch on their own: they hold the poller while they
// are shown, so a page with the panel closed and no status bar asks nothing.

import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import { DisposableDelegate, IDisposable } from '@lumino/disposable';
import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import { IStatusReply, parseReply } from './reply';

export const STATUS_PATH = 'tfgpu/api/status';
export { CONTRACT_VERSION } from './reply';
export type { IGpu, IGpuShare, IGpuSplit, IKernel, IMigInstance, IProcess, IStatusReply } from './reply';

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
 *
 * The schedule is `@lumino/polling`'s `Poll` (as jupyter-resource-usage uses): it backs off
 * after failures (a failed reading rejects the poll's factory) and stands by while the page
 * is hidden or no view holds the poller.
 */
export class StatusPoller implements IDisposable {
  constructor(settings: ServerConnection.ISettings = ServerConnection.makeSettings()) {
    this._settings = settings;
    this._poll = new Poll<Reading, Error, 'standby'>({
      auto: false, // started by the first hold
      factory: () => this._tick(),
      frequency: { interval: DEFAULT_INTERVAL_S * 1000, backoff: true, max: MAX_BACKOFF_S * 1000 },
      linger: 0, // a hidden tab stops asking at its next tick, not one later
      name: '@tfgpu-magic/lab:StatusPoller',
      standby: () => (this._holders <= 0 ? true : 'when-hidden')
    });
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
    return this._poll.isDisposed;
  }

  /** Keep polling while the returned handle is not disposed (a shown panel, a visible item). */
  hold(): IDisposable {
    this._holders += 1;
    if (this._holders === 1) {
      // Coming on screen: ask once the last reading is an interval old (at once if it is).
      const last = this._reading?.receivedAt ?? -Infinity;
      const wait = Math.max(Math.min(last + this._interval() - Date.now(), this._interval()), 0);
      void this._poll.schedule({ interval: wait, phase: 'started' });
    }
    return new DisposableDelegate(() => {
      this._holders -= 1;
      if (this._holders === 0) {
        void this._poll.stop();
      }
    });
  }

  /** Ask now, whatever the schedule; calls made while a request runs share it. */
  refresh(): Promise<Reading> {
    return this._request().then(reading => {
      if (this._holders > 0 && !this._poll.isDisposed) {
        // The next poll an interval after this answer (the server's interval, known only now).
        void this._poll.schedule({ interval: this._interval(), phase: 'refreshed' });
      }
      return reading;
    });
  }

  dispose(): void {
    if (this._poll.isDisposed) {
      return;
    }
    this._poll.dispose();
    Signal.clearData(this);
  }

  /** The poll's factory: a failed reading rejects, so that the poll backs off. */
  private async _tick(): Promise<Reading> {
    const reading = await this._request();
    if (!reading.ok) {
      throw new Error(reading.error);
    }
    return reading;
  }

  /** One request at a time: a caller arriving while one runs gets its answer. */
  private _request(): Promise<Reading> {
    if (!this._inFlight) {
      this._inFlight = this._fetch().then(reading => {
        this._inFlight = null;
        this._reading = reading;
        if (reading.ok) {
          const interval = this._interval();
          this._poll.frequency = { ...this._poll.frequency, interval, max: Math.max(interval, MAX_BACKOFF_S * 1000) };
        }
        if (!this._poll.isDisposed) {
          this._changed.emit(reading);
        }
        return reading;
      });
    }
    return this._inFlight;
  }

  /** Milliseconds between polls: the server's interval, within bounds. */
  private _interval(): number {
    const reading = this._reading;
    const asked = (reading?.ok ? reading.reply.refresh_interval_s : null) ?? DEFAULT_INTERVAL_S;
    return Math.min(Math.max(asked, MIN_INTERVAL_S), MAX_INTERVAL_S) * 1000;
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
    const reply = parseReply(body);
    return typeof reply === 'string' ? failed(reply) : { ok: true, reply, receivedAt: Date.now() };
  }

  private _settings: ServerConnection.ISettings;
  private _poll: Poll<Reading, Error, 'standby'>;
  private _reading: Reading | null = null;
  private _changed = new Signal<this, Reading>(this);
  private _holders = 0;
  private _inFlight: Promise<Reading> | null = null;
}
