"""What the SLURM monitor knows of each job it follows, and the files it keeps for it.

``Track`` is one followed job; ``MonitorBase`` is what every part of the monitor
(``slurm_submit.py``, ``slurm_follow.py``, ``slurm_record.py``) shares: the tracked
jobs and their lock, the ledger, and the job's ``spool/<id>/log`` and ``slurm.json``.
"""

from __future__ import annotations

import contextlib
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..vocab import private

if TYPE_CHECKING:
    from ..store import JobInfo, Lease
    from .port import Port

ACTIVE = ("queued", "preempted", "running")
SLURM_FILE = "slurm.json"


class SaysWhy(Protocol):
    """The SLURM policy as the monitor sees it: why each job waits, by job id."""

    @property
    def reasons(self) -> dict[str, str]: ...


class SlurmSide(Protocol):
    """What the monitor's parts use of their ``SlurmBackend`` (``slurm.py``)."""

    @property
    def name(self) -> str: ...

    @property
    def poll(self) -> float: ...

    @property
    def python(self) -> str | None: ...

    @property
    def gpu_mem(self) -> int: ...

    @property
    def port(self) -> Port | None: ...

    @property
    def slurm_policy(self) -> SaysWhy: ...

    def sbatch_options(self, job: JobInfo) -> list[str]: ...


@dataclass
class Track:
    """One ledger job the monitor follows, and the lease it follows it under."""

    job_id: str
    folder: Path  # spool/<id>
    lease: Lease
    slurm_id: str | None = None
    via: str = ""  # "submitit" (functions, cells) or "sbatch" (commands)
    tasks: int = 1
    nice: int | None = None
    started: float | None = None
    offsets: dict[str, int] = field(default_factory=dict)
    partial: dict[str, bytes] = field(default_factory=dict)
    stop_reason: str | None = None  # cancel, timeout
    detail: str = ""
    give_up_at: float | None = None

    @property
    def outputs(self) -> list[Path]:
        base = self.folder / "slurm"
        if self.via == "submitit":
            return [base / f"{self.slurm_id}_{t}_log.out" for t in range(self.tasks)]
        return [base / f"{self.slurm_id}.out"]


class MonitorBase:
    """What the parts of ``SlurmMonitor`` share; ``SlurmMonitor.__init__`` sets it up."""

    backend: SlurmSide
    _tracks: dict[str, Track]
    _lock: threading.RLock
    _last_change: float

    @property
    def store(self) -> Any:
        assert self.backend.port is not None
        return self.backend.port.store

    # -- logs ----------------------------------------------------------------------------------

    def _tail(self, track: Track, final: bool = False) -> None:
        """Copy what the job wrote since the last pass into ``spool/<id>/log``."""
        if not track.slurm_id:
            return
        chunks: list[bytes] = []
        for path in track.outputs:
            key = path.name
            try:
                with open(path, "rb") as source:
                    source.seek(track.offsets.get(key, 0))
                    data = source.read()
            except OSError:
                continue
            if not data and not final:
                continue
            track.offsets[key] = track.offsets.get(key, 0) + len(data)
            if track.via == "submitit":
                data = track.partial.get(key, b"") + data
                cut = len(data) if final else data.rfind(b"\n") + 1
                track.partial[key] = data[cut:]
                # submitit's own bookkeeping lines say nothing about the job
                data = b"".join(
                    line
                    for line in data[:cut].splitlines(keepends=True)
                    if not line.startswith(b"submitit ")
                )
            chunks.append(data)
        if any(chunks):
            with open(private.open_append(track.folder / "log"), "ab") as out:
                out.write(b"".join(chunks))

    def _note(self, track: Track, text: str) -> None:
        with contextlib.suppress(OSError):
            with open(private.open_append(track.folder / "log"), "ab") as out:
                out.write(f"[dlsched] {text}\n".encode())

    def _save(self, track: Track) -> None:
        data = {
            "slurm_id": track.slurm_id,
            "via": track.via,
            "tasks": track.tasks,
            "nice": track.nice,
        }
        private.write_file(track.folder / SLURM_FILE, json.dumps(data).encode())


def _read_slurm_json(folder: Path) -> dict[str, Any] | None:
    data = private.read_file(folder / SLURM_FILE)
    return json.loads(data) if data else None


def _read_slurm_file(folder: Path) -> str | None:
    with contextlib.suppress(OSError, ValueError):
        saved = _read_slurm_json(folder)
        return str(saved["slurm_id"]) if saved else None
    return None
