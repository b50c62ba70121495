"""A source read with its owner's rights: how a shared pool's stager (root) stages a user's data.

The stager keeps the ledger and the cache (both the service's); every byte of
the source is read by a child process that has become the job's owner
(``local.jobproc.become``) before it opens anything, and sends what it read
over a socket pair. So a user can stage only what that user could read, and
the service's own rights never touch a user's source.

Frames on the socket pair: 4-byte length + bytes; a request is JSON
(``{"op": "listing"}`` or ``{"op": "open", "path": ...}``); the reader answers a
JSON header (``{"ok": ...}`` or ``{"error": ...}``), then, for ``open``, the
file's bytes as frames ending with an empty one.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
from typing import IO, Any

from .sources import SourceFile, StagingFailed, open_source

_LEN = struct.Struct(">I")
CHUNK = 4 * 2**20


def _send(sock: socket.socket, data: bytes) -> None:
    sock.sendall(_LEN.pack(len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    parts, left = [], n
    while left:
        part = sock.recv(min(left, 1 << 20))
        if not part:
            raise StagingFailed("the reader of the source ended unexpectedly")
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


def _recv(sock: socket.socket) -> bytes:
    (n,) = _LEN.unpack(_recv_exact(sock, _LEN.size))
    return _recv_exact(sock, n)


class OwnerSource:
    """``open_source(text)`` as seen by user ``uid``: the same ``listing``/``open``/``basename``,
    read by a child that is that user. ``close()`` ends the child."""

    def __init__(self, text: str, uid: int) -> None:
        self.text = text
        self.uid = uid
        self.basename = os.path.basename(text.rstrip("/")) or "data"
        #: How each file crossed, as the reader says at its end (``HttpSource.encodings``).
        self.encodings: dict[str, str] = {}
        parent, child = socket.socketpair()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child's exit status is what is checked
            parent.close()
            _serve(child, text, uid)
        child.close()
        self._sock = parent
        self._pid = pid

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        _send(self._sock, json.dumps(request).encode())
        header: dict[str, Any] = json.loads(_recv(self._sock))
        if "error" in header:
            raise StagingFailed(str(header["error"]))
        return header

    def listing(self) -> list[SourceFile]:
        files = self._ask({"op": "listing"})["ok"]
        return [SourceFile(str(f[0]), int(f[1]), str(f[2])) for f in files]

    def open(self, rel: str) -> IO[bytes]:
        self._ask({"op": "open", "path": rel})
        return _Stream(self._sock, self.encodings, rel)  # type: ignore[return-value]

    def close(self) -> None:
        self._sock.close()
        try:
            os.kill(self._pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(self._pid, 0)


class _Stream:
    """One file's bytes as the reader sends them (``read`` until ``b""``)."""

    def __init__(self, sock: socket.socket, encodings: dict[str, str], rel: str) -> None:
        self._sock = sock
        self._done = False
        self._encodings = encodings
        self._rel = rel

    def read(self, n: int = -1) -> bytes:
        if self._done:
            return b""
        data = _recv(self._sock)
        if not data:
            self._done = True
            tail: dict[str, Any] = json.loads(_recv(self._sock))
            if "error" in tail:
                raise StagingFailed(str(tail["error"]))
            if tail.get("encoding"):
                self._encodings[self._rel] = str(tail["encoding"])
        return data

    def __enter__(self) -> _Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        while not self._done:
            self.read()


def _serve(sock: socket.socket, text: str, uid: int) -> None:
    """The reader: become ``uid`` first, then answer requests until the stager hangs up."""
    code = 0
    try:
        keep = sock.fileno()
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            if fd > 2 and fd != keep:
                try:
                    os.close(fd)
                except OSError:
                    pass
        # what http(s) sources need is imported while the service's Python is readable
        # (the owner may not read it): urllib (``HttpSource`` imports it when it first
        # reads), a host name's lookup, and zstd
        import encodings.idna  # noqa: F401
        import urllib.error  # noqa: F401
        import urllib.request  # noqa: F401

        from ..local.jobproc import become
        from .sources import _zstd

        _zstd()
        env: dict[str, str] = {}
        become(uid, env)  # exits the process rather than read anything as root
        os.environ.clear()
        os.environ.update({"PATH": "/usr/local/bin:/usr/bin:/bin", **env})
        source = None
        while True:
            try:
                request = json.loads(_recv(sock))
            except StagingFailed:
                break  # the stager hung up
            try:
                if source is None:
                    source = open_source(text)
                if request.get("op") == "listing":
                    files = [[f.path, f.size, f.stamp] for f in source.listing()]
                    _send(sock, json.dumps({"ok": files}).encode())
                    continue
                reader = source.open(str(request.get("path", "")))
            except StagingFailed as error:
                _send(sock, json.dumps({"error": str(error)}).encode())
                continue
            except OSError as error:
                why = f"cannot read {error.filename or text}: {error.strerror or error}"
                _send(sock, json.dumps({"error": why}).encode())
                continue
            _send(sock, json.dumps({"ok": True}).encode())
            tail: dict[str, Any] = {"ok": True}
            try:
                with reader:
                    while chunk := reader.read(CHUNK):
                        _send(sock, chunk)
                # how an http(s) file crossed (HttpSource), for the stager's event
                tail["encoding"] = getattr(source, "encodings", {}).get(request.get("path", ""))
            except OSError as error:
                tail = {"error": f"cannot read {text}: {error.strerror or error}"}
            except Exception as error:  # e.g. a compressed answer that does not decode
                tail = {"error": f"cannot read {text}: {error}"}
            _send(sock, b"")
            _send(sock, json.dumps(tail).encode())
    except BaseException:
        code = 1
    finally:
        os._exit(code)
