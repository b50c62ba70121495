"""How a supervised run ended, in the ledger's words: its exit status, why it was
stopped and what it left behind, recorded by the one rule (``schema.end_of_run``,
through ``Lease.finish``)."""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..store import JobInfo, Lease, RunEnd, Store, disk_full
from ..vocab import private
from ..vocab.errors import IllegalTransition, JobNotFound, LedgerUnavailable, UnsafeStateFolder
from .jobproc import RESULT_REPORT
from .usage import Usage

#: Tries at recording a job's end while the disk stays full (about 30 s in all).
RECORD_TRIES = 8


@dataclass
class Outcome:
    status: int = 0
    stop_reason: str | None = None  # cancel, preempt, timeout, oom, rank, lease, crash
    detail: str = ""
    usage: Usage = field(default_factory=lambda: Usage())
    #: processes killed that were not the job's main ones: outside its process group when
    #: it was stopped, or still running once its main processes had exited
    strays: set[int] = field(default_factory=set)
    #: its success was recorded when its process said its result was written (its grant is
    #: held until everything of it has exited)
    recorded: bool = False


def read_report(fd: int, pid: int) -> tuple[float, int] | None:
    """What the job's process ``pid`` reported as its result was written
    (``RESULT_REPORT``), or None when it closed its end without a report (it failed, or
    it exec'd a program), or the report is another process's (a fork of it that returned
    through the same code keeps the pipe)."""
    try:
        data = os.read(fd, RESULT_REPORT.size)
    except OSError:
        return None
    if len(data) != RESULT_REPORT.size:
        return None
    sender, cpu, maxrss = RESULT_REPORT.unpack(data)
    return (float(cpu), int(maxrss)) if sender == pid else None


def wait_status(result: os.waitid_result | None) -> int:
    """The ``wait()`` status word of a ``waitid`` result (an exit code, or a signal)."""
    assert result is not None
    if result.si_code == os.CLD_EXITED:
        return result.si_status << 8
    return result.si_status | (0x80 if result.si_code == os.CLD_DUMPED else 0)


def describe_status(
    status: int, folder: Path, owner: int | None = None
) -> tuple[int | None, int | None, str]:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return None, sig, f"killed by signal {signal.Signals(sig).name}"
    code = os.WEXITSTATUS(status)
    try:
        # the job's own report, never through a link, and never more of it than a line needs
        text = private.read_file(folder / "error.json", owner, max_bytes=1_000_000)
    except (OSError, UnsafeStateFolder):
        text = None
    if text is not None:
        try:
            error = json.loads(text[:1_000_000])
            message = error["message"].strip().splitlines()
            first = message[0] if message else ""
            return code, None, f"{error['type']}: {first}"[:300]
        except (ValueError, KeyError):
            pass
    if code != 0 and disk_full(folder):
        # its output (or its error report) could not be written: say so, not "exit code 1"
        return code, None, f"no space left on device for its output in {folder.parent.parent}"
    return code, None, f"exit code {code}"


def record_end(lease: Lease, outcome: Outcome, folder: Path, owner: int | None = None) -> None:
    job = lease.job
    if outcome.recorded:
        # its success was recorded when its result was written: its grant goes now, and
        # its reason says what was killed once it had ended
        try:
            lease.release(left_behind(outcome.strays))
        except LedgerUnavailable:
            pass  # a full disk: the held grant lapses with its lease
        return
    if outcome.stop_reason == "lease":
        return  # the reaper already recorded this job as lost or requeued
    end = run_end(job, outcome, folder, owner)
    usage = outcome.usage.columns(job)
    for attempt in range(RECORD_TRIES):
        try:
            lease.finish(end, **usage)
            return
        except (IllegalTransition, JobNotFound):
            return  # the job was reaped (lease expired) while this supervisor was stalled
        except LedgerUnavailable:
            # the disk is full even past the reserve: keep trying while the lease lasts
            # (after that the reaper records the job as lost, and says why)
            time.sleep(min(2.0**attempt, 5.0))


def run_end(job: JobInfo, outcome: Outcome, folder: Path, owner: int | None = None) -> RunEnd:
    """How this run ended, from why it was stopped, its exit status and what it left."""
    exit_code, term_signal, detail = describe_status(outcome.status, folder, owner)
    reason = outcome.stop_reason
    if reason == "cancel":
        to, why = "cancelled", "cancelled by user"
    elif reason == "preempt":
        to, why = "preempted", ""
    elif reason == "timeout":
        to, why = "timeout", outcome.detail
    elif reason in ("oom", "rank", "crash"):
        to, why = "failed", outcome.detail
    elif exit_code == 0 and (job.kind == "command" or (folder / "result.pkl").exists()):
        to, why = "succeeded", ""
    else:
        to, why = "failed", detail
    killed = left_behind(outcome.strays)
    if killed:
        # what it left running was killed: the end says so (the state is the main
        # processes' own)
        why = f"{why}; {killed}" if why else killed
    return RunEnd(to, why, exit_code=exit_code, term_signal=term_signal)


def left_behind(strays: set[int]) -> str:
    """What the end says of the processes killed that it left behind ("" for none)."""
    n = len(strays)
    return f"killed {n} process{'es' if n > 1 else ''} left behind" if n else ""


def record_refusal(store: Store, lease: Lease, why: str) -> None:
    """End a run that could not start (its spool folder was tampered with): failed, no retry."""
    try:
        lease.finish(RunEnd("failed", why, retry=False))
    except (IllegalTransition, JobNotFound, LedgerUnavailable):
        pass  # reaped meanwhile, or a full disk: the lease lapses and the reaper says so
    store.close()
