"""jupyter-dlsched: a deep-learning job scheduler that lives inside Jupyter.

>>> import jupyter_dlsched as dls
>>> h = dls.submit(train, 1e-3, gpus=1, priority="high", name="resnet-lr3")  # doctest: +SKIP
>>> h.result()  # doctest: +SKIP

The module-level functions use one process-wide ``Scheduler`` (created on
first use, state folder ``$DLSCHED_HOME`` or ``<jupyter data dir>/dlsched``).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from . import _moved
from ._version import __version__ as __version__  # the release, re-exported
from .vocab.errors import (
    DlschedError,
    JobError,
    JobFailed,
    JobLost,
    JobNotFound,
    JobTimeout,
    SpecError,
    raised_here,
)

if TYPE_CHECKING:
    from .client.default import default_scheduler, set_default_scheduler
    from .client.handle import JobHandle, gather
    from .client.scheduler import Scheduler
    from .inside.runtime import DataNotStaged, checkpoint_requested, data, progress
    from .machine.inventory import GpuInfo, PoolInfo
    from .store import JobInfo
    from .vocab.schedule_info import ScheduleInfo
    from .widgets import JobView

#: Public names loaded on first use: ``import jupyter_dlsched`` (which every job process,
#: agent, CLI run and kernel of the pool does, as the parent of what it runs) costs no
#: client, ledger or inventory code until asked (``dls.Scheduler``, ``dls.progress``, ...).
_LAZY = {
    **dict.fromkeys(("default_scheduler", "set_default_scheduler"), ".client.default"),
    **dict.fromkeys(("JobHandle", "gather"), ".client.handle"),
    "Scheduler": ".client.scheduler",
    **dict.fromkeys(
        ("DataNotStaged", "checkpoint_requested", "data", "progress"), ".inside.runtime"
    ),
    **dict.fromkeys(("GpuInfo", "PoolInfo"), ".machine.inventory"),
    "JobInfo": ".store",
    "ScheduleInfo": ".vocab.schedule_info",
    # front ends too: importing the package never imports ipywidgets
    "JobView": ".widgets",
}

_moved.install()


def _default() -> Scheduler:
    from .client.default import default_scheduler

    return default_scheduler()


@raised_here
def submit(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> JobHandle:
    """Queue ``fn(*args, **kwargs)``; resource keywords (gpus, cpus, mem, priority, ...) first.

    >>> h = dls.submit(train, 1e-3, gpus=1, cpus=2, mem="8GiB", time_limit="2h")  # doctest: +SKIP
    """
    return _default().submit(fn, *args, **kwargs)


@raised_here
def submit_notebook(
    path: str | os.PathLike[str],
    *,
    parameters: dict[str, Any] | None = None,
    output: str | os.PathLike[str] | None = None,
    kernel: str | None = None,
    **resources: Any,
) -> JobHandle:
    """Run a whole notebook as a job; the result is the executed copy's path.

    >>> h = dls.submit_notebook("train.ipynb", parameters={"lr": 3e-4}, gpus=1)  # doctest: +SKIP
    >>> h.result()  # doctest: +SKIP
    '/home/anna/train.k3x9m2ab.ipynb'
    """
    return _default().submit_notebook(
        path, parameters=parameters, output=output, kernel=kernel, **resources
    )


@raised_here
def schedules() -> list[ScheduleInfo]:
    """The schedules ``every=`` made (``dlsched schedules``): ``dls.schedules()[0].next_run``."""
    return _default().schedules()


@raised_here
def remove_schedule(schedule_id: str) -> ScheduleInfo:
    """Stop a schedule (no new runs; one going on goes on): ``dls.remove_schedule("s4k2m9qa")``."""
    return _default().remove_schedule(schedule_id)


@raised_here
def jobs(state: str | Iterable[str] | None = None, owner: str | None = None) -> list[JobInfo]:
    """Jobs in the ledger in submit order: ``dls.jobs(state="queued")``."""
    return _default().jobs(state=state, owner=owner)


@raised_here
def get(job_id: str) -> JobHandle:
    """A handle on an existing job, from any process: ``dls.get("k3x9m2ab").result()``."""
    return _default().get(job_id)


@raised_here
def cancel(job_id: str) -> JobInfo:
    """Cancel a job by id."""
    return _default().cancel(job_id)


@raised_here
def set_priority(job_id: str, priority: int | str) -> JobInfo:
    """Change a waiting job's priority: ``dls.set_priority(job_id, "urgent")``."""
    return _default().set_priority(job_id, priority)


@raised_here
def requeue(job_id: str) -> JobHandle:
    """Run a finished (failed, cancelled, ...) job again as a new job with the same spec:
    ``dls.requeue(job_id).result()``; the new job's ``info().requeue_of`` is ``job_id``."""
    return _default().requeue(job_id)


@raised_here
def pool() -> PoolInfo:
    """CPU cores, memory and GPUs with live usage and the jobs on each."""
    return _default().pool()


class JobFunction:
    """A function with resources attached by ``@dls.job``; calling it runs it here."""

    def __init__(self, fn: Callable[..., Any], resources: dict[str, Any]) -> None:
        self.fn = fn
        self.resources = resources
        self.__name__ = getattr(fn, "__name__", "job")
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    @raised_here
    def submit(self, *args: Any, **kwargs: Any) -> JobHandle:
        """Queue one call; keyword resources here override the decorator's."""
        return _default().submit(self.fn, *args, **{**self.resources, **kwargs})

    @raised_here
    def map(self, items: Iterable[Any], **resources: Any) -> list[JobHandle]:
        """One job per item: ``train.map([1e-3, 1e-4])``."""
        return _default().map(self.fn, items, **{**self.resources, **resources})


def job(
    fn: Callable[..., Any] | None = None, **resources: Any
) -> JobFunction | Callable[[Callable[..., Any]], JobFunction]:
    """Attach resources to a function::

    @dls.job(gpus=1, priority=5)
    def train(lr): ...

    train.submit(1e-3)
    train.map([1e-3, 1e-4])
    """
    if fn is not None:
        return JobFunction(fn, resources)
    return lambda f: JobFunction(f, resources)


@raised_here
def cache_info() -> dict[str, Any]:
    """The staging cache of the default scheduler: size, entries, hits, what is being staged."""
    return _default().cache_info()


def dashboard(**options: Any) -> Any:
    """The ipywidgets panel: pool, queue and utilisation history."""
    from .widgets import dashboard as make_dashboard

    return make_dashboard(_default(), **options)


def __getattr__(name: str) -> Any:
    where = _LAZY.get(name)
    if where is not None:
        value = getattr(importlib.import_module(where, __name__), name)
        globals()[name] = value  # found at once from now on
        return value
    if name == "torch":  # dls.torch.Checkpoint, dls.torch.device(); torch loads on first use
        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module 'jupyter_dlsched' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY, "torch"})


class _Root(ModuleType):
    """The package's module: a submodule imported later never replaces a public function
    of the same name (the import system sets each submodule on its parent). The
    ``schedules`` room is imported after ``dls.schedules`` is defined, and so is the old
    name ``jupyter_dlsched.pool`` (a pickle of a ledger written before the package had
    rooms), which made ``dls.pool()`` a module."""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, ModuleType) and name in __all__:
            return  # jupyter_dlsched.schedules stays importable: sys.modules has it
        super().__setattr__(name, value)

    def __reduce__(self) -> tuple[Any, ...]:
        # by name, as pickle takes a module (a job's function that names ``dls``)
        return importlib.import_module, (self.__name__,)


sys.modules[__name__].__class__ = _Root


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext jupyter_dlsched``: the ``%%schedule`` and ``%dlsched`` magics."""
    from .notebook.magics import load_ipython_extension as load

    load(ipython)


__all__ = [
    "DataNotStaged",
    "DlschedError",
    "GpuInfo",
    "JobError",
    "JobFailed",
    "JobFunction",
    "JobHandle",
    "JobInfo",
    "JobLost",
    "JobView",
    "JobNotFound",
    "JobTimeout",
    "PoolInfo",
    "ScheduleInfo",
    "Scheduler",
    "SpecError",
    "cache_info",
    "cancel",
    "checkpoint_requested",
    "dashboard",
    "data",
    "default_scheduler",
    "gather",
    "get",
    "job",
    "jobs",
    "pool",
    "progress",
    "remove_schedule",
    "requeue",
    "schedules",
    "set_default_scheduler",
    "set_priority",
    "submit",
    "submit_notebook",
]


def _load_in_ipython() -> None:
    # imported in a notebook, the package brings its magics (`%dlsched` needs no
    # `%load_ext` first), and `dls.submit(f, gpus=9)` shows as its line and the SpecError,
    # not the package's frames; IPython is not imported here, only used when it is running
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is not None:
        load_ipython_extension(shell)


_load_in_ipython()


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """Where JupyterLab finds the prebuilt sidebar (pip also installs it under share/jupyter)."""
    return [{"src": "labextension", "dest": "jupyter-dlsched"}]


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    """The Jupyter server extension (REST, scheduler loop, sampler): ``jupyter_dlsched.server``."""
    from .server import _jupyter_server_extension_points as points

    return points()
