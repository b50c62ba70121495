/**
 * `dls.dashboard()`'s output, so that it outlives its kernel.
 *
 * The dashboard puts three things in the cell's output: the live ipywidget, a plain snapshot
 * of itself (text/html, updated by the kernel while the queue changes) and `DASHBOARD_MIME`.
 * This renderer ranks before the widget manager's and decides, as the job line does:
 *
 * - the widget's model lives in the notebook's kernel: it shows the widget, through the
 *   notebook's own widget renderer;
 * - otherwise (the kernel restarted, the page was reloaded, no kernel at all): the snapshot,
 *   under a note that says why it no longer moves and how to get the live view back, instead
 *   of "Error displaying widget: model not found".
 */
import type { ISessionContext } from '@jupyterlab/apputils';
import type { Kernel } from '@jupyterlab/services';
import type { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import { Panel, Widget } from '@lumino/widgets';

import { h } from './dom';
import { JOB_RANK } from './jobline';
import { IRendermime, openWidgetComms, WIDGET_MIME } from './kernelwidgets';

export const DASHBOARD_MIME = 'application/vnd.dlsched.dashboard+json';

/** The words over a snapshot, by what happened to the widget's kernel. */
export const SNAPSHOT_NOTES = {
  looking: 'a snapshot: looking for the live view in the kernel…',
  restarted: 'kernel restarted: run the cell again for a live view',
  missing:
    'no live view: its kernel is gone (restarted, or the page was reloaded); ' +
    'run the cell again for a live view',
  untrusted: 'a snapshot from an untrusted notebook: run the cell for a live view'
};

export class DashboardOutput extends Panel implements IRenderMime.IRenderer {
  constructor(options: DashboardOutput.IOptions) {
    super();
    this._options = options;
    this.addClass('jp-dlsched-dashboard-output');
    this._fallback = new Widget();
    this._fallback.addClass('jp-dlsched-dashboard-fallback');
    this._note = h('div', {
      className: 'jp-dlsched-dashboard-note jp-dlsched-muted',
      attrs: { role: 'note' }
    });
    this._fallback.node.appendChild(this._note);
    this.addWidget(this._fallback);
    options.sessionContext?.statusChanged.connect(this._onKernelStatus, this);
    options.sessionContext?.kernelChanged.connect(this._onKernelChanged, this);
  }

  async renderModel(model: IRenderMime.IMimeModel): Promise<void> {
    const before = this._modelId;
    this._mimeModel = model;
    this._modelId = modelIdOf(model);
    if (this._widgetView && this._modelId === before) {
      // the kernel updated the snapshot beside the live widget: the widget stays as it is
      return;
    }
    this._dropWidget(false);
    const canLook = model.trusted && !!this._modelId && !!this._options.sessionContext;
    await this._drawSnapshot(
      !model.trusted ? 'untrusted' : this._reason || (canLook ? 'looking' : 'missing')
    );
    await this._lookForWidget();
    const stillLooking = this._note.textContent === SNAPSHOT_NOTES.looking;
    if (!this._widgetView && !this.isDisposed && stillLooking) {
      this._note.textContent = SNAPSHOT_NOTES.missing;
    }
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._options.sessionContext?.statusChanged.disconnect(this._onKernelStatus, this);
    this._options.sessionContext?.kernelChanged.disconnect(this._onKernelChanged, this);
    super.dispose();
  }

  private async _drawSnapshot(reason: keyof typeof SNAPSHOT_NOTES): Promise<void> {
    const model = this._mimeModel;
    this._note.textContent = SNAPSHOT_NOTES[reason];
    this.node.dataset.view = 'snapshot';
    this._fallback.show();
    if (!model) {
      return;
    }
    const html = model.data['text/html'];
    const text = model.data['text/plain'];
    this._snapshot?.dispose();
    this._snapshot = null;
    const { rendermime } = this._options;
    if (typeof html === 'string' && rendermime?.mimeTypes.includes('text/html')) {
      // JupyterLab's own HTML renderer: it sanitizes the snapshot of an untrusted notebook
      const view = rendermime.createRenderer('text/html');
      this._snapshot = view;
      this._fallback.node.appendChild(view.node);
      await view.renderModel(mimeModel({ 'text/html': html }, model.trusted));
    } else if (typeof text === 'string') {
      const view = new Widget({ node: h('pre', { className: 'jp-dlsched-muted' }, text) });
      this._snapshot = view;
      this._fallback.node.appendChild(view.node);
    }
  }

  /** Show the widget instead of the snapshot when its model lives in the notebook's kernel. */
  private async _lookForWidget(): Promise<void> {
    const { sessionContext, rendermime } = this._options;
    const model = this._mimeModel;
    const modelId = this._modelId;
    if (
      !sessionContext ||
      !rendermime ||
      !model ||
      !model.trusted ||
      !modelId ||
      !rendermime.mimeTypes.includes(WIDGET_MIME) ||
      this._looking
    ) {
      return;
    }
    this._looking = true;
    try {
      await sessionContext.ready;
      const kernel = sessionContext.session?.kernel;
      if (!kernel || this.isDisposed) {
        return;
      }
      const open = await openWidgetComms(kernel);
      if (open.has(modelId) && !this.isDisposed && !this._widgetView && this._modelId === modelId) {
        const view = rendermime.createRenderer(WIDGET_MIME);
        this._widgetView = view;
        this._fallback.hide();
        this.node.dataset.view = 'live';
        this.addWidget(view);
        void view.renderModel(this._mimeModel ?? model);
      }
    } catch {
      // No answer from the kernel (busy for long, gone): the snapshot stays.
    } finally {
      this._looking = false;
    }
  }

  private _dropWidget(redraw: boolean): void {
    const view = this._widgetView;
    if (!view) {
      return;
    }
    this._widgetView = null;
    view.dispose();
    if (redraw) {
      void this._drawSnapshot(this._reason || 'missing');
    }
  }

  private _onKernelStatus(_: ISessionContext, status: Kernel.Status): void {
    if (status === 'restarting' || status === 'autorestarting' || status === 'dead') {
      this._reason = 'restarted';
      this._dropWidget(true);
      if (this.node.dataset.view === 'snapshot') {
        this._note.textContent = SNAPSHOT_NOTES.restarted;
      }
    }
  }

  private _onKernelChanged(): void {
    this._reason = 'restarted';
    this._dropWidget(true);
  }

  private _options: DashboardOutput.IOptions;
  private _fallback: Widget;
  private _note: HTMLElement;
  private _snapshot: IRenderMime.IRenderer | Widget | null = null;
  private _mimeModel: IRenderMime.IMimeModel | null = null;
  private _modelId = '';
  private _reason: '' | 'restarted' = '';
  private _looking = false;
  private _widgetView: IRenderMime.IRenderer | null = null;
}

export namespace DashboardOutput {
  export interface IOptions {
    sessionContext?: ISessionContext;
    rendermime?: IRendermime;
  }
}

function modelIdOf(model: IRenderMime.IMimeModel): string {
  const source = model.data[WIDGET_MIME] as { model_id?: unknown } | undefined;
  return typeof source?.model_id === 'string' ? source.model_id : '';
}

/** A mime model of fixed data (what a renderer reads of one). */
function mimeModel(data: { [mime: string]: string }, trusted: boolean): IRenderMime.IMimeModel {
  return {
    trusted,
    data,
    metadata: {},
    setData: () => undefined
  };
}

/** A renderer factory for `DASHBOARD_MIME`; safe: untrusted snapshots go through the sanitizer. */
export function dashboardFactory(options: DashboardOutput.IOptions): IRenderMime.IRendererFactory {
  return {
    safe: true,
    mimeTypes: [DASHBOARD_MIME],
    defaultRank: JOB_RANK,
    createRenderer: () => new DashboardOutput(options)
  };
}
