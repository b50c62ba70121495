"""The simulated pool's GPUs during a replay: which are free, which hold a whole job, and
how much of each shared GPU is left.

Shares of a GPU (``TraceJob(gpus=0.5)``) are placed by the live scheduler's own
placement code: each simulated GPU has 1000 units of memory and a share takes its
fraction of them, packed best-fit next to other shares, never on a GPU held whole.
The replay checks every placement a policy makes against this state, and gives the
policy the state back as the ``Capacity`` it decides on.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..vocab.resources import Capacity, GpuFree, Placement, Request
from .results import SimulationError

# the replay keeps a record per GPU; past this a pool is a typo that would exhaust memory
MAX_GPUS = 100_000
# memory units of one simulated GPU: a share of a GPU takes its fraction of them
GPU_UNITS = 1000


@dataclass(frozen=True)
class _PoolCapacity(Capacity):
    """A ``Capacity`` that already knows how many GPUs are free (the replay counts as it goes).

    The count holds only for the ``gpus`` tuple it was made with: a copy with
    other GPUs (``dataclasses.replace``) counts afresh.
    """

    counted: tuple[GpuFree, ...] = ()
    free: int = 0

    @property
    def free_whole_gpus(self) -> int:
        if self.gpus is self.counted:
            return self.free
        return super().free_whole_gpus


class SimGpus:
    """``gpus`` simulated GPUs split evenly over ``nodes``, all free at first.

    ``busy`` counts GPUs in use with shares as fractions (the utilisation timeline);
    ``occupied`` counts GPUs with at least one job (what is not free to a whole job).
    """

    def __init__(self, gpus: int, nodes: int) -> None:
        per_node = gpus // nodes
        group = (lambda i: i // per_node) if nodes > 1 else (lambda i: None)
        self.n = gpus
        # one record per GPU for each of its two whole states, shared by every use of it
        self.free_gpu = [GpuFree(i, GPU_UNITS, GPU_UNITS, 0, group(i)) for i in range(gpus)]
        self.busy_gpu = [GpuFree(i, GPU_UNITS, 0, 1, group(i)) for i in range(gpus)]
        self.state = list(self.free_gpu)
        self.busy = 0.0
        self.occupied = 0

    def capacity(self) -> Capacity:
        """The GPUs as a policy sees them now, with the free count already made."""
        gpus = tuple(self.state)
        return _PoolCapacity(gpus, (), 0, 0, gpus, self.n - self.occupied)

    def occupy(self, policy: str, job_id: str, request: Request, placement: Placement) -> None:
        """Mark ``placement``'s GPUs as used, refusing a placement onto GPUs that are not free
        (``policy`` names who placed it, in the error)."""
        gpus, state = placement.gpus, self.state
        if request.shared:
            g = gpus[0] if len(gpus) == 1 else -1
            need = request.gpu_mem_on(GPU_UNITS)
            if g < 0 or g >= len(state) or state[g].mem_free < need:
                raise SimulationError(
                    f"{policy} placed {job_id} ({request.gpus:g} of a GPU) on GPUs "
                    f"{list(gpus)}, which is not one GPU with that much room"
                )
            card = state[g]
            if not card.jobs:
                self.occupied += 1
            state[g] = replace(card, mem_free=card.mem_free - need, jobs=card.jobs + 1)
            self.busy += request.gpus
        else:
            n = request.whole_gpus
            if len(gpus) != n or any(g >= len(state) or state[g].jobs for g in gpus):
                raise SimulationError(
                    f"{policy} placed {job_id} ({n} GPUs) "
                    f"on GPUs {list(gpus)}, which are not that many free GPUs"
                )
            for g in gpus:
                state[g] = self.busy_gpu[g]
            self.occupied += n
            self.busy += n

    def release(self, request: Request, placement: Placement) -> float:
        """Free ``placement``'s GPUs; the GPUs (or share of one) it held."""
        state = self.state
        if request.shared:
            g = placement.gpus[0]
            card = state[g]
            jobs = card.jobs - 1
            if jobs:
                need = request.gpu_mem_on(GPU_UNITS)
                state[g] = replace(card, mem_free=card.mem_free + need, jobs=jobs)
            else:
                state[g] = self.free_gpu[g]
                self.occupied -= 1
            self.busy -= request.gpus
            return request.gpus
        for g in placement.gpus:
            state[g] = self.free_gpu[g]
        n = len(placement.gpus)
        self.occupied -= n
        self.busy -= n
        return float(n)
