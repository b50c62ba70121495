/**
 * The status-bar item: "GPU 2/4 · 3 queued", and "· your kernel #2 in line" while a GPU kernel
 * of the user waits for its GPU (the notebook itself says only "Initializing" meanwhile).
 */
import { Widget } from '@lumino/widgets';

import { SchedulerModel } from './model';

export class SchedulerStatus extends Widget {
  constructor(
    private _model: SchedulerModel,
    onClick: () => void
  ) {
    super();
    this.addClass('jp-dlsched-status');
    this.node.title = 'GPU scheduler: GPUs in use and jobs waiting (click to open the queue)';
    this.node.addEventListener('click', onClick);
    this._model.changed.connect(this._render, this);
    this._render();
  }

  dispose(): void {
    this._model.changed.disconnect(this._render, this);
    super.dispose();
  }

  private _render(): void {
    const model = this._model;
    if (model.connection === 'missing') {
      this.node.textContent = 'GPU scheduler: server part missing';
      return;
    }
    const status = model.status;
    if (!status) {
      this.node.textContent = 'GPU …';
      return;
    }
    const queued = status.counts?.queued ?? 0;
    const running = status.counts?.running ?? 0;
    const gpus = status.gpus ?? { busy: 0, total: 0 };
    const head = gpus.total ? `GPU ${gpus.busy}/${gpus.total}` : `${running} running`;
    const stale = model.connection === 'unreachable' ? ' · offline' : '';
    this.node.textContent = `${head} · ${queued} queued${kernelWait(model)}${stale}`;
  }
}

/** " · your kernel #2 in line" while one of the user's GPU kernels waits; "" otherwise. */
function kernelWait(model: SchedulerModel): string {
  const user = model.status?.user;
  const waits = model.active.filter(
    job => job.kind === 'kernel' && job.state === 'queued' && job.owner === user
  );
  if (!waits.length) {
    return '';
  }
  const first = waits[0];
  const where = first.position ? ` #${first.position} in line` : ' waits';
  return waits.length === 1 ? ` · your kernel${where}` : ` · ${waits.length} of your kernels wait`;
}
