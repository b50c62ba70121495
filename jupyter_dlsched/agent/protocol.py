"""The pool agent's wire format: one JSON header and its binary attachments per message.

A message is a 4-byte big-endian header length, the header (UTF-8 JSON, an
object), then the attachments back to back; the header's ``"blobs"`` lists
their sizes. Payloads (pickles) travel as attachments and are stored as
they came: the agent never unpickles anything a client sends.

Requests carry ``"op"``; replies carry ``"ok": true`` and the op's fields, or
``"ok": false`` and ``"error": {"type", "message", ...}``, which the client
raises as the package's own exception (``SpecError``, ``JobNotFound``,
``PermissionDenied``, ...).
"""

from __future__ import annotations

import json
import os
import socket
import struct
from typing import Any

from ..vocab.errors import (
    DlschedError,
    IllegalTransition,
    JobNotFound,
    LedgerUnavailable,
    PermissionDenied,
    SpecError,
    UnsafeStateFolder,
)

HEADER = struct.Struct(">I")
#: Largest header (JSON) accepted, in bytes.
MAX_HEADER = 16 * 2**20
#: Largest attachments of one message (a payload pickle), in bytes; ``DLSCHED_MAX_PAYLOAD``.
MAX_BLOBS = int(os.environ.get("DLSCHED_MAX_PAYLOAD", str(2**30)))


class ProtocolError(DlschedError):
    """A peer sent something that is not a well-formed message."""


class AgentUnavailable(DlschedError, ConnectionError):
    """No pool agent answers on the socket (not started, stopped, or gone)."""


def encode(message: dict[str, Any], blobs: list[bytes] | tuple[bytes, ...] = ()) -> bytes:
    """One message as bytes: header length, JSON header, attachments."""
    head = dict(message)
    if blobs:
        head["blobs"] = [len(b) for b in blobs]
    data = json.dumps(head, separators=(",", ":")).encode()
    return b"".join([HEADER.pack(len(data)), data, *blobs])


class Decoder:
    """Splits a byte stream into messages: ``feed(data)`` then ``pop()`` until None."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._head: dict[str, Any] | None = None
        self._head_end = 0
        self._need = 0

    def feed(self, data: bytes) -> None:
        self._buffer += data

    @property
    def buffered(self) -> int:
        """Bytes received and not yet taken as messages."""
        return len(self._buffer)

    def pop(self) -> tuple[dict[str, Any], list[bytes]] | None:
        buf = self._buffer
        if self._head is None:
            if len(buf) < HEADER.size:
                return None
            (size,) = HEADER.unpack_from(buf)
            if size > MAX_HEADER:
                raise ProtocolError(f"a message header of {size} bytes (at most {MAX_HEADER})")
            if len(buf) < HEADER.size + size:
                return None
            try:
                head = json.loads(bytes(buf[HEADER.size : HEADER.size + size]))
            except (ValueError, RecursionError) as error:
                raise ProtocolError(f"a message header that is not JSON: {error}") from None
            if not isinstance(head, dict):
                raise ProtocolError("a message header that is not a JSON object")
            sizes = head.get("blobs") or []
            if not isinstance(sizes, list) or not all(
                isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in sizes
            ):
                raise ProtocolError("attachment sizes that are not a list of byte counts")
            if sum(sizes) > MAX_BLOBS:
                raise ProtocolError(
                    f"attachments of {sum(sizes)} bytes (at most {MAX_BLOBS}; "
                    "DLSCHED_MAX_PAYLOAD raises it)"
                )
            self._head, self._head_end, self._need = head, HEADER.size + size, sum(sizes)
        if len(buf) < self._head_end + self._need:
            return None
        head = self._head
        blobs = []
        at = self._head_end
        for n in head.get("blobs") or []:
            blobs.append(bytes(buf[at : at + n]))
            at += n
        del buf[:at]
        self._head = None
        return head, blobs


def recv_message(sock: socket.socket, decoder: Decoder) -> tuple[dict[str, Any], list[bytes]]:
    """Block until one whole message has arrived on ``sock``."""
    while True:
        message = decoder.pop()
        if message is not None:
            return message
        data = sock.recv(1 << 20)
        if not data:
            raise AgentUnavailable("the pool agent closed the connection")
        decoder.feed(data)


_ERRORS: dict[str, type[DlschedError]] = {
    "SpecError": SpecError,
    "JobNotFound": JobNotFound,
    "PermissionDenied": PermissionDenied,
    "LedgerUnavailable": LedgerUnavailable,
    "IllegalTransition": IllegalTransition,
    "UnsafeStateFolder": UnsafeStateFolder,
    "ProtocolError": ProtocolError,
}


def error_reply(error: BaseException) -> dict[str, Any]:
    """An exception as a reply the client can raise again."""
    detail: dict[str, Any] = {"type": type(error).__name__, "message": str(error)}
    if isinstance(error, SpecError):
        detail.update(field=error.field, value=repr(error.value), allowed=error.allowed)
    elif isinstance(error, JobNotFound):
        detail["job_id"] = str(error.job_id)
    if type(error).__name__ not in _ERRORS:
        detail["type"] = "DlschedError"
    return {"ok": False, "error": detail}


def raise_error(detail: dict[str, Any]) -> None:
    """Raise the exception an error reply describes."""
    kind = detail.get("type")
    message = str(detail.get("message", "the pool agent refused the request"))
    if kind == "SpecError":
        refused = SpecError(str(detail.get("field")), _Shown(detail.get("value")), "")
        refused.allowed = str(detail.get("allowed"))
        refused.args = (message,)
        raise refused
    if kind == "JobNotFound":
        raise JobNotFound(detail.get("job_id", ""))
    cls = _ERRORS.get(str(kind), DlschedError)
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    raise error


class _Shown(str):
    """A value as the agent showed it (``repr``), printed without extra quotes."""

    def __repr__(self) -> str:
        return str(self)
