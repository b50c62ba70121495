"""Backends run what the policy decided: ``local`` (supervised processes), ``ray`` or ``slurm``.

A backend is a small life cycle (see ``Backend``): describe the pool, launch
an allocated job, deliver a cancel, clean up after a job whose lease expired,
close.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import SpecError
from .base import Backend

if TYPE_CHECKING:
    from ..scheduler import Scheduler


def make_backend(backend: str | Backend, scheduler: Scheduler, **options: Any) -> Backend:
    """The backend called ``backend`` (``"local"``, ``"ray"`` or ``"slurm"``) bound to ``scheduler``."""
    if isinstance(backend, Backend):
        backend.bind(scheduler)
        return backend
    if backend == "local":
        from .local import LocalBackend

        return LocalBackend(scheduler, **options)
    if backend == "ray":
        from .ray import RayBackend

        return RayBackend(scheduler, **options)
    if backend == "slurm":
        from .slurm import SlurmBackend

        return SlurmBackend(scheduler, **options)
    raise SpecError("backend", backend, '"local", "ray" or "slurm"')


__all__ = ["Backend", "make_backend"]
