"""The pool agent's read requests: a job, listings, counts, status, metrics and samples,
events and metadata, and ``changes`` (answered at once or held until a state changes).

Part of the request handlers (``requests.py``, whose docstring says how each is
typed and checked); these write nothing to the ledger.
"""

from __future__ import annotations

import math
import os
import time
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..local import preload
from ..vocab.errors import JobNotFound, SpecError
from ..vocab.schema import info_to_json
from .config import ServiceConfig
from .connections import Connections, Peer
from .shapes import (
    CacheReply,
    ChangesReply,
    ChangesRequest,
    CountReply,
    Done,
    EventsReply,
    EventsRequest,
    FinishedRequest,
    JobIdRequest,
    JobReply,
    JobsReply,
    JobsRequest,
    MetaReply,
    MetaRequest,
    MetricsReply,
    NoFields,
    SamplesReply,
    SamplesRequest,
    SeqReply,
    StatusReply,
)

if TYPE_CHECKING:
    from ..engine import Engine
    from ..machine.sampling import Sampler
    from .bites import Bites
    from .ray_keeper import RayKeeper

#: Longest a ``changes`` request waits for a state change before answering empty.
MAX_WAIT = 30.0


#: Rows a list request returns at most (samples: small rows).
MAX_ROWS = 100_000
#: Events one ``events`` request returns at most (the reply says ``more``): a ledger's
#: 100,000 events in one reply held the agent's one thread for most of a second.
MAX_EVENT_ROWS = 2_000
#: State changes one ``changes`` request returns at most (the reply says ``more``, and the
#: client asks again from the last one it got, ``link.RemoteLedger.state_changes_since``):
#: a page of 10,000 cost the agent's one thread about 40 ms, one of 2,000 about 8 ms.
MAX_CHANGE_ROWS = 2_000

#: Jobs one ``jobs`` or ``finished`` request returns at most: a larger ``limit`` is clamped,
#: and the reply says there is more (``more``, ``next_offset``). A page costs the agent's one
#: thread about 12 ms (its rows made JSON and encoded: ``benchmarks/list_reads.py``), and
#: another user's request waits behind one page at most; a ledger of 12,000 jobs in one
#: reply would cost a few hundred milliseconds.
MAX_JOB_ROWS = 500


#: Requests that read many rows: each user's wait in a line of their own, and the agent
#: answers one from each user's line per turn of its loop, so a user reading in a loop (from
#: any number of connections) delays another user's request by one page at most. A
#: ``changes`` request is one of them (a page of up to MAX_CHANGE_ROWS); once answered from
#: its line it may be held for a change, as before.
QUEUED_READS = frozenset({"jobs", "finished", "events", "samples", "changes"})


#: A user's line of list requests this long is logged as a limit biting (``bites.py``).
LONG_LINE = 8


#: Samples one ``samples`` request answers at most (each source thinned evenly to fit).
MAX_SAMPLES = 20_000


_METADATA_KEYS = ("inventory", "settings", "cache")


#: Job ids one ``jobs`` request may name (SQLite binds at most 32,766 values a statement).
MAX_IDS = 10_000


def _count_arg(msg: Mapping[str, Any], key: str) -> int:
    """A request's ``offset`` or ``since`` (missing: 0): a whole number the ledger's 64-bit
    integers hold, 0 or more."""
    value = msg.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise SpecError(key, value, "a whole number from 0 to 2**63 - 1")
    return value


def _list_args(msg: Mapping[str, Any]) -> dict[str, Any]:
    """The filters of a ``jobs`` request, checked: states, owner, ids, order, holding."""
    from ..vocab.schema import STATES

    states, owner, ids = msg.get("states"), msg.get("owner"), msg.get("ids")
    if states is not None and (
        not isinstance(states, list) or not all(isinstance(x, str) and x in STATES for x in states)
    ):
        raise SpecError("states", states, "a list of job states: " + ", ".join(STATES))
    if owner is not None and not isinstance(owner, str):
        raise SpecError("owner", owner, "a user name")
    if ids is not None and (
        not isinstance(ids, list) or len(ids) > MAX_IDS or not all(isinstance(x, str) for x in ids)
    ):
        raise SpecError("ids", ids, f"a list of at most {MAX_IDS:,} job ids")
    newest_first = msg.get("newest_first", False)
    if not isinstance(newest_first, bool | None):
        raise SpecError("newest_first", newest_first, "true or false")
    holding = msg.get("holding", False)
    if not isinstance(holding, bool | None):
        raise SpecError("holding", holding, "true or false")
    return {
        "states": states,
        "owner": owner,
        "ids": ids,
        "newest_first": bool(newest_first),
        "holding": bool(holding),
    }


def _page(msg: Mapping[str, Any], most: int = MAX_ROWS) -> int:
    """Rows one list request answers: its ``limit``, at most ``most``."""
    limit = msg.get("limit")
    if limit is None:
        return most
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise SpecError("limit", limit, "a whole number of rows, 1 or more")
    return min(limit, most)


def _job_page(rows: list[dict[str, Any]], page: int, offset: int) -> JobsReply:
    """A page of jobs as JSON (``rows`` holds one more when more follow) and how to ask on."""
    more = len(rows) > page
    reply: JobsReply = {"jobs": rows[:page], "more": more}
    if more:
        reply["next_offset"] = offset + page
    return reply


def _owner(path: str) -> int | None:
    try:
        return os.stat(path).st_uid
    except OSError:
        return None


def _seconds(msg: Mapping[str, Any], key: str, default: float) -> float:
    """A time field of a request (epoch seconds), or ``default`` when left out."""
    value = msg.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not -1e12 < value < 1e12:
        raise SpecError(key, value, "a time in epoch seconds")
    return float(value)


class Reads:
    """The read requests of ``Agent`` (``service.py``), part of its ``Requests``."""

    if TYPE_CHECKING:  # the agent's, set in Agent.__init__
        home: Path
        shared: bool
        uid: int
        code: str
        config: ServiceConfig | None
        conns: Connections
        sched: Engine | None
        sampler: Sampler | None
        ray: RayKeeper
        _dirty: bool
        _stopping: bool
        socket_path: Path | None

        _read_queue: dict[int, deque[tuple[Peer, dict[str, Any], list[bytes]]]]
        bites: Bites

        def _answer(self, peer: Peer, message: dict[str, Any], blobs: list[bytes]) -> None: ...
        def _cache_quota(self, uid: int) -> int | None: ...
        def take_back(self, peer: Peer, again: bool) -> None: ...
        def stop_listening(self) -> None: ...

        @property
        def _store(self) -> Any: ...
        @property
        def peers(self) -> dict[int, Peer]: ...

    def queue_read(self, peer: Peer, message: dict[str, Any], blobs: list[bytes]) -> None:
        """Put a list request in its user's line; the connection reads no more until it is
        answered (a client waits for each reply anyway)."""
        peer.held = True
        line = self._read_queue.setdefault(peer.uid, deque())
        line.append((peer, message, blobs))
        if len(line) >= LONG_LINE:
            self.bites.hit(
                "queued_reads",
                peer.user,
                "%s has %d list requests waiting in line (each answered in its turn)",
                peer.user,
                len(line),
            )

    def serve_queued_reads(self) -> None:
        """Answer the first list request in each user's line (one turn of the loop)."""
        for uid in list(self._read_queue):
            line = self._read_queue[uid]
            peer, message, blobs = line.popleft()
            if not line:
                del self._read_queue[uid]
            peer.held = False
            if self.conns.is_open(peer):
                self._answer(peer, message, blobs)
                self.conns.resume(peer)  # what it sent meanwhile

    def _get(self, peer: Peer, msg: JobIdRequest, blobs: list[bytes]) -> JobReply:
        job_id = msg.get("id")
        if not isinstance(job_id, str):
            raise JobNotFound(job_id)
        return {"job": info_to_json(self._store.get(job_id))}

    def _clamped(self, peer: Peer, msg: Mapping[str, Any]) -> int:
        """A job list's page, counted as a limit biting when it asked for more."""
        page, asked = _page(msg, MAX_JOB_ROWS), msg.get("limit")
        if isinstance(asked, int) and asked > page:
            self.bites.hit(
                "list_rows",
                peer.user,
                "%s asked for %s jobs in one %r request; a page is %d",
                peer.user,
                asked if asked < 10**12 else f"{asked:.3g}",
                msg.get("op"),
                page,
            )
        return page

    def _jobs(self, peer: Peer, msg: JobsRequest, blobs: list[bytes]) -> JobsReply:
        page, offset = self._clamped(peer, msg), _count_arg(msg, "offset")
        rows = self._store.job_rows(limit=page + 1, offset=offset, **_list_args(msg))
        return _job_page(rows, page, offset)

    def _finished(self, peer: Peer, msg: FinishedRequest, blobs: list[bytes]) -> JobsReply:
        since, owner = msg.get("since") or 0.0, msg.get("owner")
        if (
            isinstance(since, bool)
            or not isinstance(since, int | float)
            or not math.isfinite(since)
        ):
            raise SpecError("since", since, "a time in epoch seconds")
        if owner is not None and not isinstance(owner, str):
            raise SpecError("owner", owner, "a user name")
        page, offset = self._clamped(peer, msg), _count_arg(msg, "offset")
        rows = self._store.finished_rows(
            since=float(since), owner=owner, limit=page + 1, offset=offset
        )
        return _job_page(rows, page, offset)

    def _ping(self, peer: Peer, msg: NoFields, blobs: list[bytes]) -> Done:
        return {}

    def _count(self, peer: Peer, msg: NoFields, blobs: list[bytes]) -> CountReply:
        return {"counts": self._store.count_jobs()}

    def _seq(self, peer: Peer, msg: NoFields, blobs: list[bytes]) -> SeqReply:
        return {"seq": self._store.last_event_seq()}

    def _status_request(self, peer: Peer, msg: NoFields, blobs: list[bytes]) -> StatusReply:
        return {"status": self._status(peer)}

    def _cache(self, peer: Peer, msg: NoFields, blobs: list[bytes]) -> CacheReply:
        return {"cache": self._cache_info(peer)}

    def _metrics(self, peer: Peer, msg: NoFields, blobs: list[bytes]) -> MetricsReply:
        return {"text": self.render_metrics().decode()}

    def _status(self, peer: Peer) -> dict[str, Any]:
        assert self.sched is not None
        status = self.sched.status()
        status["pool"] = {
            "mode": "shared" if self.shared else "user",
            "socket": str(self.socket_path) if self.socket_path else None,
            "agent_pid": os.getpid(),
            "you": peer.user,
            "admin": peer.admin,
        }
        if not self.shared:  # what this agent's DLSCHED_PRELOAD says (not the asker's)
            status["pool"]["preload"] = {
                "launcher": preload.launcher_modules(),
                "pinned": preload.pinned() is not None,
            }
        return status

    def _samples(self, peer: Peer, msg: SamplesRequest, blobs: list[bytes]) -> SamplesReply:
        """Utilisation history in ``[since, until]`` (of ``source``), thinned to ``max_rows``."""
        since, until = _seconds(msg, "since", 0.0), _seconds(msg, "until", time.time())
        source = msg.get("source")
        if source is not None and (not isinstance(source, str) or len(source) > 64):
            raise SpecError("source", source, "gpu, gpu:N, cpu or ram")
        rows = msg.get("max_rows", MAX_SAMPLES)
        if isinstance(rows, bool) or not isinstance(rows, int) or not 1 <= rows <= MAX_SAMPLES:
            raise SpecError("max_rows", rows, f"a whole number from 1 to {MAX_SAMPLES}")
        return {"samples": self._store.usage.thinned_samples(since, until, source, rows)}

    def render_metrics(self) -> bytes:
        """The pool's Prometheus metrics now (GPUs measured through NVML when real)."""
        from ..machine.metrics import exposition

        assert self.sched is not None
        inventory = self._store.get_meta("inventory", {}) or {}
        pool = None
        if any(not g.get("simulated") for g in inventory.get("gpus") or []):
            pool = self.sched.pool()  # measured, with each GPU process's job (or user)
        return exposition(self._store, pool, time.time(), self.bites.counts)

    def _cache_info(self, peer: Peer) -> dict[str, Any]:
        """The stage-in cache; in a shared pool a user sees only their own entries and
        stagings listed (their sources are theirs), with the totals of everyone's."""
        from ..staging import cache_info

        info = cache_info(self._store)
        if self.shared:
            mine = [item for item in info["items"] if _owner(item["path"]) == peer.uid]
            # this user's share: what their entries hold, and their max_cache_bytes
            info["user_bytes"] = sum(item["bytes"] for item in mine)
            info["user_max_bytes"] = self._cache_quota(peer.uid)
            if not peer.admin:
                info["items"] = mine
                info["staging"] = [s for s in info["staging"] if s.get("uid") == peer.uid]
        return info

    def _events(self, peer: Peer, msg: EventsRequest, blobs: list[bytes]) -> EventsReply:
        job_id = msg.get("id")
        if job_id is not None:
            self._store.get(job_id)  # JobNotFound for an unknown id
        page = _page(msg, MAX_EVENT_ROWS)
        rows = self._store.events(job_id, since=_count_arg(msg, "since"), limit=page + 1)
        return {"events": rows[:page], "more": len(rows) > page}

    def _meta(self, peer: Peer, msg: MetaRequest, blobs: list[bytes]) -> MetaReply:
        key = msg.get("key")
        if not isinstance(key, str) or not (key in _METADATA_KEYS or key.startswith("inventory:")):
            raise SpecError("key", key, "one of " + ", ".join(_METADATA_KEYS))
        return {"value": self._store.get_meta(key)}

    def _changes(self, peer: Peer, msg: ChangesRequest, blobs: list[bytes]) -> ChangesReply | None:
        """State changes after ``since``; with ``wait``, held until there is one (or timeout)."""
        since, wait = _count_arg(msg, "since"), msg.get("wait") or 0.0
        if isinstance(wait, bool) or not isinstance(wait, int | float) or not 0 <= wait < math.inf:
            raise SpecError("wait", wait, "seconds to wait, 0 or more")
        wait = min(float(wait), MAX_WAIT)
        # the next from the last one
        page = _page(msg, MAX_CHANGE_ROWS)
        rows = self._store.state_changes_since(since, page + 1)
        if rows or wait <= 0:
            return {"changes": [list(r) for r in rows[:page]], "more": len(rows) > page}
        peer.waiting = (since, time.monotonic() + wait)
        return None

    def _answer_watchers(self) -> None:
        watchers = [p for p in self.peers.values() if p.waiting is not None]
        if not watchers:
            return
        now = time.monotonic()
        seq = self._store.last_event_seq()
        for peer in watchers:
            assert peer.waiting is not None
            since, deadline = peer.waiting
            if seq <= since and now < deadline:
                continue
            peer.waiting = None
            page = MAX_CHANGE_ROWS
            rows = self._store.state_changes_since(since, page + 1) if seq > since else []
            changes = [list(r) for r in rows[:page]]
            self.conns.send(peer, {"ok": True, "changes": changes, "more": len(rows) > page})
            self.conns.resume(peer)  # the requests that arrived while it was held
