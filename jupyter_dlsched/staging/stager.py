"""The stager: one background process copies one source into the cache while its jobs wait.

Launched like a supervisor (forked by the launcher, or a fresh interpreter),
it claims the staging armed by a tick, holding a lease it renews with its
progress, so a killed stager's work is redone by another and never done twice
at once. It lists the source, and either finds that listing's entry in the
cache (a hit) or copies the source into a temporary folder, verifies every
file's size and SHA-256 against what was read, renames it into place and
records the entry. Either way the waiting jobs' inputs are bound to the entry
in one transaction with an event each, which wakes every scheduler loop; a
failure (missing source, full disk, a cap too small) fails those jobs with the
reason, before any of them holds a GPU, and deletes the partial copy.

    python -m jupyter_dlsched.staging.stager --home DLSCHED_HOME SOURCE_ID
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from ..local.wake import wake_pool
from ..store import Store
from ..store.settings import Settings
from ..vocab.units import format_size
from . import cache
from .gate import format_rate, staging_words
from .owner import OwnerSource
from .sources import Source, SourceFile, StagingFailed, fingerprint, open_source

CHUNK = 4 * 2**20
PROGRESS_SECONDS = 0.5
#: Copies begun again when the source changes while it is read, before giving up.
CHANGE_TRIES = 3


class Abandoned(Exception):
    """This stager's lease was taken back (it stalled); another one does the work."""


class Progress:
    """Counts bytes, renews the lease with them, and keeps to ``max_rate``."""

    def __init__(
        self, store: Store, source_id: str, lease_ttl: float, max_rate: float | None
    ) -> None:
        self.store, self.source_id, self.lease_ttl = store, source_id, lease_ttl
        self.max_rate = max_rate
        self.total: int | None = None
        self.done = 0
        self.note: str | None = None
        self.began = time.monotonic()
        self.next_write = 0.0

    def start(self, total: int) -> None:
        self.total, self.done, self.began = total, 0, time.monotonic()
        self.write(force=True)

    def add(self, n: int) -> None:
        self.done += n
        if self.max_rate:
            ahead = self.done / self.max_rate - (time.monotonic() - self.began)
            if ahead > 0:
                time.sleep(ahead)
        self.write()

    def write(self, force: bool = False, note: str | None = None) -> None:
        now = time.monotonic()
        if note is not None:
            self.note = note
        if not force and now < self.next_write:
            return
        self.next_write = now + PROGRESS_SECONDS
        elapsed = now - self.began
        rate = self.done / elapsed if elapsed > 0.05 and self.done else None
        kept = self.store.cache.renew_staging(
            self.source_id,
            self.lease_ttl,
            done=self.done,
            total=self.total,
            rate=rate,
            note=self.note,
            words=staging_words,
        )
        if not kept:
            raise Abandoned(self.source_id)


def stage(
    home: str | os.PathLike[str],
    source_id: str,
    *,
    as_owner: bool = False,
    quota_for: Callable[[int], int | None] | None = None,
) -> int:
    """Stage one source for the jobs that wait for it; returns the process's exit status.

    ``as_owner``: a shared pool's service (root) stages a user's source, reading it as
    that user (``owner.OwnerSource``) into a cache entry that belongs to that user.
    ``quota_for``: the bytes of the cache a user's entries may hold (a shared pool's
    ``max_cache_bytes``; None: no quota).
    """
    store = Store(home)
    row = store.cache.staging(source_id)
    owner: int | None = None
    if row is not None and row["uid"] != os.getuid():
        if not as_owner or os.geteuid() != 0:
            return 2  # a source is read only as the user whose jobs declared it
        owner = int(row["uid"])
    if row is None:
        return 2
    settings = Settings.load(store)
    since = store.cache.claim_staging(source_id, row["attempt"], settings.lease_ttl)
    if since is None:
        return 0  # another stager has it
    try:
        quota = quota_for(owner) if owner is not None and quota_for is not None else None
        _stage(
            store,
            source_id,
            row["source"],
            row["attempt"],
            since,
            settings.lease_ttl,
            owner,
            quota,
        )
    finally:
        store.close()
        if owner is None:
            wake_pool(home)  # start the jobs that were waiting for this data
    return 0


def _stage(
    store: Store,
    source_id: str,
    source: str,
    attempt: int,
    since: float,
    lease_ttl: float,
    owner: int | None = None,
    quota: int | None = None,
) -> None:
    config = cache.CacheConfig.load(store)
    progress = Progress(store, source_id, lease_ttl, config.max_rate)
    folder: Path | None = None
    tmp: Path | None = None
    reader: OwnerSource | None = None
    try:
        folder = cache.open_folder(store, config)
        if owner is not None:
            os.chmod(folder, 0o711)  # owners reach their own entries (0700, theirs), no more
            reader = OwnerSource(source, owner)
        for stale in folder.glob(f".tmp-{source_id}-*"):  # left by a stager that was killed
            cache.remove(folder, stale)
        tmp = folder / f".tmp-{source_id}-{attempt}"
        for _ in range(CHANGE_TRIES):
            if _stage_once(
                store,
                source_id,
                source,
                since,
                folder,
                tmp,
                config,
                progress,
                reader,
                owner,
                quota,
            ):
                return
        raise StagingFailed(f"{source} kept changing while it was copied ({CHANGE_TRIES} tries)")
    except Abandoned:
        pass
    except StagingFailed as error:
        _fail(store, source_id, since, str(error))
    except OSError as error:
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            where = folder if folder is not None else store.home
            why = (
                f"no space left on device in the cache folder {where} "
                f"({format_size(progress.total)} to stage); free space there, or choose "
                "another folder with Scheduler.configure_cache(folder=...)"
            )
        else:
            why = f"{error.strerror or error} ({error.filename or source})"
        _fail(store, source_id, since, why)
    except Exception as error:
        traceback.print_exc()
        _fail(store, source_id, since, f"{type(error).__name__}: {error}")
    finally:
        if reader is not None:
            reader.close()
        if folder is not None and tmp is not None:
            cache.remove(folder, tmp)  # a partial or superseded copy never stays


def _fail(store: Store, source_id: str, since: float, why: str) -> None:
    store.fail_staging(source_id, since=since, reason=lambda name: f"stage-in {name!r}: {why}")


def _stage_once(
    store: Store,
    source_id: str,
    source: str,
    since: float,
    folder: Path,
    tmp: Path,
    config: cache.CacheConfig,
    progress: Progress,
    reader: OwnerSource | None = None,
    owner: int | None = None,
    quota: int | None = None,
) -> bool:
    """One try: True when the jobs are served (hit or fresh copy), False if the source changed.

    With an ``owner`` (a shared pool), the entry is that user's alone: its key names the
    user, so another user's staging of the same source never finds it, and its files
    belong to the user, and with a ``quota`` the user's entries make room within it."""
    src: Source | OwnerSource = reader if reader is not None else open_source(source)
    files = src.listing()
    total = sum(f.size for f in files)
    progress.start(total)
    identity = source if owner is None else f"uid {owner}\0{source}"
    key = fingerprint(identity, files)
    found = store.cache.cache_entry(key)
    if found is not None and os.path.exists(found["path"]):
        served = store.cache.finish_staging(
            source_id,
            key,
            since=since,
            entry=None,
            reason=lambda name: f"{name} found in the cache ({format_size(found['bytes'])})",
            owner=owner,
        )
        if served is not None:
            return True
        # evicted between the look and the binding: copy it after all
    cap = config.cap(folder)
    if total > cap:
        raise StagingFailed(
            f"{source} holds {format_size(total)}, more than the cache may hold "
            f"({format_size(cap)}); raise it with Scheduler.configure_cache(max_size=...)"
        )
    if owner is not None and quota is not None:
        _within_quota(store, folder, owner, quota, source, total)
    cache.make_room(store, folder, cap, total)
    cache.remove(folder, tmp)
    began = time.monotonic()
    os.mkdir(tmp, 0o700)
    target = tmp / src.basename
    digests = _copy(src, files, target, progress)
    progress.write(force=True, note="verifying")
    _verify(files, target, digests, progress)
    if fingerprint(identity, src.listing()) != key:
        cache.remove(folder, tmp)
        return False
    if owner is not None:
        _give(tmp, owner)
    final = folder / key
    cache.remove(folder, final)  # a copy no entry names (its recording was interrupted)
    os.rename(tmp, final)
    seconds = max(time.monotonic() - began, 1e-3)
    zstd = "zstd" in getattr(src, "encodings", {}).values()  # how HttpSource read it
    checksum = hashlib.sha256("".join(f"{p}\0{d}\n" for p, d in digests).encode()).hexdigest()
    entry = {
        "source": source,
        "path": str(final / src.basename),
        "bytes": total,
        "files": len(files),
        "checksum": checksum,
    }
    served = store.cache.finish_staging(
        source_id,
        key,
        since=since,
        entry=entry,
        reason=lambda name: (
            f"{name} staged: {format_size(total)} in {seconds:.1f} s "
            f"({format_rate(total / seconds)}{', zstd in transfer' if zstd else ''})"
        ),
        owner=owner,
    )
    if served is None:  # the lease was taken back meanwhile: the copy is no one's
        cache.remove(folder, final)
        return True
    cache.make_room(store, folder, cap, 0)
    return True


def _within_quota(
    store: Store, folder: Path, owner: int, quota: int, source: str, total: int
) -> None:
    """Make room for ``total`` bytes among ``owner``'s entries, or fail with the figures."""
    limit = f"your share of the data cache ({format_size(quota)}, max_cache_bytes in service.toml)"
    if total > quota:
        raise StagingFailed(f"{source} holds {format_size(total)}, more than {limit}")
    used = cache.make_room_within(store, folder, owner, quota, total)
    if used + total > quota:
        raise StagingFailed(
            f"{source} needs {format_size(total)} but your cached inputs that unfinished jobs "
            f"still use hold {format_size(used)} of {limit}: let those jobs end, or ask for "
            "a larger max_cache_bytes"
        )


def _give(folder: Path, uid: int) -> None:
    """Make a verified copy its owner's: every folder and file of it, never through a link."""
    import pwd

    gid = pwd.getpwuid(uid).pw_gid
    for root, dirs, names in os.walk(folder):
        for name in [*dirs, *names]:
            os.chown(os.path.join(root, name), uid, gid, follow_symlinks=False)
    os.chown(folder, uid, gid, follow_symlinks=False)


def _copy(
    src: Source | OwnerSource, files: list[SourceFile], target: Path, progress: Progress
) -> list[tuple[str, str]]:
    """Copy every listed file under ``target``; returns (path, SHA-256) of what was read."""
    digests = []
    for f in files:
        dest = target / f.path if f.path else target
        dest.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        digest = hashlib.sha256()
        size = 0
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(dest, flags, 0o600)
        try:
            with src.open(f.path) as reader:
                while chunk := reader.read(CHUNK):
                    digest.update(chunk)
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(fd, view) :]
                    size += len(chunk)
                    if size > f.size:  # e.g. a compressed answer that inflates past its size
                        break
                    progress.add(len(chunk))
        finally:
            os.close(fd)
        if size != f.size:
            where = f"{src.text}/{f.path}" if f.path else src.text
            raise StagingFailed(
                f"{where} changed while it was copied ({size} bytes read, {f.size} listed)"
            )
        digests.append((f.path, digest.hexdigest()))
    return digests


def _verify(
    files: list[SourceFile], target: Path, digests: list[tuple[str, str]], progress: Progress
) -> None:
    """Read the copy back: every file's size and SHA-256 must be what was read from the source.

    The files are made read-only: jobs share them.
    """
    for f, (_, expected) in zip(files, digests, strict=True):
        dest = target / f.path if f.path else target
        digest = hashlib.sha256()
        with open(dest, "rb") as reader:
            while chunk := reader.read(CHUNK):
                digest.update(chunk)
                progress.write()
        if os.path.getsize(dest) != f.size or digest.hexdigest() != expected:
            raise StagingFailed(f"the copy of {f.path or dest.name} does not match its source")
        os.chmod(dest, 0o400)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Stage one jupyter-dlsched input.")
    parser.add_argument("--home", required=True)
    parser.add_argument("source_id")
    args = parser.parse_args(argv)
    return stage(args.home, args.source_id)


if __name__ == "__main__":
    sys.exit(main())
