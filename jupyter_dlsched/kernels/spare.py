"""A spare GPU kernel: a Python process with a kernel's imports done, waiting for a lease.

The provisioner (``spares.py``) starts one per GPU kernelspec as::

    python .../jupyter_dlsched/kernels/spare.py SPARES_FOLDER KERNELSPEC DELAY

with the environment the kernelspec's kernels get, less the lease's grant:
``CUDA_VISIBLE_DEVICES`` is empty, so nothing it runs can reach a GPU. After ``DELAY``
seconds (the kernel just started beside it gets the CPU first) it imports what every kernel
imports (ipykernel's kernel app, the activity extension) and the modules GPU kernels were
seen to import (``imports.json``, written by ``activity.py``; ``DLSCHED_PRELOAD=a,b`` pins
the list), never initialising CUDA: a module after whose import the CUDA driver is loaded
(``libcuda`` mapped) or ``torch.cuda.is_initialized()`` is dropped, and the spare exits, so
the next one starts without it. Then it writes ``SPARES_FOLDER/<pid>.json`` (what it
imported; ``dlsched status`` reads it) and waits, importing what kernels learn meanwhile.

The handover is one JSON line on its stdin: ``{"argv": [...], "env": {...}, "cwd": ...}``.
It takes that environment whole (the grant's ``CUDA_VISIBLE_DEVICES`` and
``DLSCHED_GPU_MEM`` among it) and working folder before anything touches CUDA, and becomes
the kernel, as ``python -m ipykernel_launcher ARGV`` run there would: the same process, so
its pid, session and process group are those the provisioner holds. End of file on stdin
(the provisioner let it go, or its server died) or its server's death ends it.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import json
import os
import select
import signal
import sys
import time
from pathlib import Path
from typing import Any

#: the modules every kernel imports, also those its start imports on the way (its debugger:
#: debugpy alone is a third of a second); the activity extension is loaded in each GPU kernel
KERNEL_MODULES = (
    "ipykernel.kernelapp",
    "ipykernel.ipkernel",
    "ipykernel.debugger",
    "IPython.core.completerlib",
    "IPython.extensions.storemagic",
    "tornado.queues",
    "tornado.platform.asyncio",
    "jupyter_dlsched.kernels.activity",
)
#: what kernels imported beyond a kernel's start, name -> file (in the kernels' folder)
IMPORTS_FILE = "imports.json"
#: modules that must not be imported ahead (failed, hung or initialised CUDA), one a line
DROPPED_FILE = "imports.dropped"
#: modules imported ahead, at most (the first learnt first), as for job launchers
MAX_LEARNT = 8
#: seconds one module may take to import
IMPORT_BUDGET = 60.0
#: how often a waiting spare looks for newly learnt modules
LEARN_EVERY = 2.0
#: the exit status of a spare that dropped a module: the provisioner starts the next one
EXIT_DROPPED = 3
_OFF = ("none", "off", "0", "no")


class LetGo(BaseException):
    """The provisioner let this spare go (SIGTERM): not the fault of what it imported."""


def _let_go(signum: int, frame: Any) -> None:
    raise LetGo


def pinned() -> list[str] | None:
    """``DLSCHED_PRELOAD``'s modules (as job launchers read it), or None: learn.

    ``none`` turns spare kernels off altogether (``spares.enabled``)."""
    value = os.environ.get("DLSCHED_PRELOAD")
    if value is None:
        return None
    if value.strip().lower() in _OFF:
        return []
    return [name.strip() for name in value.split(",") if name.strip()]


def wanted(base: Path) -> list[tuple[str, str | None]]:
    """The modules to import ahead: ``(name, file)``, the file a kernel imported it from
    (None for a pinned name: whichever this Python finds)."""
    named = pinned()
    if named is not None:
        return [(name, None) for name in named]
    try:
        learnt = json.loads((base / IMPORTS_FILE).read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(learnt, dict):
        return []
    dropped = set(_read(base / DROPPED_FILE).split())
    found: list[tuple[str, str | None]] = [
        (str(n), f) for n, f in learnt.items() if isinstance(f, str) and n not in dropped
    ]
    return found[:MAX_LEARNT]


def cuda_touched() -> bool:
    """Whether anything in this process loaded the CUDA driver or initialised torch.cuda."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            return True
    except Exception:
        pass
    return "libcuda.so" in _read(Path("/proc/self/maps"))


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


class Spare:
    """The waiting process: its imports, its state file, its handover."""

    def __init__(self, folder: Path, kernelspec: str) -> None:
        self.folder, self.kernelspec = folder, kernelspec
        self.base = folder.parent
        self.state = folder / f"{os.getpid()}.json"
        self.modules: list[str] = []
        self.buffer = b""
        self.started = time.time()
        parent = os.getppid()
        try:
            self.parent: int | None = os.pidfd_open(parent)
        except (OSError, AttributeError):  # no pidfds (an old kernel or Python): EOF tells
            self.parent = None
        self._learnt_at = 0.0

    def wait(self, timeout: float) -> dict[str, Any] | None:
        """The handover when it comes within ``timeout`` s; None when nothing came;
        ``SystemExit`` when stdin ended or the server died."""
        deadline = time.monotonic() + timeout
        while True:
            fds = [0] + ([self.parent] if self.parent is not None else [])
            left = max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select(fds, [], [], left)
            if self.parent is not None and self.parent in ready:
                raise SystemExit(0)  # the server went away: nobody will hand a kernel over
            if 0 in ready:
                chunk = os.read(0, 1 << 16)
                if not chunk:
                    raise SystemExit(0)
                self.buffer += chunk
                if b"\n" in self.buffer:
                    line = self.buffer.split(b"\n", 1)[0]
                    message = json.loads(line)
                    return message if isinstance(message, dict) else None
                continue
            if time.monotonic() >= deadline:
                return None

    def import_ahead(self, name: str, origin: str | None) -> None:
        """Import one module; drop it (and exit) when it fails, hangs or touches CUDA."""
        if name in sys.modules:
            self._note(name)
            return
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is None or (origin is not None and spec.origin != origin):
            return  # not on this Python's path, or another module of that name
        previous = signal.signal(signal.SIGALRM, _too_long)
        signal.setitimer(signal.ITIMER_REAL, IMPORT_BUDGET)
        try:
            importlib.import_module(name)
        except LetGo:
            raise
        except BaseException as error:
            self.drop(name, f"importing it failed: {type(error).__name__}: {error}")
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        if cuda_touched():
            self.drop(name, "importing it initialised CUDA")
        self._note(name)

    def import_kernel(self) -> None:
        """What every kernel imports; a spare that cannot is no use (exit status 1: the
        provisioner spawns this kernelspec's kernels, after a few tries)."""
        for name in KERNEL_MODULES:
            # what a kernel's start prints on the way (debugpy's warning about frozen
            # modules) goes to its notebook, whose output it is not yet: not the server's log
            try:
                with contextlib.redirect_stderr(io.StringIO()):
                    importlib.import_module(name)
            except Exception as error:
                print(
                    f"[dlsched] spare kernel of {self.kernelspec}: cannot import {name} "
                    f"({type(error).__name__}: {error})",
                    file=sys.stderr,
                    flush=True,
                )
                self.forget()
                os._exit(1)
            self._note(name)

    def _note(self, name: str) -> None:
        top = name.partition(".")[0]
        if top not in self.modules:
            self.modules.append(top)

    def drop(self, name: str, why: str) -> None:
        print(
            f"[dlsched] spare kernel of {self.kernelspec}: {name} is no longer imported ahead "
            f"({why}); kernels import it themselves",
            file=sys.stderr,
            flush=True,
        )
        try:
            fd = os.open(self.base / DROPPED_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            with os.fdopen(fd, "a") as f:
                f.write(name + "\n")
        except OSError:
            pass
        self.forget()
        os._exit(EXIT_DROPPED)

    def learn(self) -> None:
        """Import what kernels learnt since (read at most every ``LEARN_EVERY`` s)."""
        now = time.monotonic()
        if now - self._learnt_at < LEARN_EVERY:
            return
        self._learnt_at = now
        before = list(self.modules)
        for name, origin in wanted(self.base):
            self.import_ahead(name, origin)
        if self.modules != before:
            self.write_state()

    def write_state(self) -> None:
        data = {
            "pid": os.getpid(),
            "kernelspec": self.kernelspec,
            "modules": self.modules,
            "started": self.started,
            "server_pid": os.getppid(),
        }
        tmp = self.state.with_name(f".{self.state.name}")
        try:
            tmp.write_text(json.dumps(data))
            os.replace(tmp, self.state)
        except OSError:
            pass

    def forget(self) -> None:
        try:
            self.state.unlink()
        except OSError:
            pass


def _too_long(signum: int, frame: Any) -> None:
    raise TimeoutError(f"it took more than {IMPORT_BUDGET:.0f} s")


def become_kernel(message: dict[str, Any]) -> None:
    """Take the lease's environment and working folder, then run the kernel here."""
    env = message.get("env")
    if isinstance(env, dict):
        os.environ.clear()
        os.environ.update({str(k): str(v) for k, v in env.items()})
    cwd = message.get("cwd")
    if cwd:
        os.chdir(cwd)
    launcher = importlib.util.find_spec("ipykernel_launcher")
    argv = [str(a) for a in message.get("argv") or []]
    sys.argv = [launcher.origin if launcher and launcher.origin else "ipykernel_launcher", *argv]
    torch = sys.modules.get("torch")
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if torch is not None and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))  # its thread pool was sized at import
    from ipykernel import kernelapp

    kernelapp.launch_new_instance()


def main(argv: list[str]) -> int:
    folder, kernelspec, delay = Path(argv[0]), argv[1], float(argv[2])
    # Run as a script (not -m), so that nothing of the package is imported before the
    # delay; its folder is not on the path of a kernel (nor is the working folder while
    # ipykernel_launcher imports: IPython puts the kernel's own back)
    if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
        del sys.path[0]
    spare = Spare(folder, kernelspec)
    # let go (SIGTERM) before it became a kernel: no state file is left behind
    signal.signal(signal.SIGTERM, _let_go)
    try:
        message = spare.wait(delay)  # a kernel starting beside it gets the CPU first
        if message is None:
            spare.import_kernel()
            spare.learn()
            spare.write_state()
            while message is None:
                message = spare.wait(LEARN_EVERY)
                if message is None:
                    spare.learn()
    except LetGo:
        return 0
    finally:
        spare.forget()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # as in a kernel started by exec
    if spare.parent is not None:
        os.close(spare.parent)
    become_kernel(message)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
