"""``dlsched service run --metrics HOST:PORT``: Prometheus scrapes, answered from the agent's loop.

A tiny HTTP/1.0 server on the agent's own selector (no thread: the agent
forks supervisors all the time, and a thread holding a lock at a fork would
leave the child stuck): ``GET /metrics`` is answered with the pool's metrics
(``metrics.py``), anything else with 404. It never waits on a scraper: a
request must arrive within ``REQUEST_TIMEOUT`` seconds and fit in 8 KiB.

Anyone on the host can connect, so idle connections must not lock scrapers out:
a request already waiting when its connection is accepted is answered at once,
and with ``MAX_SCRAPERS`` connections open a new one pushes out the oldest that
has not sent a whole request. A connection is never dropped with its whole request
waiting unread (the loop may have been busy): it is read and answered first. The exposition is rendered at most once per
``RENDER_EVERY`` seconds, however many ask.
"""

from __future__ import annotations

import logging
import selectors
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..vocab.errors import SpecError

log = logging.getLogger("jupyter_dlsched.agent")

#: Seconds a connection may take to send its request.
REQUEST_TIMEOUT = 2.0
MAX_REQUEST = 8192
#: Connections open at once; a new one pushes out the oldest idle one.
MAX_SCRAPERS = 64
#: Seconds a rendered exposition is served again (a flood of scrapes renders it once).
RENDER_EVERY = 1.0


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (or ``:PORT``, ``PORT``: loopback) as a bind address."""
    host, _, port = text.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    try:
        number = int(port)
    except ValueError:
        number = -1
    if not 0 <= number <= 65535:
        raise SpecError("--metrics", text, "HOST:PORT, e.g. 127.0.0.1:9464")
    return host, number


@dataclass(eq=False)
class _Scraper:
    sock: socket.socket
    until: float
    request: bytearray = field(default_factory=bytearray)
    out: bytes = b""


class ScrapeEndpoint:
    """The metrics listener of one agent; ``render()`` gives the exposition text."""

    def __init__(
        self,
        selector: selectors.BaseSelector,
        address: tuple[str, int],
        render: Callable[[], bytes],
        content_type: str,
        *,
        evicted: Callable[[], None] | None = None,
    ) -> None:
        self.selector = selector
        self.render = render
        #: told each time an idle connection is pushed out for a new one (a limit biting)
        self.evicted = evicted
        self._rendered: tuple[float, bytes] | None = None
        self.content_type = content_type
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind(address)
        except OSError as error:
            listener.close()
            raise SpecError(
                "--metrics", f"{address[0]}:{address[1]}", f"an address free to bind ({error})"
            ) from None
        listener.listen(128)
        listener.setblocking(False)
        self.listener = listener
        self.address = listener.getsockname()[:2]
        self._scrapers: dict[int, _Scraper] = {}
        selector.register(listener, selectors.EVENT_READ, self)

    @property
    def connections(self) -> int:
        """Connections open now."""
        return len(self._scrapers)

    def owns(self, data: object) -> bool:
        return data is self or isinstance(data, _Scraper)

    def event(self, data: object, mask: int) -> None:
        if data is self:
            self._accept()
        elif isinstance(data, _Scraper):
            if mask & selectors.EVENT_READ and not data.out:
                self._read(data)
            elif mask & selectors.EVENT_WRITE:
                self._write(data)

    def sweep(self, now: float) -> None:
        for scraper in [s for s in self._scrapers.values() if now >= s.until]:
            if not self._read_waiting(scraper):
                self._close(scraper)

    def _read_waiting(self, scraper: _Scraper) -> bool:
        """Read a request that arrived while the agent's loop was busy (a loaded machine):
        True when it was whole and is being answered, so the connection must stay."""
        fd = scraper.sock.fileno()
        if not scraper.out:
            self._read(scraper)
        return self._scrapers.get(fd) is scraper and bool(scraper.out)

    def close(self) -> None:
        for scraper in list(self._scrapers.values()):
            self._close(scraper)
        self.selector.unregister(self.listener)
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, OSError):
                return
            if len(self._scrapers) >= MAX_SCRAPERS:
                self._push_out()
            sock.setblocking(False)
            scraper = _Scraper(sock, time.monotonic() + REQUEST_TIMEOUT)
            self._scrapers[sock.fileno()] = scraper
            self.selector.register(sock, selectors.EVENT_READ, scraper)
            self._read(scraper)  # a scraper sends its request at once: answer it now

    def _push_out(self) -> None:
        """Close the oldest connection that has not sent a whole request (or the oldest); one
        whose request has arrived unread is answered instead, and the next oldest goes."""
        idle = sorted((s for s in self._scrapers.values() if not s.out), key=lambda s: s.until)
        for scraper in idle:
            if not self._read_waiting(scraper):
                self._close(scraper)
                break
        else:
            if len(self._scrapers) < MAX_SCRAPERS:
                return  # answering made room
            self._close(min(self._scrapers.values(), key=lambda s: s.until))
        if self.evicted is not None:
            self.evicted()

    def _read(self, scraper: _Scraper) -> None:
        try:
            data = scraper.sock.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._close(scraper)
            return
        scraper.request += data
        if b"\r\n\r\n" not in scraper.request and b"\n\n" not in scraper.request:
            if len(scraper.request) > MAX_REQUEST:
                self._answer(scraper, 431, b"request too large\n", "text/plain")
            return
        line = bytes(scraper.request).split(b"\n", 1)[0].decode("latin-1").split()
        if len(line) < 2 or line[0] not in ("GET", "HEAD"):
            self._answer(scraper, 405, b"only GET /metrics\n", "text/plain")
        elif line[1].split("?", 1)[0] != "/metrics":
            self._answer(scraper, 404, b"the metrics are at /metrics\n", "text/plain")
        else:
            try:
                body = self._exposition()
            except Exception:
                log.exception("dlsched agent: metrics")
                self._answer(scraper, 500, b"the metrics could not be read\n", "text/plain")
                return
            self._answer(scraper, 200, body if line[0] == "GET" else b"", self.content_type)

    def _exposition(self) -> bytes:
        now = time.monotonic()
        if self._rendered is None or now - self._rendered[0] >= RENDER_EVERY:
            self._rendered = (now, self.render())
        return self._rendered[1]

    def _answer(self, scraper: _Scraper, status: int, body: bytes, content_type: str) -> None:
        reason = {200: "OK", 404: "Not Found", 405: "Method Not Allowed"}.get(status, "Error")
        head = (
            f"HTTP/1.0 {status} {reason}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        scraper.out = head.encode() + body
        self.selector.modify(scraper.sock, selectors.EVENT_WRITE, scraper)
        self._write(scraper)

    def _write(self, scraper: _Scraper) -> None:
        try:
            sent = scraper.sock.send(scraper.out)
        except BlockingIOError:
            return
        except OSError:
            self._close(scraper)
            return
        scraper.out = scraper.out[sent:]
        if not scraper.out:
            self._close(scraper)

    def _close(self, scraper: _Scraper) -> None:
        fd = scraper.sock.fileno()
        if self._scrapers.pop(fd, None) is not None:
            self.selector.unregister(scraper.sock)
        scraper.sock.close()
