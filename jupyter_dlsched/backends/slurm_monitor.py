"""Following SLURM jobs: one monitor thread per ``SlurmBackend``.

Each pass, in order: ``adopt`` (take the ledger's SLURM jobs nobody follows: new
submissions, or those of a participant that went away), ``_sync`` (the ledger
asked for something: a cancel, a new priority, or a queued job was cancelled or
failed by its dependency), ``_submit`` (queued jobs not yet in SLURM), ``_poll``
(``squeue``: wait reasons, starts, ends; ``scontrol show job`` for exit codes and
GPUs), ``_tail`` (output into ``spool/<id>/log``) and lease renewal. A job's SLURM
id is kept in ``spool/<id>/slurm.json`` so another participant can take it over.

The monitor is put together from its parts, one module each: ``slurm_track.py``
(a followed job, its ``log`` and ``slurm.json``), ``slurm_submit.py`` (queued jobs
into SLURM), ``slurm_follow.py`` (``squeue``/``scontrol``: waits and starts) and
``slurm_record.py`` (how a job ended, into the ledger).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Any

from ..store import Lease, RunEnd
from ..store.settings import Settings
from ..vocab.units import format_duration
from .slurm_follow import SlurmFollower
from .slurm_submit import SlurmSubmitter
from .slurm_tools import SlurmError, nice_for, run_tool
from .slurm_track import ACTIVE, SLURM_FILE, Track, _read_slurm_file, _read_slurm_json

if TYPE_CHECKING:
    from .slurm_track import SlurmSide

log = logging.getLogger("jupyter_dlsched")

STOP_TIMEOUT_SECONDS = 30.0  # a cancelled job SLURM still reports after this long is recorded


class SlurmMonitor(SlurmSubmitter, SlurmFollower):
    """The SLURM jobs of one ledger that this process follows, from submission to end."""

    def __init__(self, backend: SlurmSide) -> None:
        self.backend = backend
        self._tracks: dict[str, Track] = {}
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_renew = 0.0
        self._last_change = time.monotonic()

    def start(self) -> None:
        """Take over what is ours in the ledger now (before the first tick), then follow it."""
        self.adopt()
        if self._thread is None or not self._thread.is_alive():
            self._closed.clear()
            self._thread = threading.Thread(target=self._loop, name="dlsched-slurm", daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Stop following; hand the leases back so the next participant takes over at once."""
        self._closed.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        with self._lock:
            held = self._held()
            self._tracks.clear()
        with contextlib.suppress(Exception):
            Lease.renew_all(held, time.time() - 1)  # a time past: theirs to take at once

    def wake(self) -> None:
        self._last_change = time.monotonic()
        self._wake.set()

    # -- requests from the scheduler ----------------------------------------------------------

    def cancel(self, job: Any) -> None:
        with self._lock:
            track = self._tracks.get(job.id)
        if track is not None:
            self._stop(track, "cancel", "cancelled by user")
        self.wake()

    def reap(self, job: Any) -> None:
        """The ledger gave up on the job (its lease lapsed): end its SLURM job too."""
        with self._lock:
            track = self._tracks.pop(job.id, None)
        slurm_id = track.slurm_id if track else _read_slurm_file(self.store.spool(job.id))
        if slurm_id:
            self._scancel(slurm_id)
        with contextlib.suppress(OSError):
            (self.store.spool(job.id) / SLURM_FILE).unlink()

    # -- the thread ----------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._closed.is_set():
            try:
                self.adopt()
                self._sync()
                self._submit()
                self._poll()
                self._renew()
            except Exception:
                log.exception("dlsched slurm monitor")
                self._closed.wait(0.5)
            quiet = time.monotonic() - self._last_change
            self._wake.wait(min(self.backend.poll, 0.1 + quiet / 10))
            self._wake.clear()
        self.store.close()

    def adopt(self) -> None:
        """Follow this user's active SLURM jobs that nobody (alive) follows."""
        store = self.store
        now = time.time()
        ttl = Settings.load(store).lease_ttl
        with self._lock:
            rows = store.followable_jobs(self.backend.name, os.getuid())
            for job_id, inline, supervisor, lease in rows:
                if job_id in self._tracks:
                    continue
                if supervisor not in (None, os.getpid()) and lease is not None and lease > now:
                    continue  # another live participant follows it
                lease = store.claim(job_id, ttl, follow=True, now=now)
                if lease is None:
                    continue
                if inline:
                    why = (
                        "an --inline cell runs in the kernel, which the SLURM backend "
                        "cannot do: run the cell without --inline"
                    )
                    lease.end_followed(RunEnd("failed", why, retry=False), now)
                    continue
                folder = store.make_spool(job_id)
                track = Track(job_id, folder, lease)
                saved = _read_slurm_json(folder)
                if saved:
                    track.slurm_id, track.via = saved["slurm_id"], saved["via"]
                    track.tasks, track.nice = saved.get("tasks", 1), saved.get("nice")
                self._tracks[job_id] = track
                self._last_change = time.monotonic()

    def _sync(self) -> None:
        """Carry out what the ledger says: cancels, dependency failures, new priorities."""
        with self._lock:
            tracks = dict(self._tracks)
        if not tracks:
            return
        rows = {r["id"]: r for r in self.store.followed_jobs(list(tracks))}
        now = time.time()
        for job_id, track in tracks.items():
            row = rows.get(job_id)
            if row is None or row["state"] not in ACTIVE or row["supervisor_pid"] != os.getpid():
                # cancelled while queued, failed by its dependency, or taken over
                if track.slurm_id and (row is None or row["state"] not in ACTIVE):
                    self._scancel(track.slurm_id)
                    self._tail(track, final=True)
                with self._lock:
                    self._tracks.pop(job_id, None)
                continue
            if row["cancel_requested"]:
                self._stop(track, "cancel", "cancelled by user")
            limit, started = row["time_limit"], row["started"]
            if row["state"] == "running" and limit is not None and started is not None:
                if now - started >= limit:
                    self._stop(track, "timeout", f"time limit {format_duration(limit)} reached")
            nice = nice_for(row["priority"])
            if track.slurm_id and row["state"] != "running" and nice != track.nice:
                self._renice(track, nice)
            if track.give_up_at is not None and now >= track.give_up_at:
                self._record(track, {"JobState": "CANCELLED"})

    def _renice(self, track: Track, nice: int) -> None:
        try:
            run_tool(["scontrol", "update", f"JobId={track.slurm_id}", f"Nice={nice}"])
            self._note(track, f"priority changed: SLURM nice {track.nice} -> {nice}")
        except SlurmError as error:
            self._note(track, f"SLURM refused the priority change (nice {nice}): {error}")
        track.nice = nice
        self._save(track)

    def _stop(self, track: Track, reason: str, detail: str) -> None:
        if track.stop_reason is not None:
            return
        track.stop_reason, track.detail = reason, detail
        track.give_up_at = time.time() + STOP_TIMEOUT_SECONDS
        if track.slurm_id:
            self._scancel(track.slurm_id)

    def _scancel(self, slurm_id: str) -> None:
        try:
            run_tool(["scancel", slurm_id])
        except SlurmError as error:
            log.debug("scancel %s: %s", slurm_id, error)

    # -- the ledger's lease ----------------------------------------------------------------

    def _renew(self) -> None:
        now = time.time()
        if now < self._next_renew:
            return
        ttl = Settings.load(self.store).lease_ttl
        self._next_renew = now + ttl / 4
        with self._lock:
            held = self._held()
        Lease.renew_all(held, now + ttl)

    def _held(self) -> list[Lease]:
        """The leases of the jobs still followed."""
        return [track.lease for track in self._tracks.values()]
