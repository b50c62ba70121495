"""A room of whole GPUs for planning a pool of hundreds by rank, changed in place.

``Room`` (``jupyter_dlsched.policy.base``) copies the pool's GPUs on every grant;
a plan by rank (``jupyter_dlsched.policy.preempting``) grants and returns hundreds
of running jobs' GPUs per decision, so ``GangRoom`` touches only the granted GPUs
and shares the few states each GPU goes through.
"""

from __future__ import annotations

from ..vocab.placement import place
from ..vocab.resources import Capacity, GpuFree, Placement, Request


class GangRoom:
    """A ``Room`` for whole GPUs on a pool of hundreds, changed in place.

    ``Room`` copies the pool's GPUs on every grant; planning a pool of 512 GPUs
    by rank grants and returns hundreds of running jobs' GPUs per decision, so
    here a grant touches only its own GPUs and the ``Capacity`` that placement
    reads is built only when asked. Needs GPU ``i`` at position ``i`` and
    placements without CPU cores or memory (a ``gpu_only`` queue's); same
    answers as ``Room`` otherwise.

    >>> room = GangRoom(Capacity.empty(n_gpus=2, gpu_mem=16 * 2**30, cpus=0, mem=0))
    >>> room.take(room.place(Request(gpus=2, cpus=0)))
    >>> room.whole, room.place(Request(gpus=1, cpus=0))
    (0, None)
    """

    __slots__ = ("_base", "_capacity", "gpus", "whole")
    indexed = True

    def __init__(self, capacity: Capacity) -> None:
        self._base = capacity
        self._capacity: Capacity | None = capacity
        self.gpus = list(capacity.gpus)
        self.whole = capacity.free_whole_gpus

    @property
    def capacity(self) -> Capacity:
        if self._capacity is None:
            base = self._base
            self._capacity = Capacity(
                tuple(self.gpus), base.cpu_load, base.mem_free, base.mem_total
            )
        return self._capacity

    def place(self, request: Request) -> Placement | None:
        if request.whole_gpus > self.whole:
            return None
        return place(request, self.capacity)

    def take(self, placement: Placement) -> None:
        self._apply(placement, +1)

    def copy(self) -> GangRoom:
        other = GangRoom.__new__(GangRoom)
        other._base, other._capacity = self._base, self._capacity
        other.gpus, other.whole = list(self.gpus), self.whole
        return other

    def give_back(self, placement: Placement) -> None:
        self._apply(placement, -1)

    def _apply(self, placement: Placement, sign: int) -> None:
        # the arithmetic of Capacity.take / give_back, on the granted GPUs only
        if placement.shared or placement.cpus or placement.mem:
            raise ValueError("GangRoom holds whole GPUs only; use Room for shares, cores, memory")
        gpus, steps = self.gpus, _GPU_TAKEN if sign > 0 else _GPU_RETURNED
        for i, mem in zip(placement.gpus, placement.gpu_mem, strict=False):
            g = gpus[i]
            step = steps.get(id(g))
            gpus[i] = step[2] if step is not None and step[1] == mem else _step(g, mem, sign)
        self.whole -= sign * len(placement.gpus)
        self._capacity = None


def _step(g: GpuFree, mem: int, sign: int) -> GpuFree:
    """The card ``g`` becomes when ``mem`` of it is granted (``sign`` 1) or returned (-1)."""
    state = (g.index, g.mem_total, g.mem_free - sign * mem, g.jobs + sign, g.group)
    known = _GPU_STATES
    card = known.get(state)
    if card is None:
        if len(known) > 100_000:
            known.clear()
            _GPU_TAKEN.clear()
            _GPU_RETURNED.clear()
        card = known[state] = GpuFree(*state)
    steps = _GPU_TAKEN if sign > 0 else _GPU_RETURNED
    if len(steps) > 100_000:
        steps.clear()
    # the entry holds ``g`` itself, so its id names no other card while it is kept
    steps[id(g)] = (g, mem, card)
    return card


# A plan grants and returns the same few states of each GPU over and over: share the objects.
_GPU_STATES: dict[tuple[int, int, int, int, int | None], GpuFree] = {}
# and the card each shared state becomes when a grant of some memory is taken or given back,
# by the id of the card before: one lookup instead of building and hashing its state
_GPU_TAKEN: dict[int, tuple[GpuFree, int, GpuFree]] = {}
_GPU_RETURNED: dict[int, tuple[GpuFree, int, GpuFree]] = {}
