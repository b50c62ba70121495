"""Queueing a notebook job: ``dls.submit_notebook`` and ``dlsched submit --notebook``.

>>> h = dls.submit_notebook("train.ipynb", parameters={"lr": 3e-4}, gpus=1)  # doctest: +SKIP
>>> h.result()  # doctest: +SKIP
'/home/anna/train.k3x9m2ab.ipynb'
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..vocab.errors import SpecError
from .execute import run_notebook
from .params import check_parameters

if TYPE_CHECKING:
    from ..client.handle import JobHandle


class Submits(Protocol):
    """What queueing a notebook uses of a ``Scheduler``: its one way to queue a payload."""

    def submit_payload(
        self, kind: str, payload: dict[str, Any], *, default_name: str = ..., **resources: Any
    ) -> JobHandle: ...


NOT_RESUMABLE = (
    "False for a notebook job: a notebook cannot go on from where it was stopped, so a "
    "preempted run would lose its work (split it into jobs that checkpoint instead)"
)


def check_resources(resources: dict[str, Any]) -> None:
    """Refuse what a notebook job cannot be (before anything is asked of the pool)."""
    if resources.get("preemptible"):
        raise SpecError("preemptible", resources["preemptible"], NOT_RESUMABLE)
    if resources.get("distributed"):
        raise SpecError(
            "distributed",
            resources["distributed"],
            "False for a notebook job: one kernel runs the notebook on every GPU granted "
            "(start ranks from a cell, e.g. with torch.multiprocessing)",
        )


def submit_notebook(
    scheduler: Submits,
    path: str | os.PathLike[str],
    *,
    parameters: dict[str, Any] | None = None,
    output: str | os.PathLike[str] | None = None,
    kernel: str | None = None,
    **resources: Any,
) -> JobHandle:
    """Queue the notebook at ``path``; the job's result is the executed copy's path."""
    try:
        import nbclient  # noqa: F401
        import nbformat
    except ImportError as error:
        raise SpecError(
            "notebook",
            str(path),
            f"nbclient and nbformat installed (pip install 'jupyter-dlsched[notebooks]'): {error}",
        ) from None
    source = Path(os.fspath(path)).expanduser().absolute()
    check_resources(resources)
    if source.suffix != ".ipynb" or not source.is_file():
        raise SpecError("notebook", str(path), "the path of an existing .ipynb file")
    try:
        nb = nbformat.read(source, as_version=4)
    except (OSError, ValueError, json.JSONDecodeError) as error:
        raise SpecError("notebook", str(path), f"a notebook nbformat can read ({error})") from None
    if kernel is not None and (not isinstance(kernel, str) or not kernel.strip()):
        raise SpecError("kernel", kernel, "the name of an installed kernelspec, e.g. python3")
    target = None
    if output is not None:
        target = Path(os.fspath(output)).expanduser().absolute()
        if not target.parent.is_dir():
            raise SpecError("output", str(output), "a path in an existing folder")
        if target.resolve() == source.resolve():
            raise SpecError("output", str(output), "another path than the notebook itself")
    if kernel is None and not nb.metadata.get("kernelspec", {}).get("name"):
        kernel = "python3"
    _check_kernel(kernel or nb.metadata["kernelspec"]["name"], kernel is None)
    payload = {
        "runner": run_notebook,
        "input": str(source),
        "output": None if target is None else str(target),
        "parameters": check_parameters(parameters),
        "kernel": kernel,
    }
    return scheduler.submit_payload("notebook", payload, default_name=source.stem, **resources)


def _check_kernel(name: str, from_notebook: bool) -> None:
    """Refuse a kernel this machine does not have now, rather than fail in the queue later."""
    from jupyter_client.kernelspec import KernelSpecManager

    installed = KernelSpecManager().find_kernel_specs()
    if name not in installed:
        field, where = (
            ("notebook kernel", " (the notebook's; --kernel / kernel= names another)")
            if from_notebook
            else ("kernel", "")
        )
        raise SpecError(
            field, name, f"an installed kernelspec{where}: {', '.join(sorted(installed)) or 'none'}"
        )
