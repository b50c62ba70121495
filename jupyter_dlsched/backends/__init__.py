"""Backends run what the policy decided: ``local`` (supervised processes), ``ray`` or ``slurm``.

A backend is a small life cycle (see ``Backend``): describe the pool, launch
an allocated job, deliver a cancel, clean up after a job whose lease expired,
close.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..vocab.errors import SpecError
from .base import Backend

if TYPE_CHECKING:
    from .port import Port


def make_backend(backend: str | Backend, port: Port, **options: Any) -> Backend:
    """The backend called ``backend`` (``"local"``, ``"ray"`` or ``"slurm"``) bound to ``port`` (the scheduler it runs jobs for)."""
    if isinstance(backend, Backend):
        backend.bind(port)
        return backend
    if backend == "local":
        from .local import LocalBackend

        return LocalBackend(port, **options)
    if backend == "ray":
        from .ray import RayBackend

        return RayBackend(port, **options)
    if backend == "slurm":
        from .slurm import SlurmBackend

        return SlurmBackend(port, **options)
    raise SpecError("backend", backend, '"local", "ray" or "slurm"')


__all__ = ["Backend", "make_backend"]
