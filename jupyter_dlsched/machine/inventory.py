"""What this machine has: CPU cores, memory and GPUs (NVML), live usage included.

No NVIDIA driver means a CPU-only pool with the reason kept, never a crash.
``DLSCHED_SIMULATE_GPUS="4x16GiB"`` (or ``"2x16GiB,1x80GiB"``) adds simulated
GPUs after the real ones; they are always marked ``simulated``. The ledger remembers
them (``meta.inventory["simulate"]``): a pool created with simulated GPUs keeps them
whoever starts its next agent, until ``DLSCHED_SIMULATE_GPUS`` says otherwise
(``none`` or ``0``: no simulated GPUs; an empty value counts as unset).
"""

from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import psutil

from ..vocab.errors import SpecError
from ..vocab.resources import Capacity, GpuFree
from ..vocab.units import format_size, parse_size
from . import nvml

SIMULATE_ENV = "DLSCHED_SIMULATE_GPUS"
_SIM_ITEM = re.compile(r"^\s*(\d+)\s*[xX]\s*(\S+)\s*$")


@dataclass
class GpuProcess:
    """A process holding memory on a GPU; ``job_id`` is set when the scheduler started it.

    ``user`` and ``command`` say whose it is when it is not a job's ("who is on GPU 3
    without asking"); None where the process cannot be seen (another PID namespace).
    """

    pid: int
    used_mem: int
    job_id: str | None = None
    user: str | None = None
    command: str | None = None


@dataclass
class GpuInfo:
    """One GPU: identity, memory, utilisation, processes, topology island."""

    index: int
    uuid: str
    name: str
    mem_total: int
    mem_used: int = 0
    util: float | None = None
    simulated: bool = False
    processes: list[GpuProcess] = field(default_factory=list)
    #: how fractions of it are held to their grants: ``MPS (user)``, ``MPS``, ``cap + watch``
    #: (``machine/mps.py``); empty where nobody asked
    fractions: str = ""
    group: int | None = None
    jobs: list[str] = field(default_factory=list)

    @property
    def reading(self) -> float:
        """Percent for a utilisation line: measured on a real GPU, the memory allocated on a
        simulated one (which views label as allocated)."""
        if self.simulated:
            return 100.0 * min(1.0, self.mem_used / self.mem_total) if self.mem_total else 0.0
        return float(self.util or 0.0)

    @property
    def external_mem(self) -> int:
        """Memory held by processes the scheduler did not start."""
        return sum(p.used_mem for p in self.processes if p.job_id is None)


@dataclass
class PoolInfo:
    """The machine's resources and their live use.

    >>> import jupyter_dlsched as dls
    >>> p = dls.pool()  # doctest: +SKIP
    >>> p.cpus, len(p.gpus)  # doctest: +SKIP
    (16, 4)
    """

    cpus: int
    cpu_percent: float
    mem_total: int
    mem_used: int
    mem_available: int
    gpus: list[GpuInfo] = field(default_factory=list)
    gpu_error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "cpus": {"count": self.cpus, "percent": self.cpu_percent},
            "memory": {
                "total": self.mem_total,
                "used": self.mem_used,
                "available": self.mem_available,
            },
            "gpus": [asdict(g) for g in self.gpus],
            "gpu_error": self.gpu_error,
        }

    def __repr__(self) -> str:
        return self.describe("PoolInfo")

    def __str__(self) -> str:
        return self.describe("machine")

    def describe(self, label: str) -> str:
        """The machine's CPUs and memory on a line that starts with ``label``, then a line
        for each GPU (and for each process on it outside the pool)."""
        lines = [
            f"{label}: {self.cpus} CPUs ({self.cpu_percent:.0f}% busy), "
            f"RAM {format_size(self.mem_used)} / {format_size(self.mem_total)}"
        ]
        for g in self.gpus:
            sim = " [simulated]" if g.simulated else ""
            util = "-" if g.util is None else f"{g.util:.0f}%"
            lines.append(
                f"  GPU {g.index}  {g.name}{sim}  util {util}  "
                f"mem {format_size(g.mem_used)} / {format_size(g.mem_total)}"
                + (f"  jobs {', '.join(g.jobs)}" if g.jobs else "")
                + (f"  fractions: {g.fractions}" if g.fractions else "")
            )
            for p in g.processes:
                if p.job_id is None:
                    who = p.user or "an unknown user"
                    what = f" · {p.command}" if p.command else ""
                    lines.append(
                        f"    outside the pool: {who} · {format_size(p.used_mem)} · pid {p.pid}{what}"
                    )
        if not self.gpus:
            lines.append(f"  no GPUs ({self.gpu_error or 'none found'})")
        return "\n".join(lines)


#: values of DLSCHED_SIMULATE_GPUS that say "no simulated GPUs" (and make the ledger forget them)
NO_SIMULATION = ("0", "none", "no", "off")


def simulation(inventory: dict[str, Any] | None = None) -> str:
    """Which simulated GPUs a probe adds: ``DLSCHED_SIMULATE_GPUS`` when it is set (``none``
    or ``0``: none), else what the pool's stored ``inventory`` remembers, so the pool's
    shape does not depend on who started its agent.

    >>> simulation({"simulate": "4x16GiB", "gpus": []})  # doctest: +SKIP
    '4x16GiB'
    """
    value = os.environ.get(SIMULATE_ENV, "").strip()
    if value:
        return "" if value.lower() in NO_SIMULATION else value
    return remembered_simulation(inventory)


def remembered_simulation(inventory: dict[str, Any] | None) -> str:
    """The simulated GPUs a stored inventory says the pool has, as ``"2x16GiB,1x80GiB"``."""
    if not inventory:
        return ""
    if "simulate" in inventory:
        return str(inventory["simulate"] or "")
    # a ledger from before the setting was kept: its simulated GPUs say what it was
    sizes = [int(g["mem_total"]) for g in inventory.get("gpus", []) if g.get("simulated")]
    groups: list[list[int]] = []
    for size in sizes:
        if groups and groups[-1][0] == size:
            groups[-1][1] += 1
        else:
            groups.append([size, 1])
    return ",".join(f"{n}x{size}" for size, n in groups)


def parse_simulated(value: str) -> list[int]:
    """Memory sizes of simulated GPUs: ``parse_simulated("2x16GiB") == [2**34, 2**34]``."""
    sizes: list[int] = []
    for item in value.split(","):
        if not item.strip():
            continue
        match = _SIM_ITEM.match(item)
        if not match:
            raise SpecError(SIMULATE_ENV, value, 'a list like "4x16GiB" or "2x16GiB,1x80GiB"')
        sizes += [parse_size(match.group(2), SIMULATE_ENV)] * int(match.group(1))
    return sizes


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _real_gpus(usage: bool) -> tuple[list[GpuInfo], str | None]:
    try:
        nv = nvml.module()
    except nvml.NvmlUnavailable as error:
        return [], str(error)
    gpus: list[GpuInfo] = []
    handles = []
    try:
        for i in range(nv.nvmlDeviceGetCount()):
            h = nvml.handle(nv, i)
            handles.append(h)
            memory = nv.nvmlDeviceGetMemoryInfo(h)
            info = GpuInfo(
                index=i,
                uuid=_text(nv.nvmlDeviceGetUUID(h)),
                name=_text(nv.nvmlDeviceGetName(h)),
                mem_total=int(memory.total),
                mem_used=int(memory.used),
            )
            if usage:
                try:
                    info.util = float(nv.nvmlDeviceGetUtilizationRates(h).gpu)
                except nv.NVMLError:
                    info.util = None
                info.processes = _gpu_processes(nv, h)
            gpus.append(info)
    except nv.NVMLError as error:
        return gpus, f"NVML error: {error}"
    _topology_groups(nv, handles, gpus)
    return gpus, None


def _gpu_processes(nv: Any, handle: Any) -> list[GpuProcess]:
    seen = nvml.processes(nv, handle)
    return [GpuProcess(pid, used, *_owner_of(pid)) for pid, used in sorted(seen.items())]


def _owner_of(pid: int) -> tuple[None, str | None, str | None]:
    """(no job yet, the Unix user, the command line) of a process, as far as it can be seen."""
    try:
        process = psutil.Process(pid)
        with process.oneshot():
            user = process.username()
            argv = process.cmdline() or [process.name()]
    except (psutil.Error, KeyError, OSError):
        return None, None, None
    command = " ".join(argv)
    return None, user, command if len(command) <= 200 else command[:199] + "…"


def _topology_groups(nv: Any, handles: list[Any], gpus: list[GpuInfo]) -> None:
    """Islands of GPUs joined by NVLink or sharing a PCIe switch (union-find)."""
    if len(handles) < 2:
        return
    parent = list(range(len(handles)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    close = getattr(nv, "NVML_TOPOLOGY_MULTIPLE", 20)
    known = False
    for a in range(len(handles)):
        for b in range(a + 1, len(handles)):
            try:
                level = nv.nvmlDeviceGetTopologyCommonAncestor(handles[a], handles[b])
            except Exception:
                continue
            known = True
            if level <= close or _nvlinked(nv, handles[a], handles[b]):
                parent[find(a)] = find(b)
    if known:
        for i, g in enumerate(gpus):
            g.group = find(i)


def _nvlinked(nv: Any, a: Any, b: Any) -> bool:
    try:
        status = nv.nvmlDeviceGetP2PStatus(a, b, nv.NVML_P2P_CAPS_INDEX_NVLINK)
    except Exception:  # older drivers and bindings: no NVLink query
        return False
    return bool(status == nv.NVML_P2P_STATUS_OK)


_cache_lock = threading.Lock()
_cache: dict[str, tuple[float, PoolInfo]] = {}


def probe(usage: bool = True, max_age: float = 1.0, simulate: str | None = None) -> PoolInfo:
    """Read the machine now (or from a cache at most ``max_age`` seconds old).

    ``simulate`` names the simulated GPUs to add (``"4x16GiB"``; ``""``: none); by
    default ``simulation()``, this process's environment.
    """
    simulated = (simulation() if simulate is None else simulate).strip()
    key = f"{usage}:{simulated}"
    with _cache_lock:
        hit = _cache.get(key)
        if hit and time.monotonic() - hit[0] <= max_age:
            return hit[1]
    gpus, error = _real_gpus(usage)
    if simulated:
        start = len(gpus)
        for offset, size in enumerate(parse_simulated(simulated)):
            gpus.append(
                GpuInfo(
                    index=start + offset,
                    uuid=f"SIM-{start + offset}",
                    name="Simulated GPU",
                    mem_total=size,
                    util=0.0 if usage else None,
                    simulated=True,
                )
            )
    vm = psutil.virtual_memory()
    info = PoolInfo(
        cpus=len(usable_cores()),
        cpu_percent=psutil.cpu_percent(interval=None) if usage else 0.0,
        mem_total=int(vm.total),
        mem_used=int(vm.total - vm.available),
        mem_available=int(vm.available),
        gpus=gpus,
        gpu_error=error if not gpus else None,
    )
    with _cache_lock:
        _cache[key] = (time.monotonic(), info)
    return info


def usable_cores() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(psutil.cpu_count() or 1))


def inventory_json(info: PoolInfo) -> dict[str, Any]:
    """The static shape of the pool, as stored in the ledger for every participant."""
    return {
        "cpus": info.cpus,
        "mem_total": info.mem_total,
        "gpus": [
            {
                "index": g.index,
                "uuid": g.uuid,
                "name": g.name,
                "mem_total": g.mem_total,
                "simulated": g.simulated,
                "group": g.group,
            }
            for g in info.gpus
        ],
    }


def idle_capacity(inventory: dict[str, Any]) -> Capacity:
    """Capacity of the machine with nothing running (what validation checks against)."""
    return Capacity(
        gpus=tuple(
            GpuFree(g["index"], g["mem_total"], g["mem_total"], 0, g.get("group"))
            for g in inventory["gpus"]
        ),
        cpu_load=(0.0,) * int(inventory["cpus"]),
        mem_free=int(inventory["mem_total"]),
        mem_total=int(inventory["mem_total"]),
    )
