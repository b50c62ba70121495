/**
 * Notifications about GPU kernels (docs/kernels.md): a reclaim to come, and one done.
 *
 * A GPU kernel's lease reports, as its job's progress, `reclaim_at` (epoch seconds) while it
 * warned that the kernel is idle and work waits for its GPUs, and `reclaimed` once the kernel
 * was shut down for that. Each warning is shown once and withdrawn when the lease withdraws
 * it (a cell ran, or nothing waits any more).
 */
import { Notification } from '@jupyterlab/apputils';

import { IJob } from './api';

export class KernelNotifier {
  /** Look at the jobs of one poll of the model (`user`: whose notifications these are). */
  look(user: string | undefined, active: IJob[], recent: IJob[]): void {
    if (!user) {
      return;
    }
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

  private _dismiss(jobId: string): void {
    const warning = this._warnings.get(jobId);
    if (warning) {
      Notification.dismiss(warning.id);
      this._warnings.delete(jobId);
    }
  }

  private _warnings = new Map<string, { id: string; at: number }>();
  private _reclaimed = new Set<string>();
  private _seen = new Set<string>();
}

/** "The kernel of sweep.ipynb" from a lease named "kernel · sweep.ipynb". */
function kernelLabel(job: IJob): string {
  const label = job.name.replace(/^kernel · /, '');
  return `The GPU kernel of ${label}`;
}
