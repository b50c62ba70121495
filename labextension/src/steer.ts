/**
 * Steering a job from any view, with the same words everywhere: the question before a cancel
 * (the notebook widgets ask it in their own bar, `jupyter_dlsched/widgets/format.py`), and
 * "Run again" for a job that ended.
 */
import { Dialog, showDialog } from '@jupyterlab/apputils';

import { IJob, jobPath, requestAPI } from './api';

/** The answers of the question, as the notebook widgets label their buttons. */
export const KEEP_LABEL = 'Keep it';
export const CANCEL_LABEL = 'Cancel job';

/** "Cancel job k3f9x2ab?" and "resnet (running) will be stopped and will not be retried." */
export function cancelQuestion(job: Pick<IJob, 'id' | 'name' | 'state'>): {
  title: string;
  body: string;
} {
  return {
    title: `Cancel job ${job.id}?`,
    body: `${job.name} (${job.state}) will be stopped and will not be retried.`
  };
}

/** Ask before a cancel; true when the user answered "Cancel job". */
export async function confirmCancel(job: Pick<IJob, 'id' | 'name' | 'state'>): Promise<boolean> {
  const { title, body } = cancelQuestion(job);
  const result = await showDialog({
    title,
    body,
    buttons: [
      Dialog.cancelButton({ label: KEEP_LABEL }),
      Dialog.warnButton({ label: CANCEL_LABEL })
    ]
  });
  return result.button.accept;
}

/**
 * Queue an ended job again: a new job with the same spec, linked to the old one.
 * The server answers 409 for a job that has not ended and 403 for someone else's.
 */
export async function runAgain(id: string): Promise<IJob> {
  const answer = await requestAPI<{ job: IJob }>(jobPath(id, '/requeue'), { method: 'POST' });
  return answer.job;
}

export const RUN_AGAIN_LABEL = 'Run again';
export const RUN_AGAIN_TITLE = 'Queue a new job with the same code and resources';
