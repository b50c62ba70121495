"""Where staged data comes from: a local path, or any URL ``fsspec`` can open.

A source lists its files (relative path, size, and a stamp that changes when
the content does: modification time for local files; ETag, checksum or
modification time for ``fsspec``), and the listing's fingerprint names the
cache entry, so a source that changes gets a new entry. ``fsspec`` is imported
only for URLs.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

from ..errors import DlschedError


class StagingFailed(DlschedError):
    """A source could not be staged; the message says why and becomes the job's reason."""


@dataclass(frozen=True)
class SourceFile:
    """One file of a source: ``path`` relative to it (``""`` when the source is one file)."""

    path: str
    size: int
    stamp: str


class LocalSource:
    """A file or folder on a mounted file system (local disk, NFS, Lustre, ...)."""

    def __init__(self, path: str) -> None:
        self.text = path
        self.path = path
        self.basename = os.path.basename(path.rstrip("/")) or "data"

    def listing(self) -> list[SourceFile]:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            raise StagingFailed(f"{self.path} does not exist") from None
        except OSError as error:
            raise StagingFailed(f"cannot read {self.path}: {error.strerror}") from None
        if stat.S_ISREG(st.st_mode):
            return [SourceFile("", st.st_size, str(st.st_mtime_ns))]
        if not stat.S_ISDIR(st.st_mode):
            raise StagingFailed(f"{self.path} is neither a file nor a folder")
        files = []
        for folder, dirs, names in self._walk():
            dirs.sort()
            for name in sorted(names):
                full = os.path.join(folder, name)
                try:
                    st = os.stat(full)
                except OSError as error:
                    raise StagingFailed(f"cannot read {full}: {error.strerror}") from None
                if stat.S_ISREG(st.st_mode):  # sockets, pipes and devices are not data
                    rel = os.path.relpath(full, self.path).replace(os.sep, "/")
                    files.append(SourceFile(rel, st.st_size, str(st.st_mtime_ns)))
        return files

    def _walk(self) -> Iterator[tuple[str, list[str], list[str]]]:
        def fail(error: OSError) -> None:
            raise StagingFailed(f"cannot read {error.filename}: {error.strerror}")

        return os.walk(self.path, onerror=fail)

    def open(self, rel: str) -> IO[bytes]:
        return open(os.path.join(self.path, rel) if rel else self.path, "rb")


_STAMP_KEYS = ("ETag", "etag", "md5Hash", "md5", "crc32c", "mtime", "LastModified", "updated")


class FsspecSource:
    """A URL read through ``fsspec`` (``s3://``, ``gs://``, ``https://``, ``file://``, ...)."""

    def __init__(self, url: str) -> None:
        self.text = url
        try:
            import fsspec
        except ImportError:
            raise StagingFailed(
                f"{url} is a URL, and reading URLs needs fsspec: pip install fsspec "
                "(plus the plugin for its scheme, e.g. s3fs or gcsfs)"
            ) from None
        try:
            self.fs, self.path = fsspec.core.url_to_fs(url)
        except (ImportError, ValueError) as error:
            # fsspec names the missing plugin ("Install s3fs to access S3")
            raise StagingFailed(f"cannot open {url}: {error}") from None
        self.basename = os.path.basename(str(self.path).rstrip("/")) or "data"

    def listing(self) -> list[SourceFile]:
        try:
            if not self.fs.exists(self.path):
                raise StagingFailed(f"{self.text} does not exist")
            if self.fs.isfile(self.path):
                info = self.fs.info(self.path)
                return [SourceFile("", int(info.get("size") or 0), _stamp(info))]
            found: dict[str, Any] = self.fs.find(self.path, detail=True, withdirs=False)
        except StagingFailed:
            raise
        except Exception as error:
            raise StagingFailed(f"cannot list {self.text}: {error}") from None
        root = str(self.path).rstrip("/") + "/"
        files = []
        for name in sorted(found):
            info = found[name]
            rel = name[len(root) :] if name.startswith(root) else name.rsplit("/", 1)[-1]
            files.append(SourceFile(rel, int(info.get("size") or 0), _stamp(info)))
        return files

    def open(self, rel: str) -> IO[bytes]:
        path = str(self.path).rstrip("/") + "/" + rel if rel else self.path
        handle: IO[bytes] = self.fs.open(path, "rb")
        return handle


def _stamp(info: dict[str, Any]) -> str:
    for key in _STAMP_KEYS:
        if info.get(key) is not None:
            return f"{key}={info[key]}"
    return ""


Source = LocalSource | FsspecSource


def open_source(text: str) -> Source:
    """The source a ``stage_in`` value names (``spec.parse_stage_in`` made paths absolute)."""
    if "://" in text:
        return FsspecSource(text)
    return LocalSource(text)


def fingerprint(source: str, files: list[SourceFile]) -> str:
    """The cache key: the source's identity and its listing (paths, sizes, stamps)."""
    digest = hashlib.sha256(source.encode())
    for f in files:
        digest.update(f"\0{f.path}\0{f.size}\0{f.stamp}".encode())
    return digest.hexdigest()[:32]
