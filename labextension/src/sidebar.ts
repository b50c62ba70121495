/**
 * The left-sidebar panel: GPU cards, CPU/RAM, the queue and recent jobs.
 *
 * The panel is built once; each poll patches it. Job rows are kept by id and only their texts
 * change, so a focused button or a hovered row survives the next poll.
 */
import { Dialog, showDialog, showErrorMessage } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import { ICache, IGpu, IJob, IPool } from './api';
import { bar, h, sparkline } from './dom';
import {
  cacheCounts,
  cacheUsed,
  formatBytes,
  formatDuration,
  isFinished,
  lastMetric,
  nextPriority,
  ownerText,
  priorityText,
  progressFraction,
  ranFor,
  requestText,
  stateChip,
  stateDetail,
  stateTone,
  stateWords,
  usageWords,
  waitedFor
} from './format';
import { SchedulerModel } from './model';

export class SchedulerSidebar extends Widget {
  constructor(options: SchedulerSidebar.IOptions) {
    super();
    this._model = options.model;
    this._openLog = options.openLog;
    this.addClass('jp-dlsched-sidebar');
    this.id = 'jupyter-dlsched-sidebar';
    this.title.caption = 'GPU job scheduler';

    const actions: JobRow.IActions = {
      openLog: id => this._openLog(id),
      cancel: job => void this._cancel(job),
      bump: (job, direction) => void this._bump(job, direction)
    };
    this._queue = new JobList(actions, true, 'Nothing queued or running.');
    this._recent = new JobList(actions, false, 'No finished jobs yet.');
    // In a pool shared by the machine's users: everyone's jobs, or only mine
    this._filter = h(
      'span',
      { className: 'jp-dlsched-filter', attrs: { role: 'group', 'aria-label': 'Show' } },
      filterButton('everyone', 'Everyone’s jobs', () => this._showMine(false)),
      filterButton('mine', 'Only my jobs', () => this._showMine(true))
    );
    this._filter.hidden = true;
    this._queueTitle = h('h3', {}, h('span', {}), this._filter);
    this._markFilter();
    this._queueBox = h(
      'section',
      { className: 'jp-dlsched-section jp-dlsched-queue' },
      this._queueTitle,
      this._queue.node
    );
    this._recentTitle = h('summary', {});
    this._recentBox = h(
      'details',
      { className: 'jp-dlsched-section jp-dlsched-recent' },
      this._recentTitle,
      this._recent.node
    );
    this.node.append(
      this._header,
      this._messageBox,
      this._gpuBox,
      this._hostBox,
      this._queueBox,
      this._recentBox
    );
    this._model.changed.connect(this._render, this);
    this._render();
  }

  dispose(): void {
    this._model.changed.disconnect(this._render, this);
    super.dispose();
  }

  /** Unfold "recent", where jobs that just finished are listed. */
  showRecent(): void {
    this._recentBox.open = true;
  }

  private _render(): void {
    const model = this._model;
    const now = Date.now() / 1000;

    const status = model.status;
    this._header.replaceChildren(h('h2', {}, 'GPU scheduler'));
    if (status) {
      this._header.appendChild(
        h(
          'span',
          { className: 'jp-dlsched-muted' },
          `policy ${status.policy} · you are ${status.user}` +
            (status.shared ? ' · a pool shared by every user of this machine' : '')
        )
      );
    }

    // Redrawn only when it changes: an alert that is re-created is read out again.
    const messageKey = model.connection === 'ok' ? '' : `${model.connection}\n${model.error}`;
    if (messageKey !== this._messageKey) {
      this._messageKey = messageKey;
      this._messageBox.replaceChildren(...(messageKey ? [this._message()] : []));
    }
    // Unreachable after a first answer: keep showing the last known state under the warning.
    const showData =
      model.connection === 'ok' || (model.connection === 'unreachable' && model.pool !== null);
    for (const part of [this._gpuBox, this._hostBox, this._queueBox, this._recentBox]) {
      part.hidden = !showData;
    }
    if (!showData) {
      return;
    }

    if (model.pool) {
      this._gpuBox.replaceChildren(...this._gpus(model.pool, model.active));
      this._hostBox.replaceChildren(...this._host(model.pool));
    }
    const user = status?.user ?? '';
    const admin = status?.admin !== false;
    const mine = (job: IJob): boolean => admin || job.owner === user;
    this._filter.hidden = !status?.shared;
    const shown = (jobs: IJob[]): IJob[] =>
      status?.shared && this._onlyMine ? jobs.filter(job => job.owner === user) : jobs;
    const active = shown(model.active);
    const recent = shown(model.recent);
    setText(this._queueTitle.firstChild as Element, `Queue (${active.length})`);
    this._queue.update(active, now, mine);
    this._recentTitle.textContent = `recent (${recent.length})`;
    this._recent.update(recent, now, mine);
  }

  private _message(): HTMLElement {
    const model = this._model;
    if (model.connection === 'connecting') {
      return h('p', { className: 'jp-dlsched-message' }, 'Connecting to the scheduler…');
    }
    const title =
      model.connection === 'missing'
        ? 'The scheduler server extension is missing'
        : 'The scheduler is unreachable; retrying with back-off';
    return h(
      'div',
      { className: 'jp-dlsched-message jp-dlsched-message-error', attrs: { role: 'alert' } },
      h('strong', {}, title),
      h('p', {}, model.error)
    );
  }

  private _gpus(pool: IPool, active: IJob[]): HTMLElement[] {
    const parts: HTMLElement[] = [h('h3', {}, `GPUs (${pool.gpus.length})`)];
    if (!pool.gpus.length) {
      parts.push(
        h(
          'p',
          { className: 'jp-dlsched-muted' },
          pool.gpu_error ? `No GPUs: ${pool.gpu_error}` : 'No GPUs on this machine.'
        )
      );
    }
    const byId = new Map(active.map(job => [job.id, job]));
    for (const gpu of pool.gpus) {
      parts.push(this._gpuCard(gpu, byId));
    }
    return parts;
  }

  private _gpuCard(gpu: IGpu, jobs: Map<string, IJob>): HTMLElement {
    const util = gpu.util ?? 0;
    const memFraction = gpu.mem_total ? gpu.mem_used / gpu.mem_total : 0;
    const card = h(
      'div',
      { className: 'jp-dlsched-gpu', data: { index: String(gpu.index) } },
      h(
        'div',
        { className: 'jp-dlsched-gpu-title' },
        h('strong', {}, `GPU ${gpu.index}`),
        h('span', { className: 'jp-dlsched-muted' }, `${gpu.name} · ${formatBytes(gpu.mem_total)}`),
        gpu.simulated
          ? h(
              'span',
              {
                className: 'jp-dlsched-badge',
                title: 'A simulated GPU (DLSCHED_SIMULATE_GPUS); no real device behind it'
              },
              'simulated'
            )
          : null
      ),
      // a simulated GPU has nothing to measure: it shows what was allocated, labelled so
      gpu.simulated
        ? h(
            'div',
            { className: 'jp-dlsched-row jp-dlsched-muted' },
            h('span', { className: 'jp-dlsched-label' }, 'util'),
            h('span', { className: 'jp-dlsched-value' }, 'not measured (simulated)')
          )
        : h(
            'div',
            { className: 'jp-dlsched-row' },
            h('span', { className: 'jp-dlsched-label' }, 'util'),
            sparkline(this._model.history(gpu.index)),
            h(
              'span',
              { className: 'jp-dlsched-value' },
              gpu.util === null ? '–' : `${Math.round(util)}%`
            )
          ),
      h(
        'div',
        { className: 'jp-dlsched-row' },
        gpu.simulated
          ? h(
              'span',
              {
                className: 'jp-dlsched-label',
                title: 'GPU memory allocated to jobs (a simulated GPU is not measured)'
              },
              'alloc'
            )
          : h('span', { className: 'jp-dlsched-label' }, 'mem'),
        bar(memFraction, memFraction > 0.9 && !gpu.simulated ? 'jp-dlsched-bar-hot' : ''),
        h(
          'span',
          { className: 'jp-dlsched-value' },
          `${formatBytes(gpu.mem_used)} / ${formatBytes(gpu.mem_total)}`
        )
      )
    );
    const list = h('ul', { className: 'jp-dlsched-gpu-jobs' });
    for (const id of gpu.jobs) {
      const job = jobs.get(id);
      const used = gpu.processes
        .filter(p => p.job_id === id)
        .reduce((sum, p) => sum + p.used_mem, 0);
      // "1 GPU · 40 GiB": what the job holds here (granted memory; in use when NVML says)
      const slot = job ? job.devices.indexOf(gpu.index) : -1;
      const granted = job && slot >= 0 ? job.gpu_mem_granted?.[slot] : undefined;
      const holds = [
        job ? `${job.request.gpus} GPU` : '',
        granted ? formatBytes(granted) : '',
        used ? `${formatBytes(used)} in use` : ''
      ].filter(Boolean);
      list.appendChild(
        h(
          'li',
          {
            className: 'jp-dlsched-link',
            // the full notebook path here, where the line itself shows only its file name
            title: [
              job ? `${job.name} (${[job.owner, job.origin].filter(Boolean).join(' · ')})` : id,
              ...holds,
              'click for the log'
            ].join(' · '),
            onClick: () => this._openLog(id)
          },
          h('span', {}, job ? job.name : id),
          job ? h('span', { className: 'jp-dlsched-muted' }, ` (${ownerText(job)})`) : null,
          h('span', { className: 'jp-dlsched-muted' }, holds.length ? ` · ${holds.join(' · ')}` : '')
        )
      );
    }
    const outside = gpu.processes.filter(p => !p.job_id);
    if (outside.length) {
      const mem = outside.reduce((sum, p) => sum + p.used_mem, 0);
      list.appendChild(
        h(
          'li',
          { className: 'jp-dlsched-muted' },
          `${outside.length} process${outside.length > 1 ? 'es' : ''} outside the scheduler · ${formatBytes(mem)}`
        )
      );
    }
    if (list.childElementCount) {
      card.appendChild(list);
    }
    return card;
  }

  private _host(pool: IPool): HTMLElement[] {
    const mem = pool.memory;
    const cache = this._model.cache;
    return [
      h(
        'div',
        { className: 'jp-dlsched-row' },
        h('span', { className: 'jp-dlsched-label' }, 'CPU'),
        sparkline(this._model.cpuHistory),
        h(
          'span',
          { className: 'jp-dlsched-value' },
          `${Math.round(pool.cpus.percent)}% of ${pool.cpus.count}`
        )
      ),
      h(
        'div',
        { className: 'jp-dlsched-row' },
        h('span', { className: 'jp-dlsched-label' }, 'RAM'),
        bar(mem.total ? mem.used / mem.total : 0),
        h('span', { className: 'jp-dlsched-value' }, `${formatBytes(mem.used)} / ${formatBytes(mem.total)}`)
      ),
      // Only once something was staged: a pool that never stages has no use for the line.
      ...(cacheUsed(cache) ? this._cache(cache) : [])
    ];
  }

  /** "data ███░░ 1.2 GiB / 50 GiB" and "data cache · 3 entries · 12 hits · staging 1". */
  private _cache(cache: ICache): HTMLElement[] {
    const cap = cache.max_bytes;
    const staging = cache.staging.map(item => {
      const done = item.total_bytes
        ? `${Math.round((100 * item.done_bytes) / item.total_bytes)} %`
        : formatBytes(item.done_bytes);
      return `staging ${item.source}: ${done}`;
    });
    const title = [
      `stage-in cache in ${cache.folder}`,
      `${formatBytes(cache.bytes)} of ${cap === null ? 'an unknown cap' : formatBytes(cap)}`,
      `${cache.entries} entries (${cache.in_use} in use by unfinished jobs)`,
      `${cache.hits} hits, ${cache.misses} misses, ${cache.evictions} evictions`,
      ...staging
    ].join('\n');
    return [
      h(
        'div',
        { className: 'jp-dlsched-row jp-dlsched-cache', title },
        h('span', { className: 'jp-dlsched-label' }, 'data'),
        bar(cap ? cache.bytes / cap : 0),
        h(
          'span',
          { className: 'jp-dlsched-value' },
          `${formatBytes(cache.bytes)} / ${cap === null ? '–' : formatBytes(cap)}`
        )
      ),
      h(
        'div',
        { className: 'jp-dlsched-cache-counts jp-dlsched-muted', title },
        `data cache · ${cacheCounts(cache)}`
      )
    ];
  }

  private _showMine(onlyMine: boolean): void {
    this._onlyMine = onlyMine;
    this._markFilter();
    this._render();
  }

  private _markFilter(): void {
    for (const node of Array.from(this._filter.children) as HTMLElement[]) {
      const pressed = (node.dataset.show === 'mine') === this._onlyMine;
      node.setAttribute('aria-pressed', String(pressed));
    }
  }

  private async _cancel(job: IJob): Promise<void> {
    const result = await showDialog({
      title: `Cancel job ${job.id}?`,
      body: `${job.name} (${job.state}) will be stopped and will not be retried.`,
      buttons: [
        Dialog.cancelButton({ label: 'Keep it' }),
        Dialog.warnButton({ label: 'Cancel job' })
      ]
    });
    if (!result.button.accept) {
      return;
    }
    try {
      await this._model.cancel(job.id);
    } catch (error) {
      void showErrorMessage('Could not cancel the job', String((error as Error).message ?? error));
    }
  }

  private async _bump(job: IJob, direction: 1 | -1): Promise<void> {
    try {
      await this._model.setPriority(job.id, nextPriority(job.priority, direction));
    } catch (error) {
      void showErrorMessage(
        'Could not change the priority',
        String((error as Error).message ?? error)
      );
    }
  }

  private _model: SchedulerModel;
  private _openLog: (id: string) => void;
  private _header = h('header', { className: 'jp-dlsched-header' });
  private _messageBox = h('div', {});
  private _messageKey = '';
  private _gpuBox = h('section', { className: 'jp-dlsched-section jp-dlsched-gpus' });
  private _hostBox = h('section', { className: 'jp-dlsched-section jp-dlsched-host' });
  private _queue: JobList;
  private _queueBox: HTMLElement;
  private _queueTitle: HTMLElement;
  private _recent: JobList;
  private _recentTitle: HTMLElement;
  private _recentBox: HTMLDetailsElement;
  private _filter: HTMLElement;
  private _onlyMine = false;
}

function filterButton(text: string, title: string, onClick: () => void): HTMLButtonElement {
  const node = h(
    'button',
    {
      className: 'jp-dlsched-button jp-dlsched-filter-button',
      title,
      data: { show: text },
      attrs: { type: 'button', 'aria-pressed': 'false' }
    },
    text
  );
  node.addEventListener('click', event => {
    event.stopPropagation();
    onClick();
  });
  return node;
}

/** A list of job rows kept by id: rows are patched in place and moved only when out of order. */
class JobList {
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
class JobRow {
  constructor(actions: JobRow.IActions, active: boolean) {
    this._actions = actions;
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
    }
    this._log = button('log', 'Open the log', 'log', () =>
      this._actions.openLog(this._job!.id)
    );
    buttons.append(this._log);
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
      const step = job.progress ? `step ${job.progress.done}` : '';
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
      ['metric', lastMetric(job), 'the last metric reported with dls.progress']
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
  private _job: IJob | null = null;
  private _mine = true;
  private _steering: HTMLButtonElement[] = [];
  private _log: HTMLButtonElement;
  private _chip: HTMLElement;
  private _name: HTMLButtonElement;
  private _progress: HTMLElement;
  private _meta: HTMLElement;
  private _metaParts = new Map<string, HTMLElement>();
  private _buttons: HTMLElement;
  private _why: HTMLElement;
  private _usage: HTMLElement;
}

namespace JobRow {
  export interface IActions {
    openLog: (id: string) => void;
    cancel: (job: IJob) => void;
    bump: (job: IJob, direction: 1 | -1) => void;
  }
}

function button(
  text: string,
  title: string,
  action: string,
  onClick: () => void
): HTMLButtonElement {
  const node = h(
    'button',
    {
      className: 'jp-dlsched-button',
      title,
      data: { action },
      attrs: { type: 'button', 'aria-label': title }
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
function setText(node: Element, text: string): void {
  if (node.textContent !== text) {
    node.textContent = text;
  }
}

export namespace SchedulerSidebar {
  export interface IOptions {
    model: SchedulerModel;
    openLog: (id: string) => void;
  }
}
