/**
 * jupyter-dlsched in JupyterLab: sidebar, status-bar item, job logs, notifications, and the
 * live line of a scheduled cell (`jobline.ts`).
 */
import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import {
  ICommandPalette,
  MainAreaWidget,
  Toolbar,
  ToolbarButton,
  WidgetTracker
} from '@jupyterlab/apputils';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';
import { LabIcon } from '@jupyterlab/ui-components';

import { IJob } from './api';
import { dashboardFactory } from './dashboardview';
import { jobLineFactory } from './jobline';
import { WidgetComms } from './kernelwidgets';
import { IRendermime } from './kernelwidgets';
import { createLogWidget, JobLogView } from './logview';
import { SchedulerModel } from './model';
import { KernelNotifier } from './kernelnotify';
import { runNotebookDialog } from './runnotebook';
import { FinishNotifier } from './notify';
import { SchedulerSidebar } from './sidebar';
import { SchedulerStatus } from './statusbar';

const schedulerIconSvg = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
<g class="jp-icon3" fill="#616161">
<rect x="5" y="5" width="14" height="14" rx="2" fill="none" stroke="#616161" stroke-width="2"/>
<rect x="9" y="9" width="6" height="6"/>
<rect x="8" y="1" width="2" height="4"/><rect x="14" y="1" width="2" height="4"/>
<rect x="8" y="19" width="2" height="4"/><rect x="14" y="19" width="2" height="4"/>
<rect x="1" y="8" width="4" height="2"/><rect x="1" y="14" width="4" height="2"/>
<rect x="19" y="8" width="4" height="2"/><rect x="19" y="14" width="4" height="2"/>
</g></svg>`;

const schedulerIcon = new LabIcon({ name: 'jupyter-dlsched:gpu', svgstr: schedulerIconSvg });

namespace CommandIDs {
  export const showQueue = 'dlsched:show-queue';
  export const openLog = 'dlsched:open-log';
  export const runNotebook = 'dlsched:run-notebook';
}

const PLUGIN_ID = 'jupyter-dlsched:plugin';

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'GPU job queue, utilisation and logs from the jupyter-dlsched scheduler.',
  autoStart: true,
  optional: [ILayoutRestorer, IStatusBar, ICommandPalette, ISettingRegistry],
  activate: (
    app: JupyterFrontEnd,
    restorer: ILayoutRestorer | null,
    statusBar: IStatusBar | null,
    palette: ICommandPalette | null,
    settingRegistry: ISettingRegistry | null
  ) => {
    const model = new SchedulerModel();
    const tracker = new WidgetTracker<MainAreaWidget<JobLogView>>({ namespace: 'dlsched-log' });

    const openLog = (id: string) => app.commands.execute(CommandIDs.openLog, { id });

    app.commands.addCommand(CommandIDs.openLog, {
      label: args => (args.id ? `Job Log ${args.id}` : 'Job Log'),
      describedBy: {
        args: {
          type: 'object',
          properties: { id: { type: 'string', description: 'The job id' } }
        }
      },
      execute: args => {
        const id = String(args.id ?? '');
        if (!id) {
          return;
        }
        const existing = tracker.find(widget => widget.content.jobId === id);
        if (existing) {
          app.shell.activateById(existing.id);
          return;
        }
        const widget = createLogWidget(id);
        void tracker.add(widget);
        app.shell.add(widget, 'main');
        app.shell.activateById(widget.id);
      }
    });

    // A scheduled cell's line, live from the server, in every notebook: registered on the
    // notebook's own registry (where the widget manager registers too) so that it can reach
    // the notebook's kernel and show the widget while the kernel has it.
    app.docRegistry.addWidgetExtension('Notebook', {
      createNew: (panel, context) => {
        const rendermime = rendermimeOf(panel);
        // the widget models the kernel opens while the notebook is open (known while busy too)
        const comms = new WidgetComms(context.sessionContext);
        panel.disposed.connect(() => comms.dispose());
        rendermime?.addFactory(
          jobLineFactory({
            model,
            openLog: id => void openLog(id),
            sessionContext: context.sessionContext,
            rendermime,
            comms
          })
        );
        // dls.dashboard(): the live widget while its kernel has it, else a snapshot with a note
        rendermime?.addFactory(
          dashboardFactory({ sessionContext: context.sessionContext, rendermime, comms })
        );
      }
    });

    const sidebar = new SchedulerSidebar({
      model,
      openLog: id => void openLog(id),
      openNotebook: path => void app.commands.execute('docmanager:open', { path })
    });
    sidebar.title.icon = schedulerIcon;
    app.shell.add(sidebar, 'left', { rank: 600 });
    if (restorer) {
      restorer.add(sidebar, 'jupyter-dlsched-sidebar');
      void restorer.restore(tracker, {
        command: CommandIDs.openLog,
        args: widget => ({ id: widget.content.jobId }),
        name: widget => widget.content.jobId
      });
    }

    app.commands.addCommand(CommandIDs.showQueue, {
      label: 'Show GPU Job Queue',
      execute: () => {
        app.shell.activateById(sidebar.id);
      }
    });
    palette?.addItem({ command: CommandIDs.showQueue, category: 'GPU Scheduler' });

    // A whole notebook as a job: from its toolbar, the file browser, or the palette
    app.commands.addCommand(CommandIDs.runNotebook, {
      label: 'Run in the Queue…',
      caption: 'Run this notebook as a job on the pool’s GPUs, with parameters',
      icon: schedulerIcon,
      describedBy: {
        args: {
          type: 'object',
          properties: { path: { type: 'string', description: 'The notebook, in the server’s folder' } }
        }
      },
      execute: async args => {
        const path = String(args.path ?? '') || selectedNotebook(app);
        if (!path) {
          return;
        }
        const job = await runNotebookDialog(path);
        if (job) {
          app.shell.activateById(sidebar.id);
          void model.refreshSoon();
        }
      }
    });
    palette?.addItem({ command: CommandIDs.runNotebook, category: 'GPU Scheduler' });
    app.contextMenu.addItem({
      command: CommandIDs.runNotebook,
      selector: '.jp-DirListing-item[data-file-type="notebook"]',
      rank: 3
    });
    app.docRegistry.addWidgetExtension('Notebook', {
      createNew: (panel, context) => {
        const button = new ToolbarButton({
          className: 'jp-dlsched-run-notebook',
          icon: schedulerIcon,
          label: 'Queue',
          tooltip: 'Run in the queue… (this notebook as a job, saved first)',
          onClick: async () => {
            if (context.model.dirty) {
              await context.save();
            }
            await app.commands.execute(CommandIDs.runNotebook, { path: context.path });
          }
        });
        const toolbar = (panel as unknown as { toolbar?: Toolbar }).toolbar;
        toolbar?.insertItem(10, 'dlsched-run-notebook', button);
        return button;
      }
    });

    if (statusBar) {
      const item = new SchedulerStatus(model, () => app.shell.activateById(sidebar.id));
      statusBar.registerStatusItem('jupyter-dlsched:status', {
        item,
        align: 'left',
        rank: 5
      });
    }

    const notifier = new FinishNotifier({
      openLog: id => void openLog(id),
      showJobs: () => {
        app.shell.activateById(sidebar.id);
        sidebar.showRecent();
      }
    });
    // a GPU kernel's lease ending is not news; a reclaim is, and KernelNotifier says it
    model.jobsFinished.connect((_, jobs: IJob[]) =>
      notifier.add(jobs.filter(job => job.kind !== 'kernel'))
    );
    const kernels = new KernelNotifier({
      showRow: id => {
        app.shell.activateById(sidebar.id);
        sidebar.showJob(id);
      }
    });
    model.changed.connect(() => kernels.look(model.status?.user, model.active, model.recent));
    if (settingRegistry) {
      const apply = (settings: ISettingRegistry.ISettings) => {
        notifier.enabled = settings.get('notifyFinished').composite as boolean;
        notifier.groupWindow = settings.get('groupWindow').composite as number;
      };
      settingRegistry
        .load(PLUGIN_ID)
        .then(settings => {
          apply(settings);
          settings.changed.connect(apply);
        })
        .catch(reason => {
          // Without its settings the extension still works, with the defaults.
          console.warn(`jupyter-dlsched: could not load settings (${reason}); using defaults`);
        });
    }
  }
};

/**
 * The notebook selected in the file browser, found without depending on the file browser
 * package: the left area's widget that has a selection (its `selectedItems()`).
 */
function selectedNotebook(app: JupyterFrontEnd): string {
  for (const widget of app.shell.widgets('left')) {
    const browser = widget as unknown as {
      selectedItems?: () => Iterable<{ path: string; type: string }>;
    };
    if (typeof browser.selectedItems !== 'function') {
      continue;
    }
    for (const item of browser.selectedItems()) {
      if (item.type === 'notebook') {
        return item.path;
      }
    }
  }
  return '';
}

/** A notebook panel's registry (`panel.content.rendermime`), without depending on the notebook. */
function rendermimeOf(panel: unknown): IRendermime | null {
  const content = (panel as { content?: { rendermime?: IRendermime } }).content;
  const rendermime = content?.rendermime;
  return rendermime && typeof rendermime.addFactory === 'function' ? rendermime : null;
}

export default plugin;
