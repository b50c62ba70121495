"""A plan by rank on whole GPUs in which the holders keep their GPUs until a planned job
takes them.

``RankedPreemption._plan_by_rank`` plans the pool as if every holder (a possible
victim) ranked worse than the first waiting job had let go, and takes each back as
the walk passes it unless a better-ranked job planned over holders took its GPUs.
On whole GPUs (``GangRoom``) a holder's GPUs are apart from everyone else's, and
only such a planned job can take them: a job started on the GPUs free now never
lands there. So returning hundreds of holders and taking nearly all of them back,
one call each, changes nothing but the clock. ``HeldPlan`` leaves them held and
counts them as free; a holder is returned only when a planned job lands on its
GPUs, and it is displaced then. Its answers are those of the plan that returned
them all, which is ``room`` with every holder not yet passed nor displaced let go.
"""

from __future__ import annotations

import bisect
from itertools import accumulate

from ..vocab.resources import Placement, Request
from .base import RunningJob
from .gang_room import GangRoom


class HeldPlan:
    """The plan of ``_plan_by_rank`` on whole GPUs, holders held until displaced.

    ``holders`` are the possible victims best rank first (``((rank, seq), job)``);
    those before ``h`` are already in the plan, the others count as free
    (``whole``) until the walk passes them (``pass_to``: kept) or a job planned
    over them takes one of their GPUs (``take``: displaced).
    """

    __slots__ = ("_gpus", "_ranks", "gone", "h", "holders", "room")

    def __init__(
        self, room: GangRoom, holders: list[tuple[tuple[float, int], RunningJob]], h: int
    ) -> None:
        self.room = room
        self.holders = holders
        self.h = h
        self._ranks = [key[0] for key, _ in holders]
        # whole GPUs held by holders[:i]: the free ones of a stretch in one subtraction
        self._gpus = list(accumulate((len(r.placement.gpus) for _, r in holders), initial=0))
        self.gone: set[int] = set()  # positions of displaced holders not yet passed

    def gpus_before(self, i: int) -> int:
        """Whole GPUs the holders before position ``i`` hold."""
        return self._gpus[i]

    @property
    def whole(self) -> int:
        """Whole GPUs free in the plan, those of the holders not yet passed included."""
        return self.room.whole + self._free_from(self.h)

    def _free_from(self, i: int) -> int:
        """GPUs of ``holders[i:]`` not displaced (a displaced one's are in ``room``)."""
        free = self._gpus[-1] - self._gpus[i]
        for j in self.gone:
            if j >= i:
                free -= len(self.holders[j][1].placement.gpus)
        return free

    def pass_to(self, rank: float, displaced: list[RunningJob]) -> None:
        """The walk reaches a job of ``rank``: holders ranked no worse keep their GPUs
        (already held here) unless displaced, then they join ``displaced``, in order."""
        end = bisect.bisect_right(self._ranks, rank, self.h)
        if end == self.h:
            return
        for j in sorted(j for j in self.gone if j < end):
            displaced.append(self.holders[j][1])
            self.gone.discard(j)
        self.h = end

    def displaced_rest(self) -> list[RunningJob]:
        """The holders the walk never passed that a planned job displaced, in order."""
        return [self.holders[j][1] for j in sorted(self.gone) if j >= self.h]

    def place_sparing(self, request: Request) -> tuple[Placement, list[int]] | None:
        """``_place_sparing`` on this plan: where ``request`` goes, on the GPUs of the
        worst-ranked holders it must displace; and those holders' positions.

        That trial takes the free holders back best rank first while at least
        ``request``'s GPUs stay free, so it lets go of the last ones, whose GPUs
        add up to what ``room`` lacks: here they are found from the back and
        returned in a copy of ``room``. If the request still does not fit there
        (islands of GPUs, memory), the next worse-ranked free holder goes too.
        """
        whole = request.whole_gpus
        room, holders, gone = self.room, self.holders, self.gone
        need = whole - room.whole  # GPUs the released holders must add up to
        if need > self._free_from(self.h):
            return None
        trial = room.copy()
        owner: dict[int, int] = {}  # GPU -> position of the holder returned in the trial
        j = len(holders) - 1
        released = 0
        while j >= self.h and released < need:
            if j not in gone:
                placement = holders[j][1].placement
                trial.give_back(placement)
                owner.update(dict.fromkeys(placement.gpus, j))
                released += len(placement.gpus)
            j -= 1
        while True:
            if trial.whole >= whole:
                spot = trial.place(request)
                if spot is not None:
                    return spot, sorted({owner[i] for i in spot.gpus if i in owner})
            while j >= self.h and j in gone:
                j -= 1
            if j < self.h:
                return None
            placement = holders[j][1].placement
            trial.give_back(placement)
            owner.update(dict.fromkeys(placement.gpus, j))
            j -= 1

    def take(self, placement: Placement, displacing: list[int]) -> None:
        """Grant ``placement``, which lands on the GPUs of the holders at ``displacing``:
        they let go of all their GPUs and are displaced."""
        for j in displacing:
            self.room.give_back(self.holders[j][1].placement)
            self.gone.add(j)
        self.room.take(placement)
