"""jupyter-dlsched: a deep-learning job scheduler that lives inside Jupyter.

>>> import jupyter_dlsched as dls
>>> h = dls.submit(train, 1e-3, gpus=1, priority="high", name="resnet-lr3")  # doctest: +SKIP
>>> h.result()  # doctest: +SKIP

The module-level functions use one process-wide ``Scheduler`` (created on
first use, state folder ``$DLSCHED_HOME`` or ``<jupyter data dir>/dlsched``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable
from typing import Any

from . import _moved
from ._version import __version__ as __version__  # the release, re-exported
from .client.default import default_scheduler, set_default_scheduler
from .client.handle import JobHandle, gather
from .client.scheduler import Scheduler
from .inside.runtime import DataNotStaged, checkpoint_requested, data, progress
from .machine.inventory import GpuInfo, PoolInfo
from .store import JobInfo
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
from .vocab.schedule_info import ScheduleInfo

_moved.install()


@raised_here
def submit(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> JobHandle:
    """Queue ``fn(*args, **kwargs)``; resource keywords (gpus, cpus, mem, priority, ...) first.

    >>> h = dls.submit(train, 1e-3, gpus=1, cpus=2, mem="8GiB", time_limit="2h")  # doctest: +SKIP
    """
    return default_scheduler().submit(fn, *args, **kwargs)


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
    return default_scheduler().submit_notebook(
        path, parameters=parameters, output=output, kernel=kernel, **resources
    )


@raised_here
def schedules() -> list[ScheduleInfo]:
    """The schedules ``every=`` made (``dlsched schedules``): ``dls.schedules()[0].next_run``."""
    return default_scheduler().schedules()


@raised_here
def remove_schedule(schedule_id: str) -> ScheduleInfo:
    """Stop a schedule (no new runs; one going on goes on): ``dls.remove_schedule("s4k2m9qa")``."""
    return default_scheduler().remove_schedule(schedule_id)


@raised_here
def jobs(state: str | Iterable[str] | None = None, owner: str | None = None) -> list[JobInfo]:
    """Jobs in the ledger in submit order: ``dls.jobs(state="queued")``."""
    return default_scheduler().jobs(state=state, owner=owner)


@raised_here
def get(job_id: str) -> JobHandle:
    """A handle on an existing job, from any process: ``dls.get("k3x9m2ab").result()``."""
    return default_scheduler().get(job_id)


@raised_here
def cancel(job_id: str) -> JobInfo:
    """Cancel a job by id."""
    return default_scheduler().cancel(job_id)


@raised_here
def set_priority(job_id: str, priority: int | str) -> JobInfo:
    """Change a waiting job's priority: ``dls.set_priority(job_id, "urgent")``."""
    return default_scheduler().set_priority(job_id, priority)


@raised_here
def requeue(job_id: str) -> JobHandle:
    """Run a finished (failed, cancelled, ...) job again as a new job with the same spec:
    ``dls.requeue(job_id).result()``; the new job's ``info().requeue_of`` is ``job_id``."""
    return default_scheduler().requeue(job_id)


@raised_here
def pool() -> PoolInfo:
    """CPU cores, memory and GPUs with live usage and the jobs on each."""
    return default_scheduler().pool()


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
        return default_scheduler().submit(self.fn, *args, **{**self.resources, **kwargs})

    @raised_here
    def map(self, items: Iterable[Any], **resources: Any) -> list[JobHandle]:
        """One job per item: ``train.map([1e-3, 1e-4])``."""
        return default_scheduler().map(self.fn, items, **{**self.resources, **resources})


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
    return default_scheduler().cache_info()


def dashboard(**options: Any) -> Any:
    """The ipywidgets panel: pool, queue and utilisation history."""
    from .widgets import dashboard as make_dashboard

    return make_dashboard(default_scheduler(), **options)


def __getattr__(name: str) -> Any:
    # front ends load on first use, so importing the package never imports ipywidgets
    if name == "JobView":
        from .widgets import JobView

        return JobView
    if name == "torch":  # dls.torch.Checkpoint, dls.torch.device(); torch loads on first use
        import importlib

        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module 'jupyter_dlsched' has no attribute {name!r}")


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
