/**
 * The live ipywidgets a notebook's kernel holds: which widget models are open there, and the
 * part of the notebook's registry that renders one. A job's line (`jobline.ts`) and the
 * dashboard's output (`dashboardview.ts`) show the widget itself while its kernel has it.
 */
import type { Kernel } from '@jupyterlab/services';
import type { IRenderMime } from '@jupyterlab/rendermime-interfaces';

/** The ipywidgets manager's output type. */
export const WIDGET_MIME = 'application/vnd.jupyter.widget-view+json';

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
      kernel.requestCommInfo({ target_name: 'jupyter.widget' }),
      timeout
    ]);
    const content = reply.content;
    return new Set(content.status === 'ok' ? Object.keys(content.comms) : []);
  } finally {
    window.clearTimeout(timer);
  }
}
