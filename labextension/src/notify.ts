/**
 * Notifications when your jobs finish, grouped so that a sweep brings one message, not fifty.
 */
import { Notification } from '@jupyterlab/apputils';

import { IJob } from './api';
import { formatDuration, ranFor } from './format';

/** How long a success message stays up; a failure stays until dismissed. */
const SUCCESS_AUTOCLOSE_MS = 8000;

/**
 * Collects finished jobs into one notification while they keep finishing.
 *
 * A job that ends within `groupWindow` seconds of the previous one joins its notification,
 * which then reads "10 jobs finished: 9 done, 1 failed"; a job that ends later, or after the
 * user dismissed the message, starts a new one.
 */
export class FinishNotifier {
  constructor(options: FinishNotifier.IOptions) {
    this._openLog = options.openLog;
    this._showJobs = options.showJobs;
  }

  /** Whether finishes are announced at all (the `notifyFinished` setting). */
  enabled = true;
  /** Seconds after a finish during which the next one joins the same notification. */
  groupWindow = 10;

  /** Announce jobs that finished together (one look of the model). */
  add(jobs: IJob[]): void {
    if (!this.enabled || !jobs.length) {
      return;
    }
    const now = Date.now();
    const group = this._group;
    if (group && now - group.lastAt <= this.groupWindow * 1000) {
      group.jobs.push(...jobs);
      group.lastAt = now;
      // Fails when the user closed the message in the meantime: then a new one starts.
      if (Notification.update({ id: group.id, ...this._content(group.jobs) })) {
        return;
      }
    }
    const content = this._content(jobs);
    const id = Notification.emit(content.message, content.type, {
      autoClose: content.autoClose,
      actions: content.actions
    });
    this._group = { id, jobs: [...jobs], lastAt: now };
  }

  private _content(jobs: IJob[]): {
    message: string;
    type: Notification.TypeOptions;
    autoClose: number | false;
    actions: Notification.IAction[];
  } {
    const failed = jobs.filter(job => job.state !== 'succeeded');
    const type = failed.length ? 'error' : 'success';
    const autoClose = failed.length ? false : SUCCESS_AUTOCLOSE_MS;
    if (jobs.length === 1) {
      const job = jobs[0];
      const ran = formatDuration(ranFor(job, job.finished ?? Date.now() / 1000), false);
      const message =
        job.state === 'succeeded'
          ? `Job ${job.name} (${job.id}) done in ${ran}`
          : `Job ${job.name} (${job.id}) failed: ${job.reason || job.state}`;
      return {
        message,
        type,
        autoClose,
        actions: [{ label: 'Show log', callback: () => this._openLog(job.id) }]
      };
    }
    const done = jobs.length - failed.length;
    const counts = [done ? `${done} done` : '', failed.length ? `${failed.length} failed` : '']
      .filter(Boolean)
      .join(', ');
    const actions: Notification.IAction[] = [{ label: 'Show jobs', callback: this._showJobs }];
    if (failed.length === 1) {
      const job = failed[0];
      actions.push({ label: `Show log of ${job.name}`, callback: () => this._openLog(job.id) });
    }
    return { message: `${jobs.length} jobs finished: ${counts}`, type, autoClose, actions };
  }

  private _openLog: (id: string) => void;
  private _showJobs: () => void;
  private _group: { id: string; jobs: IJob[]; lastAt: number } | null = null;
}

export namespace FinishNotifier {
  export interface IOptions {
    openLog: (id: string) => void;
    /** Open the sidebar with its recent jobs. */
    showJobs: () => void;
  }
}
