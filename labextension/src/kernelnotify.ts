/**
 * Notifications about GPU kernels (docs/kernels.md): a wait in line for a GPU, a reclaim to
 * come, and one done.
 *
 * A GPU kernel waits for its lease before it starts; all the notebook shows meanwhile is
 * "Initializing". So while one of the user's kernel leases is queued, a notification says
 * where it is in line, why it waits and when it should start (updated as that changes), and
 * the lease's row in the sidebar is brought into view once; when the GPU is granted the
 * notification says so and goes.
 *
 * A GPU kernel's lease reports, as its job's progress, `reclaim_at` (epoch seconds) while it
 * warned that the kernel is idle and work waits for its GPUs, and `reclaimed` once the kernel
 * was shut down for that. Each warning is shown once and withdrawn when the lease withdraws
 * it (a cell ran, or nothing waits any more).
 */
import { Notification } from '@jupyterlab/apputils';

import { IJob } from './api';
import { stateWords } from './format';

export class KernelNotifier {
  /** `showRow(jobId)`: open the sidebar with the job's row in view. */
  constructor(options: { showRow?: (jobId: string) => void } = {}) {
    this._showRow = options.showRow;
  }

  /** Look at the jobs of one poll of the model (`user`: whose notifications these are). */
  look(user: string | undefined, active: IJob[], recent: IJob[]): void {
    if (!user) {
      return;
    }
    this._lookAtWaits(user, active);
    const warned = new Set<string>();
    for (const job of active) {
      if (job.kind !== 'kernel' || job.owner !== user || job.state !== 'running') {
        continue;
      }
      const reclaimAt = Number(job.progress?.metrics?.reclaim_at ?? 0);
      if (!reclaimAt) {
        continue;
      }
      warned.add(job.id);
      if (this._warnings.get(job.id)?.at !== reclaimAt) {
        this._dismiss(job.id);
        const minutes = Math.max(0, Math.round((reclaimAt - Date.now() / 1000) / 60));
        const when = minutes < 1 ? 'in under a minute' : `in ${minutes} min`;
        const id = Notification.warning(
          `${kernelLabel(job)} is idle while other work waits for GPUs: its GPU goes to the ` +
            `queue ${when} unless a cell runs`,
          { autoClose: false }
        );
        this._warnings.set(job.id, { id, at: reclaimAt });
      }
    }
    for (const job of recent) {
      if (job.kind !== 'kernel' || job.owner !== user || this._reclaimed.has(job.id)) {
        continue;
      }
      if (Number(job.progress?.metrics?.reclaimed ?? 0) && this._seen.has(job.id)) {
        this._reclaimed.add(job.id);
        const message =
          `${kernelLabel(job)} was shut down: it was idle while other work waited, so its GPU ` +
          'went to the queue. Start a new kernel to wait for a GPU again.';
        // the warning's message becomes the notice, so one message tells the whole story
        const warning = this._warnings.get(job.id);
        this._warnings.delete(job.id);
        const updated =
          warning !== undefined &&
          Notification.update({ id: warning.id, message, type: 'warning', autoClose: false });
        if (!updated) {
          Notification.warning(message, { autoClose: false });
        }
      }
    }
    for (const id of [...this._warnings.keys()]) {
      if (!warned.has(id)) {
        this._dismiss(id);
      }
    }
    // Only kernels seen running are announced as reclaimed (not old ones at page load).
    this._seen = new Set(active.filter(j => j.kind === 'kernel').map(j => j.id));
    for (const id of this._reclaimed) {
      this._seen.add(id);
    }
  }

  /** A notification for each of the user's GPU kernels waiting for a GPU. */
  private _lookAtWaits(user: string, active: IJob[]): void {
    const now = Date.now() / 1000;
    const waiting = new Set<string>();
    for (const job of active) {
      if (job.kind !== 'kernel' || job.owner !== user || job.state !== 'queued') {
        continue;
      }
      waiting.add(job.id);
      const message = waitMessage(job, now);
      const shown = this._waits.get(job.id);
      if (shown?.message === message) {
        continue;
      }
      const actions = this._showRow
        ? [{ label: 'Show in the queue', callback: () => this._showRow?.(job.id) }]
        : [];
      if (shown && Notification.update({ id: shown.id, message, actions, autoClose: false })) {
        shown.message = message;
        continue;
      }
      const id = Notification.emit(message, 'in-progress', { autoClose: false, actions });
      this._waits.set(job.id, { id, message });
      if (!shown) {
        this._showRow?.(job.id); // once, when the wait is first seen
      }
    }
    for (const [jobId, shown] of [...this._waits]) {
      if (waiting.has(jobId)) {
        continue;
      }
      this._waits.delete(jobId);
      const job = active.find(j => j.id === jobId);
      if (job?.state === 'running') {
        Notification.update({
          id: shown.id,
          message: `${kernelLabel(job)} got its GPU: the kernel starts`,
          type: 'success',
          actions: [],
          autoClose: 5000
        });
      } else {
        Notification.dismiss(shown.id); // cancelled: the kernel's start fails with the reason
      }
    }
  }

  private _dismiss(jobId: string): void {
    const warning = this._warnings.get(jobId);
    if (warning) {
      Notification.dismiss(warning.id);
      this._warnings.delete(jobId);
    }
  }

  private _showRow: ((jobId: string) => void) | undefined;
  private _waits = new Map<string, { id: string; message: string }>();
  private _warnings = new Map<string, { id: string; at: number }>();
  private _reclaimed = new Set<string>();
  private _seen = new Set<string>();
}

/** "The kernel of sweep.ipynb" from a lease named "kernel · sweep.ipynb". */
function kernelLabel(job: IJob): string {
  const label = job.name.replace(/^kernel · /, '');
  return `The GPU kernel of ${label}`;
}

/** "The GPU kernel of train.ipynb has not started: #3 in line · waiting for 1 GPU · …". */
export function waitMessage(job: IJob, now: number): string {
  const detail = stateWords(job, now).replace(/^queued( · )?/, '');
  return detail
    ? `${kernelLabel(job)} has not started: ${detail}`
    : `${kernelLabel(job)} has not started: it waits in line for its GPUs`;
}
