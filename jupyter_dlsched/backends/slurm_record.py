"""Recording how a SLURM job ended in the ledger: the result or error, the state and
why, or back to ``queued`` for a retry."""

from __future__ import annotations

import contextlib
import json
import signal
import time
from typing import Any

from ..vocab import private
from ..vocab.errors import IllegalTransition, JobNotFound
from ..vocab.schema import RunEnd
from .slurm_track import SLURM_FILE, MonitorBase, Track


class SlurmRecorder(MonitorBase):
    """The monitor's part that writes a job's end into the ledger."""

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
        # a job can end before this monitor saw it start: then no retry (it never ran here)
        end = RunEnd(to, why, exit_code, term_signal, retry=job.state == "running")
        moved = None  # also when taken over meanwhile: the ledger moved on
        with contextlib.suppress(IllegalTransition, JobNotFound):
            moved = track.lease.end_followed(end, finished)
        if moved == "queued":
            with contextlib.suppress(OSError):
                (folder / SLURM_FILE).unlink()
            self._note(track, store.get(job.id).reason)
        self._last_change = time.monotonic()
        assert self.backend.port is not None
        self.backend.port.wake()

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
