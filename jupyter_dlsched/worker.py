"""The supervisor of one job, and the job process it starts.

A supervisor runs in its own session (so it outlives the kernel), claims the
job in the ledger, forks the job process with its devices, cores and
environment set, streams output to ``spool/<id>/log``, renews the lease,
enforces time limit, memory limit, cancellation and preemption, records how
the job ended, and then ticks the scheduler once so the queue keeps draining
with no kernel or server alive.

    python -m jupyter_dlsched.worker --home DLSCHED_HOME JOB_ID
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import select
import signal
import socket
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from .errors import IllegalTransition, JobNotFound
from .runtime import STOP_FILE
from .settings import Settings
from .store import JobInfo, Store
from .units import format_size

PR_SET_PDEATHSIG = 1
POLL_SECONDS = 0.2
MEMORY_CHECK_SECONDS = 0.5


def supervise(home: str | os.PathLike[str], job_id: str) -> int:
    """Run ``job_id`` to its end; returns the supervisor's exit status."""
    store = Store(home)
    try:
        job = store.get(job_id)
    except JobNotFound:
        return 2
    if job.uid != os.getuid():
        return 2  # payloads run only as the user who submitted them
    settings = Settings.load(store)
    claimed = store.claim(job, settings.lease_ttl)
    if claimed is None:
        return 0
    job = claimed
    folder = store.spool(job_id)
    folder.mkdir(mode=0o700, exist_ok=True)
    for stale in ("result.pkl", "error.json", "error.pkl", STOP_FILE):
        (folder / stale).unlink(missing_ok=True)
    log_fd = os.open(folder / "log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    if job.attempts > 1:
        os.write(log_fd, f"[dlsched] attempt {job.attempts}\n".encode())
    context = json.loads(store.read_file(job_id, "context.json") or b"{}")
    payload = store.read_file(job_id, "command.json" if job.kind == "command" else "payload.pkl")
    if payload is None:
        payload = b'{"argv": ["false"]}' if job.kind == "command" else b""
    env = job_environment(job, store, context)
    cores = _cores(job, store)
    pids = _start_ranks(folder, job, env, context, payload, cores, log_fd)
    os.close(log_fd)
    store.update(job_id, job_pid=pids[0])
    outcome = _monitor(store, job, pids, settings, folder)
    _record(store, job, outcome, folder)
    store.close()
    _tick_after(home)
    return 0


def job_environment(job: JobInfo, store: Store, context: dict[str, Any]) -> dict[str, str]:
    """The environment a job process sees: the submitter's, plus its grant."""
    env = dict(context.get("env") or os.environ)
    env.update(job.env)
    placement = job.placement
    devices = list(placement.gpus) if placement else []
    env["DLSCHED_JOB_ID"] = job.id
    env["DLSCHED_HOME"] = str(store.home)
    env["DLSCHED_DEVICES"] = ",".join(map(str, devices))
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # NVML's order, the one devices are numbered in
    env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, devices))
    if placement and placement.shared:
        env["DLSCHED_GPU_MEM"] = ",".join(map(str, placement.gpu_mem))
    else:
        env.pop("DLSCHED_GPU_MEM", None)
    threads = str(max(1, int(job.cpus)))
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[name] = threads
    return env


def _cores(job: JobInfo, store: Store) -> set[int]:
    if not job.placement or not job.placement.cpus:
        return set()
    inventory = store.get_meta("inventory", {}) or {}
    cores = inventory.get("cores") or []
    mapped = {cores[i] if i < len(cores) else i for i in job.placement.cpus}
    try:
        usable = os.sched_getaffinity(0)
    except AttributeError:
        return set()
    return mapped & usable


_LIBC: list[ctypes.CDLL] = []


def _libc() -> ctypes.CDLL:
    """The C library, loaded once (in the launcher, before it forks)."""
    if not _LIBC:
        _LIBC.append(ctypes.CDLL(None))
    return _LIBC[0]


def world_size(job: JobInfo) -> int:
    """Processes a job runs: one per granted GPU (or whole CPU) when distributed, else one."""
    if not job.distributed:
        return 1
    return len(job.devices) or max(1, int(job.cpus))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _start_ranks(
    folder: Path,
    job: JobInfo,
    env: dict[str, str],
    context: dict[str, Any],
    payload: bytes,
    cores: set[int],
    log_fd: int,
) -> list[int]:
    """Fork the job's process(es), all in one process group led by rank 0."""
    world = world_size(job)
    if job.distributed:
        env = {
            **env,
            "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(_free_port()),
        }
    supervisor = os.getpid()
    pids: list[int] = []
    for rank in range(world):
        rank_env = env
        if job.distributed:
            rank_env = {**env, "RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0"}
        pgid = pids[0] if pids else 0
        pid = os.fork()
        if pid == 0:
            _run_job(folder, job, rank_env, context, payload, cores, log_fd, supervisor, pgid, rank)
        try:
            os.setpgid(pid, pgid or pid)  # also done by the child: whichever runs first wins
        except OSError:
            pass
        pids.append(pid)
    return pids


def _run_job(
    folder: Path,
    job: JobInfo,
    env: dict[str, str],
    context: dict[str, Any],
    payload: bytes,
    cores: set[int],
    log_fd: int,
    supervisor: int,
    pgid: int = 0,
    rank: int = 0,
) -> None:
    """A job process (rank ``rank`` of a distributed job): never returns."""
    code = 1
    try:
        try:
            os.setpgid(0, pgid)
        except OSError:
            pass
        try:
            _libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass
        if os.getppid() != supervisor:
            os._exit(1)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
        sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
        cwd = context.get("cwd")
        if cwd and os.path.isdir(cwd):
            os.chdir(cwd)
        if cores:
            os.sched_setaffinity(0, cores)
        os.environ.clear()
        os.environ.update(env)
        if job.kind == "command":
            argv = json.loads(payload)["argv"]
            try:
                os.execvpe(argv[0], argv, env)
            except OSError as error:
                print(f"[dlsched] cannot run {argv[0]!r}: {error}", file=sys.stderr)
                os._exit(127)
        for entry in reversed(context.get("sys_path") or []):
            if entry not in sys.path:
                sys.path.insert(0, entry)
        code = _run_python(folder, payload, rank)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _run_python(folder: Path, data: bytes, rank: int = 0) -> int:
    import cloudpickle

    try:
        payload = cloudpickle.loads(data)
        runner = payload.get("runner")
        if runner is not None:
            result = runner(payload)
        else:
            # ``map`` pickles the function once for all its jobs
            fn = (
                cloudpickle.loads(payload["fn_pickle"])["fn"]
                if "fn_pickle" in payload
                else payload["fn"]
            )
            result = fn(*payload.get("args", ()), **payload.get("kwargs", {}))
    except SystemExit as stop:
        if stop.code in (0, None):
            result = None
        else:
            _write_error(folder, stop, rank)
            return stop.code if isinstance(stop.code, int) else 1
    except BaseException as error:
        _write_error(folder, error, rank)
        return 1
    if rank != 0:
        return 0  # a distributed job's result is rank 0's
    try:
        data = cloudpickle.dumps(result)
    except Exception as error:
        wrapped = TypeError(f"the job's result could not be pickled: {error}")
        _write_error(folder, wrapped, rank)
        return 1
    tmp = folder / "result.pkl.tmp"
    tmp.write_bytes(data)
    tmp.rename(folder / "result.pkl")
    return 0


def _write_error(folder: Path, error: BaseException, rank: int = 0) -> None:
    """Record the job's exception; with several ranks the first failing rank's is kept."""
    import cloudpickle

    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    sys.stderr.write(text)
    message = str(error) if rank == 0 else f"rank {rank}: {error}"
    info = {"type": type(error).__name__, "message": message, "traceback": text, "rank": rank}
    try:
        fd = os.open(folder / "error.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(info))
    try:
        (folder / "error.pkl").write_bytes(cloudpickle.dumps(error))
    except Exception:
        pass


@dataclass
class Outcome:
    status: int = 0
    stop_reason: str | None = None  # cancel, preempt, timeout, oom, lease
    detail: str = ""


def _monitor(
    store: Store, job: JobInfo, pids: list[int], settings: Settings, folder: Path
) -> Outcome:
    """Watch the job's processes until all have exited; stop them when the job must end."""
    outcome = Outcome()
    pgid = pids[0]
    poller = select.poll()
    pidfds = {os.pidfd_open(pid): pid for pid in pids}
    for fd in pidfds:
        poller.register(fd, select.POLLIN)
    statuses: dict[int, int] = {}
    started = job.started or time.time()
    next_renew = time.time() + settings.lease_ttl / 4
    next_memory = 0.0
    kill_at: float | None = None
    version = -1  # read the flags once at the start: a cancel may predate this supervisor
    processes = []
    for pid in pids:
        try:
            processes.append(psutil.Process(pid))
        except psutil.Error:
            continue
    grants = (
        dict(zip(job.placement.gpus, job.placement.gpu_mem, strict=False))
        if (job.placement and job.placement.shared)
        else {}
    )

    def stop(reason: str, detail: str, at_once: bool = False) -> None:
        nonlocal kill_at
        if outcome.stop_reason is not None:
            return
        outcome.stop_reason, outcome.detail = reason, detail
        (folder / STOP_FILE).touch()
        _signal_group(pgid, signal.SIGKILL if at_once else signal.SIGTERM)
        grace = settings.preempt_grace() if reason == "preempt" else settings.grace
        kill_at = time.time() + (0.0 if at_once else grace)

    while len(statuses) < len(pids):
        for fd, _ in poller.poll(POLL_SECONDS * 1000):
            pid = pidfds[fd]
            poller.unregister(fd)
            os.close(fd)
            _, status = os.waitpid(pid, 0)
            statuses[pid] = status
            if status != 0 and len(pids) > 1 and outcome.stop_reason is None:
                rank = pids.index(pid)
                _, _, why = _describe_status(status, folder)
                stop("rank", f"rank {rank} failed ({why}); stopped the other ranks")
        if len(statuses) == len(pids):
            break
        now = time.time()
        if now >= next_renew:
            next_renew = now + settings.lease_ttl / 4
            with store.transaction() as db:
                kept = db.execute(
                    "UPDATE jobs SET lease_expires=? WHERE id=? AND state='running' "
                    "AND supervisor_pid=?",
                    (now + settings.lease_ttl, job.id, os.getpid()),
                ).rowcount
            if not kept:
                stop("lease", "the allocation was taken back", at_once=True)
        current = store.data_version()
        if current != version:
            version = current
            row = store.get(job.id)
            if row.cancel_requested:
                stop("cancel", "cancelled by user")
            elif row.preempt_requested:
                stop("preempt", "preempted by a higher-priority job")
        if job.time_limit is not None and now - started >= job.time_limit:
            from .units import format_duration

            stop("timeout", f"time limit {format_duration(job.time_limit)} reached")
        if now >= next_memory and (job.mem or grants):
            next_memory = now + MEMORY_CHECK_SECONDS
            tree = _tree(processes)
            used = _rss(tree)
            if job.mem and used > job.mem:
                stop(
                    "oom",
                    f"out of memory: used {format_size(used)}, limit {format_size(job.mem)}",
                    at_once=True,
                )
            over = _gpu_over_grant(tree, grants)
            if over:
                stop("oom", over, at_once=True)
        if kill_at is not None and now >= kill_at:
            _signal_group(pgid, signal.SIGKILL)
            kill_at = None
    _signal_group(pgid, signal.SIGKILL)  # whatever the job left behind in its group
    bad = [st for st in statuses.values() if st != 0]
    outcome.status = statuses[pgid] if statuses[pgid] != 0 or not bad else bad[0]
    return outcome


def _tree(processes: list[psutil.Process]) -> list[psutil.Process]:
    tree = list(processes)
    for p in processes:
        try:
            tree += p.children(recursive=True)
        except psutil.Error:
            continue
    return tree


def _rss(tree: list[psutil.Process]) -> int:
    total = 0
    for p in tree:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            continue
    return total


def _gpu_over_grant(tree: list[psutil.Process], grants: dict[int, int]) -> str | None:
    """Why a shared-GPU job is over its memory grant (measured through NVML), or None."""
    if not grants:
        return None
    try:
        from .gpu_watch import job_gpu_memory
    except ImportError:
        return None
    used = job_gpu_memory({p.pid for p in tree})
    for index, limit in grants.items():
        if used.get(index, 0) > limit:
            return (
                f"GPU out of memory: used {format_size(used[index])}, "
                f"limit {format_size(limit)} on GPU {index}"
            )
    return None


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _describe_status(status: int, folder: Path) -> tuple[int | None, int | None, str]:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return None, sig, f"killed by signal {signal.Signals(sig).name}"
    code = os.WEXITSTATUS(status)
    error_file = folder / "error.json"
    if error_file.exists():
        try:
            error = json.loads(error_file.read_text())
            message = error["message"].strip().splitlines()
            first = message[0] if message else ""
            return code, None, f"{error['type']}: {first}"[:300]
        except (ValueError, KeyError):
            pass
    return code, None, f"exit code {code}"


def _record(store: Store, job: JobInfo, outcome: Outcome, folder: Path) -> None:
    now = time.time()
    exit_code, term_signal, detail = _describe_status(outcome.status, folder)
    started = job.started or now
    attained = job.attained + max(0.0, now - started) * job.gpus
    common: dict[str, Any] = {
        "exit_code": exit_code,
        "term_signal": term_signal,
        "attained": attained,
        "lease_expires": None,
    }
    reason = outcome.stop_reason
    try:
        with store.transaction() as db:
            if reason == "cancel":
                to, why = "cancelled", "cancelled by user"
            elif reason == "preempt":
                to, why = "preempted", "requeued after preemption"
                common.update(
                    placement=None,
                    supervisor_pid=None,
                    job_pid=None,
                    preempt_requested=0,
                    preemptions=job.preemptions + 1,
                )
            elif reason == "timeout":
                to, why = "timeout", outcome.detail
            elif reason == "lease":
                return  # the reaper already recorded this job as lost or requeued
            elif reason in ("oom", "rank"):
                to, why = "failed", outcome.detail
            elif exit_code == 0 and (job.kind == "command" or (folder / "result.pkl").exists()):
                to, why = "succeeded", ""
            else:
                to, why = "failed", detail
            if to == "failed" and job.attempts <= job.retries:
                to = "queued"
                why = f"retry {job.attempts}/{job.retries} after: {why}"
                common.update(placement=None, supervisor_pid=None, job_pid=None)
            if to != "queued" and to != "preempted":
                common["finished"] = now
            store.transition_in(db, job.id, to, why, expect=["running"], now=now, **common)
    except (IllegalTransition, JobNotFound):
        pass  # the job was reaped (lease expired) while this supervisor was stalled


def _tick_after(home: str | os.PathLike[str]) -> None:
    """Start whatever can start now that this job's resources are free."""
    if not (Path(home) / "ledger.sqlite").exists():
        return  # the state folder was removed while the job ran: nothing to schedule
    try:
        from .scheduler import Scheduler

        with Scheduler(home, backend="local", loop=False, probe_pool=False) as sched:
            sched.tick()
    except Exception:
        traceback.print_exc()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Supervise one jupyter-dlsched job.")
    parser.add_argument("--home", required=True)
    parser.add_argument("job_id")
    args = parser.parse_args(argv)
    return supervise(args.home, args.job_id)


if __name__ == "__main__":
    sys.exit(main())
