"""Where staged data comes from: a local path, an ``http(s)://`` file, or any URL ``fsspec``
can open.

A source lists its files (relative path, size, and a stamp that changes when
the content does: modification time for local files; ETag or Last-Modified
for HTTP; ETag, checksum or modification time for ``fsspec``), and the
listing's fingerprint names the cache entry, so a source that changes gets a
new entry. ``fsspec`` is imported only for the URLs it reads.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any, cast

from ..vocab.errors import DlschedError


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


# An ``http://`` or ``https://`` file, read with compression where it pays.
#
# Compressing pays only where the bytes cross a slow link, and only the far end can
# compress before the link: so the stager asks the server for it (``Accept-Encoding:
# zstd``, which servers that support it answer: Caddy's ``encode zstd``, nginx's zstd
# module) when a sample shows the data compresses, and not otherwise. The sample is the
# file's first MiB, read plainly: if zstd (level 3) shrinks it to at most :data:`WORTH`
# of its size, the file is asked for again compressed, else the plain response is read
# on. A server that ignores the ask answers plainly, which is read as it comes. Decoding
# stops at the listed size, so a response that inflates beyond it fails the copy rather
# than filling the disk.

#: Bytes of each file read plainly to decide whether asking for zstd pays.
SAMPLE = 1 << 20
#: Ask for zstd when a sample compresses to this share of its size or less.
WORTH = 0.8
_TIMEOUT = 60.0


def compresses(sample: bytes) -> bool:
    """Whether zstd shrinks ``sample`` enough that a compressed transfer pays."""
    zstd = _zstd()
    if zstd is None or not sample:
        return False
    return len(zstd.ZstdCompressor(level=3).compress(sample)) <= WORTH * len(sample)


def _zstd() -> Any:
    try:
        import zstandard
    except ImportError:  # without it every file is read plainly
        return None
    return zstandard


class HttpSource:
    """One file at an ``http(s)://`` URL; its stamp is the ETag or Last-Modified."""

    def __init__(self, url: str) -> None:
        self.text = url
        self.url = url
        self.basename = url.rstrip("/").rsplit("/", 1)[-1].split("?", 1)[0] or "data"
        #: How each file was transferred (``"zstd"`` or ``"plain"``): what the sample decided.
        self.encodings: dict[str, str] = {}

    def listing(self) -> list[SourceFile]:
        with self._request("HEAD", {}) as response:
            size = response.headers.get("Content-Length")
            if size is None:
                raise StagingFailed(f"{self.url} does not say its size (no Content-Length)")
            for key in ("ETag", "Last-Modified"):
                if response.headers.get(key):
                    stamp = f"{key}={response.headers[key]}"
                    break
            else:
                stamp = ""
            return [SourceFile("", int(size), stamp)]

    def open(self, rel: str) -> IO[bytes]:
        plain = self._request("GET", {"Accept-Encoding": "identity"})
        sample = plain.read(SAMPLE)
        if len(sample) == SAMPLE and compresses(sample):
            squeezed = self._request("GET", {"Accept-Encoding": "zstd"})
            if squeezed.headers.get("Content-Encoding", "").strip().lower() == "zstd":
                plain.close()
                self.encodings[rel] = "zstd"
                reader = _zstd().ZstdDecompressor().stream_reader(squeezed, closefd=True)
                return cast(IO[bytes], reader)
            squeezed.close()  # the server ignored the ask: read on plainly
        self.encodings[rel] = "plain"
        return cast(IO[bytes], _Chained(sample, plain))

    def _request(self, method: str, headers: dict[str, str]) -> Any:
        import urllib.error  # the http(s) sources' own: an agent without them never pays it
        import urllib.request

        request = urllib.request.Request(self.url, method=method, headers=headers)
        try:
            return urllib.request.urlopen(request, timeout=_TIMEOUT)  # noqa: S310 - http(s) only
        except urllib.error.HTTPError as error:
            raise StagingFailed(
                f"cannot read {self.url}: HTTP {error.code} {error.reason}"
            ) from None
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise StagingFailed(f"cannot read {self.url}: {reason}") from None


class _Chained(io.RawIOBase):
    """The sample already read, then the rest of the same response."""

    def __init__(self, head: bytes, rest: Any) -> None:
        self._head = head
        self._rest = rest

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        if self._head:
            head, self._head = self._head, b""
            return head
        data: bytes = self._rest.read(n)
        return data

    def close(self) -> None:
        self._rest.close()
        super().close()


Source = LocalSource | FsspecSource | HttpSource


def open_source(text: str) -> Source:
    """The source a ``stage_in`` value names (``spec.parse_stage_in`` made paths absolute).

    An ``http(s)://`` URL of a file is read by :class:`HttpSource` (compressed where that
    pays); one of a folder (ending in ``/``) by ``fsspec``, which lists its links.
    """
    if text.startswith(("http://", "https://")) and not text.endswith("/"):
        return HttpSource(text)
    if "://" in text:
        return FsspecSource(text)
    return LocalSource(text)


def fingerprint(source: str, files: list[SourceFile]) -> str:
    """The cache key: the source's identity and its listing (paths, sizes, stamps)."""
    digest = hashlib.sha256(source.encode())
    for f in files:
        digest.update(f"\0{f.path}\0{f.size}\0{f.stamp}".encode())
    return digest.hexdigest()[:32]
