/**
 * The left-sidebar panel: GPU cards, CPU/RAM, the queue and recent jobs.
 */
import { Dialog, showDialog, showErrorMessage } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import { IGpu, IJob, IPool } from './api';
import { bar, h, sparkline } from './dom';
import {
  formatBytes,
  formatDuration,
  lastMetric,
  nextPriority,
  priorityText,
  progressFraction,
  ranFor,
  requestText,
  stateChip,
  stateDetail,
  stateTone,
  stateWords,
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
    this._model.changed.connect(this._render, this);
    this._render();
  }

  dispose(): void {
    this._model.changed.disconnect(this._render, this);
    super.dispose();
  }

  private _render(): void {
    const model = this._model;
    const now = Date.now() / 1000;
    const root = this.node;
    const scroll = root.querySelector('.jp-dlsched-queue-scroll');
    const scrollLeft = scroll ? scroll.scrollLeft : 0;
    root.replaceChildren();

    const status = model.status;
    root.appendChild(
      h(
        'header',
        { className: 'jp-dlsched-header' },
        h('h2', {}, 'GPU scheduler'),
        status
          ? h(
              'span',
              { className: 'jp-dlsched-muted' },
              `policy ${status.policy} · you are ${status.user}`
            )
          : null
      )
    );

    if (model.connection !== 'ok') {
      root.appendChild(this._message());
      if (model.connection !== 'unreachable' || !model.pool) {
        return;
      }
    }

    if (model.pool) {
      root.appendChild(this._gpus(model.pool, model.active));
      root.appendChild(this._host(model.pool));
    }

    root.appendChild(
      h(
        'section',
        { className: 'jp-dlsched-section jp-dlsched-queue' },
        h('h3', {}, `Queue (${model.active.length})`),
        model.active.length
          ? h(
              'div',
              { className: 'jp-dlsched-queue-scroll' },
              this._table(model.active, now, true)
            )
          : h('p', { className: 'jp-dlsched-muted' }, 'Nothing queued or running.')
      )
    );

    const recent = h(
      'details',
      { className: 'jp-dlsched-section jp-dlsched-recent' },
      h('summary', {}, `recent (${model.recent.length})`),
      model.recent.length
        ? h('div', { className: 'jp-dlsched-queue-scroll' }, this._table(model.recent, now, false))
        : h('p', { className: 'jp-dlsched-muted' }, 'No finished jobs yet.')
    );
    recent.open = this._recentOpen;
    recent.addEventListener('toggle', () => {
      this._recentOpen = recent.open;
    });
    root.appendChild(recent);

    const newScroll = root.querySelector('.jp-dlsched-queue-scroll');
    if (newScroll) {
      newScroll.scrollLeft = scrollLeft;
    }
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

  private _gpus(pool: IPool, active: IJob[]): HTMLElement {
    const section = h(
      'section',
      { className: 'jp-dlsched-section jp-dlsched-gpus' },
      h('h3', {}, `GPUs (${pool.gpus.length})`)
    );
    if (!pool.gpus.length) {
      section.appendChild(
        h(
          'p',
          { className: 'jp-dlsched-muted' },
          pool.gpu_error ? `No GPUs: ${pool.gpu_error}` : 'No GPUs on this machine.'
        )
      );
    }
    const byId = new Map(active.map(job => [job.id, job]));
    for (const gpu of pool.gpus) {
      section.appendChild(this._gpuCard(gpu, byId));
    }
    return section;
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
      h(
        'div',
        { className: 'jp-dlsched-row' },
        h('span', { className: 'jp-dlsched-label' }, 'util'),
        sparkline(this._model.history(gpu.index)),
        h('span', { className: 'jp-dlsched-value' }, gpu.util === null ? '–' : `${Math.round(util)}%`)
      ),
      h(
        'div',
        { className: 'jp-dlsched-row' },
        h('span', { className: 'jp-dlsched-label' }, 'mem'),
        bar(memFraction, memFraction > 0.9 ? 'jp-dlsched-bar-hot' : ''),
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
            title: [job ? `${job.name} (${ownerText(job)})` : id, ...holds, 'click for the log'].join(
              ' · '
            ),
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

  private _host(pool: IPool): HTMLElement {
    const mem = pool.memory;
    return h(
      'section',
      { className: 'jp-dlsched-section jp-dlsched-host' },
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
      )
    );
  }

  private _table(jobs: IJob[], now: number, active: boolean): HTMLTableElement {
    const head = h(
      'tr',
      {},
      ...['state', 'job', 'priority', 'request', 'waited', 'ran', 'progress'].map(text =>
        h('th', {}, text)
      ),
      h('th', { className: 'jp-dlsched-actions' }, '')
    );
    const body = h('tbody');
    for (const job of jobs) {
      body.appendChild(this._row(job, now, active));
    }
    return h('table', { className: 'jp-dlsched-table' }, h('thead', {}, head), body);
  }

  private _row(job: IJob, now: number, active: boolean): HTMLTableRowElement {
    const words = stateWords(job, now);
    const fraction = progressFraction(job);
    const metric = lastMetric(job);
    const actions = h('td', { className: 'jp-dlsched-actions' });
    if (active) {
      actions.appendChild(
        this._button('✕', `Cancel job ${job.id}`, 'cancel', () => void this._cancel(job))
      );
      actions.appendChild(
        this._button('↑', 'Raise priority', 'raise', () => void this._bump(job, 1))
      );
      actions.appendChild(
        this._button('↓', 'Lower priority', 'lower', () => void this._bump(job, -1))
      );
    }
    actions.appendChild(this._button('log', 'Open the log', 'log', () => this._openLog(job.id)));

    return h(
      'tr',
      {
        className: `jp-dlsched-job jp-dlsched-state-${stateTone(job.state)}`,
        data: { jobId: job.id, state: job.state },
        onClick: () => this._openLog(job.id)
      },
      h(
        'td',
        {},
        h(
          'span',
          { className: `jp-dlsched-chip jp-dlsched-chip-${stateTone(job.state)}`, title: words },
          stateChip(job.state)
        ),
        h('div', { className: 'jp-dlsched-why' }, stateDetail(job, now))
      ),
      h(
        'td',
        { className: 'jp-dlsched-job-cell' },
        h('div', { className: 'jp-dlsched-name', title: job.name }, job.name),
        h(
          'div',
          { className: 'jp-dlsched-muted' },
          h('span', { className: 'jp-dlsched-id' }, job.id),
          ` · ${ownerText(job)}`
        )
      ),
      h('td', {}, priorityText(job.priority)),
      h('td', {}, requestText(job)),
      h('td', {}, formatDuration(waitedFor(job, now), false)),
      h('td', {}, formatDuration(ranFor(job, now))),
      h(
        'td',
        {},
        fraction === null ? null : bar(fraction),
        h(
          'span',
          { className: 'jp-dlsched-muted' },
          [fraction === null ? '' : `${Math.round(fraction * 100)}%`, metric].filter(Boolean).join(' ')
        )
      ),
      actions
    );
  }

  private _button(
    text: string,
    title: string,
    action: string,
    onClick: () => void
  ): HTMLButtonElement {
    const button = h(
      'button',
      {
        className: 'jp-dlsched-button',
        title,
        data: { action },
        attrs: { type: 'button', 'aria-label': title }
      },
      text
    );
    button.addEventListener('click', event => {
      event.stopPropagation();
      onClick();
    });
    return button;
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
  private _recentOpen = false;
}

function ownerText(job: IJob): string {
  return job.origin ? `${job.owner} · ${job.origin}` : job.owner;
}

export namespace SchedulerSidebar {
  export interface IOptions {
    model: SchedulerModel;
    openLog: (id: string) => void;
  }
}
