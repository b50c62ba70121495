"""The node-local cache: where it is, how big it may grow, what is evicted, what it holds.

Entries are folders ``<cache>/<key>/<name of the source>``; a copy in progress
lives in ``<cache>/.tmp-<staging>-<attempt>`` and is renamed into place once
verified. The ledger's ``cache_entries`` table is the index; an entry is in
use while an unfinished job's input is bound to it, and entries not in use
are evicted least recently used first whenever something is staged and the
cache is over its cap. The folder follows ``private``'s rules: 0700, the
user's own, nothing above it writable by others.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..store import Store
from ..vocab import private
from ..vocab.errors import SpecError
from ..vocab.units import parse_size

META_KEY = "staging"
#: Jobs (in the policy's order) whose inputs are staged ahead of their start.
DEFAULT_AHEAD = 3


@dataclass
class CacheConfig:
    """Ledger-wide staging settings (``meta`` key ``staging``): every participant reads them.

    ``folder`` defaults to ``<state folder>/cache``; ``max_bytes`` to a quarter
    of the disk that holds it; ``max_rate`` (bytes/s) limits how fast staging
    reads, to spare a shared file server.
    """

    folder: str | None = None
    max_bytes: int | None = None
    ahead: int = DEFAULT_AHEAD
    max_rate: float | None = None

    @classmethod
    def load(cls, store: Store) -> CacheConfig:
        data = store.get_meta(META_KEY, {}) or {}
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})

    def save(self, store: Store) -> None:
        store.set_meta(META_KEY, asdict(self))

    def path(self, home: Path) -> Path:
        return Path(self.folder) if self.folder else home / "cache"

    def cap(self, folder: Path) -> int:
        if self.max_bytes is not None:
            return self.max_bytes
        st = os.statvfs(folder)
        return st.f_blocks * st.f_frsize // 4


def configure(
    store: Store,
    folder: str | os.PathLike[str] | None = None,
    max_size: object = None,
    ahead: object = None,
    max_rate: object = None,
) -> CacheConfig:
    """Change the staging settings given (others keep their value); checks each first."""
    config = CacheConfig.load(store)
    if folder is not None:
        path = Path(folder).expanduser().absolute()
        private.secure_folder(path)  # refuse a folder others could write before storing it
        config.folder = str(path)
    if max_size is not None:
        config.max_bytes = parse_size(max_size, "cache_max")
    if ahead is not None:
        if not isinstance(ahead, int) or isinstance(ahead, bool) or not 1 <= ahead <= 1000:
            raise SpecError("stage_ahead", ahead, "a whole number of jobs from 1 to 1000")
        config.ahead = ahead
    if max_rate is not None:
        config.max_rate = float(parse_size(max_rate, "stage_max_rate")) or None
    config.save(store)
    return config


def open_folder(store: Store, config: CacheConfig) -> Path:
    """The cache folder, created and checked (``UnsafeStateFolder`` if others could write it)."""
    if config.folder is None:
        return private.private_subfolder(store.home / "cache")
    return private.secure_folder(Path(config.folder))


def remove(folder: Path, path: Path) -> None:
    """Delete an entry or a partial copy: first renamed out of sight, then removed."""
    if not path.exists():
        return
    trash = folder / f".trash-{os.getpid()}-{os.urandom(4).hex()}"
    try:
        os.rename(path, trash)
    except OSError:
        trash = path
    shutil.rmtree(trash, ignore_errors=True)


def make_room(store: Store, folder: Path, cap: int, needed: int) -> int:
    """Evict entries no unfinished job uses, least recently used first, until ``needed``
    more bytes fit under ``cap``; returns the bytes the cache then holds.

    Entries in use are never evicted, so the cache may stay above its cap until
    the jobs that use them end (the next staging evicts then).
    """
    entries = store.cache.cache_entries()
    used = sum(e["bytes"] for e in entries)
    for entry in entries:
        if used + needed <= cap:
            break
        if entry["in_use"] or not store.cache.drop_cache_entry(entry["key"]):
            continue
        remove(folder, Path(entry["path"]).parent)
        used -= entry["bytes"]
    return used


def make_room_within(store: Store, folder: Path, owner: int, quota: int, needed: int) -> int:
    """Evict ``owner``'s entries no unfinished job uses, least recently used first, until
    ``needed`` more bytes fit in the owner's ``quota`` (a shared pool's
    ``max_cache_bytes``); returns the bytes the owner's entries then hold. Other users'
    entries are never touched: one user's stage-ins cannot push out another's data."""
    entries = [e for e in store.cache.cache_entries() if e["uid"] == owner]
    used = sum(e["bytes"] for e in entries)
    for entry in entries:
        if used + needed <= quota:
            break
        if entry["in_use"] or not store.cache.drop_cache_entry(entry["key"]):
            continue
        remove(folder, Path(entry["path"]).parent)
        used -= entry["bytes"]
    return used


def cache_info(store: Store) -> dict[str, Any]:
    """The cache in numbers, for the widgets, the sidebar and ``Scheduler.cache_info()``.

    >>> s.cache_info()["entries"]  # doctest: +SKIP
    2
    """
    config = CacheConfig.load(store)
    folder = config.path(store.home)
    try:
        cap: int | None = config.cap(folder if folder.exists() else store.home)
    except OSError:
        cap = None
    entries = store.cache.cache_entries()
    staging = [
        {
            "source": r["source"],
            "done_bytes": r["done_bytes"],
            "total_bytes": r["total_bytes"],
            "rate": r["rate"],
            "note": r["note"],
            "uid": r["uid"],
        }
        for r in store.cache.active_stagings()
    ]
    return {
        "folder": str(folder),
        "max_bytes": cap,
        "bytes": sum(e["bytes"] for e in entries),
        "entries": len(entries),
        "in_use": sum(1 for e in entries if e["in_use"]),
        **store.cache.cache_counters(),
        "staging": staging,
        "items": [
            {
                "source": e["source"],
                "path": e["path"],
                "bytes": e["bytes"],
                "files": e["files"],
                "hits": e["hits"],
                "last_used": e["last_used"],
                "in_use": e["in_use"],
            }
            for e in entries
        ],
    }
