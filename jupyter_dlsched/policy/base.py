"""The policy interface: ``(queued, running, capacity, now) -> Decisions``.

A policy is a pure function of plain data: no I/O, no clock, no randomness.
The live scheduler and the simulator call the very same objects.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..vocab.placement import place
from ..vocab.resources import Capacity, GpuFree, Placement, Request
from .gang_room import GangRoom


@dataclass(frozen=True)
class QueuedJob:
    """A job waiting to start (state ``queued`` or ``preempted``) whose dependencies are met."""

    id: str
    seq: int  # submit order
    submitted: float
    request: Request
    priority: int = 50
    owner: str = ""
    deadline: float | None = None
    time_limit: float | None = None  # also the duration estimate for backfill and sjf
    preemptible: bool = False
    attained: float = 0.0  # GPU-seconds of service received so far (las, gittins)
    preemptions: int = 0
    # True run time still needed, in seconds. Only the simulator knows it (the
    # oracle ``srtf`` policy reads it); the live scheduler leaves it ``None``.
    remaining: float | None = None
    name: str = ""  # the job's name: learning policies group finished jobs by owner and name
    # An elastic job asks for ``request.gpus`` (its minimum) up to ``max_gpus`` whole GPUs;
    # ``None``: a rigid job (see ``jupyter_dlsched.policy.elastic``)
    max_gpus: int | None = None
    # An elastic job stopped for a resize: start it again at once on these GPUs if free
    resume_on: Placement | None = None
    # An elastic job that asked for ``request.gpus`` and may also start on as few as these
    # (the simulator's, whose trace says what each job asked for); ``None``: ``request.gpus``
    # is its minimum
    min_gpus: int | None = None

    @property
    def gpu_count(self) -> float:
        return self.request.gpus


@dataclass(frozen=True)
class RunningJob:
    """A job holding resources now."""

    id: str
    seq: int
    submitted: float
    started: float
    request: Request
    placement: Placement
    priority: int = 50
    owner: str = ""
    time_limit: float | None = None
    preemptible: bool = False
    attained: float = 0.0  # GPU-seconds before this run started
    # True run time still needed when this run started (simulator only, else None).
    remaining: float | None = None
    # Already asked to stop (preempted, inside its grace period): not a victim
    # again, and its resources count as about to be free.
    stopping: bool = False
    name: str = ""
    # An elastic job's range of whole GPUs (``request.gpus`` is what it holds now);
    # ``None``: a rigid job
    min_gpus: int | None = None
    max_gpus: int | None = None
    #: when it should end by (a tie-break of ``priority``'s order, as while it waited)
    deadline: float | None = None

    @property
    def expected_end(self) -> float | None:
        return None if self.time_limit is None else self.started + self.time_limit

    def attained_at(self, now: float) -> float:
        """GPU-seconds of service received up to ``now``, this run included."""
        return self.attained + self.request.gpus * max(0.0, now - self.started)

    def remaining_at(self, now: float) -> float | None:
        """True run time still needed at ``now`` (``None`` outside the simulator)."""
        if self.remaining is None:
            return None
        return max(0.0, self.remaining - max(0.0, now - self.started))


@dataclass(frozen=True)
class FinishedJob:
    """A job that ran to its end: what a learning policy may know about the past.

    ``size`` is the GPU-service it used in all (GPUs × seconds over all its
    runs). The live scheduler builds these from the ledger's finished jobs, the
    simulator from jobs that finished before the moment of the decision; no
    policy ever sees the size of a job that has not finished.

    >>> FinishedJob(owner="ana", name="resnet", size=7200.0, finished=10.0).key
    ('ana', 'resnet')
    """

    owner: str
    name: str
    size: float
    finished: float = 0.0
    gpus: float = 0.0  # GPUs it held; 0: not known (then size counts as one GPU's seconds)

    @property
    def duration(self) -> float:
        """Seconds it ran (its size over its GPUs; the size itself when those are unknown)."""
        return self.size / self.gpus if self.gpus > 0 else self.size

    @property
    def key(self) -> tuple[str, str]:
        return (self.owner, self.name)


@dataclass(frozen=True)
class Start:
    """Start ``job_id`` on ``placement``."""

    job_id: str
    placement: Placement


@dataclass(frozen=True)
class Preempt:
    """Stop ``job_id`` (SIGTERM, grace, requeue as ``preempted``)."""

    job_id: str
    reason: str


@dataclass(frozen=True)
class Resize:
    """Restart the elastic job ``job_id`` at once on ``placement`` (more or fewer GPUs).

    A resize is a checkpoint and restart: the job stops, keeps its progress, and
    starts again on the new GPUs, paying its restart cost.
    """

    job_id: str
    placement: Placement
    reason: str = ""


@dataclass
class Decisions:
    """What a policy decided in one tick.

    ``waiting`` says, for each job left in the queue, why it waits (the one
    question every queue user asks); ``order`` is the queue order (position 1
    starts next).
    """

    starts: list[Start] = field(default_factory=list)
    preempts: list[Preempt] = field(default_factory=list)
    waiting: dict[str, str] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    # Ask again at this time even if nothing else happens (a running job
    # crosses a ``las`` threshold, say); ``None``: only when something changes.
    wake_at: float | None = None
    # The policy stopped looking because nothing left in the queue could start
    # (see ``PresortedQueue.shapes``): jobs it did not look at change nothing.
    settled: bool = False
    # Elastic jobs to restart on other GPUs (``jupyter_dlsched.policy.elastic``)
    resizes: list[Resize] = field(default_factory=list)
    # Every waiting job's place in line and reason were worked out with this decision (a
    # decision over the whole queue, or one on its head with the rest read from the lanes)
    placed: bool = False


class Policy(Protocol):
    """Anything with a ``name`` that maps a snapshot to decisions.

    Optional attributes callers look for: ``preempt_grace`` (seconds a
    preempted job gets between SIGTERM and SIGKILL), ``queue_key`` (a
    function of one queued job that orders the queue and never changes while
    the job waits, unless ``model_version`` changes; see ``PresortedQueue``),
    ``learn(finished)`` (a policy that learns job sizes: the caller passes jobs
    that have finished, each once; ``model_version`` counts how often what it
    learnt changed its ranking), ``oracle`` (True when it reads the true
    remaining run time, which only the simulator has), and the three of a
    policy whose decisions a caller may take on the head of a deep queue
    (``lane_layout()``, ``lane(job)``, ``head(lanes, now, k)``; see
    ``jupyter_dlsched.engine.queue_index.QueueIndex``).
    """

    name: str

    def __call__(
        self,
        queued: Sequence[QueuedJob],
        running: Sequence[RunningJob],
        capacity: Capacity,
        now: float,
    ) -> Decisions: ...


class PolicyGate:
    """A policy wrapped for one decision (staging, per-user limits): it answers to the
    wrapped policy's name and attributes, and narrows what the policy is offered."""

    def __init__(self, policy: Policy) -> None:
        self._policy = policy
        self.name = getattr(policy, "name", "policy")

    def __getattr__(self, name: str) -> Any:
        if name == "_policy":  # not set yet (a copy being made): no recursion
            raise AttributeError(name)
        return getattr(self._policy, name)

    def passes_through(
        self,
        decisions: Decisions,
        queued: Sequence[QueuedJob],
        running: Sequence[RunningJob],
    ) -> bool:
        """Whether ``decisions`` (this gate's, on ``queued``: the head of a deep queue) are
        the wrapped policy's own, and the gate would have held no job of the whole queue back: then
        places in line may be read from the policy's lanes (``QueueIndex``). A gate that
        cannot tell says no, and places come from a decision over the whole queue."""
        return False


def passes_through(
    policy: Policy,
    decisions: Decisions,
    queued: Sequence[QueuedJob],
    running: Sequence[RunningJob],
) -> bool:
    """``PolicyGate.passes_through`` for any policy: a bare policy decides alone."""
    check = getattr(type(policy), "passes_through", None)
    return check is None or bool(check(policy, decisions, queued, running))


def submit_order(job: QueuedJob) -> int:
    """The queue key of first-in-first-out order."""
    return job.seq


class PresortedQueue(list[QueuedJob]):
    """Queued jobs already sorted by ``key``, from a caller that keeps its queue sorted.

    The simulator passes one of these so that a policy whose ``queue_key`` is
    ``key`` can skip sorting a queue of thousands on every event. With
    ``gpu_only`` every job asks for whole GPUs and nothing else, so a policy
    may stop looking as soon as no GPU is free; ``waiting`` and ``order`` then
    cover only the jobs it looked at. ``uniform_priority`` says every job has
    the same priority and no deadline. ``sizes``, when kept, counts the queued
    jobs by whole GPUs asked, so a policy can tell that nothing left fits.

    The live agent passes one of these holding only the head of a deep queue
    (``QueueIndex``): ``in_order`` says the jobs are already in the policy's
    own order at this decision's moment, and ``shapes`` holds the distinct
    requests of every job of the queue, these and those behind. A policy then
    stops as soon as none of ``shapes`` fits what is left, and says so with
    ``Decisions.settled``; if it runs out of jobs without settling, the caller
    asks again with the whole queue. ``waiting`` and ``order`` then cover only
    the jobs it looked at. ``cut`` names the lanes of a head that leaves jobs
    out in the middle of the policy's order (``fair``: the owners with more
    jobs behind), which the policy must not run out of and still settle.

    >>> q = PresortedQueue([], key=submit_order, gpu_only=True)
    >>> q.key is submit_order, len(q)
    (True, 0)
    """

    def __init__(
        self,
        jobs: Iterable[QueuedJob] = (),
        key: Callable[[QueuedJob], Any] = submit_order,
        gpu_only: bool = False,
        uniform_priority: bool = False,
        sizes: dict[int, int] | None = None,
        shapes: frozenset[Request] | None = None,
        in_order: bool = False,
        cut: frozenset[Any] = frozenset(),
    ) -> None:
        super().__init__(jobs)
        self.key = key
        self.gpu_only = gpu_only
        self.uniform_priority = uniform_priority
        self.sizes = sizes
        self.shapes = shapes
        self.in_order = in_order
        self.cut = cut

    def narrowed(self, jobs: Iterable[QueuedJob]) -> PresortedQueue:
        """The same queue with only ``jobs`` (a subsequence of it, in its order) offered."""
        return PresortedQueue(
            jobs,
            self.key,
            self.gpu_only,
            self.uniform_priority,
            self.sizes,
            self.shapes,
            self.in_order,
            self.cut,
        )


def narrowed(queued: Sequence[QueuedJob], jobs: list[QueuedJob]) -> Sequence[QueuedJob]:
    """``jobs`` (some of ``queued``, in its order), keeping what a ``PresortedQueue`` says."""
    return queued.narrowed(jobs) if isinstance(queued, PresortedQueue) else jobs


def shapes_of(queued: Sequence[QueuedJob]) -> frozenset[Request] | None:
    """The requests of the whole queue when ``queued`` is only its head, else ``None``."""
    return queued.shapes if isinstance(queued, PresortedQueue) else None


def nothing_fits(room: Room | GangRoom, shapes: frozenset[Request]) -> bool:
    """Whether none of ``shapes`` can be placed in ``room`` (so, room only shrinking while a
    policy decides, no job of those shapes can start in this decision any more).

    >>> room = Room(Capacity.empty(n_gpus=1, gpu_mem=16 * 2**30, cpus=4, mem=2**34))
    >>> nothing_fits(room, frozenset({Request(gpus=2)})), nothing_fits(room, frozenset({Request(gpus=1)}))
    (True, False)
    """
    return all(room.place(shape) is None for shape in shapes)


class RunningSet(list[RunningJob]):
    """Running jobs with their ``ranks``, an index the caller keeps as jobs start and stop.

    The simulator passes one of these to a policy that offers ``running_ranks()``
    (see ``jupyter_dlsched.policy.ranks``), so that a pool of hundreds of running
    jobs is not ranked afresh on every event.
    """

    def __init__(self, jobs: Iterable[RunningJob] = (), ranks: Any = None) -> None:
        super().__init__(jobs)
        self.ranks = ranks


def smallest_size(queued: Sequence[QueuedJob]) -> int:
    """The fewest whole GPUs any job of a ``gpu_only`` queue asks for (1 when unknown)."""
    sizes = getattr(queued, "sizes", None)
    return min((n for n, count in sizes.items() if count > 0), default=1) if sizes else 1


def presorted(queued: Sequence[QueuedJob], key: Callable[[QueuedJob], Any]) -> bool:
    """Whether ``queued`` is a ``PresortedQueue`` already in ``key`` order."""
    return isinstance(queued, PresortedQueue) and queued.key == key


def gpu_only(queued: Sequence[QueuedJob]) -> bool:
    return isinstance(queued, PresortedQueue) and queued.gpu_only


#: The capacity the last ``Room`` was made for, and the placements found on it.
_last_tried: tuple[Capacity | None, dict[Request, Placement | None]] = (None, {})


class Room:
    """Free capacity during one policy call, with a cheap "cannot fit" test.

    Counting whole free GPUs once lets a policy reject a request for more
    GPUs than are free without a full placement search, which is what keeps a
    queue of thousands cheap to scan.

    >>> room = Room(Capacity.empty(n_gpus=2, gpu_mem=16 * 2**30, cpus=4, mem=2**34))
    >>> room.take(room.place(Request(gpus=2, cpus=1)))
    >>> room.whole, room.place(Request(gpus=1))
    (0, None)
    """

    __slots__ = ("capacity", "tried", "whole")

    def __init__(self, capacity: Capacity) -> None:
        global _last_tried
        self.capacity = capacity
        self.whole = capacity.free_whole_gpus
        # placements found for this capacity, by request: a scan asks again for every job of
        # the same shape, and a placement search is the costly part of a decision. Shared
        # with the last Room made for the very same capacity (a placement depends on nothing
        # else): a forecast asks whether anything fits, then the policy asks of that capacity
        last, tried = _last_tried
        if last is not capacity:
            tried = {}
            _last_tried = (capacity, tried)
        self.tried: dict[Request, Placement | None] = tried

    def place(self, request: Request) -> Placement | None:
        if request.whole_gpus > self.whole:
            return None
        if request in self.tried:
            return self.tried[request]
        placement = self.tried[request] = place(request, self.capacity)
        return placement

    def take(self, placement: Placement) -> None:
        self.tried = {}  # a new capacity; the old one's placements may be shared
        self.capacity = self.capacity.take(placement)
        if placement.shared:
            self.whole = self.capacity.free_whole_gpus
        else:
            self.whole -= len(placement.gpus)

    def give_back(self, placement: Placement) -> None:
        self.tried = {}  # a new capacity; the old one's placements may be shared
        self.capacity = self.capacity.give_back(placement)
        if placement.shared:
            self.whole = self.capacity.free_whole_gpus
        else:
            self.whole += len(placement.gpus)

    def copy(self) -> Room:
        other = Room.__new__(Room)
        other.capacity, other.whole, other.tried = self.capacity, self.whole, dict(self.tried)
        return other

    @property
    def gpus(self) -> Sequence[GpuFree]:
        return self.capacity.gpus

    @property
    def indexed(self) -> bool:
        """Whether GPU ``i`` sits at position ``i`` (then a GPU is found without a search)."""
        return all(g.index == i for i, g in enumerate(self.capacity.gpus))
