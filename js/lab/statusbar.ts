// The status-bar item: what the kernel of the notebook in front holds on each GPU.
// "GPU 1: 6.1 GiB", "no GPU memory", or "GPU n/a" with the reason on hover; a click opens
// the GPU panel.  It polls (through the shared poller) only while it is on screen.

import { IDisposable } from '@lumino/disposable';
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { StatusPoller } from './api';
import { statusText } from './format';
import { gpuIcon } from './icons';

export interface IGpuStatusOptions {
  poller: StatusPoller;
  /** The kernel of the notebook in front; null when it has none (undefined: no notebook). */
  currentKernelId: () => string | null | undefined;
  /** What a click does: open the GPU panel. */
  onClick: () => void;
}

export class GpuStatusItem extends Widget {
  constructor(options: IGpuStatusOptions) {
    super({ node: document.createElement('button') });
    this._options = options;
    this.addClass('tfgpu-lab-status');
    this.addClass('jp-StatusBar-GroupItem');
    this.node.append(gpuIcon.element({ tag: 'span', className: 'tfgpu-lab-status-icon' }));
    this._text = document.createElement('span');
    this._text.className = 'tfgpu-lab-status-text jp-StatusBar-TextItem';
    this.node.append(this._text);
    this.node.addEventListener('click', options.onClick);
    options.poller.changed.connect(this._onReading, this);
  }

  /** True while a notebook is in front: the item shows only then. */
  get hasNotebook(): boolean {
    return this._options.currentKernelId() !== undefined;
  }

  override dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._release();
    this._options.poller.changed.disconnect(this._onReading, this);
    this.node.removeEventListener('click', this._options.onClick);
    super.dispose();
  }

  protected override onAfterAttach(msg: Message): void {
    super.onAfterAttach(msg);
    this._holdIfVisible();
    this.update();
  }

  protected override onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this._holdIfVisible();
  }

  protected override onAfterHide(msg: Message): void {
    super.onAfterHide(msg);
    this._release();
  }

  protected override onBeforeDetach(msg: Message): void {
    this._release();
    super.onBeforeDetach(msg);
  }

  protected override onUpdateRequest(msg: Message): void {
    super.onUpdateRequest(msg);
    const kernelId = this._options.currentKernelId() ?? null;
    const { text, title } = statusText(this._options.poller.reading, kernelId);
    if (this._text.textContent !== text) {
      this._text.textContent = text;
    }
    this.node.title = title;
    this.node.dataset.kernelId = kernelId ?? '';
  }

  private _onReading(): void {
    this.update();
  }

  private _holdIfVisible(): void {
    if (this.isVisible && !this._hold) {
      this._hold = this._options.poller.hold();
    }
  }

  private _release(): void {
    this._hold?.dispose();
    this._hold = null;
  }

  private _options: IGpuStatusOptions;
  private _text: HTMLSpanElement;
  private _hold: IDisposable | null = null;
}
