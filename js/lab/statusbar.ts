// The status-bar item: what the kernel of the notebook in front holds on each GPU.
// "GPU 1: 6.1 GiB", "no GPU memory", or "GPU n/a" with the reason on hover; a click opens
// the GPU panel.  It polls (through the shared poller) only while it is on screen.

import { Message } from '@lumino/messaging';

import { StatusPoller } from './api';
import { statusText } from './format';
import { gpuIcon } from './icons';
import { PolledWidget } from './polled';

export interface IGpuStatusOptions {
  poller: StatusPoller;
  /** The kernel of the notebook in front; null when it has none (undefined: no notebook). */
  currentKernelId: () => string | null | undefined;
  /** What a click does: open the GPU panel. */
  onClick: () => void;
}

export class GpuStatusItem extends PolledWidget {
  constructor(options: IGpuStatusOptions) {
    super(options.poller, { node: document.createElement('button') });
    this._options = options;
    this.addClass('tfgpu-lab-status');
    this.addClass('jp-StatusBar-GroupItem');
    this.node.append(gpuIcon.element({ tag: 'span', className: 'tfgpu-lab-status-icon' }));
    this._text = document.createElement('span');
    this._text.className = 'tfgpu-lab-status-text jp-StatusBar-TextItem';
    this.node.append(this._text);
    this.node.addEventListener('click', options.onClick);
  }

  /** True while a notebook is in front: the item shows only then. */
  get hasNotebook(): boolean {
    return this._options.currentKernelId() !== undefined;
  }

  override dispose(): void {
    this.node.removeEventListener('click', this._options.onClick);
    super.dispose();
  }

  protected override onUpdateRequest(msg: Message): void {
    super.onUpdateRequest(msg);
    const kernelId = this._options.currentKernelId() ?? null;
    const { text, title, idle } = statusText(this._options.poller.reading, kernelId);
    this.node.classList.toggle('tfgpu-lab-status-idle', Boolean(idle));
    if (this._text.textContent !== text) {
      this._text.textContent = text;
    }
    this.node.title = title;
    this.node.dataset.kernelId = kernelId ?? '';
  }

  private _options: IGpuStatusOptions;
  private _text: HTMLSpanElement;
}
