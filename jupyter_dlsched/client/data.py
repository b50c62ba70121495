"""How a submission's data travels: big buffers into files beside the pickle.

In a pool of one's own whose jobs run on this machine, arguments are pickled with their
big buffers out of band (``store/buffers.py``): written once into this user's buffer
folder, mapped by the job. A shared pool's clients, and Ray and SLURM jobs, pickle in
band as before.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from ..store import buffers
from ..store.buffers import check_picklable as check_picklable
from ..vocab.spec import pickle_payload


def data_folder(home: Path, *, shared: bool, backend: str) -> Path | None:
    """Where this client writes its jobs' big buffers, or None for all in band."""
    if shared or backend != "local":
        return None
    return buffers.buffer_folder(home)


def pickle_job(
    payload: dict[str, Any],
    folder: Path | None,
    written: dict[int, tuple[Any, str]] | None = None,
    nested: bytes | None = None,
) -> bytes:
    """``payload`` pickled for its job; a ``SpecError`` names what cannot travel.

    ``written``: shared by the members of one ``map``, so a buffer they share is written
    once; ``nested``: the member's function, pickled once by this function (its buffers
    are named with each member's).
    """
    return pickle_payload(
        payload,
        dumps=partial(buffers.dumps, folder=folder, written=written, nested=nested),
        check=buffers.check_picklable,
    )
