/**
 * The live ipywidgets a notebook's kernel holds: which widget models are open there, and the
 * part of the notebook's registry that renders one. A job's line (`jobline.ts`) and the
 * dashboard's output (`dashboardview.ts`) show the widget itself while its kernel has it.
 *
 * Two ways to know: `WidgetComms` watches the kernel's messages while the notebook is open
 * (a widget opened or closed in that time is known at once, even while the kernel is busy
 * running a cell); for one opened before the page was loaded, `openWidgetComms` asks the
 * kernel, which answers only between cells.
 */
import type { ISessionContext } from '@jupyterlab/apputils';
import type { Kernel, KernelMessage } from '@jupyterlab/services';
import type { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import { ISignal, Signal } from '@lumino/signaling';

/** The ipywidgets manager's output type. */
export const WIDGET_MIME = 'application/vnd.jupyter.widget-view+json';

/** The comm target of ipywidgets' models (a model's id is its comm's id). */
const WIDGET_TARGET = 'jupyter.widget';

/** How long to wait for the kernel to list its widget models before giving up. */
const COMM_INFO_TIMEOUT_MS = 10_000;

/** The notebook's registry, as far as this extension uses it (`IRenderMimeRegistry`). */
export interface IRendermime {
  readonly mimeTypes: ReadonlyArray<string>;
  addFactory(factory: IRenderMime.IRendererFactory, rank?: number): void;
  createRenderer(mimeType: string): IRenderMime.IRenderer;
}

/** The ids of the widget models the kernel holds (their comms are open). */
export async function openWidgetComms(kernel: Kernel.IKernelConnection): Promise<Set<string>> {
  let timer = 0;
  const timeout = new Promise<never>((_, reject) => {
    timer = window.setTimeout(
      () => reject(new Error('the kernel did not list its comms')),
      COMM_INFO_TIMEOUT_MS
    );
  });
  try {
    const reply = await Promise.race([
      kernel.requestCommInfo({ target_name: WIDGET_TARGET }),
      timeout
    ]);
    const content = reply.content;
    return new Set(content.status === 'ok' ? Object.keys(content.comms) : []);
  } finally {
    window.clearTimeout(timer);
  }
}

/**
 * The widget models a notebook's kernel opened and closed while the notebook was open here,
 * from the kernel's own messages: no question to the kernel, so a busy kernel is no obstacle.
 * A restart or a new kernel forgets them all (their models are gone with the old process).
 */
export class WidgetComms {
  constructor(sessionContext: ISessionContext) {
    this._session = sessionContext;
    sessionContext.iopubMessage.connect(this._onMessage, this);
    sessionContext.statusChanged.connect(this._onStatus, this);
    sessionContext.kernelChanged.connect(this._forget, this);
  }

  /** True: open in the kernel now; false: closed, or its kernel restarted; undefined: the
   * page has not seen it opened (it may have been, before the page was loaded). */
  isOpen(modelId: string): boolean | undefined {
    if (this._open.has(modelId)) {
      return true;
    }
    return this._closed.has(modelId) ? false : undefined;
  }

  /** Emits a model's id when its kernel closes it (or restarts). */
  get closed(): ISignal<this, string> {
    return this._closedSignal;
  }

  dispose(): void {
    this._session.iopubMessage.disconnect(this._onMessage, this);
    this._session.statusChanged.disconnect(this._onStatus, this);
    this._session.kernelChanged.disconnect(this._forget, this);
    Signal.clearData(this);
  }

  private _onMessage(_: ISessionContext, message: KernelMessage.IMessage): void {
    const type = message.header.msg_type;
    if (type === 'comm_open') {
      const content = message.content as KernelMessage.ICommOpenMsg['content'];
      if (content.target_name === WIDGET_TARGET) {
        this._open.add(content.comm_id);
        this._closed.delete(content.comm_id);
      }
    } else if (type === 'comm_close') {
      const id = (message.content as KernelMessage.ICommCloseMsg['content']).comm_id;
      if (this._open.delete(id)) {
        this._closed.add(id);
        this._closedSignal.emit(id);
      }
    }
  }

  private _onStatus(_: ISessionContext, status: Kernel.Status): void {
    if (status === 'restarting' || status === 'autorestarting' || status === 'dead') {
      this._forget();
    }
  }

  private _forget(): void {
    const open = [...this._open];
    for (const id of open) {
      this._closed.add(id);
    }
    this._open.clear();
    for (const id of open) {
      this._closedSignal.emit(id);
    }
  }

  private _session: ISessionContext;
  private _open = new Set<string>();
  private _closed = new Set<string>();
  private _closedSignal = new Signal<this, string>(this);
}

/**
 * Whether `modelId` lives in the session's kernel: what the page saw, else the kernel's
 * answer; `busy` when the kernel did not answer in time (it is running a cell).
 */
export async function widgetLives(
  sessionContext: ISessionContext,
  comms: WidgetComms | undefined,
  modelId: string
): Promise<boolean | 'busy'> {
  const seen = comms?.isOpen(modelId);
  if (seen !== undefined) {
    return seen;
  }
  await sessionContext.ready;
  const kernel = sessionContext.session?.kernel;
  if (!kernel) {
    return false;
  }
  try {
    return (await openWidgetComms(kernel)).has(modelId);
  } catch {
    // no answer: a kernel running a cell answers only once the cell ends (right after a
    // page load its status may not say 'busy' yet)
    return kernel.status === 'dead' ? false : 'busy';
  }
}
