/**
 * The left-sidebar panel: GPU cards, CPU/RAM, the queue and recent jobs.
 *
 * The panel is built once; each poll patches it. Job rows are kept by id and only their texts
 * change, so a focused button or a hovered row survives the next poll.
 */
import { showErrorMessage } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import { ICache, IGpu, IJob, IPool } from './api';
import { bar, h, sparkline } from './dom';
import { cacheCounts, cacheUsed, formatBytes, nextPriority, ownerText } from './format';
import { JobList, JobRow, setText } from './joblist';
import { SchedulerModel } from './model';
import { confirmCancel } from './steer';

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
      bump: (job, direction) => void this._bump(job, direction),
      runAgain: job => void this._runAgain(job),
      openNotebook: options.openNotebook
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

  /** Bring a job's row into view (a waiting GPU kernel's lease, say). */
  showJob(jobId: string): void {
    const row = this.node.querySelector<HTMLElement>(
      `.jp-dlsched-job[data-job-id="${CSS.escape(jobId)}"]`
    );
    row?.scrollIntoView({ block: 'nearest' });
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
      const users = [...new Set(outside.map(p => p.user || 'unknown user'))].sort();
      list.appendChild(
        h(
          'li',
          {
            className: 'jp-dlsched-muted',
            title: outside
              .map(p => `${p.user || '?'} · pid ${p.pid} · ${p.command || '?'} · ${formatBytes(p.used_mem)}`)
              .join('\n')
          },
          `${outside.length} process${outside.length > 1 ? 'es' : ''} outside the scheduler · ${formatBytes(mem)} · ${users.join(', ')}`
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
      ...this._cacheShare(cache),
      h(
        'div',
        { className: 'jp-dlsched-cache-counts jp-dlsched-muted', title },
        `data cache · ${cacheCounts(cache)}`
      )
    ];
  }

  /** In a shared pool with a share per user: "yours ███░░ 1 MiB / 1.5 MiB". */
  private _cacheShare(cache: ICache): HTMLElement[] {
    const share = cache.user_max_bytes;
    if (typeof share !== 'number') {
      return [];
    }
    const mine = cache.user_bytes ?? 0;
    return [
      h(
        'div',
        {
          className: 'jp-dlsched-row jp-dlsched-cache-share',
          title: 'your share of the data cache (max_cache_bytes in the service\'s configuration)'
        },
        h('span', { className: 'jp-dlsched-label' }, 'yours'),
        bar(share ? mine / share : 0),
        h('span', { className: 'jp-dlsched-value' }, `${formatBytes(mine)} / ${formatBytes(share)}`)
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
    if (!(await confirmCancel(job))) {
      return;
    }
    try {
      await this._model.cancel(job.id);
    } catch (error) {
      void showErrorMessage('Could not cancel the job', String((error as Error).message ?? error));
    }
  }

  /** Queue an ended job again; its new row appears in the queue, scrolled into view. */
  private async _runAgain(job: IJob): Promise<void> {
    let fresh: IJob;
    try {
      fresh = await this._model.runAgain(job.id);
    } catch (error) {
      void showErrorMessage(
        `Could not run job ${job.id} again`,
        String((error as Error).message ?? error)
      );
      return;
    }
    await this._model.refreshSoon();
    const row = this._queue.node.querySelector<HTMLElement>(
      `.jp-dlsched-job[data-job-id="${CSS.escape(fresh.id)}"]`
    );
    row?.scrollIntoView({ block: 'nearest' });
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

export namespace SchedulerSidebar {
  export interface IOptions {
    model: SchedulerModel;
    openLog: (id: string) => void;
    /** Open a notebook job's executed copy (by its path in the server's folder). */
    openNotebook?: (path: string) => void;
  }
}
