/**
 * A scheduled cell's status line drawn from the REST API, so it outlives the kernel.
 *
 * `%%schedule`, `%dlsched attach` and `JobView.show()` put three things in the cell's output:
 * the live ipywidget, a plain summary (text/html, text/plain) and `JOB_MIME`, `{"id": ...}`.
 * JupyterLab shows the one whose renderer ranks first; this renderer ranks before the widget
 * manager's, and decides at render time:
 *
 * - the widget's model lives in the notebook's kernel (the comm is open): it shows the widget,
 *   through the notebook's own widget renderer, exactly as JupyterLab would have;
 * - otherwise (the kernel restarted, the page was reloaded, no kernel at all): it draws the
 *   line itself from `GET jobs/<id>`, live until the job ends, with Cancel and the log.
 *
 * Polling is the sidebar's: the line reads its job from the shared model's lists, which are
 * fetched every 2 seconds anyway, and asks for the job alone only when it is in neither list.
 */
import type { ISessionContext } from '@jupyterlab/apputils';
import type { Kernel } from '@jupyterlab/services';
import type { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import { Panel, Widget } from '@lumino/widgets';

import { APIError, IJob, jobPath, requestAPI, ServerPartMissing } from './api';
import { bar, h } from './dom';
import {
  isFinished,
  lineWords,
  liveUsageWords,
  progressFraction,
  progressWords,
  stateTone
} from './format';
import { IRendermime, WIDGET_MIME, WidgetComms, widgetLives } from './kernelwidgets';
import { SchedulerModel } from './model';
import { confirmCancel, RUN_AGAIN_LABEL, RUN_AGAIN_TITLE } from './steer';

export const JOB_MIME = 'application/vnd.dlsched.job+json';
/**
 * Lower ranks are preferred (`RenderMimeRegistry.preferredMimeType` walks the types by rank).
 * The ipywidgets manager registers its renderer at -10, the built-in ones at 0 and above.
 */
export const JOB_RANK = -20;

/** Job ids as the server accepts them: nothing from a notebook reaches a URL unchecked. */
const JOB_ID = /^[a-z0-9]{1,32}$/;

export class JobLine extends Panel implements IRenderMime.IRenderer {
  constructor(options: JobLine.IOptions) {
    super();
    this._options = options;
    this.addClass('jp-dlsched-jobline-output');
    this._line = new Widget();
    this._line.node.appendChild(this._box);
    this.addWidget(this._line);
    options.sessionContext?.statusChanged.connect(this._onKernelStatus, this);
    options.sessionContext?.kernelChanged.connect(this._onKernelChanged, this);
    options.comms?.closed.connect(this._onWidgetClosed, this);
  }

  /** The job shown, once the server has told. */
  get job(): IJob | null {
    return this._job;
  }

  async renderModel(model: IRenderMime.IMimeModel): Promise<void> {
    this._mimeModel = model;
    const data = model.data[JOB_MIME] as { id?: unknown; ended?: unknown } | undefined;
    const id = typeof data?.id === 'string' && JOB_ID.test(data.id) ? data.id : '';
    if (id !== this._id && !this._againOf) {
      this._id = id;
      this._job = null;
      this._gone = '';
    }
    const summary = data?.ended === true ? model.data['text/html'] : undefined;
    if (typeof summary === 'string' && id && !this._againOf) {
      // The job has ended: the kernel's summary (value, traceback, output) is the output,
      // with the steering an ended job has under it. No widget, nothing to poll.
      this._dropWidget(false);
      this._unwatch();
      await this._showSummary(summary, model.trusted);
      this._draw();
      return;
    }
    if (this._widgetView) {
      // the kernel updated its display (a change of state): the widget redraws, as it would
      await this._widgetView.renderModel(model);
      return;
    }
    this._draw();
    if (!id) {
      return;
    }
    this._watch();
    void this._fetch();
    void this._lookForWidget();
  }

  /** The ended job's summary as the kernel wrote it, through JupyterLab's HTML renderer. */
  private async _showSummary(html: string, trusted: boolean): Promise<void> {
    const rendermime = this._options.rendermime;
    this._endedSummary = true;
    if (!rendermime || !rendermime.mimeTypes.includes('text/html')) {
      return; // the line's own words stand in for it
    }
    if (!this._summary) {
      this._summary = rendermime.createRenderer('text/html');
      this.insertWidget(0, this._summary);
    }
    // sanitized when the notebook is not trusted, as any HTML output is
    await this._summary.renderModel({
      trusted,
      data: { 'text/html': html },
      metadata: {},
      setData: () => undefined
    });
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._unwatch();
    this._options.sessionContext?.statusChanged.disconnect(this._onKernelStatus, this);
    this._options.sessionContext?.kernelChanged.disconnect(this._onKernelChanged, this);
    this._options.comms?.closed.disconnect(this._onWidgetClosed, this);
    super.dispose();
  }

  // -- the line from the REST API ------------------------------------------------------------

  private _watch(): void {
    if (!this._watching && !this._ended()) {
      this._watching = true;
      this._options.model.changed.connect(this._onModel, this);
    }
  }

  private _unwatch(): void {
    if (this._watching) {
      this._watching = false;
      this._options.model.changed.disconnect(this._onModel, this);
    }
  }

  private _ended(): boolean {
    return (this._job !== null && isFinished(this._job.state)) || this._gone !== '';
  }

  private _onModel(model: SchedulerModel): void {
    const job =
      model.active.find(j => j.id === this._id) ?? model.recent.find(j => j.id === this._id);
    if (job) {
      this._show(job);
    } else if (model.connection === 'ok') {
      // in neither list: it ended longer ago than "recent" reaches, or it is not there at all
      void this._fetch();
    }
  }

  private async _fetch(): Promise<void> {
    if (this._fetching || !this._id) {
      return;
    }
    this._fetching = true;
    try {
      this._show(await requestAPI<IJob>(jobPath(this._id)));
    } catch (error) {
      if (error instanceof APIError && error.status === 404) {
        this._gone = `job ${this._id} is no longer in the scheduler's ledger`;
      } else if (error instanceof ServerPartMissing) {
        this._gone = 'the scheduler is not running in this Jupyter server';
      }
      // anything else (the server restarting): the next tick of the model tries again
      this._draw();
      if (this._ended()) {
        this._unwatch();
      }
    } finally {
      this._fetching = false;
    }
  }

  private _show(job: IJob): void {
    if (this.isDisposed || job.id !== this._id) {
      return;
    }
    this._job = job;
    this._draw();
    if (this._ended()) {
      this._unwatch(); // nothing moves any more
    }
  }

  private _draw(): void {
    if (this._widgetView) {
      return;
    }
    const node = this._box;
    const job = this._job;
    if (!this._id) {
      node.replaceChildren(
        h('span', { className: 'jp-dlsched-muted' }, 'This output names no scheduler job.')
      );
      return;
    }
    if (this._endedSummary && !this._againOf) {
      // under the kernel's summary of an ended job: what can still be done with it
      node.className = 'jp-dlsched-jobline jp-dlsched-jobline-ended';
      node.dataset.state = 'ended';
      node.dataset.jobId = this._id;
      node.replaceChildren(
        h(
          'div',
          { className: 'jp-dlsched-jobline-main' },
          this._runAgainButton(),
          this._button('log', 'Open the job\'s output in the main area', () =>
            this._options.openLog(this._id)
          )
        ),
        ...(this._requeueError
          ? [
              h(
                'div',
                { className: 'jp-dlsched-muted jp-dlsched-jobline-note' },
                `run again failed: ${this._requeueError}`
              )
            ]
          : [])
      );
      return;
    }
    if (!job) {
      // Before the first answer, or with no server to ask: what the kernel last wrote.
      const saved = String(this._mimeModel?.data['text/plain'] ?? `job ${this._id}`);
      node.dataset.state = '';
      node.replaceChildren(
        h('div', { className: 'jp-dlsched-jobline-words' }, saved),
        ...(this._gone
          ? [h('div', { className: 'jp-dlsched-muted jp-dlsched-jobline-note' }, this._gone)]
          : [])
      );
      return;
    }
    const now = Date.now() / 1000;
    const tone = stateTone(job.state);
    node.className = `jp-dlsched-jobline jp-dlsched-state-${tone}`;
    node.dataset.state = job.state;
    node.dataset.jobId = job.id;
    const main = h(
      'div',
      { className: 'jp-dlsched-jobline-main' },
      h('span', { className: 'jp-dlsched-jobline-words' }, lineWords(job, now))
    );
    if (job.state === 'running') {
      const fraction = progressFraction(job);
      const words = progressWords(job);
      if (fraction !== null || words) {
        main.appendChild(
          h(
            'span',
            { className: 'jp-dlsched-progress' },
            fraction !== null ? bar(fraction) : null,
            words
          )
        );
      }
      const using = liveUsageWords(job);
      if (using) {
        main.appendChild(
          h(
            'span',
            {
              className: 'jp-dlsched-using',
              title: 'what it uses now: CPU (100% is one core) and resident memory'
            },
            using
          )
        );
      }
    }
    main.appendChild(
      h('span', { className: 'jp-dlsched-muted jp-dlsched-jobline-who' }, `${job.name} · ${job.id}`)
    );
    if (!isFinished(job.state)) {
      main.appendChild(this._cancelButton());
    } else if (!job.inline) {
      // a cell run in its kernel's thread (--inline) needs that kernel to run again
      main.appendChild(this._runAgainButton());
    }
    main.appendChild(
      this._button('log', 'Open the job\'s output in the main area', () =>
        this._options.openLog(job.id)
      )
    );
    node.replaceChildren(main);
    const note = this._note(job);
    if (note) {
      node.appendChild(h('div', { className: 'jp-dlsched-muted jp-dlsched-jobline-note' }, note));
    }
  }

  /** What the line cannot show, and where to get it. */
  private _note(job: IJob): string {
    if (this._cancelError) {
      return `cancel failed: ${this._cancelError}`;
    }
    if (this._requeueError) {
      return `run again failed: ${this._requeueError}`;
    }
    if (this._againOf) {
      return `run again of job ${this._againOf}`;
    }
    if (job.state === 'succeeded' && job.kind === 'cell' && !job.inline) {
      return (
        `the cell's value and --out names are kept with the job: ` +
        `%dlsched outputs ${job.id} brings them into a kernel`
      );
    }
    return '';
  }

  private _runAgainButton(): HTMLButtonElement {
    const node = this._button(
      this._requeueing ? 'Queueing…' : RUN_AGAIN_LABEL,
      RUN_AGAIN_TITLE,
      () => void this._runAgain(),
      'run-again'
    );
    node.disabled = this._requeueing;
    return node;
  }

  private _cancelButton(): HTMLButtonElement {
    const cancelling = this._cancelling;
    const node = this._button(
      cancelling ? 'Cancelling…' : 'Cancel',
      'Cancel this job',
      () => void this._cancel(),
      'cancel'
    );
    node.disabled = cancelling;
    return node;
  }

  private _button(
    text: string,
    title: string,
    onClick: () => void,
    action = text
  ): HTMLButtonElement {
    return h(
      'button',
      {
        className: 'jp-dlsched-button',
        title,
        data: { action },
        attrs: { type: 'button' },
        onClick: () => onClick()
      },
      text
    );
  }

  /** As the widget's Cancel button: asks first (as every view does), then cancels at once. */
  private async _cancel(): Promise<void> {
    const job = this._job;
    if (!job || !(await confirmCancel(job)) || this.isDisposed) {
      return;
    }
    this._cancelling = true;
    this._cancelError = '';
    this._draw();
    try {
      this._show(await requestAPI<IJob>(jobPath(this._id, '/cancel'), { method: 'POST' }));
      void this._options.model.refreshSoon();
    } catch (error) {
      this._cancelError = error instanceof Error ? error.message : String(error);
    } finally {
      this._cancelling = false;
      this._draw();
    }
  }

  /** "Run again": the line follows the new job from now on (the old one stays in the ledger). */
  private async _runAgain(): Promise<void> {
    const old = this._id;
    this._requeueing = true;
    this._requeueError = '';
    this._draw();
    try {
      const fresh = await this._options.model.runAgain(old);
      if (this.isDisposed || this._id !== old) {
        return;
      }
      this._id = fresh.id;
      this._job = null;
      this._gone = '';
      this._againOf = old;
      this._show(fresh);
      this._watch();
    } catch (error) {
      this._requeueError = error instanceof Error ? error.message : String(error);
    } finally {
      this._requeueing = false;
      this._draw();
    }
  }

  // -- the live widget, when its kernel still has it -----------------------------------------

  /** Show the widget instead of the line when its model lives in the notebook's kernel. */
  private async _lookForWidget(): Promise<void> {
    const { sessionContext, rendermime } = this._options;
    const model = this._mimeModel;
    const source = model?.data[WIDGET_MIME] as { model_id?: unknown } | undefined;
    const modelId = typeof source?.model_id === 'string' ? source.model_id : '';
    if (
      !sessionContext ||
      !rendermime ||
      !model ||
      // an untrusted output never gets the widget (it is not a safe renderer)
      !model.trusted ||
      !modelId ||
      !rendermime.mimeTypes.includes(WIDGET_MIME) ||
      this._looking ||
      this._ended()
    ) {
      return;
    }
    this._looking = true;
    try {
      const lives = await widgetLives(sessionContext, this._options.comms, modelId);
      // a kernel busy with a cell answers once it ends: look again then
      this._lookWhenIdle = lives === 'busy';
      if (lives === true && !this.isDisposed && !this._widgetView && !this._ended()) {
        this._showWidget(rendermime, this._mimeModel ?? model);
      }
    } catch {
      // No answer from the kernel (gone): the line from the server stays.
    } finally {
      this._looking = false;
    }
  }

  private _showWidget(rendermime: IRendermime, model: IRenderMime.IMimeModel): void {
    const view = rendermime.createRenderer(WIDGET_MIME);
    this._widgetView = view;
    this._unwatch(); // the kernel keeps the widget up to date
    this._line.hide();
    this.addWidget(view);
    void view.renderModel(model);
  }

  /** The kernel that held the widget's model restarts or is replaced: back to the line. */
  private _dropWidget(follow = true): void {
    const view = this._widgetView;
    if (!view) {
      return;
    }
    this._widgetView = null;
    view.dispose();
    this._line.show();
    if (follow) {
      this._draw();
      this._watch();
      void this._fetch();
    }
  }

  private _onKernelStatus(_: ISessionContext, status: Kernel.Status): void {
    if (status === 'idle' && this._lookWhenIdle && !this._widgetView) {
      this._lookWhenIdle = false;
      void this._lookForWidget();
    } else if (status === 'restarting' || status === 'autorestarting' || status === 'dead') {
      this._lookWhenIdle = false;
      this._dropWidget();
    }
  }

  /** The kernel closed a widget: if it is the one shown, back to the line from the server
   * (a widget view of a closed model would stay "Loading widget..." for good). */
  private _onWidgetClosed(_: WidgetComms, modelId: string): void {
    const source = this._mimeModel?.data[WIDGET_MIME] as { model_id?: unknown } | undefined;
    if (this._widgetView && source?.model_id === modelId) {
      this._dropWidget();
    }
  }

  private _onKernelChanged(): void {
    this._dropWidget();
  }

  private _options: JobLine.IOptions;
  private _line: Widget;
  private _box = h('div', { className: 'jp-dlsched-jobline' });
  private _mimeModel: IRenderMime.IMimeModel | null = null;
  private _id = '';
  private _job: IJob | null = null;
  private _gone = '';
  private _watching = false;
  private _fetching = false;
  private _looking = false;
  private _lookWhenIdle = false;
  private _cancelling = false;
  private _cancelError = '';
  private _requeueing = false;
  private _requeueError = '';
  private _againOf = '';
  /** The output is the kernel's summary of an ended job (`{"id", "ended": true}`). */
  private _endedSummary = false;
  private _summary: IRenderMime.IRenderer | null = null;
  private _widgetView: IRenderMime.IRenderer | null = null;
}

export namespace JobLine {
  export interface IOptions {
    model: SchedulerModel;
    openLog: (id: string) => void;
    /** The notebook's session and registry; without them the line never becomes the widget. */
    sessionContext?: ISessionContext;
    rendermime?: IRendermime;
    /** what the page saw of the kernel's widget models (see `WidgetComms`) */
    comms?: WidgetComms;
  }
}

/** A renderer factory for `JOB_MIME`; safe: it sets only text, and GETs a checked job id. */
export function jobLineFactory(options: JobLine.IOptions): IRenderMime.IRendererFactory {
  return {
    safe: true,
    mimeTypes: [JOB_MIME],
    defaultRank: JOB_RANK,
    createRenderer: () => new JobLine(options)
  };
}
