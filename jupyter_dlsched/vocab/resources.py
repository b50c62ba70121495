"""The resource vocabulary shared by spec, placement, policies and the simulator.

Pure data: nothing here does I/O. A ``Request`` is what a job asks for, a
``Capacity`` is what is free right now, a ``Placement`` is what a job was given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

EPS = 1e-9


@dataclass(frozen=True)
class Request:
    """What one job needs.

    ``gpus`` is 0 (CPU only), a fraction in (0, 1) (a share of one GPU, sized by
    ``gpu_mem`` when given, else by the fraction of the card's memory) or a whole
    number of dedicated GPUs. For whole GPUs ``gpu_mem`` is the least memory a
    card must have.

    >>> Request(gpus=0.5).shared, Request(gpus=2).whole_gpus
    (True, 2)
    """

    gpus: float = 0.0
    gpu_mem: int | None = None
    cpus: float = 1.0
    mem: int = 0

    @property
    def shared(self) -> bool:
        return 0.0 < self.gpus < 1.0

    @property
    def whole_gpus(self) -> int:
        return 0 if self.shared else int(self.gpus)

    def gpu_mem_on(self, mem_total: int) -> int:
        """Memory a shared request takes on a card with ``mem_total`` bytes."""
        if self.gpu_mem is not None:
            return self.gpu_mem
        return int(math.ceil(self.gpus * mem_total))

    def describe(self) -> str:
        """Short text such as ``"2 GPU · 8 CPU · 32 GiB"`` (the words UI.md uses)."""
        from .units import format_size

        parts = []
        if self.shared:
            parts.append(
                f"{format_size(self.gpu_mem)} GPU" if self.gpu_mem else f"{self.gpus:g} GPU"
            )
        elif self.gpus:
            parts.append(f"{int(self.gpus)} GPU")
        parts.append(f"{self.cpus:g} CPU")
        if self.mem:
            parts.append(format_size(self.mem))
        return " · ".join(parts)


@dataclass(frozen=True)
class GpuFree:
    """One GPU as the scheduler sees it at one moment."""

    index: int
    mem_total: int
    mem_free: int  # after scheduler grants and processes outside the scheduler
    jobs: int = 0  # scheduler allocations on this card
    group: int | None = None  # topology island (NVLink / PCIe switch); None when unknown

    @property
    def whole_free(self) -> bool:
        return self.jobs == 0


@dataclass(frozen=True)
class Placement:
    """What a job was given: device indices with the memory granted on each, cores, RAM."""

    gpus: tuple[int, ...] = ()
    gpu_mem: tuple[int, ...] = ()
    shared: bool = False
    cpus: tuple[int, ...] = ()
    cpu_share: float = 0.0
    mem: int = 0

    def to_json(self) -> dict:
        return {
            "gpus": list(self.gpus),
            "gpu_mem": list(self.gpu_mem),
            "shared": self.shared,
            "cpus": list(self.cpus),
            "cpu_share": self.cpu_share,
            "mem": self.mem,
        }

    @classmethod
    def from_json(cls, data: dict | None) -> Placement:
        if not data:
            return cls()
        return cls(
            gpus=tuple(data.get("gpus", ())),
            gpu_mem=tuple(data.get("gpu_mem", ())),
            shared=bool(data.get("shared", False)),
            cpus=tuple(data.get("cpus", ())),
            cpu_share=float(data.get("cpu_share", 0.0)),
            mem=int(data.get("mem", 0)),
        )


@dataclass(frozen=True)
class Capacity:
    """What is free: per-GPU memory and holders, per-core load, RAM."""

    gpus: tuple[GpuFree, ...] = ()
    cpu_load: tuple[float, ...] = ()
    mem_free: int = 0
    mem_total: int = 0

    @property
    def cpus_total(self) -> int:
        return len(self.cpu_load)

    @property
    def cpus_free(self) -> float:
        return max(0.0, len(self.cpu_load) - sum(self.cpu_load))

    @property
    def free_whole_gpus(self) -> int:
        return [g.jobs for g in self.gpus].count(0)  # same as whole_free, at C speed

    def take(self, p: Placement) -> Capacity:
        """Capacity left after granting ``p``."""
        return self._apply(p, +1)

    def give_back(self, p: Placement) -> Capacity:
        """Capacity after the job holding ``p`` ends (for what-if questions)."""
        return self._apply(p, -1)

    def _apply(self, p: Placement, sign: int) -> Capacity:
        granted = dict(zip(p.gpus, p.gpu_mem, strict=False))
        n = len(self.gpus)
        if all(i < n and self.gpus[i].index == i for i in granted):
            # GPU i sits at position i (the usual layout): touch only the granted cards,
            # which keeps a grant cheap on pools of hundreds of GPUs (the simulator)
            changed = list(self.gpus)
            for i, mem in granted.items():
                g = changed[i]
                # built directly: ``dataclasses.replace`` costs several times more, and a
                # replay's forecast grants and returns devices hundreds of thousands of times
                changed[i] = GpuFree(
                    g.index, g.mem_total, g.mem_free - sign * mem, g.jobs + sign, g.group
                )
            gpus = tuple(changed)
        else:
            gpus = tuple(
                replace(g, mem_free=g.mem_free - sign * granted[g.index], jobs=g.jobs + sign)
                if g.index in granted
                else g
                for g in self.gpus
            )
        load = list(self.cpu_load)
        if p.cpus:
            per_core = p.cpu_share / len(p.cpus)
            for c in p.cpus:
                if c < len(load):
                    load[c] = max(0.0, load[c] + sign * per_core)
        return Capacity(gpus, tuple(load), self.mem_free - sign * p.mem, self.mem_total)

    @classmethod
    def empty(cls, n_gpus: int, gpu_mem: int, cpus: int, mem: int) -> Capacity:
        """An idle machine: ``Capacity.empty(8, 80 * 2**30, 64, 512 * 2**30)``."""
        return cls(
            tuple(GpuFree(i, gpu_mem, gpu_mem) for i in range(n_gpus)),
            (0.0,) * cpus,
            mem,
            mem,
        )
