"""The job process(es) a supervisor forks: environment, cores, ranks, running the payload.

Everything here runs on the far side of ``os.fork()`` or prepares it; the
supervisor that watches these processes is ``supervisor.py``.
"""

from __future__ import annotations

import ctypes
import json
import os
import pwd
import resource
import signal
import socket
import struct
import sys
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..inside.runtime import DATA_ENV_PREFIX, run_payload
from ..store import JobInfo, Store
from ..store.results import result_name
from ..vocab import private
from .containment import Containment
from .preload import note_imports, top_level_modules
from .warmscript import Script, run_warm, warm_script

PR_SET_PDEATHSIG = 1

#: What a job process that ran its function to a result tells its supervisor on
#: ``Launch.result_fd`` as its last act before it exits: its pid, its CPU seconds and its
#: peak RSS in KiB (its own and its waited-for children's, as ``wait4`` would give them).
RESULT_REPORT = struct.Struct("=qdq")


#: Where a shared pool's job finds programs when its submission carried no environment.
OWNER_PATH = "/usr/local/bin:/usr/bin:/bin"


def job_environment(
    job: JobInfo, store: Store, context: dict[str, Any], *, inherit: bool = True
) -> dict[str, str]:
    """The environment a job process sees: the submitter's, plus its grant.

    ``inherit=False`` (a shared pool's service): a submission that carried no environment
    starts from an almost empty one (``PATH``; ``become`` adds the owner's ``HOME`` and
    names), never from the service's own.
    """
    submitted = context.get("env")
    if isinstance(submitted, dict):
        env = {str(k): str(v) for k, v in submitted.items()}
    elif inherit:
        env = dict(os.environ)
    else:
        env = {"PATH": OWNER_PATH}
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
    for name in [k for k in env if k.startswith(DATA_ENV_PREFIX)]:
        env.pop(name)  # the submitter's own inputs, when it is a job itself
    if job.stage_in:
        for name, path in store.job_data_paths(job.id).items():
            env[DATA_ENV_PREFIX + name.upper()] = path
    threads = str(max(1, int(job.cpus)))
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[name] = threads
    return env


def cores_for(job: JobInfo, store: Store) -> set[int]:
    """The CPU cores (ids) the job's grant names, within what this process may use."""
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


def become(uid: int, env: dict[str, str]) -> None:
    """Drop to user ``uid`` for good: groups, gid, uid, umask, and the user's HOME and names.

    Done first in a job process of a shared pool, before anything of the job is
    read or unpickled; a failure ends the process instead of running as root.
    """
    import pwd

    try:
        entry = pwd.getpwuid(uid)
        os.setgroups(os.getgrouplist(entry.pw_name, entry.pw_gid))
        os.setgid(entry.pw_gid)
        os.setuid(uid)
        if os.getuid() != uid or os.geteuid() != uid:
            raise PermissionError(f"still uid {os.geteuid()}")
    except (KeyError, OSError) as error:
        os.write(2, f"[dlsched] cannot run as uid {uid}: {error}\n".encode())
        os._exit(126)
    os.umask(0o077)
    env.update(HOME=entry.pw_dir, USER=entry.pw_name, LOGNAME=entry.pw_name)


_LIBC: list[ctypes.CDLL] = []


def libc() -> ctypes.CDLL:
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


@dataclass(frozen=True)
class Launch:
    """What a job's process is started with, by a fresh fork (``start_ranks``) or by a process
    forked ahead (``warm.WarmProcess.start``).

    ``as_user``: a shared pool's supervisor (root) runs it as the job's owner. ``box``: what
    holds every process of the job (its cgroup is entered right after the fork, before
    anything of the job runs).
    """

    folder: Path
    job: JobInfo
    env: dict[str, str]
    context: dict[str, Any]
    payload: bytes
    cores: set[int]
    log_fd: int  # the job's log, open for appending: its stdout and stderr
    as_user: int | None = None
    box: Containment | None = None
    #: where a one-process function job says its result is written (``RESULT_REPORT``), so
    #: its supervisor records the end before the process is torn down; -1: it does not say
    result_fd: int = -1
    #: the owner's buffer folder, where a pool of one's own's job writes its result's big
    #: buffers (``store/results.py``); None: beside the result in the spool folder
    results: Path | None = None


def start_ranks(launch: Launch) -> list[int]:
    """Fork the job's process(es), all in one process group led by rank 0."""
    job, env, box = launch.job, launch.env, launch.box
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
            _run_job(replace(launch, env=rank_env), supervisor, pgid, rank)
        if box is not None:
            box.add(pid)
        try:
            os.setpgid(pid, pgid or pid)  # also done by the child: whichever runs first wins
        except OSError:
            pass
        pids.append(pid)
    return pids


def _run_job(launch: Launch, supervisor: int, pgid: int = 0, rank: int = 0) -> None:
    """A job process (rank ``rank`` of a distributed job): never returns."""
    folder, job, env, context = launch.folder, launch.job, launch.env, launch.context
    payload, cores, log_fd, as_user, box = (
        launch.payload,
        launch.cores,
        launch.log_fd,
        launch.as_user,
        launch.box,
    )
    code = 1
    report = -1
    try:
        if box is not None:
            try:
                box.join()  # still root: a job process cannot leave its cgroup afterwards
            except OSError as error:
                os.write(log_fd, f"[dlsched] cannot enter the job's cgroup: {error}\n".encode())
                os._exit(126)
        try:
            os.setpgid(0, pgid)
        except OSError:
            pass

        try:
            libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
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
        if as_user is not None:
            become(as_user, env)
            try:
                libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # a uid change clears it
            except (OSError, AttributeError):
                pass
        os.chdir(_working_folder(context.get("cwd")))
        if cores:
            os.sched_setaffinity(0, cores)
            if world_size(job) == 1:
                # (not a distributed job's ranks: fitted there, an elastic DDP job's resize
                # was not taken up in the elastic DDP test; why is not known yet)
                fit_threads(len(cores))
        # a program run next is given ``env`` by the exec; this process takes it only to
        # run the function itself
        if as_user is not None:
            _exec_as_owner(folder, job, env, context, payload, rank)  # never returns
        if job.kind == "command":
            argv = json.loads(payload)["argv"]
            script = warm_script(argv, env)
            if script is None:
                try:
                    os.execvpe(argv[0], argv, env)
                except OSError as error:
                    print(f"[dlsched] cannot run {argv[0]!r}: {error}", file=sys.stderr)
                    os._exit(127)
            take_environment(env)
            code = run_command_warm(folder, script, rank)
            return  # (the finally exits with ``code``)
        take_environment(env)
        for entry in reversed(context.get("sys_path") or []):
            if entry not in sys.path:
                sys.path.insert(0, entry)
        results = launch.results
        named = result_name(job.id, job.attempts)
        code = run_python(folder, payload, rank, (results, named) if results else None)
        if code == 0 and world_size(job) == 1:
            report = launch.result_fd
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            if report >= 0:
                _report_result(report)
        finally:
            os._exit(code)


def fit_threads(cores: int) -> None:
    """Fit the thread pools of what was imported before the job's cores were set (torch,
    imported ahead: ``preload.py``) to those cores: they were sized by the machine's, and
    more threads than cores spin against each other (a small model trained 15 times slower
    on one core with two threads)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            torch.set_num_threads(max(1, cores))
        except Exception:
            pass  # the job runs with torch's own choice


def _working_folder(cwd: object) -> str:
    """Where the job runs: the folder it was submitted from, else (none given, or gone
    since) its owner's home, else ``/``; never its supervisor's folder, which in a shared
    pool is the service's. Called as the owner, so a folder the owner cannot enter is
    passed over too."""
    if isinstance(cwd, str) and cwd and os.path.isdir(cwd) and os.access(cwd, os.X_OK):
        return cwd
    try:
        home = pwd.getpwuid(os.getuid()).pw_dir
    except KeyError:
        home = ""
    if home and os.path.isdir(home) and os.access(home, os.X_OK):
        return home
    return "/"


def take_environment(env: dict[str, str]) -> None:
    """This process's environment becomes ``env``, changing only the variables that differ:
    a job's environment is mostly what this forked copy has already, and rewriting all of
    it would copy the pages of every variable's objects shared with its supervisor."""
    for name in [name for name in os.environ if name not in env]:
        del os.environ[name]
    for name, value in env.items():
        if os.environ.get(name) != value:
            os.environ[name] = value


def _report_result(fd: int) -> None:
    """Tell the supervisor the result is written, with what this process used (its exit,
    the tearing down of a forked copy of its supervisor, is not waited for)."""
    me, waited = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    cpu = me.ru_utime + me.ru_stime + waited.ru_utime + waited.ru_stime
    try:
        os.write(fd, RESULT_REPORT.pack(os.getpid(), cpu, max(me.ru_maxrss, waited.ru_maxrss)))
    except OSError:
        pass  # the supervisor records the end at the exit, as it would without a report


def _exec_as_owner(
    folder: Path,
    job: JobInfo,
    env: dict[str, str],
    context: dict[str, Any],
    payload: bytes,
    rank: int,
) -> None:
    """A shared pool's job process (already its owner): a fresh program, so the job's code
    finds nothing of the service in its memory or its open files."""
    if job.kind == "command":
        argv = json.loads(payload)["argv"]
    else:
        # the payload goes through the owner's own spool folder (this process is the owner)
        private.write_file(folder / f"payload-{rank}.pkl", payload)
        meta = {"sys_path": context.get("sys_path") or []}
        private.write_file(folder / f"job-{rank}.json", json.dumps(meta).encode())
        python = context.get("executable") or sys.executable
        argv = [python, "-m", "jupyter_dlsched.local.jobrun", str(folder), str(rank)]
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2:
            try:
                os.close(fd)
            except OSError:
                pass
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as error:
        print(f"[dlsched] cannot run {argv[0]!r}: {error}", file=sys.stderr)
        sys.stderr.flush()
        os._exit(127)


def _result_folder(folder: Path) -> Path | None:
    """Where the result's big buffers go: beside ``result.pkl`` when the job's folder is its
    own user's (a pool of one's own, whose client maps them), else nowhere (in band)."""
    try:
        return folder if os.stat(folder).st_uid == os.getuid() else None
    except OSError:
        return None


def run_command_warm(folder: Path, script: Script, rank: int = 0) -> int:
    """Run a ``python script.py`` command job in this warm process (``warmscript.py``); its
    exit status. Rank 0 notes what the script imported, as a function job's does."""
    before = top_level_modules()
    try:
        return run_warm(script)
    finally:
        if rank == 0:
            note_imports(folder, before)


def run_python(
    folder: Path, data: bytes, rank: int = 0, results: tuple[Path, str] | None = None
) -> int:
    """Run a function job's payload; its exit status. Rank 0 notes what the job imported
    (``preload.py``: the next jobs find it imported). ``results``: the buffer folder its
    result's big buffers go to, and the name they start with (``store/results.py``)."""
    before = top_level_modules()
    try:
        return _run_python(folder, data, rank, results)
    finally:
        if rank == 0:
            note_imports(folder, before)


def _run_python(
    folder: Path, data: bytes, rank: int, results: tuple[Path, str] | None = None
) -> int:
    from ..store.buffers import dumps

    try:
        result = run_payload(data)
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
        written = _dump_into_memory(result, results) if results is not None else None
        data = written or dumps(result, _result_folder(folder), named="result")
    except Exception as error:
        wrapped = TypeError(f"the job's result could not be pickled: {error}")
        _write_error(folder, wrapped, rank)
        return 1
    private.write_file(folder / "result.pkl", data)
    return 0


def _dump_into_memory(result: Any, results: tuple[Path, str]) -> bytes | None:
    """``result`` pickled, its big buffers written into the owner's buffer folder under
    ``results``' name; None where they do not fit there (or cannot be written: the spool
    folder takes them instead, as it takes a shared pool's), nothing of them left."""
    from ..store.buffers import DataTooLarge, dumps
    from ..store.results import discard

    folder, named = results
    try:
        return dumps(result, folder, named=named)
    except (DataTooLarge, OSError):  # (a folder planted in the way is an OSError too)
        discard(folder, named)  # what was written before the rest failed
        return None


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
        private.write_file(folder / "error.pkl", cloudpickle.dumps(error))
    except Exception:
        pass
