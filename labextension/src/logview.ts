/**
 * A job's live log in the main area: follows the file while the job runs.
 */
import { MainAreaWidget } from '@jupyterlab/apputils';
import { Poll } from '@lumino/polling';
import { Widget } from '@lumino/widgets';

import { IJob, ILogChunk, jobPath, query, requestAPI } from './api';
import { h } from './dom';
import { isFinished, stateChip, stateTone, stateWords } from './format';

/** Lines shown when the log is opened; older output stays in the file. */
const INITIAL_TAIL_LINES = 2000;
/** Characters kept in the view, so a chatty job cannot exhaust the tab. */
const MAX_CHARS = 2_000_000;

export class JobLogView extends Widget {
  constructor(readonly jobId: string) {
    super();
    this.addClass('jp-dlsched-log');
    this._header = h('div', { className: 'jp-dlsched-log-header' });
    this._pre = h('pre', { className: 'jp-dlsched-log-text', attrs: { 'aria-live': 'off' } });
    this._empty = h(
      'p',
      { className: 'jp-dlsched-log-empty jp-dlsched-muted' },
      'loading the log…'
    );
    this.node.append(this._header, this._empty, this._pre);
    this._poll = new Poll({
      factory: () => this._fetch(),
      frequency: { interval: 1000, backoff: true, max: 30 * 1000 },
      name: `jupyter-dlsched:log:${jobId}`,
      standby: 'when-hidden'
    });
  }

  dispose(): void {
    this._poll.dispose();
    super.dispose();
  }

  private async _fetch(): Promise<void> {
    let job: IJob;
    let chunk: ILogChunk;
    try {
      job = await requestAPI<IJob>(jobPath(this.jobId));
      const params =
        this._offset === null
          ? query({ tail: INITIAL_TAIL_LINES })
          : query({ offset: this._offset });
      chunk = await requestAPI<ILogChunk>(jobPath(this.jobId, `/log${params}`));
    } catch (error) {
      this._empty.textContent = `Could not read the log: ${(error as Error).message ?? error}`;
      this._empty.hidden = false;
      // Rejecting makes the Poll back off until the server answers again.
      throw error;
    }
    this._renderHeader(job);
    if (chunk.text) {
      const atBottom =
        this.node.scrollTop + this.node.clientHeight >= this.node.scrollHeight - 4;
      this._pre.appendChild(document.createTextNode(chunk.text));
      this._trim();
      if (atBottom) {
        this.node.scrollTop = this.node.scrollHeight;
      }
    }
    this._offset = chunk.next_offset;
    const finished = isFinished(job.state);
    // A blank page reads as broken; say plainly that the job has not printed anything.
    this._empty.textContent = finished ? 'the job printed nothing' : 'no output yet';
    this._empty.hidden = this._pre.textContent !== '';
    if (finished && chunk.next_offset >= chunk.size) {
      // Nothing more will be written: stop following.
      this._poll.dispose();
    }
  }

  private _renderHeader(job: IJob): void {
    const words = stateWords(job, Date.now() / 1000);
    this._header.replaceChildren(
      h('span', { className: `jp-dlsched-chip jp-dlsched-chip-${stateTone(job.state)}` }, stateChip(job.state)),
      h('strong', {}, ` ${job.name} `),
      h('span', { className: 'jp-dlsched-muted' }, `${job.id} · ${words}`)
    );
  }

  private _trim(): void {
    const text = this._pre.textContent ?? '';
    if (text.length > MAX_CHARS) {
      this._pre.textContent = text.slice(text.length - MAX_CHARS);
    }
  }

  private _header: HTMLElement;
  private _pre: HTMLPreElement;
  private _empty: HTMLElement;
  private _poll: Poll;
  private _offset: number | null = null;
}

export function createLogWidget(jobId: string): MainAreaWidget<JobLogView> {
  const content = new JobLogView(jobId);
  const widget = new MainAreaWidget({ content });
  widget.id = `jupyter-dlsched-log-${jobId.replace(/[^A-Za-z0-9_-]/g, '_')}`;
  widget.title.label = `log ${jobId}`;
  widget.title.closable = true;
  widget.addClass('jp-dlsched-log-panel');
  return widget;
}
