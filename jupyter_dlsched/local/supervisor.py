"""The supervisor of one job at a time.

A supervisor runs in its own session (so it outlives the kernel), claims the
job in the ledger, forks the job process(es) (``jobproc.py``) with their
devices, cores and environment set, streams output to ``spool/<id>/log``, renews the lease,
enforces time limit, memory limit, cancellation and preemption, records how
the job ended, and then has the pool decide what starts next: it tells the pool
agent, or without one ticks the scheduler once itself, so the queue keeps
draining with no kernel or server alive. A spare supervisor of the pool agent
then waits for another job (``agent/forking.py``).

    python -m jupyter_dlsched.local.supervisor --home DLSCHED_HOME JOB_ID
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..inside.runtime import STOP_FILE
from ..machine.mps import MpsDaemons
from ..store import JobInfo, Lease, RunEnd, Store
from ..store.buffers import buffer_folder
from ..store.results import clear as clear_result
from ..store.results import result_name, settle
from ..store.settings import Settings
from ..vocab import private
from ..vocab.errors import IllegalTransition, JobNotFound, LedgerUnavailable, UnsafeStateFolder
from ..vocab.units import format_size
from .containment import Containment, sweep_cgroups
from .ending import Outcome, describe_status, read_report, record_end, record_refusal, wait_status
from .jobproc import Launch, cores_for, job_environment, start_ranks, world_size
from .logcap import LogKeeper
from .preload import learn
from .usage import Tree, Usage, gpu_over_grant, own_memory
from .wake import LastWord, decide_after, tell_agent
from .warm import WarmProcess

POLL_SECONDS = 0.2
#: Seconds a job runs before its pid is written to the ledger.
PID_AFTER = 0.01
MEMORY_CHECK_SECONDS = 0.5
#: How often a job without memory limits has its usage read (peak RSS, CPU, GPU memory).
USAGE_SECONDS = 1.0
#: How often a running job's CPU and RSS now are written to the ledger.
LIVE_SECONDS = 2.0


def supervise(
    home: str | os.PathLike[str],
    job_id: str,
    *,
    as_owner: bool = False,
    agent: str | bytes | None = None,
    store: Store | None = None,
    warm: WarmProcess | None = None,
    again: bool | None = None,
) -> int:
    """Run ``job_id`` to its end; returns the supervisor's exit status.

    ``as_owner``: a shared pool's service (root) supervises, and the job process
    runs as the job's owner, in a spool folder that belongs to the owner.
    ``agent``: the pool agent to tell when the job has ended. ``store``: the ledger,
    when the caller opened it already (a spare supervisor, before its job was known).
    ``warm``: the job's process, forked ahead of the job (``warm.py``), when there is
    one; it is let go if the job does not run in it. ``again``: a spare supervisor's job,
    after which it waits for another (True) or exits (False), as it tells the agent with
    the job's end (``ended`` with ``again``; ``agent/forking.py``).
    """
    word = LastWord(again)
    try:
        return _supervise(home, job_id, as_owner, agent, store, warm, word)
    except BaseException:
        word.again = False if again is not None else None  # it exits
        raise
    finally:
        if warm is not None:
            warm.discard()  # not given the job: it goes
        if agent is not None and word.again is not None and not word.said:
            tell_agent(agent, job_id, home, word)  # it ended before it ran (or failed)


def rehearse(store: Store, job_id: str) -> None:
    """What a spare supervisor does while it waits for its next job: the reads that job's
    start begins with (its row, the settings, its context, its environment and cores), here
    those of the job it ran last, written nowhere.

    A spare has just forked its next job's process ahead (``warm.py``), so the two share
    every page; whichever writes a shared page first copies it, and Python writes to the
    pages of whatever it touches. The first reads of a job's start copied about 200 pages
    (1 ms of the spare's CPU) on the path from a decision to the job's first line; read once
    while waiting, those pages are the spare's own before the job comes.
    """
    try:
        job = store.get(job_id)
        Settings.load(store)
        context = json.loads(store.read_file(job_id, "context.json") or b"{}")
        job_environment(job, store, context)
        cores_for(job, store)
    except Exception:
        pass  # nothing is decided here: the job's start reads again, and says what failed


def _supervise(
    home: str | os.PathLike[str],
    job_id: str,
    as_owner: bool,
    agent: str | bytes | None,
    store: Store | None,
    warm: WarmProcess | None,
    word: LastWord,
) -> int:
    store = store if store is not None else Store(home)
    try:
        job = store.get(job_id)
    except JobNotFound:
        return 2
    owner: int | None = None
    if job.uid != os.getuid():
        if not as_owner or os.geteuid() != 0:
            return 2  # payloads run only as the user who submitted them
        owner = job.uid
    settings = Settings.load(store)
    lease = store.claim(job, settings.lease_ttl)
    if lease is None:
        return 0
    job = lease.job
    # a shared pool's supervisor (root) also gives the job a cgroup of its own
    box = Containment.create(job.id, job.attempts, home, cgroup=as_owner and os.geteuid() == 0)
    if box.cgroup is not None:
        sweep_cgroups(home, store.holding_attempts)  # crashed supervisors'
    try:
        folder = store.make_spool(job_id, owner=owner)
        private.clear_files(folder, ("result.pkl", "error.json", "error.pkl", STOP_FILE))
        # a pool of one's own's job writes its result's buffers into memory (results.py)
        results = buffer_folder(Path(home)) if owner is None and job.kind != "command" else None
        if job.attempts > 1:
            clear_result(folder, results, job.id)  # an earlier attempt's
        log_fd = private.open_append(folder / "log", owner)
    except (UnsafeStateFolder, OSError) as error:
        # a link, FIFO or folder the job's owner planted: the job fails, and says why
        box.close()
        record_refusal(store, lease, str(error))
        decide_after(home, job_id, agent, word)
        return 0
    if job.attempts > 1:
        os.write(log_fd, f"[dlsched] attempt {job.attempts}\n".encode())
    context = json.loads(store.read_file(job_id, "context.json") or b"{}")
    payload = store.read_file(job_id, "command.json" if job.kind == "command" else "payload.pkl")
    if payload is None:
        payload = b'{"argv": ["false"]}' if job.kind == "command" else b""
    env = job_environment(job, store, context, inherit=not as_owner)
    mps_gpu = _join_mps(store, job, owner, env, log_fd)
    if isinstance(agent, str):
        env["DLSCHED_SOCKET"] = agent  # a shared pool: the job reports progress to the service
    cores = cores_for(job, store)
    # a one-process function job run for an agent says when its result is written: its
    # success is recorded then, for its client, and its grant is released once it exited
    report_r, report_w = -1, -1
    if agent is not None and owner is None and job.kind != "command" and world_size(job) == 1:
        report_r, report_w = os.pipe()
    # the job's output reaches its log through a pipe this supervisor empties, within a cap
    # and never into the disk's last reserve (logcap.py)
    keeper = LogKeeper(log_fd, folder)
    launch = Launch(
        folder, job, env, context, payload, cores, keeper.job_end, owner, box, report_w, results
    )
    started = None
    if warm is not None and warm.fits(job, payload):
        started = warm.start(launch)
    if started is not None:
        pids = [started]
    else:
        if warm is not None:
            warm.discard()  # before the job's own processes: every descendant is the job's
        pids = start_ranks(launch)
    keeper.started()
    if report_w >= 0:
        os.close(report_w)

    held = False

    def record_result(usage: Usage) -> bool:
        """The job's result is written and its process exits: its success, recorded now
        with its grant held (``Lease.finish(..., hold=True)``), and the agent told."""
        nonlocal held
        keeper.pump()  # what it printed before its result is in the log when result() returns
        try:
            lease.finish(RunEnd("succeeded"), hold=True, **usage.columns(job))
        except (IllegalTransition, JobNotFound, LedgerUnavailable):
            return False  # recorded at its exit instead, as without a report
        held = True
        try:
            decide_after(home, job_id, agent)
        except Exception:
            traceback.print_exc()  # the agent sees the end at its next look at the ledger
        return True

    try:
        outcome = _monitor(
            store,
            lease,
            pids,
            settings,
            folder,
            owner,
            box,
            result=(report_r, record_result) if report_r >= 0 else None,
            keeper=keeper,
        )
    except Exception as error:
        # whatever broke here must not leave the job running unwatched until its lease
        # lapses ("lost"): its processes go, and the job fails saying why
        traceback.print_exc()
        box.kill_all()
        why = f"its supervisor failed: {type(error).__name__}: {error}"
        # (a success already recorded stays one: its grant is released below)
        outcome = Outcome(stop_reason="crash", detail=why[:300], recorded=held)
    finally:
        box.close()  # its cgroup, once the last of its processes is gone
        keeper.close()  # what the job wrote last, then the log
        os.close(log_fd)
        if report_r >= 0:
            os.close(report_r)
    record_end(lease, outcome, folder, owner)
    if mps_gpu is not None:
        _leave_mps(store, job.id, mps_gpu)
    if owner is None:
        learn(store, folder, os.getuid())  # what the job imported, for the next ones
    store.close()
    decide_after(home, job_id, agent, word)
    if results is not None:  # the result leaves memory for the spool folder, on disk
        settle(folder, results, result_name(job.id, job.attempts))
    return 0


def _join_mps(
    store: Store, job: JobInfo, owner: int | None, env: dict[str, str], log_fd: int
) -> int | None:
    """Make a fractional job an MPS client of its GPU's daemon where MPS holds fractions
    (``mps.py``); the GPU it joined, or None where cap + watch stays."""
    if not (job.placement and job.placement.shared and len(job.placement.gpus) == 1):
        return None
    gpu = int(job.placement.gpus[0])
    gpus = (store.get_meta("inventory", {}) or {}).get("gpus") or []
    known: dict[str, Any] = next((g for g in gpus if int(g.get("index", -1)) == gpu), {})
    uuid = str(known.get("uuid") or "")
    device = uuid if uuid.startswith("GPU-") else str(gpu)
    try:
        added = MpsDaemons(store.home).join(
            job, owner if owner is not None else os.getuid(), device, known.get("mem_total")
        )
    except OSError as error:  # the daemon would not start: the fraction stays cap + watch
        os.write(log_fd, f"[dlsched] MPS not used on GPU {gpu}: {error}\n".encode())
        return None
    if not added:
        return None
    env.update(added)
    limits = ", ".join(
        f"{k}={v}" for k, v in added.items() if k.startswith("CUDA_MPS_") and "DIR" not in k
    )
    os.write(log_fd, f"[dlsched] an MPS client on GPU {gpu}: {limits}\n".encode())
    return gpu


def _leave_mps(store: Store, job_id: str, gpu: int) -> None:
    try:
        holding = {j.id for j in store.jobs(holding=True)}
        MpsDaemons(store.home).leave(job_id, gpu, holding=holding.__contains__)
    except Exception:
        traceback.print_exc()  # a daemon left running is stopped by the GPU's next job end


def _monitor(
    store: Store,
    lease: Lease,
    pids: list[int],
    settings: Settings,
    folder: Path,
    owner: int | None = None,
    box: Containment | None = None,
    result: tuple[int, Callable[[Usage], bool]] | None = None,
    keeper: LogKeeper | None = None,
) -> Outcome:
    """Watch the job's processes until all have exited, its main ones and whatever they
    started (``box``); stop them all when the job must end, or when ``lease`` was taken
    back. ``result``: where the job's process says its result is written
    (``RESULT_REPORT``), and what records its success then (True once recorded: its held
    grant is renewed from then on, and the process is killed if it is not gone within
    ``grace``)."""
    job = lease.job
    box = box if box is not None else Containment()
    box.ranks.update(pids)  # reaped here, never by the box: their status is the job's
    outcome = Outcome()
    pgid = pids[0]
    ranks = set(pids)
    poller = select.poll()
    pidfds = {os.pidfd_open(pid): pid for pid in pids}
    for fd in pidfds:
        poller.register(fd, select.POLLIN)
    report_fd, record_result = result if result is not None else (-1, None)
    if report_fd >= 0:
        poller.register(report_fd, select.POLLIN)
    log_pipe = keeper.fd if keeper is not None else -1
    if log_pipe >= 0:
        poller.register(log_pipe, select.POLLIN)
    statuses: dict[int, int] = {}
    started = job.started or time.time()
    next_renew = time.time() + settings.lease_ttl / 4
    store.ledger.removed()  # holds the ledger's file from now on: a new one is not it
    next_memory = 0.0
    kill_at: float | None = None
    version = -1  # read the flags once at the start: a cancel may predate this supervisor
    tree = Tree(box)
    grants = (
        dict(zip(job.placement.gpus, job.placement.gpu_mem, strict=False))
        if (job.placement and job.placement.shared)
        else {}
    )
    left_behind = False  # the main processes have exited: what is left is being stopped

    def signal_all(sig: int) -> None:
        table = box.table()
        for pid in box.signal(sig, table):
            if pid not in ranks and (left_behind or table[pid].pgid != pgid):
                outcome.strays.add(pid)
        _signal_group(pgid, sig)

    def stop(reason: str, detail: str, at_once: bool = False) -> None:
        nonlocal kill_at
        if left_behind:
            kill_at = time.time()  # the job has ended: what it left goes now
            return
        if outcome.stop_reason is not None:
            return
        outcome.stop_reason, outcome.detail = reason, detail
        signal_all(signal.SIGKILL if at_once else signal.SIGTERM)
        if not private.touch(folder / STOP_FILE, owner):
            os.write(
                2, f"[dlsched] job {job.id}: its {STOP_FILE} flag could not be written\n".encode()
            )
        grace = settings.preempt_grace() if reason == "preempt" else settings.grace
        kill_at = time.time() + (0.0 if at_once else grace)

    next_usage = 0.0
    # what it uses now is first written after a while: a short job costs no transaction for it
    next_live = time.time() + LIVE_SECONDS
    pid_recorded = False
    while True:
        # the job's pid is written once it has run for a moment: a job that ends at once
        # costs no transaction for it (the end is recorded in one)
        timeout = POLL_SECONDS if pid_recorded else PID_AFTER
        # the report before an exit seen in the same wake-up: it was written before the exit
        # (and a job that left processes behind keeps its early result)
        for fd, _ in sorted(poller.poll(timeout * 1000), key=lambda ready: ready[0] != report_fd):
            if fd == log_pipe:
                assert keeper is not None
                if not keeper.pump():
                    poller.unregister(fd)  # every writer is gone: nothing more comes
                continue
            if fd == report_fd:
                poller.unregister(fd)
                said = read_report(fd, pgid)
                # (once its exit is seen, the end is recorded as usual, in one transaction)
                if said and record_result and outcome.stop_reason is None and not statuses:
                    usage = replace(outcome.usage)
                    usage.reported(*said)
                    if record_result(usage):
                        outcome.usage, outcome.recorded, pid_recorded = usage, True, True
                        # it said it is done: it has the grace to be gone (its limits, a
                        # cancel and a lease taken back still stop it sooner)
                        grace_end = time.time() + settings.grace
                        kill_at = grace_end if kill_at is None else min(kill_at, grace_end)
                continue
            pid = pidfds[fd]
            poller.unregister(fd)
            os.close(fd)
            if pid == pgid:
                # the group's leader is reaped last, after the group is killed: until then
                # its number (the group's) cannot be given to another process
                status = wait_status(os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT))
            else:
                _, status, rusage = os.wait4(pid, 0)
                outcome.usage.reaped(rusage)
            statuses[pid] = status
            if status != 0 and len(pids) > 1 and outcome.stop_reason is None:
                rank = pids.index(pid)
                _, _, why = describe_status(status, folder, owner)
                stop("rank", f"rank {rank} failed ({why}); stopped the other ranks")
        if len(statuses) == len(pids):
            box.reap()
            if not box.pids():
                break
            if not left_behind:
                # the main processes are gone and left others running (a daemon, a
                # double fork): they are stopped like the job, and its grant waits for them
                left_behind = True
                signal_all(signal.SIGTERM)
                if kill_at is None:
                    kill_at = time.time() + settings.grace
        if not pid_recorded:
            pid_recorded = True
            store.update(job.id, job_pid=pgid)
        now = time.time()
        if now >= next_renew:
            next_renew = now + settings.lease_ttl / 4
            try:
                if outcome.recorded:
                    kept = lease.renew_held(now + settings.lease_ttl)
                else:
                    kept = lease.renew(now + settings.lease_ttl)
            except LedgerUnavailable:
                kept = True  # disk full: keep the job and try again at the next renewal
            if not kept:
                stop("lease", "the allocation was taken back", at_once=True)
            elif store.ledger.removed():
                # the state folder was removed: nothing will ever record or stop this job
                stop("lease", "its state folder was removed", at_once=True)
        current = store.data_version()
        if current != version:
            version = current
            row = store.get(job.id)
            if row.cancel_requested:
                stop("cancel", "cancelled by user")
            elif row.preempt_requested:
                stop("preempt", "preempted by a higher-priority job")
        if job.time_limit is not None and now - started >= job.time_limit:
            from ..vocab.units import format_duration

            stop("timeout", f"time limit {format_duration(job.time_limit)} reached")
        limits = bool(job.mem or grants)
        if now >= (next_memory if limits else next_usage):
            next_memory = now + MEMORY_CHECK_SECONDS
            next_usage = now + USAGE_SECONDS
            box.reap()  # processes of the job re-parented here that have exited
            processes = tree.now()
            outcome.usage.sample(processes, gpus=job.gpus > 0)
            used = own_memory(processes) if job.mem else 0
            if job.mem and used > job.mem:
                stop(
                    "oom",
                    f"out of memory: used {format_size(used)}, limit {format_size(job.mem)}",
                    at_once=True,
                )
            over = gpu_over_grant(processes, grants)
            if over:
                stop("oom", over, at_once=True)
        if now >= next_live and pid_recorded and not outcome.recorded:
            next_live = now + LIVE_SECONDS
            try:
                store.set_live_usage(
                    job.id, os.getpid(), round(outcome.usage.cpu_now, 1), outcome.usage.rss_now
                )
            except LedgerUnavailable:
                pass  # disk full: the next reading tries again
        if kill_at is not None and now >= kill_at:
            _signal_group(pgid, signal.SIGKILL)
            table = box.table()
            for pid in box.kill_all():
                if pid not in ranks and (
                    left_behind or pid not in table or table[pid].pgid != pgid
                ):
                    outcome.strays.add(pid)
            kill_at = now + 1.0 if box.pids() else None  # one that would not die: again
    _signal_group(pgid, signal.SIGKILL)  # whatever the job left behind in its group
    _, _, rusage = os.wait4(pgid, 0)  # the leader, kept as a zombie until now
    outcome.usage.reaped(rusage)
    box.reap()
    bad = [st for st in statuses.values() if st != 0]
    outcome.status = statuses[pgid] if statuses[pgid] != 0 or not bad else bad[0]
    return outcome


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Supervise one jupyter-dlsched job.")
    parser.add_argument("--home", required=True)
    parser.add_argument("job_id")
    args = parser.parse_args(argv)
    return supervise(args.home, args.job_id)


if __name__ == "__main__":
    sys.exit(main())
