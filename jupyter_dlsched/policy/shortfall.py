"""Words for why a waiting job does not fit: ``"waiting for 2 GPUs"``, the reason a
policy gives for each job it leaves waiting, and that its ``line`` gives for the jobs
it did not look at."""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Protocol

from ..vocab.resources import EPS, Capacity, Request
from ..vocab.units import format_size


class _Asking(Protocol):
    """A waiting job, as far as its shortfall goes."""

    @property
    def request(self) -> Request: ...


def describe_shortfall(request: Request, capacity: Capacity) -> str:
    """Words for why a request does not fit now: ``"waiting for 2 GPUs"``.

    Called for every waiting job of a live tick, so the words are kept per request
    object for the last capacity seen (it is immutable; the live queue shares one
    request object among the jobs of one shape), and otherwise cached per request shape
    and the three numbers they depend on, read once per capacity, not once per job.
    """
    last = _last_free[0]
    if last[0] is not capacity:
        free = (capacity.free_whole_gpus, capacity.cpus_free, capacity.mem_free)
        last = (capacity, free, {})
        _last_free[0] = last  # one tuple, replaced whole: safe for a policy run in threads
    said = last[2]
    # keyed by identity, the request kept with its words so that its id is not reused
    known = said.get(id(request))
    if known is not None and known[0] is request:
        return known[1]
    words = _shortfall(request, *last[1])
    if len(said) < 4096:
        said[id(request)] = (request, words)
    return words


_last_free: list[tuple[Any, tuple[int, float, int], dict[int, tuple[Request, str]]]] = [
    (None, (0, 0.0, 0), {})
]


class Shortfalls:
    """Why each job does not fit ``capacity`` (``describe_shortfall`` of its request): how a
    policy's ``line`` explains the jobs it did not look at. The words depend on the request
    alone, so a caller with thousands of jobs of a few shapes may ask ``per_request``
    once per request instead of calling this once per job.

    >>> from jupyter_dlsched.policy import QueuedJob
    >>> from jupyter_dlsched.vocab.resources import Capacity, Placement, Request
    >>> free = Capacity.empty(n_gpus=1, gpu_mem=2**34, cpus=4, mem=2**34)
    >>> Shortfalls(free.take(Placement(gpus=(0,), gpu_mem=(2**34,))))(
    ...     QueuedJob("a", 1, 0.0, Request(gpus=1)))
    'waiting for 1 GPU'
    """

    __slots__ = ("capacity",)

    def __init__(self, capacity: Capacity) -> None:
        self.capacity = capacity

    def __call__(self, job: _Asking) -> str:
        return describe_shortfall(job.request, self.capacity)

    def per_request(self, request: Request) -> str:
        return describe_shortfall(request, self.capacity)


@lru_cache(maxsize=4096)
def _shortfall(request: Request, free_gpus: int, cpus_free: float, mem_free: int) -> str:
    if request.whole_gpus and free_gpus < request.whole_gpus:
        n = request.whole_gpus
        return f"waiting for {n} GPU{'s' if n > 1 else ''}"
    # CPUs and memory are what placement checks first; a shared-GPU job short of them is
    # not waiting for GPU memory, whatever its GPUs look like
    if request.cpus > cpus_free + EPS:
        return f"waiting for {request.cpus:g} CPU{'s' if request.cpus != 1 else ''}"
    if request.mem > mem_free:
        return f"waiting for {format_size(request.mem)} of memory"
    if request.shared:
        return "waiting for GPU memory" + (
            f" ({format_size(request.gpu_mem)})" if request.gpu_mem else ""
        )
    return "waiting for resources"
