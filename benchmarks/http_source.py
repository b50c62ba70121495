"""A file server on loopback that answers ``Accept-Encoding: zstd`` (when told to) and can
pace the bytes it sends, standing in for a data server behind a slow link.

Used by ``benchmarks/stage_in.py --http`` and by the tests of HTTP stage-in.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

CHUNK = 1 << 20


class FileServer(ThreadingHTTPServer):
    """Serves the files of ``root``; ``compress`` whether it answers zstd when asked; ``rate``
    bytes per second it sends at most (all responses together: one link); ``seen`` (path, encoding) of each GET and
    ``sent`` the body bytes written for it (a reader that stops early reads fewer)."""

    daemon_threads = True

    def __init__(self, root: Path, *, compress: bool = True, rate: float | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.root = root
        self.compress = compress
        self.rate = rate
        self.seen: list[tuple[str, str]] = []
        self.sent: list[int] = []  # body bytes written for each GET in ``seen``
        self._link = threading.Lock()
        self._link_free = 0.0  # when the paced link has sent what it was given

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/{name}"


class _Handler(BaseHTTPRequestHandler):
    server: FileServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        pass

    def _file(self) -> Path | None:
        path = (self.server.root / self.path.lstrip("/")).resolve()
        if self.server.root.resolve() not in path.parents or not path.is_file():
            self.send_error(404)
            return None
        return path

    def do_HEAD(self) -> None:
        if (path := self._file()) is None:
            return
        st = path.stat()
        self.send_response(200)
        self.send_header("Content-Length", str(st.st_size))
        self.send_header("ETag", f'"{st.st_mtime_ns}-{st.st_size}"')
        self.end_headers()

    def do_GET(self) -> None:
        if (path := self._file()) is None:
            return
        asked = self.headers.get("Accept-Encoding", "")
        zstd = self.server.compress and "zstd" in [
            a.split(";")[0].strip() for a in asked.split(",")
        ]
        self.server.seen.append((self.path, "zstd" if zstd else "plain"))
        self.server.sent.append(0)
        index = len(self.server.sent) - 1
        self.send_response(200)
        if zstd:
            self.send_header("Content-Encoding", "zstd")
        else:
            self.send_header("Content-Length", str(path.stat().st_size))
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        try:
            for chunk in _chunks(path, zstd):
                self._send(chunk, index)
        except (BrokenPipeError, ConnectionResetError):  # the reader stopped after its sample
            pass

    def _send(self, chunk: bytes, index: int) -> None:
        self.wfile.write(chunk)
        self.server.sent[index] += len(chunk)
        if rate := self.server.rate:
            with self.server._link:
                now = time.monotonic()
                done = max(now, self.server._link_free) + len(chunk) / rate
                self.server._link_free = done
            if done > now:
                time.sleep(done - now)


def _chunks(path: Path, zstd: bool) -> Iterator[bytes]:
    with open(path, "rb") as f:
        if not zstd:
            while chunk := f.read(CHUNK):
                yield chunk
            return
        import zstandard

        compressor = zstandard.ZstdCompressor(level=1).compressobj()
        while chunk := f.read(CHUNK):
            if out := compressor.compress(chunk):
                yield out
        yield compressor.flush()


@contextmanager
def serving(
    root: Path, *, compress: bool = True, rate: float | None = None
) -> Iterator[FileServer]:
    server = FileServer(root, compress=compress, rate=rate)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
