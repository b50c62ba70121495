"""A GPU kernel's lease: the job process that holds the kernel's grant while the kernel lives.

The lease is an ordinary job (kind ``kernel``) run by an ordinary supervisor, so it is
queued, placed, limited, accounted and cancelled like any job. What it runs is ``hold``:
it tells the provisioner its grant (``grant.json``), then watches the kernel by pid (a
pidfd, so a reused pid is never mistaken for it) and the Jupyter server that started it.
The grant goes back to the pool the moment ``hold`` returns, which it does when

* the kernel was shut down (``released``), or died and no restart followed within
  ``restart_window`` (kill -9 without a restarter);
* the Jupyter server went away: the kernel it can no longer reach is stopped first, so a
  GPU is never held by a process nobody can use;
* the kernel ran no cell for ``idle`` seconds while work waits for GPUs, was warned, and
  ran none for ``grace`` more: it is suspended where ``cuda-checkpoint`` can
  (``suspend.py``: it lives on, and its next cell queues a lease that restores it,
  ``restore_pid``), else stopped (reclaimed), saying why;
* the lease is cancelled (``dlsched cancel``): SIGTERM from the supervisor stops the kernel.

A restart (``restarting``) keeps the lease and its GPUs: the new kernel's pid replaces the
old one. Nothing here needs the provisioner to stay alive.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

from ..inside.gpu_room import free_memory, held_by
from . import control
from .suspend import Checkpointer, CheckpointError, Decision, reclaim_decision, restore_refusal

POLL = 0.2
#: how often the idle time is written to the job's progress (the queue, REST, history)
REPORT_EVERY = 10.0
#: how often the queue is read while the kernel is idle past its limit
WAITERS_EVERY = 2.0
STOP_GRACE = 5.0


class _Watched:
    """A process by pidfd; ``alive`` stays false once it ended, whatever its pid becomes."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        try:
            self.fd: int | None = os.pidfd_open(pid)
        except ProcessLookupError:
            self.fd = None

    def alive(self) -> bool:
        if self.fd is None:
            return False
        ready, _, _ = select.select([self.fd], [], [], 0)
        return not ready

    def wait(self, timeout: float) -> bool:
        """True when it ended within ``timeout`` seconds."""
        if self.fd is None:
            return True
        ready, _, _ = select.select([self.fd], [], [], timeout)
        return bool(ready)

    def signal(self, sig: int) -> None:
        """``sig`` to the process and, when it leads one, its process group (the kernel's
        children: a kernel is started in a session of its own)."""
        if not self.alive():
            return
        try:
            if os.getpgid(self.pid) == self.pid:
                os.killpg(self.pid, sig)
                return
        except OSError:
            pass
        assert self.fd is not None
        try:
            signal.pidfd_send_signal(self.fd, sig)
        except ProcessLookupError:
            pass

    def stop(self) -> None:
        """SIGTERM, up to ``STOP_GRACE`` seconds, then SIGKILL."""
        self.signal(signal.SIGTERM)
        if not self.wait(STOP_GRACE):
            self.signal(signal.SIGKILL)
            self.wait(STOP_GRACE)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def say(text: str) -> None:
    """A line in the lease's log (``dlsched logs ID``)."""
    print(f"[dlsched kernel lease {time.strftime('%H:%M:%S')}] {text}", flush=True)


def hold(
    folder_text: str,
    *,
    home: str | None,
    idle: float | None,
    grace: float,
    gpus: float = 0.0,
    server_pid: int = 0,
    restart_window: float = 10.0,
    launch_wait: float = 120.0,
    restore_pid: int = 0,
) -> dict[str, Any]:
    """Hold this job's grant for the kernel whose control folder is ``folder_text``.

    Returns (as the job's result) why the lease ended and how long the kernel held its GPUs
    idle: ``{"ended": "shut down", "idle_seconds": 812.0, ...}``. While it holds, the job's
    progress says how many cells ran (``done``), the GPU-hours held idle (``idle_gpu_h``:
    time without a running cell times the GPUs) and the current idle stretch (``idle_min``).

    ``restore_pid``: the lease of a suspended kernel's next cell, which restores the kernel
    onto this grant first (or ends, saying why it could not).
    """
    folder = Path(folder_text)
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda sig, frame: stopping.append(sig))
    grant = {k: os.environ[k] for k in control.GRANT_ENV if k in os.environ}
    job_id = os.environ.get("DLSCHED_JOB_ID", "")
    control.write(folder, "grant.json", {"job_id": job_id, "env": grant, "pid": os.getpid()})
    say(f"granted {grant.get('CUDA_VISIBLE_DEVICES') or 'no GPU'}; waiting for the kernel")
    watch = _Watch(folder, home=home, idle=idle, grace=grace, job_id=job_id, gpus=gpus)
    if server_pid > 0:  # watched from the start: a server gone before its kernel came
        watch.server = _Watched(server_pid)
    granted = time.time()
    try:
        if restore_pid > 0:
            refused = watch.restore(restore_pid)
            if refused is not None:
                return watch.end("not restored", refused)
        while True:
            if stopping:
                return watch.end("cancelled", "the lease was cancelled; the kernel was stopped")
            if control.marked(folder, "released"):
                return watch.end("shut down", "the kernel was shut down")
            watch.follow_kernel_file()
            if watch.server is not None and not watch.server.alive():
                return watch.end(
                    "server gone",
                    "the Jupyter server that started the kernel went away; the kernel was stopped",
                )
            if watch.kernel is None:
                if time.time() - granted > launch_wait:
                    return watch.end("never started", "no kernel started with this lease")
            elif not watch.kernel.alive():
                if not watch.restarted(restart_window, stopping):
                    if stopping:
                        continue
                    if control.marked(folder, "released"):
                        continue
                    return watch.end("kernel exited", "the kernel's process ended")
                continue
            watch.account()
            ended = watch.check_idle()
            if ended is not None:
                return ended
            time.sleep(POLL)
    finally:
        watch.close()


class _Watch:
    """What ``hold`` follows: the kernel, its server, its activity, the queue."""

    def __init__(
        self,
        folder: Path,
        *,
        home: str | None,
        idle: float | None,
        grace: float,
        job_id: str,
        gpus: float = 0.0,
    ) -> None:
        self.folder, self.home, self.idle, self.grace, self.job_id = (
            folder,
            home,
            idle,
            grace,
            job_id,
        )
        self.kernel: _Watched | None = None
        self.server: _Watched | None = None
        self.kernel_started = time.time()
        self._kernel_file: tuple[int, float] | None = None
        self._waiters_at = 0.0
        self._waiters = 0
        self._scheduler: Any = None
        self.gpus = gpus
        self.idle_seconds = 0.0
        self._accounted_at = time.time()
        self._reported_at = 0.0
        self.reclaimed = False
        self.checkpointer = Checkpointer()
        #: the kernel this lease restored: suspended again before it is ever killed (#53)
        self.restored_pid = 0
        self._wrote_at = 0.0

    def follow_kernel_file(self) -> None:
        data = control.read(self.folder, "kernel.json")
        if data is None:
            return
        pid, server = int(data.get("pid") or 0), int(data.get("server_pid") or 0)
        key = (pid, float(data.get("started") or 0))
        if key == self._kernel_file or pid <= 0:
            return
        self._kernel_file = key
        if self.kernel is not None:
            self.kernel.close()
        self.kernel = _Watched(pid)
        self.kernel_started = float(data.get("started") or time.time())
        if self.server is None and server > 0:
            self.server = _Watched(server)
        control.unmark(self.folder, "restarting")
        say(f"kernel pid {pid} holds the grant")

    def restarted(self, window: float, stopping: list[int]) -> bool:
        """The kernel died: True once a new kernel took its place (a restart)."""
        assert self.kernel is not None
        old = self.kernel.pid
        deadline = time.time() + window
        while time.time() < deadline or control.marked(self.folder, "restarting"):
            if stopping or control.marked(self.folder, "released"):
                return False
            if self.server is not None and not self.server.alive():
                return False
            self.follow_kernel_file()
            if self.kernel.pid != old and self.kernel.alive():
                say(f"kernel restarted (pid {old} -> {self.kernel.pid}); the lease is kept")
                return True
            if time.time() > deadline + 300:  # a restart that never finishes
                return False
            time.sleep(POLL)
        return False

    # -- idle reclaim ----------------------------------------------------------------------

    def check_idle(self) -> dict[str, Any] | None:
        if self.idle is None or self.kernel is None:
            return None
        activity = control.read(self.folder, "activity.json") or {}
        last = max(float(activity.get("last") or 0), self.kernel_started)
        warning = control.read(self.folder, "warning.json")
        now = time.time()
        if activity.get("busy") or now - last < self.idle:
            if warning is not None:
                control.unmark(self.folder, "warning.json")
                say("the kernel ran a cell: the reclaim warning is withdrawn")
                self._reported_at = 0.0  # the views learn it at the next report
            return None
        waiters = self.waiters()
        if not waiters:
            if warning is not None:
                control.unmark(self.folder, "warning.json")
                say("nothing waits for GPUs any more: the reclaim warning is withdrawn")
                self._reported_at = 0.0
            return None
        if warning is None:
            reclaim_at = now + self.grace
            control.write(
                self.folder,
                "warning.json",
                {
                    "since": last,
                    "warned": now,
                    "reclaim_at": reclaim_at,
                    "waiting": waiters,
                    "idle": self.idle,
                },
            )
            say(
                f"idle {_words(now - last)} while {waiters} job(s) wait for GPUs: "
                f"reclaimed in {_words(self.grace)} unless a cell runs"
            )
            self.report(activity, now)
            return None
        if now >= float(warning.get("reclaim_at") or 0):
            assert self.kernel is not None
            decision = reclaim_decision(self.checkpointer, activity)
            idle = f"idle {_words(now - last)} while {waiters} job(s) waited for GPUs: "
            self.reclaimed = True
            if decision.action == "suspend":
                failed = self.suspend_kernel()
                if failed is None:
                    return self.end(
                        "suspended",
                        idle + "the kernel was suspended (its GPU memory moved to host "
                        "memory) and its GPUs went to the queue; its next cell waits in line "
                        "for a GPU",
                    )
                decision = Decision("shutdown", failed)
            self.stop_kernel()
            return self.end(
                "reclaimed",
                idle + "the kernel was shut down and its GPUs went to the queue "
                f"(not suspended: {decision.reason})",
            )
        return None

    # -- suspend and restore (suspend.py) ---------------------------------------------------

    def granted(self) -> list[int]:
        raw = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        return [int(x) for x in raw.split(",") if x.strip().isdigit()]

    def suspend_kernel(self) -> str | None:
        """Move the kernel's CUDA state to host memory; None once done, else why not."""
        assert self.kernel is not None
        pid = self.kernel.pid
        held = held_by([pid])
        try:
            self.checkpointer.suspend(pid)
        except CheckpointError as error:
            return f"the suspend failed: {error}"
        control.write(
            self.folder,
            "suspended.json",
            {
                "pid": pid,
                "devices": self.granted(),
                "held": max(held.values(), default=0),
                "at": time.time(),
                "job_id": self.job_id,
            },
        )
        control.unmark(self.folder, "restored.json")
        say(f"kernel pid {pid} suspended ({held or 'no GPU memory read'})")
        return None

    def restore(self, pid: int) -> str | None:
        """Bring a suspended kernel back onto this lease's grant; None once done, else why
        not (the kernel stays suspended, and its next cell tries again)."""
        suspended = control.read(self.folder, "suspended.json") or {}
        if int(suspended.get("pid") or 0) != pid:
            return f"kernel pid {pid} is not suspended"
        granted, before = self.granted(), [int(x) for x in suspended.get("devices") or []]
        if before and granted != before:
            return (
                f"the grant is GPU {granted}, but the kernel's state belongs on GPU {before} "
                "(a restore onto another GPU is not supported)"
            )
        refused = restore_refusal(int(suspended.get("held") or 0), free_memory(granted))
        if refused is not None:
            return refused  # a restore without room leaves the process stuck (#44)
        try:
            self.checkpointer.restore(pid)
        except CheckpointError as error:
            return f"the restore failed: {error}"
        self.restored_pid = pid
        for name in ("suspended.json", "ended.json", "warning.json"):
            control.unmark(self.folder, name)
        control.write(self.folder, "restored.json", {"job_id": self.job_id, "pid": pid})
        say(f"kernel pid {pid} restored onto GPU {granted}")
        return None

    def stop_kernel(self) -> None:
        """Stop the kernel; one this lease restored is suspended first (cuda-checkpoint#53:
        a restored process killed with its CUDA state live can hang in the driver)."""
        assert self.kernel is not None
        if self.restored_pid and self.kernel.pid == self.restored_pid and self.kernel.alive():
            try:
                self.checkpointer.suspend(self.kernel.pid)
            except CheckpointError as error:
                say(f"could not suspend the restored kernel before stopping it: {error}")
        self.kernel.stop()

    def waiters(self) -> int:
        """Jobs waiting for GPUs (read at most every ``WAITERS_EVERY`` seconds)."""
        now = time.time()
        if now - self._waiters_at < WAITERS_EVERY:
            return self._waiters
        self._waiters_at = now
        try:
            if self._scheduler is None:
                from ..client.scheduler import Scheduler

                shared = bool(os.environ.get("DLSCHED_SOCKET"))
                self._scheduler = Scheduler(None if shared else self.home, loop=False)
            queued = self._scheduler.jobs(state="queued")
        except Exception as error:  # the queue unreadable for now: reclaim nothing
            say(f"cannot read the queue ({error}); nothing is reclaimed")
            self._waiters = 0
            return 0
        self._waiters = sum(1 for j in queued if j.id != self.job_id and waits_for_gpus(j))
        return self._waiters

    # -- accounting ------------------------------------------------------------------------

    def account(self) -> None:
        """Add the time since the last call to the idle time when no cell ran in it."""
        now = time.time()
        elapsed, self._accounted_at = now - self._accounted_at, now
        activity = control.read(self.folder, "activity.json") or {}
        if self.kernel is not None and not activity.get("busy"):
            self.idle_seconds += elapsed
        if now - self._reported_at >= REPORT_EVERY:
            self.report(activity, now)

    def report(self, activity: dict[str, Any], now: float) -> None:
        from ..inside import runtime

        self._reported_at = now
        last = max(float(activity.get("last") or 0), self.kernel_started)
        stretch = 0.0 if activity.get("busy") else max(0.0, now - last)
        # what the views show: the reclaim to come (JupyterLab warns), or the one done
        metrics: dict[str, float] = {"idle_gpu_h": round(self.gpus * self.idle_seconds / 3600, 4)}
        warning = control.read(self.folder, "warning.json")
        if warning is not None:
            metrics["reclaim_at"] = float(warning.get("reclaim_at") or 0)
        if self.reclaimed:
            metrics["reclaimed"] = 1.0
        metrics["idle_min"] = round(stretch / 60, 1)
        # progress writes closer together than this are dropped; a warning must land
        time.sleep(max(0.0, runtime.PROGRESS_MIN_INTERVAL + 0.01 - (time.time() - self._wrote_at)))
        self._wrote_at = time.time()
        try:
            runtime.progress(int(activity.get("cells") or 0), None, **metrics)
        except Exception as error:  # accounting must never end the lease
            say(f"could not report the idle time: {error}")

    # -- ending ----------------------------------------------------------------------------

    def end(self, why: str, message: str) -> dict[str, Any]:
        if why in ("cancelled", "server gone") and self.kernel is not None:
            self.stop_kernel()
        activity = control.read(self.folder, "activity.json") or {}
        try:
            control.write(self.folder, "ended.json", {"ended": why, "message": message})
            control.unmark(self.folder, "warning.json")
        except OSError as error:  # the folder went with its kernel: the result still says it
            say(f"cannot write to the kernel's folder ({error})")
        self._accounted_at = time.time()
        self.report(activity, time.time())
        if why == "shut down":
            # the provisioner let go of the kernel for good: nobody reads the folder again
            shutil.rmtree(self.folder, ignore_errors=True)
        say(f"lease ended ({why}): {message}; idle {_words(self.idle_seconds)} in all")
        return {
            "ended": why,
            "message": message,
            "idle_seconds": round(self.idle_seconds, 1),
            "idle_gpu_hours": self.gpus * self.idle_seconds / 3600,
        }

    def close(self) -> None:
        for watched in (self.kernel, self.server):
            if watched is not None:
                watched.close()
        if self._scheduler is not None:
            try:
                self._scheduler.close()
            except Exception:
                pass
        sys.stdout.flush()


#: why a queued job waits, when freeing a GPU would not start it (the policy's own words)
_NOT_HELPED_BY_A_GPU = ("waiting for job ", "the limit per user", "stag")


def waits_for_gpus(job: Any) -> bool:
    """Whether a queued job asks for GPUs and a GPU coming free could start it: not one that
    waits for another job to finish, for its data, or under its owner's limit."""
    if not (job.gpus > 0 or job.gpu_mem):
        return False
    words = (job.waiting or "").lower()
    return not any(reason in words for reason in _NOT_HELPED_BY_A_GPU)


def _words(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
