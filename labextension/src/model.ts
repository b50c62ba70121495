/**
 * The sidebar's model: polls the REST API politely and keeps what the views draw.
 *
 * Views never fetch; they listen to `changed` and read the model.
 */
import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import {
  ICache,
  IJob,
  IJobPage,
  IMetrics,
  IPool,
  IStatus,
  jobPath,
  query,
  requestAPI,
  ServerPartMissing
} from './api';
import { isFinished } from './format';
import { runAgain } from './steer';

/** Points kept per GPU for the sparkline. */
const HISTORY_LENGTH = 60;
/** Finished jobs shown under "recent". */
const RECENT_LIMIT = 20;
/** Seconds a job's end may precede the previous look and still count as new. */
const LOOK_MARGIN_S = 5;

export type Connection = 'connecting' | 'ok' | 'missing' | 'unreachable';

export class SchedulerModel {
  constructor(options: SchedulerModel.IOptions = {}) {
    this._poll = new Poll({
      auto: options.auto ?? true,
      factory: () => this.refresh(),
      frequency: {
        interval: options.interval ?? 2000,
        backoff: true,
        max: 60 * 1000
      },
      name: 'jupyter-dlsched:model',
      standby: 'when-hidden'
    });
  }

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** Jobs owned by this user that reached a final state since the previous look (never empty). */
  get jobsFinished(): ISignal<this, IJob[]> {
    return this._jobsFinished;
  }

  get connection(): Connection {
    return this._connection;
  }
  get error(): string {
    return this._error;
  }
  get status(): IStatus | null {
    return this._status;
  }
  get pool(): IPool | null {
    return this._pool;
  }
  /** Queued, running and preempted jobs, in the order the server gives. */
  get active(): IJob[] {
    return this._active;
  }
  get recent(): IJob[] {
    return this._recent;
  }
  /** The stage-in cache; null until the server has told (or when it cannot). */
  get cache(): ICache | null {
    return this._cache;
  }
  /** Utilisation history (0..100) per GPU index, oldest first. */
  history(index: number): number[] {
    return this._history.get(index) ?? [];
  }
  get cpuHistory(): number[] {
    return this._cpuHistory;
  }

  /** Poll now rather than at the next tick (after a user action). */
  refreshSoon(): Promise<void> {
    return this._poll.refresh();
  }

  async refresh(): Promise<void> {
    try {
      // The cache is an extra: a server without it (an older one) still shows everything else.
      const cache = requestAPI<ICache>('cache').catch(() => null);
      const [status, pool, active, recent] = await Promise.all([
        requestAPI<IStatus>('status'),
        requestAPI<IPool>('pool'),
        requestAPI<IJobPage>(`jobs${query({ state: 'running,queued,preempted', limit: 200, order: 'queue' })}`),
        requestAPI<IJobPage>(
          `jobs${query({ state: 'succeeded,failed,cancelled,timeout,lost', limit: RECENT_LIMIT })}`
        )
      ]);
      if (this._connection !== 'ok' && this._history.size === 0) {
        await this._seedHistory();
      }
      this._status = status;
      this._pool = pool;
      this._record(pool);
      this._notifyTransitions(status, active.jobs, recent.jobs);
      this._active = active.jobs;
      this._recent = recent.jobs;
      this._cache = await cache;
      this._connection = 'ok';
      this._error = '';
      this._changed.emit();
    } catch (error) {
      this._connection = error instanceof ServerPartMissing ? 'missing' : 'unreachable';
      this._error = error instanceof Error ? error.message : String(error);
      this._changed.emit();
      // Rejecting makes the Poll back off until the server answers again.
      throw error;
    }
  }

  async cancel(id: string): Promise<IJob> {
    const job = await requestAPI<IJob>(jobPath(id, '/cancel'), { method: 'POST' });
    void this.refreshSoon();
    return job;
  }

  /** "Run again": a new job with the same spec as the ended job `id` (see steer.ts). */
  async runAgain(id: string): Promise<IJob> {
    const job = await runAgain(id);
    void this.refreshSoon();
    return job;
  }

  async setPriority(id: string, priority: number): Promise<IJob> {
    const job = await requestAPI<IJob>(jobPath(id), {
      method: 'PATCH',
      body: JSON.stringify({ priority })
    });
    void this.refreshSoon();
    return job;
  }

  dispose(): void {
    this._poll.dispose();
    Signal.clearData(this);
  }

  private async _seedHistory(): Promise<void> {
    const until = Date.now() / 1000;
    try {
      const metrics = await requestAPI<IMetrics>(
        `metrics${query({ since: until - 300, until, source: 'gpu' })}`
      );
      for (const sample of metrics.samples) {
        const index = Number(sample.source.split(':')[1]);
        if (Number.isInteger(index) && sample.util !== null) {
          this._push(index, sample.util);
        }
      }
    } catch {
      // History is a nicety; the live points fill the sparkline soon enough.
    }
  }

  private _record(pool: IPool): void {
    for (const gpu of pool.gpus) {
      this._push(gpu.index, gpu.util ?? 0);
    }
    this._cpuHistory.push(pool.cpus.percent);
    if (this._cpuHistory.length > HISTORY_LENGTH) {
      this._cpuHistory.shift();
    }
  }

  private _push(index: number, value: number): void {
    let series = this._history.get(index);
    if (!series) {
      series = [];
      this._history.set(index, series);
    }
    series.push(value);
    if (series.length > HISTORY_LENGTH) {
      series.shift();
    }
  }

  private _notifyTransitions(status: IStatus, active: IJob[], recent: IJob[]): void {
    const firstLook = !this._looked;
    this._looked = true;
    // Server time of the previous look, so clocks of browser and server never get compared.
    const since = this._lastLookAt;
    this._lastLookAt = status.time ?? null;
    const seen = new Map<string, string>();
    const finished: IJob[] = [];
    for (const job of [...active, ...recent]) {
      seen.set(job.id, job.state);
      if (firstLook || job.owner !== status.user || !isFinished(job.state)) {
        continue;
      }
      if (job.state === 'cancelled') {
        continue;
      }
      const before = this._lastStates.get(job.id);
      // A quick job can be submitted and end between two looks; it is new if it ended after the
      // previous look (with a margin for the answers of one look being read at slightly
      // different moments).
      const endedSinceLastLook =
        before === undefined &&
        since !== null &&
        job.finished !== null &&
        job.finished >= since - LOOK_MARGIN_S;
      if ((before !== undefined && !isFinished(before as IJob['state'])) || endedSinceLastLook) {
        finished.push(job);
      }
    }
    if (finished.length) {
      // One signal per look: jobs that ended together are announced together.
      this._jobsFinished.emit(finished);
    }
    // Jobs we watched that left both lists (more than RECENT_LIMIT finished at once) are
    // forgotten; remembering only what is visible keeps this map bounded.
    this._lastStates = seen;
  }

  private _poll: Poll;
  private _changed = new Signal<this, void>(this);
  private _jobsFinished = new Signal<this, IJob[]>(this);
  private _connection: Connection = 'connecting';
  private _error = '';
  private _status: IStatus | null = null;
  private _pool: IPool | null = null;
  private _active: IJob[] = [];
  private _recent: IJob[] = [];
  private _cache: ICache | null = null;
  private _history = new Map<number, number[]>();
  private _cpuHistory: number[] = [];
  private _lastStates = new Map<string, string>();
  private _looked = false;
  private _lastLookAt: number | null = null;
}

export namespace SchedulerModel {
  export interface IOptions {
    /** Milliseconds between polls while all is well. */
    interval?: number;
    auto?: boolean;
  }
}
