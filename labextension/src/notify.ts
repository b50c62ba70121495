/**
 * Notifications when your jobs finish, grouped so that a sweep brings one message, not fifty.
 */
import { Notification } from '@jupyterlab/apputils';

import { IJob } from './api';
import { formatDuration, ranFor } from './format';

/** How long a message stays up when nothing failed. */
const SUCCESS_AUTOCLOSE_MS = 8000;
/** Names listed in a grouped message before "…". */
const NAMES_SHOWN = 3;

/**
 * Collects finished jobs into one notification while they keep finishing.
 *
 * A job that ends within `groupWindow` seconds of the previous one joins its notification,
 * which then reads "10 jobs finished: 9 done, 1 failed"; a job that ends later, or after the
 * user dismissed the message, starts a new one. Failures never pile up: while a message that
 * tells of a failure is still there, every later end joins it ("4 jobs failed: sweep[0],
 * sweep[1], sweep[2], …"), updated in place, so the notebook holds at most one of them.
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
    if (group && (now - group.lastAt <= this.groupWindow * 1000 || failures(group.jobs).length)) {
      const joined = [...group.jobs, ...jobs];
      // Fails when the user closed the message in the meantime: then a new one starts.
      if (Notification.update({ id: group.id, ...this._content(joined) })) {
        group.jobs = joined;
        group.lastAt = now;
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
    const failed = failures(jobs);
    const type = failed.length ? 'error' : 'success';
    // One message that tells of failures stays until dismissed; later ones join it.
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
    const actions: Notification.IAction[] = [{ label: 'Show jobs', callback: this._showJobs }];
    if (failed.length === 1) {
      const job = failed[0];
      actions.push({ label: `Show log of ${job.name}`, callback: () => this._openLog(job.id) });
    }
    let message: string;
    if (!failed.length) {
      message = `${jobs.length} jobs finished: ${done} done`;
    } else if (!done) {
      message = `${failed.length} jobs failed: ${names(failed)}`;
    } else {
      const counts = `${done} done, ${failed.length} failed`;
      message = `${jobs.length} jobs finished: ${counts}: ${names(failed)}`;
    }
    return { message, type, autoClose, actions };
  }

  private _openLog: (id: string) => void;
  private _showJobs: () => void;
  private _group: { id: string; jobs: IJob[]; lastAt: number } | null = null;
}

function failures(jobs: IJob[]): IJob[] {
  return jobs.filter(job => job.state !== 'succeeded');
}

/** "sweep[0], sweep[1], sweep[2], …": the first few names, newest last. */
function names(jobs: IJob[]): string {
  const shown = jobs.slice(0, NAMES_SHOWN).map(job => job.name);
  return jobs.length > NAMES_SHOWN ? `${shown.join(', ')}, …` : shown.join(', ');
}

export namespace FinishNotifier {
  export interface IOptions {
    openLog: (id: string) => void;
    /** Open the sidebar with its recent jobs. */
    showJobs: () => void;
  }
}
