"""Following SLURM jobs: one monitor thread per ``SlurmBackend``.

Each pass, in order: ``adopt`` (take the ledger's SLURM jobs nobody follows: new
submissions, or those of a participant that went away), ``_sync`` (the ledger
asked for something: a cancel, a new priority, or a queued job was cancelled or
failed by its dependency), ``_submit`` (queued jobs not yet in SLURM), ``_poll``
(``squeue``: wait reasons, starts, ends; ``scontrol show job`` for exit codes and
GPUs), ``_tail`` (output into ``spool/<id>/log``) and lease renewal. A job's SLURM
id is kept in ``spool/<id>/slurm.json`` so another participant can take it over.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shlex
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import private
from ..errors import IllegalTransition, JobNotFound, SpecError
from ..resources import Placement
from ..settings import Settings
from ..units import format_duration

if TYPE_CHECKING:
    from .slurm import SlurmBackend

log = logging.getLogger("jupyter_dlsched")

ACTIVE = ("queued", "preempted", "running")
RUNNING_STATES = {
    "RUNNING",
    "CONFIGURING",
    "COMPLETING",
    "SUSPENDED",
    "STOPPED",
    "SIGNALING",
    "STAGE_OUT",
    "RESIZING",
}
ENDED_STATES = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
    "OUT_OF_MEMORY",
    "SPECIAL_EXIT",
    "REVOKED",
}
# SLURM's words for why a job waits, with a gloss for people who do not know them
REASONS = {
    "Resources": "the resources it asks for are in use",
    "Priority": "jobs with a higher priority are ahead of it",
    "Dependency": "a job it depends on has not finished",
    "BeginTime": "its start time has not come",
    "JobHeldUser": "held by its user (scontrol release)",
    "JobHeldAdmin": "held by an administrator",
    "QOSMaxJobsPerUserLimit": "the QOS allows no more running jobs for you",
    "AssocGrpGRES": "your account's GPU limit is reached",
    "ReqNodeNotAvail": "a node it needs is unavailable",
    "PartitionTimeLimit": "its time limit exceeds the partition's",
}
# variables of the submitting process that describe it, not the job
DROPPED_ENV = ("CUDA_VISIBLE_DEVICES", "DLSCHED_DEVICES", "DLSCHED_JOB_ID", "DLSCHED_GPU_MEM")
DROPPED_ENV_PREFIXES = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "SUBMITIT_")
STOP_TIMEOUT_SECONDS = 30.0  # a cancelled job SLURM still reports after this long is recorded
SLURM_FILE = "slurm.json"


@dataclass
class Track:
    """One ledger job the monitor follows."""

    job_id: str
    folder: Path  # spool/<id>
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


class SlurmMonitor:
    """The SLURM jobs of one ledger that this process follows, from submission to end."""

    def __init__(self, backend: SlurmBackend) -> None:
        self.backend = backend
        self._tracks: dict[str, Track] = {}
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_renew = 0.0
        self._last_change = time.monotonic()

    @property
    def store(self) -> Any:
        assert self.backend.scheduler is not None
        return self.backend.scheduler.store

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
            ids = list(self._tracks)
            self._tracks.clear()
        if ids:
            with contextlib.suppress(Exception), self.store.transaction() as db:
                db.executemany(
                    "UPDATE jobs SET lease_expires=? WHERE id=? AND supervisor_pid=?",
                    [(time.time() - 1, i, os.getpid()) for i in ids],
                )

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
            rows = store.db.execute(
                "SELECT id, inline, supervisor_pid, lease_expires FROM jobs WHERE backend=? "
                "AND uid=? AND state IN ('queued','preempted','running')",
                (self.backend.name, os.getuid()),
            ).fetchall()
            for job_id, inline, supervisor, lease in rows:
                if job_id in self._tracks:
                    continue
                if supervisor not in (None, os.getpid()) and lease is not None and lease > now:
                    continue  # another live participant follows it
                with store.transaction() as db:
                    claimed = db.execute(
                        "UPDATE jobs SET supervisor_pid=?, lease_expires=? WHERE id=? AND "
                        "state IN ('queued','preempted','running') AND (supervisor_pid IS NULL "
                        "OR supervisor_pid=? OR lease_expires IS NULL OR lease_expires < ?)",
                        (os.getpid(), now + ttl, job_id, os.getpid(), now),
                    ).rowcount
                    if claimed and inline:
                        store.transition_in(
                            db,
                            job_id,
                            "failed",
                            "an --inline cell runs in the kernel, which the SLURM backend "
                            "cannot do: run the cell without --inline",
                            now=now,
                            finished=now,
                            supervisor_pid=None,
                            lease_expires=None,
                        )
                        continue
                if not claimed:
                    continue
                folder = store.make_spool(job_id)
                track = Track(job_id, folder)
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
        marks = ",".join("?" * len(tracks))
        rows = {
            r["id"]: r
            for r in self.store.db.execute(
                "SELECT id, state, supervisor_pid, cancel_requested, priority, time_limit, "
                f"started FROM jobs WHERE id IN ({marks})",
                list(tracks),
            )
        }
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
            nice = _nice_for(row["priority"])
            if track.slurm_id and row["state"] != "running" and nice != track.nice:
                self._renice(track, nice)
            if track.give_up_at is not None and now >= track.give_up_at:
                self._record(track, {"JobState": "CANCELLED"})

    def _renice(self, track: Track, nice: int) -> None:
        from .slurm import SlurmError, run_tool

        try:
            run_tool(["scontrol", "update", f"JobId={track.slurm_id}", f"Nice={nice}"])
            self._note(track, f"priority changed: SLURM nice {track.nice} -> {nice}")
        except SlurmError as error:
            self._note(track, f"SLURM refused the priority change (nice {nice}): {error}")
        track.nice = nice
        self._save(track)

    # -- submission ----------------------------------------------------------------------------

    def _submit(self) -> None:
        with self._lock:
            waiting = [t for t in self._tracks.values() if t.slurm_id is None]
        for track in waiting:
            try:
                job = self.store.get(track.job_id)
            except JobNotFound:
                continue
            if job.state not in ("queued", "preempted"):
                continue
            dependencies = self._dependencies(job)
            if dependencies is None:
                continue  # a dependency is not in SLURM yet, or the tick fails the job
            try:
                options = self.backend.sbatch_options(job)
                if dependencies:
                    options.append(f"--dependency=afterok:{':'.join(dependencies)}")
                if job.kind == "command":
                    self._submit_command(track, job, options)
                else:
                    self._submit_function(track, job, options)
            except (SpecError, RuntimeError, OSError) as error:
                self._fail_unsubmitted(track, f"SLURM did not accept the job: {error}")
                continue
            track.nice = _nice_for(job.priority)
            self._save(track)
            self._note(track, f"submitted to SLURM as job {track.slurm_id}")
            self._last_change = time.monotonic()

    def _dependencies(self, job: Any) -> list[str] | None:
        """SLURM ids for ``afterok`` (``None``: not every dependency can be named yet)."""
        ids: list[str] = []
        states = self.store.states(list(job.after))
        for dep in job.after:
            state = states.get(dep)
            if state == "succeeded":
                continue
            if state not in ACTIVE:
                return None
            slurm_id = _read_slurm_file(self.store.spool(dep))
            if slurm_id is None:
                return None
            ids.append(slurm_id)
        return ids

    def _context(self, job: Any) -> tuple[dict[str, Any], dict[str, str]]:
        """The submitter's working folder and import path, and the job's environment."""
        context = json.loads(self.store.read_file(job.id, "context.json") or b"{}")
        env = {
            k: v
            for k, v in {**context.get("env", {}), **job.env}.items()
            if k not in DROPPED_ENV and not k.startswith(DROPPED_ENV_PREFIXES)
        }
        threads = str(max(1, int(job.cpus)))
        env.update(
            DLSCHED_JOB_ID=job.id,
            OMP_NUM_THREADS=threads,
            MKL_NUM_THREADS=threads,
            OPENBLAS_NUM_THREADS=threads,
        )
        return context, env

    def _submit_function(self, track: Track, job: Any, options: list[str]) -> None:
        payload = self.store.read_file(job.id, "payload.pkl")
        if payload is None:
            raise SpecError("payload", None, "the job's payload, which is missing from the ledger")
        context, env = self._context(job)
        from .slurm_task import run_task

        executor = _executor(self.backend.python or sys.executable, track.folder, options)
        task = {
            "payload": payload,
            "env": env,
            "home": str(self.store.home),
            "cwd": context.get("cwd"),
            "sys_path": context.get("sys_path") or [],
            "distributed": bool(job.distributed and job.gpus >= 1),
        }
        submitted = executor.submit(run_task, task)
        track.slurm_id, track.via = str(submitted.job_id), "submitit"
        track.tasks = int(job.gpus) if task["distributed"] else 1

    def _submit_command(self, track: Track, job: Any, options: list[str]) -> None:
        from .slurm import run_tool

        raw = self.store.read_file(job.id, "command.json") or b"{}"
        argv = json.loads(raw).get("argv")
        if not argv:
            raise SpecError("argv", None, "the job's command, which is missing from the ledger")
        context, env = self._context(job)
        folder = private.private_subfolder(track.folder / "slurm")
        script = folder / "job.sh"
        home = shlex.quote(str(self.store.home))
        lines = [
            "#!/bin/sh",
            'export DLSCHED_DEVICES="${CUDA_VISIBLE_DEVICES:-}"',
            f"[ -f {home}/ledger.sqlite ] && export DLSCHED_HOME={home}",
        ]
        command = " ".join(shlex.quote(a) for a in argv)
        if job.distributed and job.gpus >= 1:
            # one task per GPU, each with the variables torchrun would set
            lines += [
                "export MASTER_ADDR=127.0.0.1 MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))",
                "exec srun --unbuffered sh -c 'export RANK=$SLURM_PROCID "
                "LOCAL_RANK=$SLURM_LOCALID GROUP_RANK=$SLURM_NODEID WORLD_SIZE=$SLURM_NTASKS "
                'LOCAL_WORLD_SIZE=$SLURM_NTASKS_PER_NODE; exec "$@"\' dlsched-rank ' + command,
            ]
        else:
            lines.append(f"exec {command}")
        private.write_file(script, ("\n".join(lines) + "\n").encode())
        cwd = context.get("cwd")
        if cwd and os.path.isdir(cwd):
            options = [*options, f"--chdir={cwd}"]
        # the job gets the submitter's environment: sbatch exports its own (--export=ALL)
        sbatch_env = dict(env)
        for key in ("SLURM_CONF", "PATH"):
            if key in os.environ:
                sbatch_env.setdefault(key, os.environ[key])
        if "SLURM_CONF" in os.environ:
            sbatch_env["SLURM_CONF"] = os.environ["SLURM_CONF"]
        out = run_tool(
            ["sbatch", "--parsable", f"--output={folder}/%j.out", *options, str(script)],
            env=sbatch_env,
        )
        track.slurm_id, track.via, track.tasks = out.strip().split(";")[0], "sbatch", 1

    def _fail_unsubmitted(self, track: Track, why: str) -> None:
        now = time.time()
        with contextlib.suppress(IllegalTransition, JobNotFound):
            self.store.transition(
                track.job_id,
                "failed",
                why[:500],
                expect=["queued", "preempted"],
                now=now,
                finished=now,
                supervisor_pid=None,
                lease_expires=None,
            )
        self._note(track, why)
        with self._lock:
            self._tracks.pop(track.job_id, None)

    # -- following -----------------------------------------------------------------------------

    def _poll(self) -> None:
        from .slurm import SlurmError, run_tool

        with self._lock:
            tracks = {t.slurm_id: t for t in self._tracks.values() if t.slurm_id}
        if not tracks:
            return
        try:
            out = run_tool(
                [
                    "squeue",
                    "--noheader",
                    "--states=all",
                    f"--jobs={','.join(tracks)}",
                    "--format=%i|%T|%r",
                ]
            )
        except SlurmError as error:
            if "Invalid job id" not in str(error):
                raise
            out = ""
        seen: dict[str, tuple[str, str]] = {}
        for line in out.splitlines():
            parts = line.strip().split("|")
            if len(parts) == 3:
                seen[parts[0]] = (parts[1], parts[2])
        for slurm_id, track in tracks.items():
            state, reason = seen.get(slurm_id, ("", ""))
            if state == "PENDING" or state.startswith("REQUEUE"):
                self._pending(track, reason)
            elif state in RUNNING_STATES:
                self._running(track)
            else:  # ended, or gone from squeue: scontrol knows more (exit code, times)
                self._running(track)  # a short job may start and end between two polls
                details = _scontrol(slurm_id)
                if details is None or details.get("JobState", "") in ENDED_STATES:
                    self._record(track, details)
                    continue
            self._tail(track)

    def _pending(self, track: Track, reason: str) -> None:
        gloss = REASONS.get(reason)
        words = f"SLURM: {reason}" + (f" ({gloss})" if gloss else "")
        policy = self.backend.slurm_policy
        if policy.reasons.get(track.job_id) == words:
            return
        policy.reasons[track.job_id] = words
        if reason == "Dependency":
            return  # the tick's own words ("waiting for job X to finish") say more
        with self.store.transaction() as db:
            db.execute(
                "UPDATE jobs SET waiting=? WHERE id=? AND state IN ('queued','preempted')",
                (words, track.job_id),
            )

    def _running(self, track: Track) -> None:
        """SLURM started the job: move it to ``running`` with its node, GPUs and start time."""
        if track.started is not None:
            return
        details = _scontrol(track.slurm_id or "") or {}
        started = _parse_time(details.get("StartTime")) or time.time()
        node = details.get("NodeList") or None
        placement = self._placement(details)
        store = self.store
        with store.transaction() as db:
            row = db.execute(
                "SELECT state, attempts, supervisor_pid FROM jobs WHERE id=?", (track.job_id,)
            ).fetchone()
            if row is None or row[2] != os.getpid():
                return
            if row[0] in ("queued", "preempted"):
                # SLURM's clock has whole seconds: never show a start before the submission
                submitted = db.execute(
                    "SELECT submitted FROM jobs WHERE id=?", (track.job_id,)
                ).fetchone()[0]
                started = max(started, submitted)
                store.transition_in(
                    db,
                    track.job_id,
                    "running",
                    "",
                    now=started,
                    placement=placement,
                    started=started,
                    attempts=row[1] + 1,
                    host=node,
                    job_pid=None,
                    exit_code=None,
                    term_signal=None,
                    cancel_requested=0,
                    position=None,
                    waiting=None,
                )
        track.started = started
        self.backend.slurm_policy.reasons.pop(track.job_id, None)
        gpus = f", GPUs {','.join(map(str, placement.gpus))}" if placement.gpus else ""
        self._note(track, f"started on {node} (SLURM job {track.slurm_id}{gpus})")
        self._last_change = time.monotonic()
        assert self.backend.scheduler is not None
        self.backend.scheduler.wake()

    def _placement(self, details: dict[str, str]) -> Placement:
        """The inventory's indices of the GPUs SLURM gave (``GRES=gpu:2(IDX:0-1)``)."""
        assert self.backend.scheduler is not None
        cards = {
            (g.get("node"), g.get("local")): g for g in self.backend.scheduler.inventory["gpus"]
        }
        indices: list[int] = []
        for node, idx in re.findall(
            r"Nodes=(\S+) [^\n]*?GRES=\S*?\(IDX:([\d,-]+)\)", details.get("_text", "")
        ):
            for local in _expand(idx):
                card = cards.get((node, local))
                if card is not None:
                    indices.append(card["index"])
        mem = [cards_mem for cards_mem in (self.backend.gpu_mem,) * len(indices)]
        return Placement(gpus=tuple(indices), gpu_mem=tuple(mem))

    def _stop(self, track: Track, reason: str, detail: str) -> None:
        if track.stop_reason is not None:
            return
        track.stop_reason, track.detail = reason, detail
        track.give_up_at = time.time() + STOP_TIMEOUT_SECONDS
        if track.slurm_id:
            self._scancel(track.slurm_id)

    def _scancel(self, slurm_id: str) -> None:
        from .slurm import SlurmError, run_tool

        try:
            run_tool(["scancel", slurm_id])
        except SlurmError as error:
            log.debug("scancel %s: %s", slurm_id, error)

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

    # -- recording the end ---------------------------------------------------------------------

    def _record(self, track: Track, details: dict[str, str] | None) -> None:
        """How the job ended, into the ledger (or queued again for a retry)."""
        from .ray_task import write_atomic

        self._tail(track, final=True)
        with self._lock:
            self._tracks.pop(track.job_id, None)
        self.backend.slurm_policy.reasons.pop(track.job_id, None)
        store = self.store
        try:
            job = store.get(track.job_id)
        except JobNotFound:
            return
        folder = track.folder
        details = details or {}
        slurm_state = details.get("JobState", "")
        code, sig = _exit_code(details.get("ExitCode", ""))
        finished = max(
            _parse_time(details.get("EndTime")) or time.time(), job.started or job.submitted
        )
        outcome = self._outcome(track) if track.via == "submitit" else None
        exit_code: int | None = None
        term_signal: int | None = None
        if outcome is not None and outcome[0] == "result":
            write_atomic(folder / "result.pkl", outcome[1])
            to, why, exit_code = "succeeded", "", 0
        elif outcome is not None and outcome[0] == "error":
            details_, pickled = outcome[1], outcome[2]
            (folder / "error.json").write_text(json.dumps(details_))
            if pickled is not None:
                write_atomic(folder / "error.pkl", pickled)
            first = (details_["message"].strip().splitlines() or [""])[0]
            to, why, exit_code = "failed", f"{details_['type']}: {first}"[:300], outcome[3]
        elif slurm_state == "COMPLETED" and track.via == "sbatch":
            to, why, exit_code = "succeeded", "", 0
        elif slurm_state in ("TIMEOUT", "DEADLINE"):
            to, why = "timeout", f"SLURM ended the job: {slurm_state}"
        elif slurm_state == "CANCELLED":
            to, why = "cancelled", "cancelled in SLURM (scancel outside dlsched)"
        elif slurm_state == "OUT_OF_MEMORY":
            to, why = "failed", "out of memory: SLURM ended the job (ask for more mem=)"
        elif slurm_state in ("NODE_FAIL", "BOOT_FAIL", "PREEMPTED", "REVOKED"):
            to, why = "lost", f"lost: SLURM reports {slurm_state}"
        elif not slurm_state:
            to, why = (
                "lost",
                f"lost: SLURM no longer knows job {track.slurm_id} (without accounting, "
                "a job's end is only known for MinJobAge after it)",
            )
        elif sig:
            term_signal = sig
            to, why = "failed", f"killed by signal {signal.Signals(sig).name}"
        else:
            exit_code = code
            to, why = (
                "failed",
                f"exit code {code}"
                + (
                    f" (SLURM: {details.get('Reason')})"
                    if details.get("Reason") not in (None, "None", "NonZeroExitCode")
                    else ""
                ),
            )
        if track.stop_reason == "cancel":
            to, why = "cancelled", "cancelled by user"
        elif track.stop_reason == "timeout" and to != "succeeded":
            to, why = "timeout", track.detail
        common: dict[str, Any] = {
            "exit_code": exit_code,
            "term_signal": term_signal,
            "lease_expires": None,
            "supervisor_pid": None,
            "attained": job.attained + max(0.0, finished - (job.started or finished)) * job.gpus,
        }
        if to in ("failed", "lost") and job.attempts <= job.retries and job.state == "running":
            why, to = f"retry {job.attempts}/{job.retries} after: {why}", "queued"
            common.update(placement=None, job_pid=None)
            with contextlib.suppress(OSError):
                (folder / SLURM_FILE).unlink()
        else:
            common["finished"] = finished
        if to == "queued":
            self._note(track, why)
        with contextlib.suppress(IllegalTransition, JobNotFound), store.transaction() as db:
            row = db.execute(
                "SELECT state, supervisor_pid FROM jobs WHERE id=?", (job.id,)
            ).fetchone()
            if row is None or row[1] != os.getpid():
                return  # taken over meanwhile; the ledger moved on
            if row[0] != "running" and to not in ("cancelled", "failed"):
                # it ended before we saw it start: mark the start first
                store.transition_in(
                    db,
                    job.id,
                    "running",
                    "",
                    now=finished,
                    started=finished,
                    attempts=job.attempts + 1,
                )
            store.transition_in(db, job.id, to, why, now=finished, **common)
        self._last_change = time.monotonic()
        assert self.backend.scheduler is not None
        self.backend.scheduler.wake()

    def _outcome(self, track: Track) -> tuple[Any, ...] | None:
        """What ``run_task`` returned: an error on any task, else task 0's result."""
        import pickle

        outcomes = []
        for task in range(track.tasks):
            path = track.folder / "slurm" / f"{track.slurm_id}_{task}_result.pkl"
            data = private.read_file(path)
            if data is None:
                continue
            status, value = pickle.loads(data)
            if status != "success":  # submitit itself failed around our task
                lines = str(value).strip().splitlines() or ["submitit failed"]
                details = {"type": "SubmititError", "message": lines[-1], "traceback": str(value)}
                value = ("error", details, None, 1)
            outcomes.append(value)
        for outcome in outcomes:
            if outcome[0] == "error":
                return tuple(outcome)
        return tuple(outcomes[0]) if outcomes else None

    # -- the ledger's lease ----------------------------------------------------------------

    def _renew(self) -> None:
        now = time.time()
        if now < self._next_renew:
            return
        ttl = Settings.load(self.store).lease_ttl
        self._next_renew = now + ttl / 4
        with self._lock:
            ids = list(self._tracks)
        if ids:
            with self.store.transaction() as db:
                db.executemany(
                    "UPDATE jobs SET lease_expires=? WHERE id=? AND supervisor_pid=?",
                    [(now + ttl, i, os.getpid()) for i in ids],
                )

    def _save(self, track: Track) -> None:
        data = {
            "slurm_id": track.slurm_id,
            "via": track.via,
            "tasks": track.tasks,
            "nice": track.nice,
        }
        private.write_file(track.folder / SLURM_FILE, json.dumps(data).encode())


def _nice_for(priority: int) -> int:
    from .slurm import nice_for

    return nice_for(priority)


def _read_slurm_json(folder: Path) -> dict[str, Any] | None:
    data = private.read_file(folder / SLURM_FILE)
    return json.loads(data) if data else None


def _read_slurm_file(folder: Path) -> str | None:
    with contextlib.suppress(OSError, ValueError):
        saved = _read_slurm_json(folder)
        return str(saved["slurm_id"]) if saved else None
    return None


def _scontrol(slurm_id: str) -> dict[str, str] | None:
    """``scontrol show job -d`` as ``{key: value}`` (``_text``: all of it); ``None`` if unknown."""
    from .slurm import SlurmError, run_tool

    try:
        text = run_tool(["scontrol", "show", "job", "-d", slurm_id])
    except SlurmError as error:
        if "Invalid job id" in str(error):
            return None
        raise
    values = dict(re.findall(r"(?:^|\s)([A-Za-z_/:]+)=(\S*)", text))
    values["_text"] = text
    return values


def _exit_code(text: str) -> tuple[int, int]:
    """``"3:0"`` -> ``(3, 0)``: the exit status and the signal that ended the job."""
    code, _, sig = text.partition(":")
    return (int(code) if code.isdigit() else 0, int(sig) if sig.isdigit() else 0)


def _parse_time(text: str | None) -> float | None:
    """SLURM's local ``2026-11-30T19:15:34`` as seconds since the epoch."""
    if not text or not text[:1].isdigit():
        return None
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def _expand(indices: str) -> list[int]:
    """``"0-1,3"`` -> ``[0, 1, 3]``."""
    out: list[int] = []
    for part in indices.split(","):
        low, _, high = part.partition("-")
        if low.isdigit():
            out += list(range(int(low), int(high or low) + 1))
    return out


def _executor(python: str, folder: Path, options: list[str]) -> Any:
    """A submitit executor whose sbatch call carries exactly our options.

    submitit writes a ``--time`` (5 minutes unless told) and a ``--signal`` of its own;
    both go, so a job without a time limit gets the partition's default. Options on
    the sbatch command line take precedence over the script's ``#SBATCH`` lines.
    """
    try:
        import submitit
    except ImportError as error:
        raise ImportError(
            "the SLURM backend runs functions and cells through submitit: "
            "pip install 'jupyter-dlsched[slurm]'"
        ) from error

    class Executor(submitit.SlurmExecutor):
        def _make_submission_file_text(self, command: str, uid: str) -> str:
            text = super()._make_submission_file_text(command, uid)
            dropped = ("#SBATCH --time=", "#SBATCH --signal=")
            return "\n".join(line for line in text.splitlines() if not line.startswith(dropped))

        def _make_submission_command(self, submission_file_path: Path) -> list[str]:
            return ["sbatch", *options, str(submission_file_path)]

    executor = Executor(folder=private.private_subfolder(folder / "slurm"), python=python)
    executor.update_parameters(stderr_to_stdout=True)
    return executor
