"""Which devices a request gets. Pure: ``place(request, capacity) -> Placement | None``.

* whole GPUs are a gang: all or nothing, preferring one topology island
  (NVLink / same PCIe switch) and, among islands, the smallest that fits;
* shared GPUs are packed best-fit by memory (the card with the least room left
  that still fits), never onto a card held whole;
* CPU shares go to the least loaded cores, RAM is a plain budget.
"""

from __future__ import annotations

import math
from collections import defaultdict

from .resources import EPS, Capacity, GpuFree, Placement, Request


def place(request: Request, capacity: Capacity) -> Placement | None:
    """Return a placement for ``request`` on ``capacity``, or ``None`` if it does not fit now.

    >>> cap = Capacity.empty(n_gpus=4, gpu_mem=16 * 2**30, cpus=8, mem=64 * 2**30)
    >>> place(Request(gpus=2, cpus=4), cap).gpus
    (0, 1)
    """
    if request.mem > capacity.mem_free:
        return None
    if request.cpus > capacity.cpus_free + EPS:
        return None
    gpus: tuple[int, ...] = ()
    gpu_mem: tuple[int, ...] = ()
    if request.shared:
        card = _best_fit_shared(request, capacity.gpus)
        if card is None:
            return None
        gpus, gpu_mem = (card.index,), (request.gpu_mem_on(card.mem_total),)
    elif request.whole_gpus:
        cards = _gang(request, capacity.gpus)
        if cards is None:
            return None
        gpus = tuple(c.index for c in cards)
        gpu_mem = tuple(c.mem_free for c in cards)
    cores = _cores(request.cpus, capacity.cpu_load)
    return Placement(
        gpus=gpus,
        gpu_mem=gpu_mem,
        shared=request.shared,
        cpus=cores,
        cpu_share=request.cpus,
        mem=request.mem,
    )


def fits_ever(request: Request, capacity: Capacity) -> str | None:
    """Why ``request`` could never be placed on an idle machine of this shape, or ``None``."""
    from .units import format_size

    n = len(capacity.gpus)
    if request.whole_gpus > n:
        return f"requests {_gpus(request.whole_gpus)}; this pool has {n}"
    if request.gpus and n == 0:
        return "requests a GPU; this pool has none"
    biggest = max((g.mem_total for g in capacity.gpus), default=0)
    if request.gpu_mem is not None and request.gpu_mem > biggest and request.gpus:
        return (
            f"requests {format_size(request.gpu_mem)} of GPU memory; "
            f"the largest GPU here has {format_size(biggest)}"
        )
    if request.whole_gpus and request.gpu_mem is not None:
        big_enough = sum(1 for g in capacity.gpus if g.mem_total >= request.gpu_mem)
        if big_enough < request.whole_gpus:
            return (
                f"requests {request.whole_gpus} GPUs with {format_size(request.gpu_mem)} each; "
                f"this pool has {big_enough} such GPUs"
            )
    if request.cpus > capacity.cpus_total + EPS:
        return f"requests {request.cpus:g} CPUs; this pool has {capacity.cpus_total}"
    if request.mem > capacity.mem_total:
        return (
            f"requests {format_size(request.mem)} of memory; "
            f"this pool has {format_size(capacity.mem_total)}"
        )
    return None


def _best_fit_shared(request: Request, gpus: tuple[GpuFree, ...]) -> GpuFree | None:
    best: GpuFree | None = None
    best_left = math.inf
    for g in gpus:
        need = request.gpu_mem_on(g.mem_total)
        left = g.mem_free - need
        # a card held whole by a job has mem_free == 0, so it never fits here
        if left >= 0 and left < best_left:
            best, best_left = g, left
    return best


def _gang(request: Request, gpus: tuple[GpuFree, ...]) -> tuple[GpuFree, ...] | None:
    k = request.whole_gpus
    if k == 1:  # the common case, answered without listing every free card
        for g in gpus:
            if g.jobs == 0 and (request.gpu_mem is None or g.mem_total >= request.gpu_mem):
                return (g,)
        return None
    free = [
        g
        for g in gpus
        if g.jobs == 0 and (request.gpu_mem is None or g.mem_total >= request.gpu_mem)
    ]
    if len(free) < k:
        return None
    if all(g.group is None for g in free):
        return tuple(free[:k])
    islands: dict[int | None, list[GpuFree]] = defaultdict(list)
    for g in free:
        islands[g.group].append(g)
    fitting = [cards for group, cards in islands.items() if group is not None and len(cards) >= k]
    if fitting:
        smallest = min(fitting, key=lambda cards: (len(cards), cards[0].index))
        return tuple(smallest[:k])
    # no single island is big enough: take the largest islands first to keep hops few
    ordered = sorted(islands.values(), key=lambda cards: (-len(cards), cards[0].index))
    chosen = [g for cards in ordered for g in cards][:k]
    return tuple(sorted(chosen, key=lambda g: g.index))


def _cores(cpus: float, load: tuple[float, ...]) -> tuple[int, ...]:
    if not load or cpus <= 0:
        return ()
    n = min(len(load), max(1, math.ceil(cpus - EPS)))
    by_load = sorted(range(len(load)), key=lambda c: (load[c], c))
    return tuple(sorted(by_load[:n]))


def _gpus(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"
