/**
 * "Run in the queue…": a notebook of the server's folder as a job, from the notebook's
 * toolbar or the file browser. The dialog's resource fields come from the server's one
 * table of options (`GET options`), so it asks for what `dlsched submit` and `%%schedule`
 * take; the values are sent as the flags' text and converted on the server the same way.
 */
import { Dialog, showDialog, showErrorMessage } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import { IJob, requestAPI } from './api';
import { h } from './dom';

/** One resource option of the table, as `GET options` describes it. */
export interface IOption {
  name: string;
  flag: string;
  help: string;
  metavar: string | null;
  switch: boolean;
}

/** The options shown first; the rest follow under "More options". */
const FIRST = ['gpus', 'cpus', 'mem', 'priority', 'time_limit'];

/** The dialog's body: parameters, then a field per resource option. */
export class RunNotebookForm extends Widget {
  constructor(path: string, options: IOption[]) {
    super({ node: h('form', { className: 'jp-dlsched-run-form' }) });
    this._path = path;
    this._parameters = h('textarea', {
      className: 'jp-mod-styled jp-dlsched-run-parameters',
      attrs: { name: 'parameters', rows: '3', placeholder: 'lr=3e-4\nepochs=10' }
    });
    const first = options.filter(o => FIRST.includes(o.name));
    const more = options.filter(o => !FIRST.includes(o.name));
    const more_fields = h('details', { className: 'jp-dlsched-run-more' }, h('summary', {}, 'More options'));
    more_fields.append(...more.map(o => this._field(o)));
    this.node.append(
      h('div', { className: 'jp-dlsched-muted' }, `Runs ${path} as a job; the executed copy goes next to it.`),
      h(
        'label',
        { className: 'jp-dlsched-run-field' },
        h('span', {}, 'Parameters (NAME=VALUE, one a line)'),
        this._parameters
      ),
      ...first.map(o => this._field(o)),
      more_fields
    );
    this.node.addEventListener('submit', event => event.preventDefault());
  }

  /** The request body: the path, the parameters, and every option given. */
  getValue(): { [key: string]: unknown } {
    const body: { [key: string]: unknown } = { path: this._path };
    if (this._parameters.value.trim()) {
      body.parameters = this._parameters.value;
    }
    for (const [name, input] of this._inputs) {
      if (input.type === 'checkbox') {
        if (input.checked) {
          body[name] = true;
        }
      } else if (input.value.trim()) {
        body[name] = input.value.trim();
      }
    }
    return body;
  }

  private _field(option: IOption): HTMLElement {
    const input = h('input', {
      className: option.switch ? '' : 'jp-mod-styled',
      title: option.help,
      attrs: {
        name: option.name,
        type: option.switch ? 'checkbox' : 'text',
        ...(option.metavar ? { placeholder: option.metavar } : {})
      }
    });
    this._inputs.set(option.name, input);
    return h(
      'label',
      { className: 'jp-dlsched-run-field', title: option.help },
      h('span', {}, option.flag.replace(/^--/, '')),
      input
    );
  }

  private _path: string;
  private _parameters: HTMLTextAreaElement;
  private _inputs = new Map<string, HTMLInputElement>();
}

/** Ask for parameters and resources, then queue the notebook; the new job, or null. */
export async function runNotebookDialog(path: string): Promise<IJob | null> {
  let options: IOption[];
  try {
    options = (await requestAPI<{ options: IOption[] }>('options')).options;
  } catch (error) {
    await showErrorMessage('Cannot run the notebook in the queue', String((error as Error).message ?? error));
    return null;
  }
  const form = new RunNotebookForm(path, options);
  const result = await showDialog({
    title: `Run ${path.split('/').pop()} in the queue`,
    body: form,
    buttons: [Dialog.cancelButton(), Dialog.okButton({ label: 'Queue it' })],
    focusNodeSelector: 'textarea'
  });
  if (!result.button.accept || !result.value) {
    return null;
  }
  try {
    const answer = await requestAPI<{ job: IJob }>('notebooks', {
      method: 'POST',
      body: JSON.stringify(result.value)
    });
    return answer.job;
  } catch (error) {
    await showErrorMessage('The notebook was not queued', String((error as Error).message ?? error));
    return null;
  }
}
