// tfgpu_magic's JupyterLab 4 / Notebook 7 extension.
//
// - `tfgpu-magic:plugin`: the GPU side panel, its command (palette, View menu), and the
//   status-bar item for the notebook in front.  Everything optional is optional: Notebook 7
//   has no status bar and no ILabShell, and the panel still works there.
// - `tfgpu-magic:side-area`: the widget behind `%gpu monitor --sidebar`, registered with
//   ipywidgets' manager when it is there.
// - `tfgpu-magic:notebook-settings`: what `%gpu save` displays is written into the open
//   notebook's metadata (settings.ts), kept at the user's next save; a notebook whose saved
//   settings did not hold as its kernel started says so at once (a notification).
//
// One poller serves the panel and the status bar (see api.ts).

import {
  ILabShell,
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { Dialog, ICommandPalette, Notification, showDialog } from '@jupyterlab/apputils';
import { IMainMenu } from '@jupyterlab/mainmenu';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { IStatusBar } from '@jupyterlab/statusbar';
import { IJupyterWidgetRegistry } from '@jupyter-widgets/base';
import { ISignal, Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import { StatusPoller } from './api';
import { gpuIcon } from './icons';
import { GpuPanel } from './panel';
import { followNotebook, noticeMessage } from './settings';
import { GpuStatusItem } from './statusbar';
import { MODULE_NAME, MODULE_VERSION } from './version';

export const OPEN_COMMAND = 'tfgpu:open-panel';
const PANEL_AREA = 'right';
const PANEL_RANK = 900;

/**
 * The notebook in front and its kernel.  JupyterLab says which main-area widget has focus
 * (ILabShell); Notebook 7 shows one document per page, so its tracker's current notebook is it.
 */
class NotebookFocus {
  constructor(tracker: INotebookTracker | null, labShell: ILabShell | null) {
    this._tracker = tracker;
    this._labShell = labShell;
    tracker?.currentChanged.connect(this._follow);
    labShell?.currentChanged.connect(this._follow);
    this._follow();
  }

  /** Emitted when the notebook in front, or its kernel, changes. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  get notebook(): NotebookPanel | null {
    const tracker = this._tracker;
    if (!tracker) {
      return null;
    }
    if (this._labShell) {
      const current: Widget | null = this._labShell.currentWidget;
      return current && tracker.has(current) ? (current as NotebookPanel) : null;
    }
    return tracker.currentWidget;
  }

  /** The kernel of the notebook in front: its id, null without a kernel, undefined without a notebook. */
  kernelId(): string | null | undefined {
    const notebook = this.notebook;
    if (!notebook) {
      return undefined;
    }
    return notebook.sessionContext.session?.kernel?.id ?? null;
  }

  // Arrow functions: the signals call them unbound.
  private readonly _follow = (): void => {
    const notebook = this.notebook;
    if (notebook !== this._watched) {
      this._watched?.sessionContext.kernelChanged.disconnect(this._emit);
      notebook?.sessionContext.kernelChanged.connect(this._emit);
      this._watched = notebook;
    }
    this._emit();
  };

  private readonly _emit = (): void => {
    this._changed.emit();
  };

  private _tracker: INotebookTracker | null;
  private _labShell: ILabShell | null;
  private _watched: NotebookPanel | null = null;
  private _changed = new Signal<this, void>(this);
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'tfgpu-magic:plugin',
  description: 'GPU memory of this server’s kernels: a side panel and a status-bar item.',
  autoStart: true,
  optional: [INotebookTracker, ILabShell, IStatusBar, ICommandPalette, IMainMenu, ILayoutRestorer],
  activate: (
    app: JupyterFrontEnd,
    tracker: INotebookTracker | null,
    labShell: ILabShell | null,
    statusBar: IStatusBar | null,
    palette: ICommandPalette | null,
    mainMenu: IMainMenu | null,
    restorer: ILayoutRestorer | null
  ): void => {
    const poller = new StatusPoller(app.serviceManager.serverSettings);
    const focus = new NotebookFocus(tracker, labShell);
    const panel = new GpuPanel({
      poller,
      commands: app.commands,
      shutdownKernel: id => app.serviceManager.kernels.shutdown(id),
      currentKernelId: () => focus.kernelId() ?? null
    });
    focus.changed.connect(() => panel.refresh());
    app.shell.add(panel, PANEL_AREA, { rank: PANEL_RANK });
    restorer?.add(panel, panel.id);

    app.commands.addCommand(OPEN_COMMAND, {
      label: 'GPU Memory Panel',
      caption: 'Show which kernels hold GPU memory, and shut them down',
      icon: gpuIcon,
      execute: () => {
        if (!panel.isAttached) {
          app.shell.add(panel, PANEL_AREA, { rank: PANEL_RANK });
        }
        app.shell.activateById(panel.id);
      }
    });
    palette?.addItem({ command: OPEN_COMMAND, category: 'GPU' });
    mainMenu?.viewMenu.addGroup([{ command: OPEN_COMMAND }], 100);

    if (statusBar) {
      const item = new GpuStatusItem({
        poller,
        currentKernelId: () => focus.kernelId(),
        onClick: () => void app.commands.execute(OPEN_COMMAND)
      });
      focus.changed.connect(() => item.update());
      statusBar.registerStatusItem('tfgpu-magic:status', {
        item,
        align: 'left',
        rank: 5,
        isActive: () => item.hasNotebook,
        activeStateChanged: focus.changed
      });
    }
  }
};

const sideArea: JupyterFrontEndPlugin<void> = {
  id: 'tfgpu-magic:side-area',
  description: 'Shows `%gpu monitor --sidebar` in the right side area (JupyterLab and Notebook 7).',
  autoStart: true,
  optional: [IJupyterWidgetRegistry],
  activate: (app: JupyterFrontEnd, registry: IJupyterWidgetRegistry | null): void => {
    if (!registry) {
      return; // no widget manager: no widget can ask for a side area
    }
    registry.registerWidget({
      name: MODULE_NAME,
      version: MODULE_VERSION,
      // Loaded when a kernel first shows such a widget, not with the page.
      exports: async () => (await import('./sidearea')).sideAreaExports(app.shell)
    });
  }
};

const notebookSettings: JupyterFrontEndPlugin<void> = {
  id: 'tfgpu-magic:notebook-settings',
  description:
    'Writes what `%gpu save` displays into the open notebook’s metadata (key `tfgpu`), and warns when saved settings did not hold.',
  autoStart: true,
  requires: [INotebookTracker],
  activate: (_app: JupyterFrontEnd, tracker: INotebookTracker): void => {
    // The kernel's line already names tfgpu_magic; it stays until the user closes it.
    const warn = (line: string): void => {
      const { message, details } = noticeMessage(line);
      const showDetails = (): void =>
        void showDialog({ title: 'GPU settings', body: details ?? '', buttons: [Dialog.okButton()] });
      const actions = details ? [{ label: 'Details', callback: showDetails }] : [];
      Notification.warning(message, { autoClose: false, actions });
    };
    tracker.forEach(panel => followNotebook(panel, warn));
    tracker.widgetAdded.connect((_, panel) => followNotebook(panel, warn));
  }
};

export default [plugin, sideArea, notebookSettings];
