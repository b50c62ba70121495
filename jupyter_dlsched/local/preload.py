"""Preload that learns: the modules a user's jobs import, imported ahead of the next job.

Every job process is a fresh fork, and a training function imports torch again: 1.3–2 s
before its first line. The launcher (the pool agent, or the fork server without one)
imports ``DLSCHED_PRELOAD`` (default numpy) once; beyond that, each job process notes the
top-level modules it imported that the launcher had not, with the file each came from
(``note_imports``, into ``imports.json`` beside its log), its supervisor adds the new
ones to the ledger's ``preload:<uid>`` (``learn``), and each spare supervisor imports
them once (``warm_up``), so every process it forks for a job has them. The first job that
imports torch pays; the next ones find it imported. A module is imported ahead only from
the file the job imported it from: never another module of that name in its place.

Importing a module initialises no GPU (torch creates its CUDA context at the first CUDA
call), so each job still gets a fresh CUDA context, with its own ``CUDA_VISIBLE_DEVICES``
set before anything touches CUDA. A module that fails or takes longer than
``IMPORT_BUDGET`` to import ahead is dropped (``preload.dropped`` in the pool's folder)
and named in the agent's log. ``DLSCHED_PRELOAD=a,b`` pins the list (nothing is learnt);
``DLSCHED_PRELOAD=none`` turns preloading off.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import signal
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..store import Store
from ..vocab import private

PRELOAD_ENV = "DLSCHED_PRELOAD"
DEFAULT_PRELOAD = ("numpy",)
#: what a job process writes beside its log: the modules it imported that were not there
IMPORTS_FILE = "imports.json"
#: what a process forked ahead could not import, one name a line (never tried again)
DROPPED_FILE = "preload.dropped"
#: seconds one module may take to import ahead of a job
IMPORT_BUDGET = 60.0
#: modules imported ahead, at most (the first learnt first)
MAX_LEARNT = 8
_OFF = ("none", "off", "0", "no")
#: never imported ahead: ours, and what a job is (its script)
_NEVER = {"__main__", "jupyter_dlsched", "__mp_main__"}


def pinned() -> list[str] | None:
    """The modules ``DLSCHED_PRELOAD`` names (none for ``none``), or None: learn."""
    value = os.environ.get(PRELOAD_ENV)
    if value is None:
        return None
    if value.strip().lower() in _OFF:
        return []
    return [name.strip() for name in value.split(",") if name.strip()]


def launcher_modules() -> list[str]:
    """What the launcher itself imports before forking anything."""
    named = pinned()
    return list(DEFAULT_PRELOAD) if named is None else named


def meta_key(uid: int) -> str:
    return f"preload:{uid}"


def learnt(store: Store, uid: int, home: str | os.PathLike[str]) -> list[tuple[str, str]]:
    """What ``uid``'s jobs imported that this process has not: ``(name, file)`` pairs, the
    file each was imported from in the job."""
    return wanted(store, uid, home)[1]


def wanted(
    store: Store, uid: int, home: str | os.PathLike[str]
) -> tuple[int, list[tuple[str, str]]]:
    """``learnt``, and how many modules were learnt in all: a number that only grows, which
    a spare supervisor tells the pool agent, so that spares that read fewer are told to
    import what they lack (``agent/spares.py``)."""
    if pinned() is not None:
        return 0, []
    known = store.get_meta(meta_key(uid)) or {}
    if not isinstance(known, dict):
        return 0, []
    dropped = _dropped(Path(home))
    names = [(n, f) for n, f in known.items() if isinstance(f, str) and n not in dropped]
    return len(known), [(n, f) for n, f in names[:MAX_LEARNT] if n not in sys.modules]


def warm_up(modules: Iterable[tuple[str, str]], home: str | os.PathLike[str]) -> None:
    """Import ``modules`` in a spare supervisor, before it forks the process for its next job
    (which has them then, for nothing). A name this process would find elsewhere than the
    job did is left alone (never another module of that name in a job's place); one that
    fails or hangs is dropped."""
    for name, origin in modules:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is None or spec.origin != origin:
            continue  # not on this launcher's path, or another module of that name
        start = time.monotonic()
        previous = signal.signal(signal.SIGALRM, _too_long)
        signal.setitimer(signal.ITIMER_REAL, IMPORT_BUDGET)
        try:
            importlib.import_module(name)
        except BaseException as error:  # an import that exits or times out is dropped too
            signal.setitimer(signal.ITIMER_REAL, 0)
            took = time.monotonic() - start
            why = f"{type(error).__name__}: {error}"
            print(
                f"[dlsched] preload: {name} dropped (importing it ahead of a job failed "
                f"after {took:.1f} s: {why}); jobs import it themselves",
                file=sys.stderr,
                flush=True,
            )
            _drop(Path(home), name)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


def _too_long(signum: int, frame: Any) -> None:
    raise TimeoutError(f"it took more than {IMPORT_BUDGET:.0f} s")


def top_level_modules() -> set[str]:
    """The top-level modules this process has imported."""
    return {name.partition(".")[0] for name in list(sys.modules)}


def note_imports(folder: Path, before: set[str]) -> None:
    """In a job process, after its job: the top-level modules it imported beyond
    ``before`` (what it had when the job began), not the standard library's, each with the
    file it came from, for its supervisor to learn from."""
    new = {}
    for name in sorted(top_level_modules() - before):
        if name in sys.stdlib_module_names or name in _NEVER or name.startswith("_"):
            continue
        spec = getattr(sys.modules.get(name), "__spec__", None)
        origin = getattr(spec, "origin", None)
        if isinstance(origin, str) and os.path.isabs(origin):
            new[name] = origin
    if new:
        try:
            data = json.dumps(dict(list(new.items())[:64])).encode()
            private.write_file(folder / IMPORTS_FILE, data)
        except OSError:
            pass  # nothing is learnt from this job


def learn(store: Store, folder: Path, uid: int, owner: int | None = None) -> None:
    """In the supervisor, after its job: add the modules the job imported that are not
    learnt yet to ``uid``'s (a write only when there is something new)."""
    if pinned() is not None:
        return
    try:
        data = private.read_file(folder / IMPORTS_FILE, owner, max_bytes=1 << 16)
        found = json.loads(data) if data else {}
    except (OSError, ValueError, private.UnsafeStateFolder):
        return
    known = store.get_meta(meta_key(uid)) or {}
    if not isinstance(found, dict) or not isinstance(known, dict):
        return
    new = {
        n: f
        for n, f in found.items()
        if isinstance(n, str) and n.isidentifier() and isinstance(f, str) and n not in known
    }
    if new and len(known) < 4 * MAX_LEARNT:
        store.set_meta(meta_key(uid), {**known, **new})


def _dropped(home: Path) -> set[str]:
    try:
        return set((home / DROPPED_FILE).read_text().split())
    except OSError:
        return set()


def _drop(home: Path, name: str) -> None:
    try:
        fd = private.open_append(home / DROPPED_FILE)
        with os.fdopen(fd, "a") as f:
            f.write(name + "\n")
    except (OSError, private.UnsafeStateFolder):
        pass
