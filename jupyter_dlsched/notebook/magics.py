"""``%%schedule`` and ``%dlsched``: the scheduler from inside a notebook.

::

    %load_ext jupyter_dlsched

    %%schedule --gpus 1 --priority high --name exp1 --out model,history
    model, history = train(lr)

    %dlsched queue | pool | dashboard | cancel ID | logs ID | priority ID P
    %dlsched wait ID | outputs ID | attach ID

A scheduled cell runs in its own job process with only the notebook
variables it reads; ``--inline`` runs it in a thread of the kernel instead,
with the notebook's namespace. Bad flags give a one-line usage error.
"""

from __future__ import annotations

import argparse
import shlex
from typing import Any, NoReturn

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.display import display

from ..client.default import default_scheduler
from ..client.handle import JobHandle
from ..vocab.errors import DlschedError, JobNotFound
from ..vocab.options import add_resource_flags, flag_resources, flags_usage
from ..vocab.schema import JobInfo
from .cell_jobs import CellJob, bring_back, inline_runner, render_as_user_error
from .cell_names import UndefinedNames, undefined
from .cells import CellResult, UnpicklableVariable, capture, run_cell

SCHEDULE_USAGE = f"%%schedule {flags_usage()} [--out a,b] [--wait] [--inline]"
DLSCHED_USAGE = (
    "%dlsched queue [--all] | pool | dashboard | cancel ID | logs ID [--tail N] | "
    "priority ID P | wait ID [--out a,b] | outputs ID [--out a,b] | attach ID"
)
HANDLE_NAME = "_job"  # the handle of the last scheduled cell, in the notebook namespace


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are a one-line ``UsageError`` with the usage, not a SystemExit."""

    def __init__(self, prog: str, usage: str) -> None:
        super().__init__(prog=prog, usage=usage, add_help=False, allow_abbrev=False)
        self.one_line_usage = usage

    def error(self, message: str) -> NoReturn:
        flag = message.removeprefix("argument ").partition(": ")[0]
        action = self._option_string_actions.get(flag) if message.startswith("argument ") else None
        if action is not None:
            # a bad value of a known flag: that flag and what it takes, not every flag there
            # is; the message itself in the words dlsched gives it
            takes = "" if action.nargs == 0 else f" {action.metavar or action.dest.upper()}"
            raise UsageError(f"{self.prog}: {message} ({flag}{takes})")
        raise UsageError(f"{self.prog}: {message}. Usage: {self.one_line_usage}")


def _names(text: str | None, flag: str, prog: str = "%%schedule") -> list[str]:
    """Comma-separated variable names (``--out``)."""
    names = _items(text)
    bad = [n for n in names if not n.isidentifier()]
    if bad:
        raise UsageError(f"{prog}: {flag} {bad[0]!r} is not a variable name")
    return names


def _items(text: str | None) -> list[str]:
    """Comma-separated words (``--after`` job ids, which may start with a digit)."""
    return [n.strip() for n in (text or "").split(",") if n.strip()]


def schedule_parser() -> _Parser:
    p = _Parser("%%schedule", SCHEDULE_USAGE)
    add_resource_flags(p)  # the same set as dls.submit's keywords and dlsched submit's flags
    p.add_argument("--out", metavar="a,b")
    p.add_argument("--wait", action="store_true")
    p.add_argument("--inline", action="store_true")
    return p


def _split(line: str, prog: str, usage: str) -> list[str]:
    try:
        return shlex.split(line)
    except ValueError as error:
        raise UsageError(f"{prog}: {error}. Usage: {usage}") from None


@magics_class
class SchedulerMagics(Magics):
    """``%%schedule`` and ``%dlsched``."""

    last_view: Any = None  # the live status of the last scheduled cell

    def __init__(self, shell: Any = None, **kwargs: Any) -> None:
        super().__init__(shell, **kwargs)
        # live status of each scheduled cell, so `%dlsched wait` can bring its names back at once
        self.cell_views: dict[str, Any] = {}

    def _scheduler(self) -> Any:
        return default_scheduler()

    @cell_magic
    def schedule(self, line: str, cell: str) -> Any:
        """Run this cell as a job: ``%%schedule --gpus 1 --priority high --out model``.

        Flags: every resource option of ``dls.submit`` (``options.RESOURCE_OPTIONS``:
        --gpus N|0.5, --gpu-mem SIZE, --cpus N, --mem SIZE, --priority P, --name NAME,
        --deadline WHEN, --time-limit DURATION, --retries N, --after ID,..., --preemptible,
        --distributed (one process per granted GPU; rank 0's names come back),
        --stage-in NAME=PATH), and --out a,b (names that come back into the notebook when the job succeeds),
        --wait (block until it ends), --inline (run in a kernel thread with the
        notebook's namespace). The handle of the job is kept in ``_job``.
        """
        args = schedule_parser().parse_args(_split(line, "%%schedule", SCHEDULE_USAGE))
        out = _names(args.out, "--out")
        resources = flag_resources(args)
        if args.distributed and args.inline:
            raise UsageError("%%schedule: --distributed starts processes; it cannot be --inline")
        shell = self.shell
        if shell is None:
            raise UsageError("%%schedule runs inside IPython")
        source = shell.transform_cell(cell)
        if not source.strip():
            raise UsageError("%%schedule: the cell is empty; there is nothing to run")
        try:
            compile(source, "<cell>", "exec")
        except SyntaxError as error:
            raise UsageError(
                f"%%schedule: syntax error in the cell, line {error.lineno}: {error.msg}"
            ) from None
        missing = undefined(source, shell.user_ns)
        if missing:
            # a NameError now, not in the job hours later at the end of a long queue
            raise UsageError(f"%%schedule: {UndefinedNames(missing)}")
        count = getattr(self.shell, "execution_count", 0)
        default_name = f"cell {count}"
        filename = f"<scheduled cell {args.name or count}>"
        scheduler = self._scheduler()
        job = CellJob(self.shell, out, inline=args.inline, show_value=not args.wait)
        try:
            if args.inline:
                handle = self._submit_inline(
                    scheduler, source, filename, out, default_name, resources
                )
            else:
                names, blob = capture(source, shell.user_ns)
                payload = {
                    "runner": run_cell,
                    "source": source,
                    "variables": blob,
                    "names": names,
                    "out": out,
                    "filename": filename,
                }
                handle = scheduler.submit_payload(
                    "cell", payload, default_name=default_name, **resources
                )
        except UnpicklableVariable as error:
            raise UsageError(f"%%schedule: {error}") from None
        except DlschedError as error:
            raise UsageError(f"%%schedule: {error}") from None
        shell.user_ns[HANDLE_NAME] = handle
        from ..widgets import JobView

        view = JobView(handle, on_finish=job.finish)
        job.attach_view(view)
        self._keep(handle.id, view)
        view.show()
        if not args.wait:
            return None
        try:
            handle.wait()
        except KeyboardInterrupt:
            print(f"stopped waiting; job {handle.id} goes on (cancel it with the button)")
            return None
        view.refresh()
        failure = handle.exception(timeout=0) if not handle.cancelled() else None
        if failure is not None:
            # shown like an error in an ordinary cell: the user's frames, not the scheduler's
            render_as_user_error(failure, handle.id)
            raise failure
        if job.result is not None and job.result.has_value:
            return job.result.value
        return None

    def _submit_inline(
        self,
        scheduler: Any,
        source: str,
        filename: str,
        out: list[str],
        default_name: str,
        resources: dict[str, Any],
    ) -> JobHandle:
        if not hasattr(scheduler, "submit_inline"):
            raise UsageError("%%schedule: --inline needs a newer jupyter-dlsched core")

        def fn(info: JobInfo) -> CellResult:
            runner = inline_runner(self.shell, source, filename, out, scheduler.log_path(info.id))
            return runner(info)

        handle: JobHandle = scheduler.submit_inline(
            fn, kind="cell", default_name=default_name, **resources
        )
        return handle

    @line_magic
    def dlsched(self, line: str) -> Any:
        """``%dlsched queue | pool | dashboard | cancel ID | logs ID | priority ID P | wait ID``."""
        words = _split(line, "%dlsched", DLSCHED_USAGE)
        if not words:
            raise UsageError(f"%dlsched: say what to do. Usage: {DLSCHED_USAGE}")
        command, rest = words[0], words[1:]
        action = {
            "queue": self._queue,
            "pool": self._pool,
            "dashboard": self._dashboard,
            "cancel": self._cancel,
            "logs": self._logs,
            "priority": self._priority,
            "wait": self._wait,
            "outputs": self._outputs,
            "attach": self._attach,
        }.get(command)
        if action is None:
            raise UsageError(f"%dlsched: unknown command {command!r}. Usage: {DLSCHED_USAGE}")
        try:
            return action(rest)
        except JobNotFound as error:
            raise UsageError(f"%dlsched {command}: {error}") from None
        except DlschedError as error:
            raise UsageError(f"%dlsched {command}: {error}") from None

    def _parse(self, command: str, rest: list[str], *spec: tuple[str, dict[str, Any]]) -> Any:
        parser = _Parser(f"%dlsched {command}", DLSCHED_USAGE)
        for name, options in spec:
            parser.add_argument(name, **options)
        return parser.parse_args(rest)

    def _queue(self, rest: list[str]) -> None:
        from ..vocab.schema import ACTIVE
        from ..widgets.tables import QueueSnapshot

        args = self._parse("queue", rest, ("--all", {"action": "store_true"}))
        scheduler = self._scheduler()
        jobs = scheduler.jobs() if args.all else scheduler.jobs(state=ACTIVE)
        display(QueueSnapshot(jobs))

    def _pool(self, rest: list[str]) -> None:
        from ..vocab.schema import ACTIVE
        from ..widgets.tables import PoolSnapshot

        self._parse("pool", rest)
        scheduler = self._scheduler()
        display(PoolSnapshot(scheduler.pool(), scheduler.jobs(state=ACTIVE)))

    def _dashboard(self, rest: list[str]) -> None:
        from ..widgets import dashboard

        self._parse("dashboard", rest)
        display(dashboard(self._scheduler()))

    def _cancel(self, rest: list[str]) -> None:
        args = self._parse("cancel", rest, ("id", {}))
        info = self._scheduler().cancel(args.id)
        if info.state == "running":
            print(f"job {info.id} ({info.name}): cancel requested; it stops within seconds")
        else:
            print(f"job {info.id} ({info.name}): {info.state}")

    def _logs(self, rest: list[str]) -> None:
        args = self._parse("logs", rest, ("id", {}), ("--tail", {"type": int, "metavar": "N"}))
        text = self._scheduler().get(args.id).logs(tail=args.tail)
        print(text if text else f"(job {args.id} has written no output yet)")

    def _priority(self, rest: list[str]) -> None:
        args = self._parse("priority", rest, ("id", {}), ("priority", {}))
        scheduler = self._scheduler()
        before = scheduler.info(args.id).priority
        info = scheduler.set_priority(args.id, args.priority)
        print(f"job {info.id} ({info.name}): priority {before} -> {info.priority}")

    def _keep(self, job_id: str, view: Any) -> None:
        self.last_view = view
        self.cell_views[job_id] = view
        while len(self.cell_views) > 500:
            del self.cell_views[next(iter(self.cell_views))]

    def _wait(self, rest: list[str]) -> None:
        from ..vocab.words import state_words

        args = self._parse("wait", rest, ("id", {}), ("--out", {"metavar": "a,b"}))
        names = _names(args.out, "--out", "%dlsched wait") if args.out is not None else None
        handle = self._scheduler().get(args.id)
        try:
            info = handle.wait()
        except KeyboardInterrupt:
            print(f"stopped waiting; job {args.id} goes on")
            return
        view = self.cell_views.get(info.id)
        if view is not None:
            view.refresh()  # its status line shows the end before this returns
        print(f"job {info.id} ({info.name}): {state_words(info)}")
        if info.state == "succeeded":
            bring_back(self.shell, handle, names)

    def _outputs(self, rest: list[str]) -> None:
        from ..vocab.words import state_words

        args = self._parse("outputs", rest, ("id", {}), ("--out", {"metavar": "a,b"}))
        names = _names(args.out, "--out", "%dlsched outputs") if args.out is not None else None
        handle = self._scheduler().get(args.id)
        info = handle.info()
        if not info.done:
            raise UsageError(
                f"%dlsched outputs: job {info.id} is {info.state}, nothing has come back yet; "
                f"`%dlsched wait {info.id}` waits for it and brings its names back"
            )
        if info.state != "succeeded":
            print(f"job {info.id} ({info.name}): {state_words(info)}; nothing came back")
            return
        bring_back(self.shell, handle, names)

    def _attach(self, rest: list[str]) -> None:
        from ..widgets import JobView

        args = self._parse("attach", rest, ("id", {}))
        handle = self._scheduler().get(args.id)
        info = handle.info()
        # as the original cell: when it succeeds, its --out names come back into this kernel
        cell = CellJob(self.shell, [], inline=info.inline, show_value=True)
        view = JobView(handle, on_finish=cell.finish if info.kind == "cell" else None)
        cell.attach_view(view)
        self._keep(handle.id, view)
        view.show()


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext jupyter_dlsched``, and importing the package in IPython; idempotent."""
    from .ipython_errors import install

    # a second registration would replace the magics and forget the views they keep
    if not isinstance(ipython.magics_manager.registry.get("SchedulerMagics"), SchedulerMagics):
        ipython.register_magics(SchedulerMagics)
    install(ipython)  # API errors as the user's line and the message
