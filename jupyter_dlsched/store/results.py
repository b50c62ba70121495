"""A job's result: its pickle in the job's spool folder, its big buffers written first into
its owner's buffer folder (shared memory), then settled beside the pickle on disk.

A function job of a pool of one's own pickles its result with ``buffers.dumps(...,
named=result_name(job, attempt))``: each buffer of 1 MiB or more is written once, under
``result-<job>-<attempt>.<n>`` (never hashed: hashing costs as much as the write), into
the owner's buffer folder, which is memory, so the job's return reaches ``result()`` at
the speed of memory. The pickle ``result.pkl`` goes into the spool folder and names them.
Once the job's processes are gone its supervisor settles them (``settle``): each is
copied into the spool folder as ``result.<n>`` and then removed from memory. So a result
holds no memory once its job has ended, and lives, like its pickle, as long as the job's
record (a new attempt replaces it, ``clear``). ``result()`` maps each buffer from the
buffer folder, or from the spool once it has moved (``buffers.loads(..., moved=spool)``):
at every moment one whole copy exists. A result that does not fit in the buffer folder is
written into the spool folder directly (``result.<n>``, as ``settle`` leaves it).

A run that ends without its result (failed, lost, cancelled, to be retried) has what it
wrote deleted when its end is recorded (``Runs.finish_run``, ``discard``), so a job
killed with its supervisor leaves nothing once it is found lost. An agent that starts
keeps a result's files in memory only for a job whose attempt may still write or settle
them (``running``); those of a result kept (``succeeded``) are settled there and then;
the rest are deleted.

A shared pool's jobs write their result's buffers into the spool folder directly: the
service would have to open a user's file with root's rights to settle them.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

#: a result's buffers in a buffer folder: ``result-<job>-<attempt>.<n>``
PREFIX = "result-"


def folder_owner(folder: Path) -> int | None:
    """The uid a buffer folder's name says it belongs to (``dlsched-<uid>-<pool>``)."""
    parts = folder.name.split("-")
    if len(parts) == 3 and parts[0] == "dlsched" and parts[1].isdigit():
        return int(parts[1])
    return None


def result_name(job_id: str, attempt: int) -> str:
    """The name a result's buffer files start with: ``result-<job>-<attempt>``."""
    return f"{PREFIX}{job_id}-{attempt}"


def parse_name(name: str) -> tuple[str, int, int] | None:
    """``(job, attempt, index)`` of a result's buffer file name, or None for another file."""
    if not name.startswith(PREFIX):
        return None
    stem, _, index = name[len(PREFIX) :].partition(".")
    job_id, _, attempt = stem.rpartition("-")
    if not (job_id and attempt.isdigit() and index.isdigit()):
        return None
    return job_id, int(attempt), int(index)


def settled_name(name: str) -> str | None:
    """What a result's buffer file ``name`` is called once settled in the spool folder."""
    parsed = parse_name(name)
    return None if parsed is None else f"result.{parsed[2]}"


def result_bytes(spool: Path, folder: Path | None = None, name: str | None = None) -> int | None:
    """The bytes of the result a job left: ``result.pkl`` in its ``spool`` folder, and its
    buffers, in the spool (``result.<n>``) or, not settled yet, in the buffer ``folder``
    under ``name`` (``<name>.<n>``); None without a pickle. Only sizes are read (``lstat``):
    a shared pool's service opens no file of a user's."""
    sizes = {}
    try:
        with os.scandir(spool) as entries:
            for entry in entries:
                base, _, index = entry.name.partition(".")
                if base == "result" and (index == "pkl" or index.isdigit()):
                    st = entry.stat(follow_symlinks=False)
                    if stat.S_ISREG(st.st_mode):
                        sizes[entry.name] = st.st_size
    except OSError:
        return None
    if "result.pkl" not in sizes:
        return None
    if folder is not None and name is not None:
        n = 0
        while f"result.{n}" in sizes or _size(folder / f"{name}.{n}") is not None:
            sizes.setdefault(f"result.{n}", _size(folder / f"{name}.{n}") or 0)
            n += 1
    return sum(sizes.values())


def _size(path: Path) -> int | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def settle(spool: Path, folder: Path, name: str) -> int:
    """Move the buffers of the result named ``name`` from the buffer ``folder`` into the
    job's ``spool`` folder (``result.<n>``); bytes moved. Each is copied under a temporary
    name, renamed whole, and only then removed from memory: a reader finds one of them
    whole at every moment (an array already mapped keeps its pages). Buffers of a job
    that left no result are deleted. Never raises: one that cannot be moved (the disk is
    full) stays in memory, where the reader maps it, until the next agent starts."""
    moved = 0
    entries = _entries(folder, name)
    kept = bool(entries) and (spool / "result.pkl").exists()
    for entry in entries:
        target = spool / str(settled_name(entry))
        partial = target.with_name(f"{target.name}.part")
        try:
            if kept:
                _copy(folder / entry, partial)
                os.replace(partial, target)
                moved += target.stat().st_size
            (folder / entry).unlink(missing_ok=True)
        except OSError:
            partial.unlink(missing_ok=True)
    return moved


def _copy(source: Path, target: Path) -> None:
    fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            with open(fd, "rb", closefd=False) as src, open(out, "wb", closefd=False) as dst:
                shutil.copyfileobj(src, dst, 16 << 20)  # (sendfile, where the kernel can)
        finally:
            os.close(out)
    finally:
        os.close(fd)


def _entries(folder: Path, name: str) -> list[str]:
    try:
        entries = os.listdir(folder)
    except OSError:
        return []
    return sorted(e for e in entries if e.startswith(f"{name}.") and parse_name(e) is not None)


def discard(folder: Path, name: str) -> None:
    """Delete the buffers of the result named ``name`` from the buffer ``folder`` (a run
    that ended without a result: what it wrote is nobody's). A shared pool's service
    deletes only in a folder of the user its name says (``dlsched-<uid>-<pool>``)."""
    _unlink_where(
        folder, lambda n: n.startswith(f"{name}.") and parse_name(n) is not None, owned=True
    )


def clear(spool: Path, folder: Path | None, job_id: str) -> None:
    """Delete what earlier attempts of ``job_id`` left of their results (a new attempt
    writes its own): ``result.<n>`` in the spool folder and, in the buffer ``folder``
    (a pool of one's own), ``result-<job>-*``. Each is unlinked through its folder opened
    without following a link."""
    _unlink_where(spool, lambda n: n.startswith("result.") and n != "result.pkl")
    if folder is not None:
        _unlink_where(folder, lambda n: (parse_name(n) or ("",))[0] == job_id, owned=True)


def _unlink_where(folder: Path, doomed: Callable[[str], bool], owned: bool = False) -> None:
    """Unlink the entries ``doomed`` names; ``owned``: only in a folder of this process's
    user or of the user its name says (a buffer folder, ``dlsched-<uid>-<pool>``)."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return
    try:
        owner = os.fstat(fd).st_uid
        if owned and owner not in (os.geteuid(), folder_owner(folder)):
            return
        for entry in os.listdir(fd):
            if doomed(entry):
                try:
                    os.unlink(entry, dir_fd=fd)
                except OSError:
                    pass
    finally:
        os.close(fd)
