"""What each request to a pool agent holds, and what its reply holds: one table for both ends.

A request is ``{"op": OP, **fields}`` and its reply ``{"ok": true, **fields}``
(``protocol.py``); this module names the fields of each op, as the clients send
them and as the agent answers. ``OPS`` maps every op to its request and reply
shape; the agent's handlers (``requests.py``) take and return these shapes, and
``Calls.call`` (the typed door ``AgentClient`` inherits) has one signature per
op, so mypy checks a client's fields and its reading of the reply::

    reply = client.call("get", id="k3x9m2qa")  # a JobReply: reply["job"]["state"]
    client.call("get", job="k3x9m2qa")  # mypy: no "job" field in a get request

The shapes are checked by mypy only: a peer can still send anything, so the
agent validates every field it reads and refuses a wrong one with the
package's own error (``SpecError``, ``ProtocolError``), as it always has.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, NotRequired, TypedDict, overload

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's own from Python 3.11

#: A job as ``schema.info_to_json`` writes it (``schema.info_from_json`` reads it back).
JobRow = dict[str, Any]


# -- requests -------------------------------------------------------------------------------


class NoFields(TypedDict):
    """A request that is its op alone (``hello``, ``status``, ``tick``, ...)."""


class _JobFiles(TypedDict):
    files: dict[str, int]


class SubmittedJob(_JobFiles, total=False):
    """One job of a ``submit``: its files, each the index of an attachment."""

    #: what the job's name adds to the common one (a sweep's ``"[2] lr=0.01"``)
    suffix: str | None


class _Submission(TypedDict, total=False):
    #: the Ray cluster the client joined (a ``ray`` backend's jobs only)
    ray: dict[str, Any] | None


class SubmitRequest(_Submission):
    """Queue jobs with the same options; their files travel as the message's attachments.
    Only ``jobs`` is needed; the rest default as the agent reads them."""

    #: ``"function"`` when left out
    kind: NotRequired[str]
    #: ``"job"`` when left out
    default_name: NotRequired[str]
    origin: NotRequired[str]
    #: resource options as JSON values (``link.wire_options``)
    options: NotRequired[dict[str, Any]]
    inline: NotRequired[bool]
    jobs: list[SubmittedJob]
    #: ``"local"`` when left out
    backend: NotRequired[str]


class JobIdRequest(TypedDict):
    """A request about one job (``get``, ``cancel``, ``requeue``)."""

    id: str


class EndedRequest(TypedDict):
    """A supervisor's word that its job ended (or that its success is recorded while its
    process still exits)."""

    id: str
    #: its last word for the job: whether it waits for another job on the pipe the agent
    #: handed it this one through (absent: the job's grant is still held)
    again: NotRequired[bool]


class PriorityRequest(TypedDict):
    id: str
    #: a level's name (``"high"``) or a number
    priority: int | str


class JobsRequest(TypedDict, total=False):
    """A page of jobs: every filter may be left out (or None)."""

    states: list[str] | None
    owner: str | None
    limit: int | None
    offset: int
    ids: list[str] | None
    newest_first: bool
    holding: bool


class FinishedRequest(TypedDict, total=False):
    """Jobs that ended after ``since`` (epoch seconds)."""

    since: float
    owner: str | None
    limit: int | None
    offset: int


class ChangesRequest(TypedDict, total=False):
    """State changes after event ``since``; with ``wait``, held until there is one."""

    since: int
    wait: float
    limit: int


class EventsRequest(TypedDict, total=False):
    """A page of events (of one job, or all) after event ``since``."""

    id: str | None
    since: int
    limit: int


class MetaRequest(TypedDict):
    #: ``inventory``, ``settings``, ``cache`` or ``inventory:NAME``
    key: str


class ProgressRequest(TypedDict):
    id: str
    #: ``{"done", "total", "metrics", "at"}`` as ``dls.progress`` reports it
    progress: dict[str, Any]


class SettingsRequest(TypedDict, total=False):
    """The pool's policy and leases; a field left out or None keeps its value."""

    policy: str | None
    lease_ttl: float | None
    grace: float | None
    policy_params: dict[str, Any] | None
    resize_every: float | None
    resize_cost: float | None
    min_schedule_interval: float | None


class SamplesRequest(TypedDict, total=False):
    """Utilisation history in ``[since, until]`` of ``source``, thinned to ``max_rows``."""

    since: float
    until: float
    source: str | None
    max_rows: int


class _RayAsk(TypedDict, total=False):
    #: this is the client's first ask: start a driver
    start: bool


class RayRequest(_RayAsk):
    """Join the Ray cluster at ``address`` (with cards of ``gpu_mem``): keep a driver on it."""

    address: str | None
    gpu_mem: int | str | None
    init_options: dict[str, Any]


class SchedulesRequest(TypedDict, total=False):
    """List the schedules, or remove the one ``remove`` names."""

    remove: str


# -- replies --------------------------------------------------------------------------------


class Done(TypedDict):
    """A reply that is ``"ok"`` alone (``ping``, ``tick``, ``ended``, ``stop``)."""


class HelloReply(TypedDict):
    """Which pool answers, and who the agent takes the client to be."""

    version: str
    mode: Literal["shared", "user"]
    home: str
    socket: str | None
    pid: int
    #: the agent's code stamp (a client replaces an agent whose code differs)
    code: str
    #: the ledger file the agent serves (``device:inode``; a client of one's own pool
    #: replaces an agent that serves a removed ledger where its folder was made again)
    ledger: str
    uid: int
    user: str
    admin: bool


class RoomReply(TypedDict):
    """What this user's payloads may still take: the bytes their jobs hold that a new
    submission would not free (ended jobs' kept payloads go first), and the limit
    (``max_payload_bytes``; None: no limit)."""

    held: int
    limit: int | None


class SubmitReply(TypedDict):
    ids: list[str]


class JobReply(TypedDict):
    job: JobRow


class _JobsPage(TypedDict):
    jobs: list[JobRow]
    #: more rows follow this page (a page holds at most ``reads.MAX_JOB_ROWS``)
    more: bool


class JobsReply(_JobsPage, total=False):
    #: the ``offset`` that asks for the next page, when there is one (an optional key in a
    #: class of its own: ``NotRequired`` is not seen at run time in a postponed annotation)
    next_offset: int


class CountReply(TypedDict):
    counts: dict[str, int]


class SeqReply(TypedDict):
    seq: int


class StatusReply(TypedDict):
    #: ``Engine.status()`` with a ``"pool"`` entry: mode, socket, agent_pid, you, admin
    status: dict[str, Any]


class ChangesReply(TypedDict):
    #: ``[seq, job id, state]`` each
    changes: list[list[Any]]
    #: more changes follow the last one (a page is ``reads.MAX_CHANGE_ROWS`` at most)
    more: bool


class EventsReply(TypedDict):
    events: list[dict[str, Any]]
    #: more events follow this page
    more: bool


class MetaReply(TypedDict):
    value: Any


class ProgressReply(TypedDict):
    #: False when the job is not running (a late report is dropped)
    recorded: bool


class SettingsReply(TypedDict):
    settings: dict[str, Any] | None


class CacheReply(TypedDict):
    #: ``staging.cache_info``; in a shared pool with the asking user's share
    cache: dict[str, Any]


class MetricsReply(TypedDict):
    #: the Prometheus exposition text
    text: str


class SamplesReply(TypedDict):
    samples: list[dict[str, Any]]


class RayReply(TypedDict):
    #: the cluster's inventory once the agent's driver has joined it, else None
    inventory: dict[str, Any] | None
    alive: bool
    #: the driver this agent started exited without joining
    failed: bool
    log: str


class SchedulesReply(TypedDict, total=False):
    """``schedules`` when listing; ``schedule`` (the one removed) with ``remove``."""

    schedules: list[dict[str, Any]]
    schedule: dict[str, Any]


#: Every op of the protocol: the shape of its request's fields, and of its reply's.
OPS: dict[str, tuple[type, type]] = {
    "hello": (NoFields, HelloReply),
    "ping": (NoFields, Done),
    "submit": (SubmitRequest, SubmitReply),
    "cancel": (JobIdRequest, JobReply),
    "priority": (PriorityRequest, JobReply),
    "requeue": (JobIdRequest, JobReply),
    "get": (JobIdRequest, JobReply),
    "jobs": (JobsRequest, JobsReply),
    "finished": (FinishedRequest, JobsReply),
    "count": (NoFields, CountReply),
    "seq": (NoFields, SeqReply),
    "status": (NoFields, StatusReply),
    "changes": (ChangesRequest, ChangesReply),
    "events": (EventsRequest, EventsReply),
    "meta": (MetaRequest, MetaReply),
    "progress": (ProgressRequest, ProgressReply),
    "ended": (EndedRequest, Done),
    "tick": (NoFields, Done),
    "settings": (SettingsRequest, SettingsReply),
    "cache": (NoFields, CacheReply),
    "metrics": (NoFields, MetricsReply),
    "samples": (SamplesRequest, SamplesReply),
    "ray": (RayRequest, RayReply),
    "schedules": (SchedulesRequest, SchedulesReply),
    "stop": (NoFields, Done),
    "room": (NoFields, RoomReply),
}

Blobs = list[bytes] | tuple[bytes, ...]


class Calls:
    """``call(op, **fields)`` typed per op (``OPS``): the fields its request may hold and
    the reply it returns. A subclass sends the message (``AgentClient._exchange``)."""

    def _exchange(self, op: str, blobs: Blobs, fields: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    @overload
    def call(self, op: Literal["hello"], /) -> HelloReply: ...
    @overload
    def call(self, op: Literal["ping"], /) -> Done: ...
    @overload
    def call(
        self, op: Literal["submit"], blobs: Blobs, /, **fields: Unpack[SubmitRequest]
    ) -> SubmitReply: ...
    @overload
    def call(self, op: Literal["cancel"], /, **fields: Unpack[JobIdRequest]) -> JobReply: ...
    @overload
    def call(self, op: Literal["priority"], /, **fields: Unpack[PriorityRequest]) -> JobReply: ...
    @overload
    def call(self, op: Literal["requeue"], /, **fields: Unpack[JobIdRequest]) -> JobReply: ...
    @overload
    def call(self, op: Literal["get"], /, **fields: Unpack[JobIdRequest]) -> JobReply: ...
    @overload
    def call(self, op: Literal["jobs"], /, **fields: Unpack[JobsRequest]) -> JobsReply: ...
    @overload
    def call(self, op: Literal["finished"], /, **fields: Unpack[FinishedRequest]) -> JobsReply: ...
    @overload
    def call(self, op: Literal["count"], /) -> CountReply: ...
    @overload
    def call(self, op: Literal["seq"], /) -> SeqReply: ...
    @overload
    def call(self, op: Literal["status"], /) -> StatusReply: ...
    @overload
    def call(self, op: Literal["changes"], /, **fields: Unpack[ChangesRequest]) -> ChangesReply: ...
    @overload
    def call(self, op: Literal["events"], /, **fields: Unpack[EventsRequest]) -> EventsReply: ...
    @overload
    def call(self, op: Literal["meta"], /, **fields: Unpack[MetaRequest]) -> MetaReply: ...
    @overload
    def call(
        self, op: Literal["progress"], /, **fields: Unpack[ProgressRequest]
    ) -> ProgressReply: ...
    @overload
    def call(self, op: Literal["ended"], /, **fields: Unpack[EndedRequest]) -> Done: ...
    @overload
    def call(self, op: Literal["tick"], /) -> Done: ...
    @overload
    def call(
        self, op: Literal["settings"], /, **fields: Unpack[SettingsRequest]
    ) -> SettingsReply: ...
    @overload
    def call(self, op: Literal["cache"], /) -> CacheReply: ...
    @overload
    def call(self, op: Literal["metrics"], /) -> MetricsReply: ...
    @overload
    def call(self, op: Literal["samples"], /, **fields: Unpack[SamplesRequest]) -> SamplesReply: ...
    @overload
    def call(self, op: Literal["ray"], /, **fields: Unpack[RayRequest]) -> RayReply: ...
    @overload
    def call(
        self, op: Literal["schedules"], /, **fields: Unpack[SchedulesRequest]
    ) -> SchedulesReply: ...
    @overload
    def call(self, op: Literal["stop"], /) -> Done: ...
    @overload
    def call(self, op: Literal["room"], /) -> RoomReply: ...

    def call(self, op: str, blobs: Blobs = (), /, **fields: Any) -> Any:
        """Send ``op`` with ``fields`` (and ``blobs``, a submission's files); the reply
        (its ``"ok"`` and its fields). A refusal raises the package's own exception."""
        return self._exchange(op, blobs, fields)
