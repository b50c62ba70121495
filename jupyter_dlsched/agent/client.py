"""Talking to a pool agent: find it, start one for this user, call it.

``AgentClient(address).call("jobs", states=["queued"])`` sends one request and
returns the reply's fields, raising the agent's refusal as the package's own
exception; what each op's request and reply hold is ``shapes.py``'s. One connection per client, used by one thread at a time; a
``changes`` long-poll gets a connection of its own (``watcher()``).
"""

from __future__ import annotations

import hashlib
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ..machine.detach import spawn
from ..vocab.errors import DlschedError
from .protocol import AgentUnavailable, Decoder, encode, raise_error, recv_message
from .shapes import Blobs, Calls

#: Where a shared pool's service listens unless ``DLSCHED_SOCKET`` says otherwise.
SYSTEM_SOCKET = "/run/dlsched/dlsched.sock"
SOCKET_ENV = "DLSCHED_SOCKET"
#: ``DLSCHED_AGENT=0``: this user's schedulers use the ledger directly, without an agent.
AGENT_ENV = "DLSCHED_AGENT"
AGENT_IDLE_ENV = "DLSCHED_AGENT_IDLE"
START_TIMEOUT = 20.0
#: ``DLSCHED_TIMEOUT``: seconds a client waits for the pool to answer a request (default 30).
TIMEOUT_ENV = "DLSCHED_TIMEOUT"
DEFAULT_TIMEOUT = 30.0
#: Seconds this user's agent waits with no client and nothing to do before it exits.
IDLE_EXIT = 600.0


def user_address(home: str | os.PathLike[str]) -> bytes:
    """The abstract socket of one user's agent for ``home``: one agent per ledger.

    (A client that finds an agent running older code asks it to stop and starts
    a fresh one: see ``local.launcher.code_stamp``.)
    """
    key = f"{os.getuid()}:{os.path.abspath(home)}"
    return b"\0dlsched-agent-" + hashlib.sha1(key.encode()).hexdigest()[:20].encode()


def shared_socket() -> str | None:
    """The shared pool to use: ``DLSCHED_SOCKET`` (``""`` or ``none``: none), else the
    system socket when it exists, else None (this user's own pool)."""
    value = os.environ.get(SOCKET_ENV)
    if value is not None:
        return None if value.strip().lower() in ("", "none", "0") else value
    return SYSTEM_SOCKET if os.path.exists(SYSTEM_SOCKET) else None


def agent_wanted() -> bool:
    """True unless ``DLSCHED_AGENT=0``: a user's pool is run by a per-user pool agent."""
    return os.environ.get(AGENT_ENV, "1").strip().lower() not in ("0", "no", "false", "off")


def client_timeout() -> float:
    """Seconds a request may wait for its reply: ``DLSCHED_TIMEOUT``, else 30."""
    value = os.environ.get(TIMEOUT_ENV, "").strip()
    if not value:
        return DEFAULT_TIMEOUT
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not (0 < seconds < float("inf")):
        from ..vocab.errors import SpecError

        raise SpecError(TIMEOUT_ENV, value, "a number of seconds above 0")
    return seconds


def _held_for(wait: object) -> float:
    """Seconds a request's ``wait`` may hold its reply (0 for anything but a real one)."""
    if isinstance(wait, bool) or not isinstance(wait, int | float):
        return 0.0
    return float(wait) if 0 < wait < 3600 else 0.0


def trusted_server_uids(path: str, service_uid: int | None = None) -> set[int]:
    """The uids that may serve the socket file ``path``, once the folders it lives in could
    not have let another user put a socket of their own there (as OpenSSH trusts a key file).

    The socket's folder must belong to root or to the service's user (``service_uid``, else
    whoever owns that folder), every folder above it to root, and none of them may be
    writable by group or others (a sticky ``/tmp`` too: anyone may create what is missing
    in it). A link on the way must be root's. Raises ``UnsafeSocket`` naming the folder,
    its owner and its mode.
    """
    import stat

    from ..vocab.errors import UnsafeSocket

    def refuse(where: str, st: os.stat_result, why: str) -> UnsafeSocket:
        mode = stat.S_IMODE(st.st_mode)
        return UnsafeSocket(
            f"the pool's socket {path} is not safe to use: {where} {why} (uid {st.st_uid}, "
            f"mode {mode:04o}), so another user could put a socket of their own in its place; "
            "serve the pool from a folder of root's or the service's user that no one else "
            "can write, in folders of root's (the default is /run/dlsched)"
        )

    absolute = os.path.abspath(path)
    folder = os.path.realpath(os.path.dirname(absolute))
    try:
        st = os.stat(folder)
    except OSError as error:
        raise AgentUnavailable(f"no pool service at {path} ({error.strerror})") from None
    owner = st.st_uid if service_uid is None else service_uid
    allowed = {0, owner}
    at = "/"
    for part in absolute.strip("/").split("/")[:-1]:
        at = os.path.join(at, part)
        try:
            link = os.lstat(at)
        except OSError:
            break
        if stat.S_ISLNK(link.st_mode) and link.st_uid != 0:
            raise refuse(at, link, "is a link of another user's")
    owners = allowed  # the socket's own folder; root's above it
    while True:
        st = os.stat(folder)
        if st.st_uid not in owners:
            raise refuse(folder, st, "belongs to another user")
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise refuse(folder, st, "is writable by others")
        if folder == "/":
            break
        folder, owners = os.path.dirname(folder), {0}
    try:
        sock = os.lstat(absolute)
    except OSError:
        return allowed
    if sock.st_uid not in allowed:
        raise refuse(absolute, sock, "belongs to another user")
    return allowed


def notify(address: str | bytes, message: dict[str, Any], timeout: float = 2.0) -> bool:
    """Send one request and wait for its reply; False if no agent answers."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(address)
            sock.sendall(encode(message))
            reply, _ = recv_message(sock, Decoder())
    except (OSError, AgentUnavailable):
        return False
    return bool(reply.get("ok"))


#: The agent's own messages (start-up failures, warnings), in its state folder.
AGENT_LOG = "agent.log"
_SPAWNED: list[subprocess.Popen[bytes]] = []
_SPAWN_LOCK = threading.Lock()


def agent_exited(pid: int) -> bool:
    """Whether the agent ``pid`` has exited: one this process started is collected (else,
    a zombie, it would still answer ``kill(pid, 0)``)."""
    with _SPAWN_LOCK:
        for process in _SPAWNED:
            if process.pid == pid:
                return process.poll() is not None
    try:
        os.kill(pid, 0)
    except OSError:
        return True
    return False


def spawn_agent(home: str | os.PathLike[str]) -> subprocess.Popen[bytes] | None:
    """Start this user's agent for ``home`` in the background (its own session); its
    messages go to ``<home>/agent.log``. Its ``Popen``, or None where it was started
    outside this process (a supervisor's, ``machine/detach.py``)."""
    from ..vocab import private

    idle = os.environ.get(AGENT_IDLE_ENV, str(IDLE_EXIT))
    log_path = Path(home) / AGENT_LOG
    try:
        if log_path.stat().st_size > 1_000_000:
            log_path.unlink()  # a fresh log now and then
    except FileNotFoundError:
        pass
    with _SPAWN_LOCK:  # a kernel's threads (its loop, a watcher) may start one at once
        # agents that have exited: collected, no zombie left
        _SPAWNED[:] = [p for p in _SPAWNED if p.poll() is None]
    log = private.open_append(log_path)
    try:
        # started outside a supervisor that starts it (``machine/detach.py``): an agent
        # below a supervisor was ended with the supervisor's job
        process = spawn(
            [
                sys.executable,
                "-m",
                "jupyter_dlsched.agent",
                "--home",
                str(home),
                "--idle-exit",
                idle,
            ],
            output=log,
            env={k: v for k, v in os.environ.items() if k != "MPLBACKEND"},
        )
    finally:
        os.close(log)
    if process is not None:
        with _SPAWN_LOCK:
            _SPAWNED.append(process)
    return process


def _last_line(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "no message"
    return lines[-1] if lines else "no message"


def _closed_by_peer(sock: socket.socket) -> bool:
    """True when the other end has closed (a readable socket with nothing to read)."""
    import select

    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return False
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


class AgentClient(Calls):
    """One connection to a pool agent; ``call(op, **fields)`` is typed per op (``Calls``).

    ``home`` (a user's own pool): an agent is started when none answers.
    """

    def __init__(
        self,
        address: str | bytes,
        home: str | os.PathLike[str] | None = None,
        timeout: float | None = None,
    ) -> None:
        self.address = address
        self.home = Path(home) if home is not None else None
        #: seconds a call may wait for its reply (``DLSCHED_TIMEOUT``, default 30)
        self.timeout = timeout if timeout is not None else client_timeout()
        self._sock: socket.socket | None = None
        self._decoder = Decoder()
        self._lock = threading.Lock()
        #: ``interrupt`` was called: a call it breaks fails, not tried again on a new socket
        self._interrupted = False

    def describe(self) -> str:
        if isinstance(self.address, bytes):
            return f"this user's pool agent for {self.home}"
        return f"the shared pool at {self.address}"

    def _connect(self) -> socket.socket:
        allowed = None
        if isinstance(self.address, str):
            try:
                allowed = trusted_server_uids(self.address)
            except DlschedError as error:
                raise AgentUnavailable(f"refusing {self.describe()}: {error}") from None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)  # a service that is stopped fills its backlog
        try:
            sock.connect(self.address)
        except TimeoutError:
            sock.close()
            raise AgentUnavailable(self._silent()) from None
        except OSError as error:
            sock.close()
            if self.home is None:
                raise AgentUnavailable(
                    f"no pool service answers at {self.address!s} ({error.strerror}); is "
                    "`dlsched service run` running? Unset DLSCHED_SOCKET to use your own pool"
                ) from None
            return self._start_agent()
        return self._trusted(sock, allowed)

    def _silent(self) -> str:
        return (
            f"{self.describe()} did not answer within {self.timeout:g} s (is it stopped or "
            f"overloaded? {TIMEOUT_ENV} sets how long to wait)"
        )

    def _trusted(self, sock: socket.socket, allowed: set[int] | None = None) -> socket.socket:
        """``sock``, once the process at its other end is who it should be: this user's own
        agent (one's payloads and environment go to it), or a shared pool's service (root,
        or the user whose folder the socket is in, which no one else could write: see
        ``trusted_server_uids``). Another user could otherwise listen in its place."""
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", creds)
        if allowed is None:
            allowed = {os.getuid()} if isinstance(self.address, bytes) else {0}
        if uid not in allowed:
            sock.close()
            raise AgentUnavailable(
                f"refusing {self.describe()}: it is served by uid {uid}, not by "
                f"{' or '.join(f'uid {u}' for u in sorted(allowed))}"
            )
        return sock

    def _start_agent(self) -> socket.socket:
        assert self.home is not None
        process, spawned = spawn_agent(self.home), time.monotonic()
        deadline = spawned + START_TIMEOUT
        delay = 0.005
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(self.address)
            except OSError:
                sock.close()
                # None: started outside this process (a supervisor's), its exit unknown here
                code = process.poll() if process is not None else None
                if code is not None and code != 0:
                    raise AgentUnavailable(
                        f"the pool agent for {self.home} could not start: "
                        f"{_last_line(self.home / AGENT_LOG)}"
                    ) from None
                if (code == 0 or process is None) and time.monotonic() > spawned + 2:
                    # it stepped aside for one that has gone since
                    process, spawned = spawn_agent(self.home), time.monotonic()
                if time.monotonic() > deadline:
                    raise AgentUnavailable(
                        f"the pool agent for {self.home} did not start within "
                        f"{START_TIMEOUT:.0f} s (python -m jupyter_dlsched.agent --home "
                        f"{self.home} shows why)"
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 0.1)
            else:
                return self._trusted(sock)

    def _exchange(self, op: str, blobs: Blobs, fields: dict[str, Any]) -> dict[str, Any]:
        """Send ``op`` with ``fields``; the reply (a refusal raises)."""
        data = encode({"op": op, **fields}, blobs)
        with self._lock:
            if self._sock is not None and _closed_by_peer(self._sock):
                self._close()  # the agent restarted (or idled out) since the last call
            for attempt in (0, 1):
                if self._sock is None:
                    self._sock = self._connect()
                    self._decoder = Decoder()
                # a held ``changes`` request answers within its wait; others at once
                self._sock.settimeout(self.timeout + _held_for(fields.get("wait")))
                try:
                    self._sock.sendall(data)
                except TimeoutError:
                    self._close()
                    raise AgentUnavailable(self._silent()) from None
                except OSError:
                    self._close()
                    if attempt == 0 and not self._interrupted:
                        continue  # nothing was sent: try a fresh connection once
                    raise AgentUnavailable(f"{self.describe()} does not answer") from None
                try:
                    reply, _ = recv_message(self._sock, self._decoder)
                    break
                except TimeoutError:
                    self._close()
                    if op == "submit":
                        raise AgentUnavailable(
                            f"{self._silent()}; `dls.jobs()` shows whether the job was queued"
                        ) from None
                    raise AgentUnavailable(self._silent()) from None
                except (OSError, AgentUnavailable):
                    self._close()
                    if op == "submit":
                        # the submission may have landed: never send it twice
                        raise AgentUnavailable(
                            f"lost the connection to {self.describe()} while submitting; "
                            "`dls.jobs()` shows whether the job was queued"
                        ) from None
                    if attempt == 1 or self._interrupted:
                        raise AgentUnavailable(f"{self.describe()} does not answer") from None
        if not reply.get("ok"):
            raise_error(reply.get("error") or {})
        return reply

    def interrupt(self) -> None:
        """Wake a thread blocked in ``call`` on this connection (its call fails at once,
        without a second try on a new connection, which would wait as long again)."""
        self._interrupted = True
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def watcher(self) -> AgentClient:
        """A second connection, for ``changes`` long-polls that must not hold up calls."""
        return AgentClient(self.address, self.home)

    def _close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
            self._sock = None

    def close(self) -> None:
        with self._lock:
            self._close()
