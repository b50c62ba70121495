"""The pool agent's client connections: accept, read, answer and drop, without letting one
user slow down another.

The agent is one thread serving everyone, so nothing here may wait on a peer:

* a refused connection (another user's agent, a user over the connection cap,
  a service at its file-descriptor limit) is told why with one non-blocking
  send and closed a moment later, from the loop, never waited on;
* each user may hold ``per_user`` connections; all of them together at most
  ``max_connections`` (the file-descriptor limit, raised to its hard limit at
  start, less a reserve for the ledger, logs and forks); at the limit the
  agent refuses new connections with the reason, and if ``accept`` itself
  runs out of descriptors it stops accepting for a second, logs once a
  minute, and goes on serving the connections it has;
* bytes in flight are budgeted per user, not per connection: a user's
  connections read on while their unfinished messages hold less than
  ``IN_BUDGET`` in all, except the one furthest along, which may finish its
  message (at most one payload, ``protocol.MAX_BLOBS``); a message that stops
  arriving for ``PARTIAL_TIMEOUT`` seconds ends its connection;
* replies are budgeted too: a connection is not read while a reply to it is
  still unsent, and none of a user's are while that user's unread replies
  exceed ``OUT_BUDGET``.
"""

from __future__ import annotations

import errno
import logging
import resource
import selectors
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..vocab.errors import DlschedError, PermissionDenied
from .bites import Bites
from .protocol import Decoder, ProtocolError, encode, error_reply

log = logging.getLogger("jupyter_dlsched.agent")

#: Connections one user may hold at once (fewer when the descriptor limit is low).
MAX_PEERS = 256
#: Descriptors kept free for the ledger, logs, pipes and forks.
FD_RESERVE = 64
#: Bytes of unfinished messages a user's connections may hold, past the one furthest along.
IN_BUDGET = 64 << 20
#: Bytes of replies a user has not read yet before the agent stops reading that user.
OUT_BUDGET = 64 << 20
#: Bytes a peer may send while one of its requests is held (a ``changes`` wait).
MAX_HELD = 1 << 20
#: Seconds an unfinished message may go without a byte before its connection is ended.
PARTIAL_TIMEOUT = 30.0
#: Seconds a refused connection is kept open for its reason to be read.
LINGER = 1.0
#: Refused connections lingering at once; more are closed at once.
MAX_LINGERING = 64
_UCRED = struct.Struct("3i")


@dataclass(eq=False)
class Peer:
    """One client connection and who is at the other end."""

    sock: socket.socket
    pid: int
    uid: int
    gid: int
    user: str
    admin: bool
    decoder: Decoder = field(default_factory=Decoder)
    out: bytearray = field(default_factory=bytearray)
    #: a ``changes`` request held until something changes: (since, deadline)
    waiting: tuple[int, float] | None = None
    #: a list request waits in its user's line of reads (``Reads.serve_queued_reads``)
    held: bool = False
    #: when a byte last arrived (time.monotonic()), or reading resumed after a pause
    last_input: float = 0.0
    #: the selector events it is registered for
    interest: int = 0


@dataclass(eq=False)
class _Lingering:
    """A refused connection, closed once its peer has read why (or after ``LINGER``)."""

    sock: socket.socket
    until: float


def raise_fd_limit() -> int:
    """Raise this process's soft descriptor limit to its hard one; the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


class Connections:
    """Every client connection of one agent, served from its loop.

    ``handle(peer, message, blobs)`` is called for each request that has arrived
    whole; ``who(uid)`` names a peer (user name, admin or not); ``refuse(uid)``
    returns why a peer may not connect at all, or None.
    """

    def __init__(
        self,
        selector: selectors.BaseSelector,
        *,
        shared: bool,
        handle: Callable[[Peer, dict[str, Any], list[bytes]], None],
        who: Callable[[int], tuple[str, bool]],
        refuse: Callable[[int], DlschedError | None],
        bites: Bites | None = None,
    ) -> None:
        self.selector = selector
        #: each limit that bites here is counted and logged (once a minute per user)
        self.bites = bites if bites is not None else Bites()
        self.shared = shared
        self._handle = handle
        self._who = who
        self._refuse_uid = refuse
        self.peers: dict[int, Peer] = {}
        self._by_user: dict[int, list[Peer]] = {}
        self._inbound: dict[int, int] = {}
        self._outbound: dict[int, int] = {}
        self._paused: dict[int, set[Peer]] = {}
        self._ready: set[Peer] = set()
        self._lingering: dict[int, _Lingering] = {}
        self.listener: socket.socket | None = None
        self._listening = False
        self._resume_accept_at = 0.0
        self.fd_limit = raise_fd_limit()
        self.max_connections = max(16, self.fd_limit - FD_RESERVE)
        self.per_user = max(8, min(MAX_PEERS, self.max_connections // 4))

    # -- the loop's side ------------------------------------------------------------------

    def listen(self, listener: socket.socket) -> None:
        self.listener = listener
        self.selector.register(listener, selectors.EVENT_READ, None)
        self._listening = True

    def event(self, data: Any, mask: int) -> None:
        """One selector event (``data`` is what was registered)."""
        if data is None:
            self._accept()
        elif isinstance(data, _Lingering):
            self._linger(data)
        else:
            peer: Peer = data
            try:
                if mask & selectors.EVENT_READ:
                    self._read(peer)
                if mask & selectors.EVENT_WRITE and self._open(peer):
                    self.flush(peer)
            except Exception:
                # one peer's bad input ends that peer's connection, never the agent
                log.exception("dlsched agent: dropping a connection of uid %s", peer.uid)
                self.drop(peer)

    def sweep(self, now: float) -> None:
        """Once in a while: end stalled messages and lingering refusals; accept again."""
        for peer in list(self.peers.values()):
            if (
                peer.decoder.buffered
                and peer.interest & selectors.EVENT_READ
                and now - peer.last_input > PARTIAL_TIMEOUT
            ):
                self.bites.hit(
                    "stalled_message",
                    peer.user,
                    "ended a connection of %s (uid %s): half a message (%d bytes) and no "
                    "byte for %.0f s",
                    peer.user,
                    peer.uid,
                    peer.decoder.buffered,
                    PARTIAL_TIMEOUT,
                )
                self.drop(peer)
        for entry in [e for e in self._lingering.values() if now >= e.until]:
            self._unlinger(entry)
        if not self._listening and self.listener is not None and now >= self._resume_accept_at:
            self.selector.register(self.listener, selectors.EVENT_READ, None)
            self._listening = True

    def close_all(self) -> None:
        for peer in list(self.peers.values()):
            self.drop(peer)
        for entry in list(self._lingering.values()):
            self._unlinger(entry)
        self.stop_listening()

    def stop_listening(self) -> None:
        """Take no new connection (those open are served on): the socket's name is free
        at once for the next agent."""
        if self.listener is not None:
            if self._listening:
                self.selector.unregister(self.listener)
            try:
                # refused from now on, even while a child just forked still holds the
                # socket (until it lets go of the agent's sockets): a bare close leaves
                # it listening there, and a client's connection would wait in its
                # backlog, then be reset
                self.listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.listener.close()
            self.listener = None
            self._listening = False

    def close_in_child(self) -> None:
        """In a forked child: let go of every socket (the agent keeps them)."""
        if self.listener is not None:
            self.listener.close()
        for peer in self.peers.values():
            peer.sock.close()
        for entry in self._lingering.values():
            entry.sock.close()

    # -- accepting ------------------------------------------------------------------------

    def _accept(self) -> None:
        assert self.listener is not None
        while True:
            try:
                sock, _ = self.listener.accept()
            except BlockingIOError:
                return
            except OSError as error:
                if error.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self._stop_accepting(error)
                return
            pid, uid, gid = _UCRED.unpack(
                sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
            )
            sock.setblocking(False)
            refusal = self._refuse_uid(uid)
            if refusal is None:
                refusal = self._over_cap(uid)
            if refusal is not None:
                self._refuse(sock, refusal)
                continue
            name, admin = self._who(uid)
            peer = Peer(sock, pid, uid, gid, name, admin, last_input=time.monotonic())
            self.peers[sock.fileno()] = peer
            self._by_user.setdefault(uid, []).append(peer)
            peer.interest = selectors.EVENT_READ
            self.selector.register(sock, peer.interest, peer)

    def _over_cap(self, uid: int) -> DlschedError | None:
        if len(self.peers) + len(self._lingering) >= self.max_connections:
            self.bites.hit(
                "connections",
                self._who(uid)[0],
                "at its limit of %d connections (file descriptors: %d); refused one of %s",
                self.max_connections,
                self.fd_limit,
                self._who(uid)[0],
            )
            return DlschedError(
                f"the pool's service is at its limit of {self.max_connections} connections; "
                "try again shortly (its file-descriptor limit sets it)"
            )
        if self.shared and len(self._by_user.get(uid, ())) >= self.per_user:
            name = self._who(uid)[0]
            self.bites.hit(
                "connections_per_user",
                name,
                "%s (uid %s) has %d connections open, the limit per user is %d; refused one",
                name,
                uid,
                len(self._by_user[uid]),
                self.per_user,
            )
            return PermissionDenied(
                f"uid {uid} has {self.per_user} connections to this pool already; close "
                "some (each kernel, CLI and Jupyter server holds one or two)"
            )
        return None

    def _stop_accepting(self, error: OSError) -> None:
        """Out of descriptors: serve the connections there are, try accepting in a second."""
        self.bites.hit(
            "descriptors",
            "",
            "out of file descriptors (%s; %d connections open, limit %d): not accepting "
            "new connections for a second",
            error.strerror,
            len(self.peers),
            self.fd_limit,
        )
        if self._listening and self.listener is not None:
            self.selector.unregister(self.listener)
            self._listening = False
        self._resume_accept_at = time.monotonic() + 1.0

    def _refuse(self, sock: socket.socket, error: DlschedError) -> None:
        """Tell a peer why it is refused without waiting for it: one send, then the socket
        lingers (read and discarded) until the peer closes it or ``LINGER`` passes, so that
        closing does not reset the connection before the reason arrives."""
        try:
            sock.send(encode(error_reply(error)))
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            sock.close()
            return
        if len(self._lingering) >= MAX_LINGERING:
            oldest = min(self._lingering.values(), key=lambda e: e.until)
            self._unlinger(oldest)
        entry = _Lingering(sock, time.monotonic() + LINGER)
        self._lingering[sock.fileno()] = entry
        self.selector.register(sock, selectors.EVENT_READ, entry)

    def _linger(self, entry: _Lingering) -> None:
        try:
            if entry.sock.recv(65536):
                return
        except BlockingIOError:
            return
        except OSError:
            pass
        self._unlinger(entry)

    def _unlinger(self, entry: _Lingering) -> None:
        fd = entry.sock.fileno()
        if self._lingering.pop(fd, None) is not None:
            self.selector.unregister(entry.sock)
        entry.sock.close()

    # -- reading --------------------------------------------------------------------------

    def _read(self, peer: Peer) -> None:
        if not self._may_read(peer):
            self._update(peer)  # waits, unread, until its budget has room
            return
        try:
            data = peer.sock.recv(1 << 20)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.drop(peer)
            return
        peer.last_input = time.monotonic()
        self._feed(peer, data)
        if (peer.waiting is not None or peer.held) and peer.decoder.buffered > MAX_HELD:
            self.drop(peer)  # sending on while its request is held: not a client of ours
            return
        self.resume(peer)

    def resume(self, peer: Peer) -> None:
        """Handle the requests of ``peer`` that have arrived whole: none while one is held,
        none while its replies are unread (it is resumed once they are)."""
        while peer.waiting is None and not peer.held and self._open(peer) and self._may_read(peer):
            try:
                message = self._pop(peer)
            except ProtocolError as error:
                self.send(peer, error_reply(error))
                self.drop(peer, flush=True)
                return
            if message is None:
                break
            self._handle(peer, *message)
        if self._open(peer):
            self._update(peer)

    def _feed(self, peer: Peer, data: bytes) -> None:
        peer.decoder.feed(data)
        self._inbound[peer.uid] = self._inbound.get(peer.uid, 0) + len(data)

    def _pop(self, peer: Peer) -> tuple[dict[str, Any], list[bytes]] | None:
        before = peer.decoder.buffered
        try:
            return peer.decoder.pop()
        finally:
            taken = before - peer.decoder.buffered
            if taken:
                self._inbound[peer.uid] -= taken
                self._wake_user(peer.uid)

    def _may_read(self, peer: Peer) -> bool:
        if peer.out or self._outbound.get(peer.uid, 0) > OUT_BUDGET:
            return False  # its replies first: a client that does not read gets no more
        if self._inbound.get(peer.uid, 0) < IN_BUDGET:
            return True
        # over budget: only the message furthest along goes on, so one always finishes
        lead = max(self._by_user.get(peer.uid, ()), key=lambda p: p.decoder.buffered)
        return lead is peer

    # -- answering ------------------------------------------------------------------------

    def send(self, peer: Peer, reply: dict[str, Any], blobs: list[bytes] | None = None) -> None:
        data = encode(reply, blobs or ())
        peer.out += data
        self._outbound[peer.uid] = self._outbound.get(peer.uid, 0) + len(data)
        self.flush(peer)

    def flush(self, peer: Peer) -> None:
        sent_any = False
        while peer.out:
            try:
                sent = peer.sock.send(peer.out)
            except BlockingIOError:
                break
            except OSError:
                self.drop(peer)
                return
            del peer.out[:sent]
            self._outbound[peer.uid] -= sent
            sent_any = True
        self._update(peer)
        if sent_any and not peer.out:
            self._wake_user(peer.uid)

    def drop(self, peer: Peer, flush: bool = False) -> None:
        """End a connection (``flush``: its unsent reply goes out first, without waiting)."""
        fd = peer.sock.fileno()
        if fd < 0 or self.peers.get(fd) is not peer:
            return
        del self.peers[fd]
        if peer.interest:
            self.selector.unregister(peer.sock)
            peer.interest = 0
        self._by_user[peer.uid].remove(peer)
        if not self._by_user[peer.uid]:
            del self._by_user[peer.uid]
        self._inbound[peer.uid] -= peer.decoder.buffered
        self._outbound[peer.uid] -= len(peer.out)
        self._paused.get(peer.uid, set()).discard(peer)
        self._ready.discard(peer)
        if flush and peer.out:
            try:
                sent = peer.sock.send(peer.out)
                del peer.out[:sent]
            except OSError:
                pass
            if not peer.out:
                try:
                    peer.sock.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                self._lingering[fd] = entry = _Lingering(peer.sock, time.monotonic() + LINGER)
                self.selector.register(peer.sock, selectors.EVENT_READ, entry)
                self._wake_user(peer.uid)
                return
        peer.sock.close()
        self._wake_user(peer.uid)

    # -- interest: what each connection is waited on for -----------------------------------

    def is_open(self, peer: Peer) -> bool:
        """Whether ``peer`` is still one of the open connections."""
        return self._open(peer)

    def _open(self, peer: Peer) -> bool:
        fd = peer.sock.fileno()
        return fd >= 0 and self.peers.get(fd) is peer

    def _update(self, peer: Peer) -> None:
        events = selectors.EVENT_WRITE if peer.out else 0
        readable = self._may_read(peer)
        if readable:
            events |= selectors.EVENT_READ
            if peer in self._paused.get(peer.uid, ()):
                self._paused[peer.uid].discard(peer)
                peer.last_input = time.monotonic()  # its silence while paused was ours
                if peer.decoder.buffered:
                    self._ready.add(peer)  # requests it sent while paused, handled next turn
        else:
            self._paused.setdefault(peer.uid, set()).add(peer)
        if events != peer.interest:
            if events:
                if peer.interest:
                    self.selector.modify(peer.sock, events, peer)
                else:
                    self.selector.register(peer.sock, events, peer)
            else:
                self.selector.unregister(peer.sock)
            peer.interest = events

    def serve_ready(self) -> None:
        """Handle what paused connections sent while they waited for their budget."""
        while self._ready:
            peer = self._ready.pop()
            if self._open(peer):
                self.resume(peer)

    def _wake_user(self, uid: int) -> None:
        """A budget of ``uid`` has room again: look at its paused connections."""
        for peer in list(self._paused.get(uid, ())):
            if self._open(peer):
                self._update(peer)
            else:
                self._paused[uid].discard(peer)
