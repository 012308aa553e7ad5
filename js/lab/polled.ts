// A widget that keeps the shared poller running only while it is on screen (the GPU panel, the
// status-bar item): it holds the poller from the moment it is attached and visible until it is
// hidden, detached or disposed, and redraws on each reading.

import { IDisposable } from '@lumino/disposable';
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { StatusPoller } from './api';

export abstract class PolledWidget extends Widget {
  constructor(poller: StatusPoller, options?: Widget.IOptions) {
    super(options);
    this.poller = poller;
    poller.changed.connect(this._onReading);
  }

  override dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._release();
    this.poller.changed.disconnect(this._onReading);
    super.dispose();
  }

  /** A new reading arrived. */
  protected onReading(): void {
    this.update();
  }

  /** The widget has just started holding the poller (it came on screen). */
  protected onHold(): void {
    // nothing by default
  }

  protected override onAfterAttach(msg: Message): void {
    super.onAfterAttach(msg);
    this._holdIfVisible();
    this.update();
  }

  protected override onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this._holdIfVisible();
    this.update();
  }

  protected override onAfterHide(msg: Message): void {
    super.onAfterHide(msg);
    this._release();
  }

  protected override onBeforeDetach(msg: Message): void {
    this._release();
    super.onBeforeDetach(msg);
  }

  private _holdIfVisible(): void {
    if (this.isVisible && !this._hold) {
      this._hold = this.poller.hold();
      this.onHold();
    }
  }

  private _release(): void {
    this._hold?.dispose();
    this._hold = null;
  }

  protected readonly poller: StatusPoller;
  // The poller's signal calls it unbound; a subclass overrides onReading.
  private readonly _onReading = (): void => this.onReading();
  private _hold: IDisposable | null = null;
}
