"""How a submission's data travels: big buffers into files beside the pickle.

In a pool whose jobs run on this machine (one's own, or a shared pool's), arguments are
pickled with their big buffers out of band (``store/buffers.py``): written once into this
user's buffer folder, mapped by the job. A pool of one's own's Ray jobs get them through
Ray's object store; its SLURM jobs map them from a buffer folder in the pool's state
folder, which the nodes see (``docs/slurm.md``). A shared pool runs local jobs only (a
Scheduler on Ray or SLURM is a pool of one's own), so nothing in it pickles in band.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from ..store import buffers
from ..store.buffers import check_picklable as check_picklable
from ..vocab.spec import pickle_payload
from ..vocab.units import format_size


def data_folder(home: Path, *, shared: bool, backend: str) -> Path | None:
    """Where this client writes its jobs' big buffers, or None for all in band (Ray or SLURM
    behind a shared pool, which ``Scheduler`` refuses: none today). A pool of one's own puts a Ray job's buffers from these
    files into Ray's object store (``backends/ray.py``: its driver runs on this machine,
    as this user); its SLURM jobs' go into the state folder, which the nodes see."""
    if backend == "local" or (backend == "ray" and not shared):
        return buffers.buffer_folder(home)
    if backend == "slurm" and not shared:
        return buffers.buffer_folder(home, in_home=True)
    return None


def pickle_job(
    payload: dict[str, Any],
    folder: Path | None,
    written: dict[int, tuple[Any, str]] | None = None,
    nested: bytes | None = None,
    room: Callable[[int], None] | None = None,
) -> bytes:
    """``payload`` pickled for its job; a ``SpecError`` names what cannot travel.

    ``written``: shared by the members of one ``map``, so a buffer they share is written
    once; ``nested``: the member's function, pickled once by this function (its buffers
    are named with each member's).
    """
    return pickle_payload(
        payload,
        dumps=partial(buffers.dumps, folder=folder, written=written, nested=nested, room=room),
        check=buffers.check_picklable,
    )


def data_status(home: Path, *, shared: bool, backend: str) -> dict[str, Any]:
    """Where this client's big buffers go and how full that place is (``dlsched status``)."""
    folder = data_folder(home, shared=shared, backend=backend)
    if folder is None:
        return {"folder": None, "why": f"the {backend} backend"}
    used = 0
    if folder.is_dir():
        used = sum(e.stat().st_size for e in folder.iterdir() if e.is_file())
    free, total = buffers.folder_space(folder)
    return {"folder": str(folder), "used": used, "free": free, "total": total}


def data_words(data: dict[str, Any]) -> str:
    """One line of ``dlsched status``: where big arguments and results travel."""
    if data.get("folder") is None:
        return f"data: pickled in band ({data.get('why')})"
    return (
        f"data: buffers of 1 MiB or more travel in files in {data['folder']} "
        f"({format_size(data['used'])} used; {format_size(data['free'])} free of "
        f"{format_size(data['total'])}; {buffers.BUFFERS_ENV} moves it)"
    )
