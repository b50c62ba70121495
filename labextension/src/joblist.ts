/**
 * The sidebar's job lists: one row per job, patched in place on every poll.
 */
import { IJob } from './api';
import { bar, h } from './dom';
import {
  formatDuration,
  isFinished,
  lastMetric,
  liveUsageWords,
  ownerText,
  priorityText,
  progressFraction,
  ranFor,
  requestText,
  stateChip,
  stateDetail,
  stateTone,
  stateWords,
  stepWords,
  usageWords,
  waitedFor
} from './format';
import { RUN_AGAIN_LABEL, RUN_AGAIN_TITLE } from './steer';

/** A list of job rows kept by id: rows are patched in place and moved only when out of order. */
export class JobList {
  constructor(
    private _actions: JobRow.IActions,
    private _active: boolean,
    emptyText: string
  ) {
    this._empty = h('p', { className: 'jp-dlsched-muted' }, emptyText);
    this.node = h('div', { className: 'jp-dlsched-jobs', attrs: { role: 'list' } }, this._empty);
  }

  readonly node: HTMLElement;

  update(jobs: IJob[], now: number, mine: (job: IJob) => boolean = () => true): void {
    const keep = new Set(jobs.map(job => job.id));
    for (const [id, row] of this._rows) {
      if (!keep.has(id)) {
        row.node.remove();
        this._rows.delete(id);
      }
    }
    this._empty.hidden = jobs.length > 0;
    let before: Element | null = this._empty.nextElementSibling;
    for (const job of jobs) {
      let row = this._rows.get(job.id);
      if (!row) {
        row = new JobRow(this._actions, this._active);
        this._rows.set(job.id, row);
      }
      row.update(job, now, mine(job));
      if (row.node !== before) {
        // Moving a row that holds focus would blur it, so only rows out of place move.
        this.node.insertBefore(row.node, before);
      } else {
        before = before.nextElementSibling;
      }
    }
  }

  private _empty: HTMLElement;
  private _rows = new Map<string, JobRow>();
}

/**
 * One job in two lines, readable at the sidebar's default width:
 *
 *   [running] resnet-lr3                 ████░░ 70%
 *   k3f9x2ab · anna · sweep.ipynb · high · 1 GPU · 2 CPU · ran 3m 12s · loss 0.31  ✕ ↑ ↓ log
 *
 * and, for a job that waits or failed, why, on a line of its own; a finished one says what it used
 * (`0.68 GPU-h · CPU 39m · peak RAM 3.1 GiB`) on the last line.
 */
export class JobRow {
  constructor(actions: JobRow.IActions, active: boolean) {
    this._actions = actions;
    this._active = active;
    this._chip = h('span', { className: 'jp-dlsched-chip' });
    this._name = h('button', {
      className: 'jp-dlsched-name',
      attrs: { type: 'button' }
    });
    this._progress = h('span', { className: 'jp-dlsched-progress' });
    this._why = h('div', { className: 'jp-dlsched-why' });
    this._usage = h('div', { className: 'jp-dlsched-usage' });
    this._meta = h('div', { className: 'jp-dlsched-meta' });
    const buttons = h('span', { className: 'jp-dlsched-actions' });
    if (active) {
      this._steering = [
        button('✕', 'Cancel this job', 'cancel', () => this._actions.cancel(this._job!)),
        button('↑', 'Raise its priority a step', 'raise', () =>
          this._actions.bump(this._job!, 1)
        ),
        button('↓', 'Lower its priority a step', 'lower', () =>
          this._actions.bump(this._job!, -1)
        )
      ];
      buttons.append(...this._steering);
    } else {
      // an ended job (done, failed, cancelled) can be queued again as a new job
      this._steering = [
        button(
          '↻',
          RUN_AGAIN_TITLE,
          'run-again',
          () => this._actions.runAgain(this._job!),
          RUN_AGAIN_LABEL
        )
      ];
      buttons.append(...this._steering);
    }
    this._log = button('log', 'Open the log', 'log', () =>
      this._actions.openLog(this._job!.id)
    );
    // a finished notebook job: its executed copy, with every output
    this._notebook = button('notebook', 'Open the executed notebook', 'open-notebook', () => {
      const path = this._job?.notebook?.path;
      if (path) {
        this._actions.openNotebook?.(path);
      }
    });
    this._notebook.hidden = true;
    buttons.append(this._notebook, this._log);
    this._buttons = buttons;
    this.node = h(
      'div',
      { className: 'jp-dlsched-job', attrs: { role: 'listitem' } },
      h('div', { className: 'jp-dlsched-line' }, this._chip, this._name, this._progress),
      this._meta,
      this._why,
      this._usage
    );
    this.node.addEventListener('click', () => {
      if (this._mine) {
        this._actions.openLog(this._job!.id);
      }
    });
  }

  readonly node: HTMLElement;

  /**
   * Show ``job``. ``mine``: the job is the user's own (or the user is an admin of a shared
   * pool); other people's jobs are listed without cancel, priority and log actions, which
   * the pool would refuse.
   */
  update(job: IJob, now: number, mine = true): void {
    this._job = job;
    if (mine !== this._mine) {
      this._mine = mine;
      for (const node of [...this._steering, this._log]) {
        node.hidden = !mine;
      }
      this._name.disabled = !mine;
    }
    if (!this._active && this._steering.length) {
      // a cell run in its kernel's thread (--inline) needs that kernel to run again
      this._steering[0].hidden = !mine || !!job.inline;
    }
    const executed = job.notebook?.path;
    this._notebook.hidden = !(executed && isFinished(job.state) && this._actions.openNotebook);
    if (executed) {
      this._notebook.title = `Open the executed notebook: ${executed}`;
    }
    const tone = stateTone(job.state);
    const node = this.node;
    node.className = `jp-dlsched-job jp-dlsched-state-${tone}`;
    node.dataset.jobId = job.id;
    node.dataset.state = job.state;

    const words = stateWords(job, now);
    this._chip.className = `jp-dlsched-chip jp-dlsched-chip-${tone}`;
    setText(this._chip, stateChip(job.state));
    this._chip.title = words;
    setText(this._name, job.name);
    this._name.title = mine ? `${job.name}: open the log` : `${job.name} (${job.owner}'s job)`;

    const fraction = progressFraction(job);
    if (fraction === null) {
      // Without a total there is no bar, only how far it got (as the Python widgets say it).
      const step = stepWords(job);
      if (this._progress.textContent !== step || this._progress.childElementCount) {
        this._progress.replaceChildren(step);
      }
      this._progress.title = '';
    } else {
      const percent = `${Math.round(fraction * 100)}%`;
      const p = job.progress!;
      this._progress.title = `${p.done} of ${p.total}`;
      const fill = this._progress.querySelector<HTMLElement>('.jp-dlsched-bar-fill');
      if (fill) {
        fill.style.width = percent;
        setText(this._progress.lastElementChild!, percent);
      } else {
        this._progress.replaceChildren(bar(fraction), h('span', {}, percent));
      }
    }

    const origin = job.origin ?? '';
    const waited = formatDuration(waitedFor(job, now), false);
    const ran = ranFor(job, now);
    const items: [string, string, string][] = [
      ['id', job.id, `job id ${job.id}`],
      ['owner', ownerText(job), origin ? `${job.owner} · ${origin}` : job.owner],
      ['priority', priorityText(job.priority), `priority ${job.priority}`],
      ['request', requestText(job), 'what the job asked for'],
      ['waited', `waited ${waited}`, 'time in the queue'],
      ['ran', ran === null ? '' : `ran ${formatDuration(ran)}`, 'time running'],
      ['metric', lastMetric(job), 'the last metric reported with dls.progress'],
      [
        'next-run',
        job.schedule ? nextRunWords(job.schedule.next_run, now) : '',
        job.schedule ? `schedule ${job.schedule.id}: a new run every ${job.schedule.every}` : ''
      ],
      ['using', liveUsageWords(job), 'what it uses now: CPU (100% is one core) and resident memory']
    ];
    this._patchMeta(items);

    // The reason a job waits or failed; running and done jobs show their times above.
    const detail = ['queued', 'failed', 'preempted'].includes(tone) ? stateDetail(job, now) : '';
    setText(this._why, detail);
    this._why.hidden = !detail;

    // What a finished job used, on a line of its own (it would crowd the meta line).
    const used = isFinished(job.state) ? usageWords(job) : { short: '', long: '' };
    setText(this._usage, used.short);
    this._usage.title = used.long;
    this._usage.hidden = !used.short;
  }

  private _patchMeta(items: [string, string, string][]): void {
    if (!this._metaParts.size) {
      for (const [key] of items) {
        const part = h('span', { className: `jp-dlsched-meta-item jp-dlsched-${key}` });
        this._metaParts.set(key, part);
        this._meta.appendChild(part);
      }
      this._meta.appendChild(this._buttons);
    }
    for (const [key, text, title] of items) {
      const part = this._metaParts.get(key)!;
      setText(part, text);
      part.title = title;
      part.hidden = !text;
    }
  }

  private _actions: JobRow.IActions;
  private _active: boolean;
  private _job: IJob | null = null;
  private _mine = true;
  private _steering: HTMLButtonElement[] = [];
  private _log: HTMLButtonElement;
  private _notebook: HTMLButtonElement;
  private _chip: HTMLElement;
  private _name: HTMLButtonElement;
  private _progress: HTMLElement;
  private _meta: HTMLElement;
  private _metaParts = new Map<string, HTMLElement>();
  private _buttons: HTMLElement;
  private _why: HTMLElement;
  private _usage: HTMLElement;
}

export namespace JobRow {
  export interface IActions {
    openLog: (id: string) => void;
    cancel: (job: IJob) => void;
    bump: (job: IJob, direction: 1 | -1) => void;
    /** Queue an ended job again (a new job with the same spec). */
    runAgain: (job: IJob) => void;
    /** Open a notebook by its path in the server's folder (a notebook job's executed copy). */
    openNotebook?: (path: string) => void;
  }
}

function button(
  text: string,
  title: string,
  action: string,
  onClick: () => void,
  label = title
): HTMLButtonElement {
  const node = h(
    'button',
    {
      className: 'jp-dlsched-button',
      title: label === title ? title : `${label}: ${title.toLowerCase()}`,
      data: { action },
      attrs: { type: 'button', 'aria-label': label }
    },
    text
  );
  node.addEventListener('click', event => {
    // The row itself opens the log; a button does only its own thing.
    event.stopPropagation();
    onClick();
  });
  return node;
}

/** Change a text only when it differs, so an unchanged row causes no DOM mutation. */
export function setText(node: Element, text: string): void {
  if (node.textContent !== text) {
    node.textContent = text;
  }
}


/** When a schedule runs next: "next run in 3m", or "next run now" once it is due. */
export function nextRunWords(at: number, now: number): string {
  const seconds = at - now;
  return seconds <= 0 ? 'next run now' : `next run in ${formatDuration(seconds)}`;
}
