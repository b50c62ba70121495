"""Inside the Ray task: what runs on a cluster node for one job.

``run_task`` is the Ray task itself (``RayBackend`` wraps it with ``ray.remote``):
it sets up the job's environment (``_job_context``), runs the job — a function or
cell payload in a thread (``_PythonJob``), an argv command (``_CommandJob``), or one
process per rank of a distributed job (``_RanksJob``) — and yields its output and
outcome back to the submitting process, whose monitor (``ray_monitor.py``) records
them. Nothing here touches the ledger: the node need not share a disk with it.

The ranks of a distributed job are this module run as a program:
``python -m jupyter_dlsched.backends.ray_task FOLDER RANK``.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..inside.runtime import run_payload
from ..store.buffers import map_buffer, write_buffer
from ..vocab import private
from .remote_task import adopt_submit_context, error_outcome

TASK_FLUSH_SECONDS = 0.2
PR_SET_PDEATHSIG = 1


def write_atomic(path: Path, data: bytes) -> None:
    private.write_file(path, data)


def run_task(task: dict[str, Any]) -> Iterator[tuple[Any, ...]]:
    """The Ray task of one job: yields ``started``, ``log`` chunks, then its outcome.

    A generator, so output streams back to the submitting process while the job
    runs: the job's node need not share a disk with the ledger.
    """
    import ray

    gpus = [str(g) for g in ray.get_gpu_ids()]
    yield ("started", {"pid": os.getpid(), "node": ray.util.get_node_ip_address(), "gpus": gpus})
    with tempfile.TemporaryFile() as capture:
        with _job_context(task, gpus, capture.fileno()):
            job: _PythonJob | _CommandJob | _RanksJob
            if task["argv"]:
                job = _CommandJob(task, capture.fileno())
            elif task.get("world"):
                job = _RanksJob(task, capture.fileno())
            else:
                job = _PythonJob(task)
            offset = 0
            while True:
                finished = job.wait(TASK_FLUSH_SECONDS)
                sys.stdout.flush()
                sys.stderr.flush()
                while chunk := os.pread(capture.fileno(), 1 << 20, offset):
                    offset += len(chunk)
                    yield ("log", chunk)
                if finished:
                    break
    yield job.outcome


@contextlib.contextmanager
def _job_context(task: dict[str, Any], gpus: list[str], fd: int) -> Iterator[None]:
    """The job's environment, folder, import path and output capture; all undone after.

    Ray reuses worker processes, so nothing of one job may leak into the next.
    """
    saved_env, saved_path, saved_cwd = dict(os.environ), list(sys.path), os.getcwd()
    saved_streams = sys.stdout, sys.stderr
    sys.stdout.flush()
    sys.stderr.flush()
    saved_fds = os.dup(1), os.dup(2)
    try:
        os.environ.update(task["env"])
        os.environ["DLSCHED_DEVICES"] = ",".join(gpus)
        adopt_submit_context(task)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
        sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
        yield
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        sys.stdout, sys.stderr = saved_streams
        os.dup2(saved_fds[0], 1)
        os.dup2(saved_fds[1], 2)
        os.close(saved_fds[0])
        os.close(saved_fds[1])
        os.environ.clear()
        os.environ.update(saved_env)
        sys.path[:] = saved_path
        with contextlib.suppress(OSError):
            os.chdir(saved_cwd)


class _PythonJob:
    """A function or cell payload, run in a thread so its output can stream meanwhile."""

    def __init__(self, task: dict[str, Any], start: bool = True) -> None:
        self.outcome: tuple[Any, ...] = ("failed", "the job did not finish")
        self._payload = task["payload"]
        # its big buffers: Ray object refs by file path (the driver put them), or a rank's
        # own copies already mapped (``_RanksJob``)
        self._refs: dict[str, Any] = task.get("buffers") or {}
        self._mapped: dict[str, Any] | None = task.get("mapped")
        self._thread = threading.Thread(target=self._run, name="dlsched-job", daemon=True)
        if start:
            self._thread.start()

    def wait(self, timeout: float) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        import cloudpickle

        try:
            buffers = self._mapped
            if buffers is None and self._refs:
                buffers = _get_buffers(self._refs)
            result = run_payload(self._payload, buffers)
        except SystemExit as stop:
            if stop.code not in (0, None):
                code = stop.code if isinstance(stop.code, int) else 1
                self.outcome = error_outcome(stop, code)
                return
            result = None
        except BaseException as error:
            self.outcome = error_outcome(error, 1)
            return
        try:
            self.outcome = ("result", cloudpickle.dumps(result))
        except Exception as error:
            wrapped = TypeError(f"the job's result could not be pickled: {error}")
            self.outcome = error_outcome(wrapped, 1)


class _CommandJob:
    """An argv command, in its own session, killed if the Ray worker dies."""

    def __init__(self, task: dict[str, Any], fd: int) -> None:
        argv = task["argv"]
        self.outcome: tuple[Any, ...] = ("exit", 127)
        self._process: subprocess.Popen[bytes] | None = None
        try:
            self._process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=fd,
                stderr=subprocess.STDOUT,
                env=dict(os.environ),
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        except OSError as error:
            os.write(fd, f"[dlsched] cannot run {argv[0]!r}: {error}\n".encode())

    def wait(self, timeout: float) -> bool:
        if self._process is None:
            return True
        try:
            code = self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        self.outcome = ("exit", code)
        return True


class _RanksJob:
    """A distributed job: one process per rank on this node (``RANK``, ``WORLD_SIZE``,
    ``MASTER_ADDR``/``MASTER_PORT`` as torchrun sets them); rank 0's result is the job's.

    The ranks are fresh interpreters (``python -m jupyter_dlsched.backends.ray_task``):
    forking a Ray worker is not safe. If one rank fails, the others are ended.
    """

    def __init__(self, task: dict[str, Any], fd: int) -> None:
        self.outcome: tuple[Any, ...] = ("exit", 1)
        self._folder = tempfile.mkdtemp(prefix="dlsched-ranks-")
        write_atomic(Path(self._folder) / "payload.pkl", task["payload"])
        _keep_for_ranks(Path(self._folder), task.get("buffers") or {})
        world = int(task["world"])
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind(("127.0.0.1", 0))
            port = str(probe.getsockname()[1])
        path = [p for p in sys.path if p]
        self._processes: list[subprocess.Popen[bytes]] = []
        for rank in range(world):
            env = {
                **os.environ,
                "PYTHONPATH": os.pathsep.join(path),
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "GROUP_RANK": "0",
                "WORLD_SIZE": str(world),
                "LOCAL_WORLD_SIZE": str(world),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": port,
            }
            self._processes.append(
                subprocess.Popen(
                    [sys.executable, "-m", __name__, self._folder, str(rank)],
                    stdin=subprocess.DEVNULL,
                    stdout=fd,
                    stderr=subprocess.STDOUT,
                    env=env,
                    preexec_fn=_die_with_parent,
                )
            )

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            codes = [p.poll() for p in self._processes]
            if any(code not in (None, 0) for code in codes):
                for p in self._processes:
                    if p.poll() is None:
                        p.kill()
                for p in self._processes:
                    p.wait()
                break
            if all(code == 0 for code in codes):
                break
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        self.outcome = self._collect()
        shutil.rmtree(self._folder, ignore_errors=True)
        return True

    def _collect(self) -> tuple[Any, ...]:
        folder = Path(self._folder)
        for rank, process in enumerate(self._processes):
            error = folder / f"error-{rank}.json"
            if error.exists():
                pickled = folder / f"error-{rank}.pkl"
                data = pickled.read_bytes() if pickled.exists() else None
                return ("error", json.loads(error.read_text()), data, process.returncode or 1)
        failed = [p.returncode for p in self._processes if p.returncode != 0]
        if failed:
            return ("exit", failed[0])
        result = folder / "result.pkl"
        if result.exists():
            return ("result", result.read_bytes())
        return ("failed", "rank 0 ended without a result")


def _get_buffers(refs: dict[str, Any]) -> dict[str, Any]:
    """The big buffers from Ray's object store: arrays over its shared memory, no copy
    (read-only, as Ray hands out every array)."""
    import ray

    return dict(zip(refs, ray.get(list(refs.values())), strict=True))


def _keep_for_ranks(folder: Path, refs: dict[str, Any]) -> None:
    """A gang's ranks are fresh interpreters, not Ray workers: its big buffers are written
    once into their folder on this node (``buffers.json`` names them), and each rank
    maps them."""
    if not refs:
        return
    listed = {}
    for n, (path, array) in enumerate(_get_buffers(refs).items()):
        name = write_buffer(folder, memoryview(array).cast("B"), f"buffer.{n}")
        listed[path] = [name, array.nbytes]
    (folder / "buffers.json").write_text(json.dumps(listed))


def _rank_main(argv: list[str]) -> int:
    """One rank: ``python -m jupyter_dlsched.backends.ray_task FOLDER RANK``."""
    folder, rank = Path(argv[0]), int(argv[1])
    mapped = None
    listed = folder / "buffers.json"
    if listed.exists():
        mapped = {
            path: map_buffer(folder / name, size)
            for path, (name, size) in json.loads(listed.read_text()).items()
        }
    job = _PythonJob(
        {"payload": (folder / "payload.pkl").read_bytes(), "mapped": mapped}, start=False
    )
    job._run()
    kind = job.outcome[0]
    if kind == "result":
        if rank == 0:
            write_atomic(folder / "result.pkl", job.outcome[1])
        return 0
    if kind == "error":
        details, pickled, code = job.outcome[1], job.outcome[2], job.outcome[3]
        (folder / f"error-{rank}.json").write_text(json.dumps(details))
        if pickled is not None:
            write_atomic(folder / f"error-{rank}.pkl", pickled)
        return int(code)
    return 1


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(_rank_main(sys.argv[1:]))
