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
import { IRendermime, WIDGET_MIME, WidgetComms, widgetLives } from './kernelwidgets';

export const DASHBOARD_MIME = 'application/vnd.dlsched.dashboard+json';
/** How soon a panel whose kernel did not answer looks again, if the kernel is idle by then. */
const ASK_AGAIN_MS = 3000;

/** The words over a snapshot, by what happened to the widget's kernel. */
export const SNAPSHOT_NOTES = {
  looking: 'a snapshot: looking for the live view in the kernel…',
  busy: 'a snapshot: the kernel is busy; the live view comes back when it answers',
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
    if (model.trusted && this._modelId && this._options.comms?.isOpen(this._modelId)) {
      // this page saw the kernel open the panel's model: live at once, busy kernel or not
      this._showWidget();
      return;
    }
    const canLook = model.trusted && !!this._modelId && !!this._options.sessionContext;
    const waiting = canLook && this._lookWhenIdle; // asked already: the kernel answers later
    await this._drawSnapshot(
      !model.trusted
        ? 'untrusted'
        : this._reason || (waiting ? 'busy' : canLook ? 'looking' : 'missing')
    );
    if (!waiting) {
      await this._look();
    }
  }

  /** Look for the live panel once at a time; say what was found over the snapshot. */
  private async _look(): Promise<void> {
    if (!this._looking) {
      this._looking = this._lookForWidget().finally(() => {
        this._looking = null;
      });
    }
    const found = await this._looking;
    const note = this._note.textContent;
    if (this._widgetView || this.isDisposed) {
      return;
    }
    if (note === SNAPSHOT_NOTES.looking || note === SNAPSHOT_NOTES.busy) {
      this._note.textContent = SNAPSHOT_NOTES[found === 'busy' ? 'busy' : 'missing'];
    }
    this._lookWhenIdle = found === 'busy';
    if (this._lookWhenIdle) {
      // No answer in time, but maybe not busy: right after a page load, or on a loaded
      // machine, an idle kernel can be slow to answer, and no 'idle' status would ever come
      // to ask again. Ask again soon if the kernel then says it is idle.
      window.clearTimeout(this._retry);
      this._retry = window.setTimeout(() => this._askIfIdle(), ASK_AGAIN_MS);
    }
  }

  private _askIfIdle(): void {
    const kernel = this._options.sessionContext?.session?.kernel;
    if (this.isDisposed || !this._lookWhenIdle || this._widgetView) {
      return;
    }
    if (kernel?.status === 'idle') {
      this._lookWhenIdle = false;
      void this._look();
    } else {
      // busy: its 'idle' status will ask (one question waits in a busy kernel, not many)
      this._retry = window.setTimeout(() => this._askIfIdle(), ASK_AGAIN_MS);
    }
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    window.clearTimeout(this._retry);
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
    // the old snapshot's node was put in by hand: disposing its renderer leaves it in place
    const old = this._snapshot;
    this._snapshot = null;
    if (old) {
      old.node.remove();
      old.dispose();
    }
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

  /** Show the widget instead of the snapshot when its model lives in the notebook's kernel;
   * 'busy' when the kernel is running a cell and could not say. */
  private async _lookForWidget(): Promise<boolean | 'busy'> {
    const { sessionContext, rendermime } = this._options;
    const model = this._mimeModel;
    const modelId = this._modelId;
    if (
      !sessionContext ||
      !rendermime ||
      !model ||
      !model.trusted ||
      !modelId ||
      !rendermime.mimeTypes.includes(WIDGET_MIME)
    ) {
      return false;
    }
    const lives = await widgetLives(sessionContext, this._options.comms, modelId);
    if (lives === true && !this.isDisposed && !this._widgetView && this._modelId === modelId) {
      this._showWidget();
    }
    return lives;
  }

  private _showWidget(): void {
    const { rendermime } = this._options;
    const model = this._mimeModel;
    if (!rendermime || !model || this._widgetView) {
      return;
    }
    const view = rendermime.createRenderer(WIDGET_MIME);
    this._widgetView = view;
    this._lookWhenIdle = false;
    this._fallback.hide();
    this.node.dataset.view = 'live';
    this.addWidget(view);
    void view.renderModel(model);
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
    if (status === 'idle' && this._lookWhenIdle && !this._widgetView) {
      this._lookWhenIdle = false;
      void this._look(); // the cell that kept the kernel busy has ended: it can answer now
      return;
    }
    if (status === 'restarting' || status === 'autorestarting' || status === 'dead') {
      this._lookWhenIdle = false;
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
  private _looking: Promise<boolean | 'busy'> | null = null;
  private _lookWhenIdle = false;
  private _retry = 0;
  private _widgetView: IRenderMime.IRenderer | null = null;
}

export namespace DashboardOutput {
  export interface IOptions {
    sessionContext?: ISessionContext;
    rendermime?: IRendermime;
    /** what the page saw of the kernel's widget models (see `WidgetComms`) */
    comms?: WidgetComms;
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
