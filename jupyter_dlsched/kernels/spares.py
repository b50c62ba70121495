"""Warm GPU kernels: one spare kernel process per GPU kernelspec, handed over at lease time.

The provisioner keeps, per GPU kernelspec it started a kernel of, one spare (``spare.py``):
a process of the kernelspec's Python with ipykernel, the activity extension and the
modules GPU kernels imported (torch, once a kernel imported it) already imported, CUDA not
initialised and no GPU visible. When a lease is granted, ``launch`` hands the kernel's
command line, environment (the grant's ``CUDA_VISIBLE_DEVICES`` and ``DLSCHED_GPU_MEM``)
and working folder to it instead of spawning a new process, and the next spare starts
behind it. The spare is a ``Popen`` like a spawned kernel's, in a session of its own, so
the provisioner polls, signals, interrupts and kills it as ``LocalProvisioner`` does.

A spare is used only where it is the process the kernelspec would have started: the same
``python [options] -m ipykernel_launcher`` command, the same environment but for what
changes from one kernel to the next (``PER_KERNEL``); otherwise the kernel is spawned as
before and the spare replaced. ``DLSCHED_PRELOAD=none`` in the Jupyter server's environment turns spares
off; ``DLSCHED_PRELOAD=a,b`` pins what they import.
"""

from __future__ import annotations

import atexit
import json
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import control
from .spare import EXIT_DROPPED, KERNEL_MODULES, pinned

#: a kernelspec's name and its Python with that Python's options (``-X ...``)
Key = tuple[str, tuple[str, ...]]
#: variables that differ from one kernel of a kernelspec to the next: everything else in a
#: kernel's environment must be what its spare started with
PER_KERNEL = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "DLSCHED_DEVICES",
        "DLSCHED_GPU_MEM",
        control.LEASE_ENV,
        "DLSCHED_KERNEL_JOB",
        "JPY_SESSION_NAME",
    }
)
#: seconds a new spare waits before importing: the kernel just handed over starts first
DELAY = 1.0
#: spares of one kernelspec that may end before any kernel used them (then: spawn)
MAX_FAILURES = 3
SPARE_SCRIPT = Path(__file__).with_name("spare.py")


def enabled() -> bool:
    """Spare kernels are on unless ``DLSCHED_PRELOAD=none``."""
    return pinned() != []


@dataclass
class Spare:
    """One waiting spare: its process and the environment it started with."""

    key: Key
    process: subprocess.Popen[bytes]
    env: dict[str, str]

    def stop(self) -> None:
        """Let it go (it is no kernel yet: SIGTERM ends it, even in the middle of an import)."""
        try:
            if self.process.stdin is not None:
                self.process.stdin.close()
            self.process.terminate()
            self.process.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait()


_lock = threading.Lock()
_spares: dict[Key, Spare] = {}
_failures: dict[Key, int] = {}


def key_of(kernelspec: str, cmd: list[str]) -> Key | None:
    """``(kernelspec, (python, *its options))`` for a ``python [OPTIONS] -m
    ipykernel_launcher ...`` command line; None for any other kernel."""
    for at in range(1, len(cmd) - 1):
        if cmd[at : at + 2] == ["-m", "ipykernel_launcher"]:
            return kernelspec, tuple(cmd[:at])
    return None


def kernel_argv(key: Key, cmd: list[str]) -> list[str]:
    """What ipykernel_launcher's own ``sys.argv[1:]`` would be."""
    return cmd[len(key[1]) + 2 :]


def comparable(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in PER_KERNEL}


def take(key: Key, env: dict[str, str], log: Any) -> Spare | None:
    """The waiting spare of ``key`` when it can become a kernel with ``env``; else None
    (a spare started with another environment is let go)."""
    with _lock:
        spare = _spares.pop(key, None)
    if spare is None:
        return None
    code = spare.process.poll()
    if code is not None:
        _ended(spare, code, log)
        return None
    if spare.env != comparable(env):
        changed = sorted(set(spare.env.items()) ^ set(comparable(env).items()))
        log.info(
            "spare kernel of %s not used: the environment changed (%s)",
            key[0],
            ", ".join(sorted({k for k, _ in changed})[:5]),
        )
        spare.stop()
        return None
    return spare


def hand_over(spare: Spare, argv: list[str], env: dict[str, str], cwd: str | None) -> bool:
    """Send the kernel's command line, environment and folder; False when it is gone."""
    message = json.dumps({"argv": argv, "env": env, "cwd": cwd}) + "\n"
    try:
        assert spare.process.stdin is not None
        spare.process.stdin.write(message.encode())
        spare.process.stdin.flush()
    except OSError:
        spare.process.kill()
        spare.process.wait()
        return False
    return True


def ensure(key: Key, env: dict[str, str], log: Any) -> None:
    """Start the spare of ``key`` unless one waits (or its spares keep failing)."""
    if not enabled():
        return
    with _lock:
        if key in _spares or _failures.get(key, 0) >= MAX_FAILURES:
            return
        kernelspec, python = key[0], list(key[1])
        folder = control.base_folder() / "spares"
        folder.mkdir(mode=0o700, exist_ok=True)
        spare_env = {**comparable(env), "CUDA_VISIBLE_DEVICES": ""}  # no GPU while it waits
        try:
            process = subprocess.Popen(
                [*python, str(SPARE_SCRIPT), str(folder), kernelspec, str(DELAY)],
                stdin=subprocess.PIPE,
                env=spare_env,
                cwd=folder,
                start_new_session=True,
            )
        except OSError as error:
            _failures[key] = MAX_FAILURES
            log.warning("no spare kernel for %s: %s", kernelspec, error)
            return
        _spares[key] = Spare(key, process, comparable(env))


def _ended(spare: Spare, code: int, log: Any) -> None:
    """A spare ended before any kernel used it: one that dropped a module is replaced;
    others count towards ``MAX_FAILURES``."""
    if code != EXIT_DROPPED:
        with _lock:
            _failures[spare.key] = _failures.get(spare.key, 0) + 1
        log.warning(
            "the spare kernel of %s ended (exit status %s) before a kernel needed it",
            spare.key[0],
            code,
        )


def stop_all() -> None:
    """Let every spare of this process go (at exit; also when a test ends)."""
    with _lock:
        spares = list(_spares.values())
        _spares.clear()
        _failures.clear()
    for spare in spares:
        spare.stop()


atexit.register(stop_all)


def waiting(base: Path | None = None) -> list[dict[str, Any]]:
    """The spare kernels waiting under this user's Jupyter runtime folder: pid,
    kernelspec, modules imported ahead, memory (``rss``) — ``dlsched status`` shows them."""
    import psutil

    if base is None:
        try:
            from jupyter_core.paths import jupyter_runtime_dir
        except ImportError:  # no Jupyter in this environment (a shell user's): no kernels
            return []
        base = Path(jupyter_runtime_dir()) / "dlsched-kernels"
    found = []
    for path in sorted((base / "spares").glob("*.json")):
        try:
            data = json.loads(path.read_text())
            process = psutil.Process(int(data["pid"]))
            # the pid of a spare that ended may be another process's by now: one started
            # after the spare wrote its file
            if process.create_time() > float(data["started"]) + 1:
                continue
            data["rss"] = process.memory_info().rss
        except (OSError, ValueError, KeyError, TypeError, psutil.Error):
            continue
        found.append(data)
    return found


def words(spares: list[dict[str, Any]]) -> str:
    """``spare GPU kernels: 1 (python3-1gpu) waiting with ipykernel, torch imported, 244.0
    MiB (DLSCHED_PRELOAD=none turns them off)``: what every kernel imports is "ipykernel"."""
    from ..vocab.units import format_size

    names = ", ".join(sorted({str(s.get("kernelspec")) for s in spares}))
    every = {name.partition(".")[0] for name in KERNEL_MODULES}
    learnt = sorted({m for s in spares for m in s.get("modules") or [] if m not in every})
    ahead = ", ".join(["ipykernel", *learnt])
    size = format_size(sum(int(s.get("rss") or 0) for s in spares))
    return (
        f"spare GPU kernels: {len(spares)} ({names}) waiting with {ahead} imported, {size} "
        f"(DLSCHED_PRELOAD=none turns them off)"
    )
