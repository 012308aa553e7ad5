// `%gpu monitor --sidebar`: a widget whose view puts its child (the memory panel) into the
// app's right side area, in JupyterLab and in Notebook 7 alike (sidecar needs JupyterLab's
// own shell, and shows nothing in Notebook 7).
//
// The side widget belongs to the model, not to a view: a notebook shows a cell's output
// again (re-rendered, scrolled back into view, opened twice) without opening a second side
// tab, and the side tab stays when the cell's output scrolls away.  Closing the model (the
// kernel closes the panel, `%gpu monitor off`, the notebook is closed) disposes it.
//
// This module is loaded only when the widget manager is there (see index.ts), so the
// extension works without ipywidgets' front end.

import { DOMWidgetModel, DOMWidgetView, ExportMap, ISerializers, unpack_models, WidgetModel } from '@jupyter-widgets/base';
import { JupyterFrontEnd } from '@jupyterlab/application';
import type { Kernel } from '@jupyterlab/services';
import type { ObjectHash } from 'backbone';
import { Panel } from '@lumino/widgets';

import { gpuIcon } from './icons';
import { MODULE_NAME, MODULE_VERSION } from './version';

const AREA = 'right';
const RANK = 1000; // below JupyterLab's own right-side panels (property inspector, debugger)

/** The side tab: holds the child's view; disposing it removes that view. */
class SideWidget extends Panel {
  constructor(id: string, title: string) {
    super();
    this.id = id;
    this.addClass('tfgpu-lab-side-area');
    this.title.icon = gpuIcon;
    this.title.label = title;
    this.title.caption = `${title} (%gpu monitor)`;
    this.title.closable = true;
  }
}

/**
 * The kernel connection a widget manager talks through.  ipywidgets' JupyterLab managers all
 * have a `kernel` property (the notebook's session kernel, or the one they were made for), but
 * the base interface does not declare it.
 */
function kernelOf(manager: unknown): Kernel.IKernelConnection | null {
  const kernel = (manager as { kernel?: Kernel.IKernelConnection | null } | null)?.kernel;
  return kernel && typeof kernel.disposed?.connect === 'function' ? kernel : null;
}

/** The model and view classes, bound to this app's shell. */
export function sideAreaExports(shell: JupyterFrontEnd.IShell): ExportMap {
  class SideAreaModel extends DOMWidgetModel {
    static override serializers: ISerializers = {
      ...DOMWidgetModel.serializers,
      child: { deserialize: unpack_models }
    };

    override defaults(): ObjectHash {
      return {
        ...super.defaults(),
        _model_name: 'SideAreaModel',
        _model_module: MODULE_NAME,
        _model_module_version: MODULE_VERSION,
        _view_name: 'SideAreaView',
        _view_module: MODULE_NAME,
        _view_module_version: MODULE_VERSION,
        child: null,
        title: 'GPU memory'
      };
    }

    override initialize(attributes: ObjectHash, options: Parameters<DOMWidgetModel['initialize']>[1]): void {
      super.initialize(attributes, options);
      this.on('destroy', () => {
        this.destroyed = true;
        void this.side?.then(side => side?.dispose());
      });
    }

    /** Open the side tab (once per model) and bring it to the front. */
    show(): Promise<SideWidget | null> {
      if (!this.side) {
        this.side = this.openSide();
      }
      return this.side.then(side => {
        if (side && !side.isDisposed) {
          shell.activateById(side.id);
        }
        return side;
      });
    }

    private async openSide(): Promise<SideWidget | null> {
      const child = this.get('child') as WidgetModel | null;
      if (!child) {
        return null;
      }
      const view = await this.widget_manager.create_view<DOMWidgetView>(child, {});
      const side = new SideWidget(`tfgpu-monitor-${this.model_id}`, String(this.get('title') || 'GPU memory'));
      side.addWidget(view.luminoWidget);
      if (this.destroyed) {
        side.dispose(); // closed while the view was being made
        return null;
      }
      // Closed by the user (the tab's close button): a later "show it" opens it again.
      side.disposed.connect(() => {
        this.side = undefined;
      });
      // The notebook closed (its kernel connection goes, and with it every comm: the chart would
      // stay on screen, frozen) or the kernel died: the side tab goes too.  A restart needs no
      // watching: the widget manager closes every model then.
      const kernel = kernelOf(this.widget_manager);
      if (kernel) {
        const onStatus = (_: unknown, status: Kernel.Status): void => {
          if (status === 'dead') {
            side.dispose();
          }
        };
        const onDisposed = (): void => side.dispose();
        kernel.disposed.connect(onDisposed);
        kernel.statusChanged.connect(onStatus);
        side.disposed.connect(() => {
          kernel.disposed.disconnect(onDisposed);
          kernel.statusChanged.disconnect(onStatus);
        });
      }
      shell.add(side, AREA, { rank: RANK });
      return side;
    }

    // Declared, not initialised: Backbone runs initialize() from its constructor, before
    // class field initialisers would run and reset them.
    side?: Promise<SideWidget | null>;
    destroyed?: boolean;
  }

  class SideAreaView extends DOMWidgetView {
    override render(): void {
      this.el.classList.add('tfgpu-lab-side-note');
      const text = document.createElement('span');
      text.textContent = `GPU monitor opened in the ${AREA} side area`;
      const again = document.createElement('button');
      again.className = 'tfgpu-lab-link';
      again.textContent = 'show it';
      again.title = 'Bring the GPU monitor to the front of the side area';
      again.addEventListener('click', () => void this.showSide(text));
      this.el.append(text, ' (', again, ')');
      void this.showSide(text);
    }

    private async showSide(text: HTMLElement): Promise<void> {
      try {
        const side = await (this.model as SideAreaModel).show();
        if (side === null) {
          text.textContent = 'The GPU monitor has nothing to show (its panel is closed).';
        }
      } catch (err) {
        // A front end without a side area: say what to do rather than show nothing.
        text.textContent = `No side area here (${String(err)}): run %gpu monitor without --sidebar.`;
      }
    }
  }

  return { SideAreaModel, SideAreaView };
}
