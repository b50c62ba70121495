"""GPU kernelspecs: this Python's IPython kernel, started by the ``dlsched-gpu`` provisioner.

>>> path = install(GpuKernelRequest(gpus=1), user=True)  # doctest: +SKIP
>>> [s["name"] for s in list_specs()]  # doctest: +SKIP
['python3-1gpu']

A spec is what ``python -m ipykernel install`` writes (same argv, logos, language) plus
``metadata.kernel_provisioner``: the provisioner's name and the lease's request, kept as the
user wrote it (``"8GiB"``, ``"30m"``) and validated here, so a bad value fails at install
rather than at the first start of a kernel.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..vocab.errors import SpecError
from ..vocab.spec import MAX_CPUS, MAX_GPUS, MIN_SHARE, parse_priority
from ..vocab.units import parse_duration, parse_size
from .provisioner import PROVISIONER_NAME

_KERNEL_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


@dataclass(frozen=True)
class GpuKernelRequest:
    """What a GPU kernel's lease asks for, and its idle and waiting settings."""

    gpus: float = 1
    gpu_mem: str | None = None
    #: None: the pool's default (its GPUs' share of the cores, at most one: ``default_cpus``)
    cpus: float | None = None
    mem: str | None = None
    priority: str = "normal"
    idle: str = "30m"
    idle_grace: str = "5m"
    wait_limit: str = "10m"

    def check(self) -> None:
        """Raise ``SpecError`` for the first value a lease could not use."""
        gpus_help = (
            f"a number of GPUs from {MIN_SHARE:g} to {MAX_GPUS}: a share below 1, else whole"
        )
        if not MIN_SHARE <= self.gpus <= MAX_GPUS or (self.gpus > 1 and self.gpus % 1):
            raise SpecError("gpus", self.gpus, gpus_help)
        if self.cpus is not None and not MIN_SHARE <= self.cpus <= MAX_CPUS:
            raise SpecError("cpus", self.cpus, f"a number of CPU cores from 1/64 to {MAX_CPUS}")
        for field in ("gpu_mem", "mem"):
            value = getattr(self, field)
            if value is not None:
                parse_size(value, field)
        parse_priority(self.priority)
        for field in ("idle", "idle_grace", "wait_limit"):
            value = getattr(self, field)
            if field == "idle_grace" or value.strip().lower() != "never":
                parse_duration(value, field)

    def config(self) -> dict[str, Any]:
        """The provisioner's ``config`` stanza (sizes and times as given)."""
        data = asdict(self)
        for field in ("gpus", "cpus"):
            if data[field] is not None and float(data[field]).is_integer():
                data[field] = int(data[field])
        return data

    def words(self) -> str:
        """``1 GPU``, ``2 GPUs``, ``0.5 GPU · 8GiB``."""
        gpus = f"{self.gpus:g}"
        text = f"{gpus} GPU" + ("" if self.gpus <= 1 else "s")
        return text + (f" · {self.gpu_mem}" if self.gpu_mem else "")


def default_name(request: GpuKernelRequest) -> str:
    return f"python3-{request.gpus:g}gpu"


def default_display_name(request: GpuKernelRequest) -> str:
    return f"Python {sys.version_info.major} · {request.words()}"


def kernel_json(request: GpuKernelRequest, display_name: str) -> dict[str, Any]:
    """This interpreter's IPython kernelspec with our provisioner and the request."""
    from ipykernel.kernelspec import get_kernel_dict

    spec: dict[str, Any] = get_kernel_dict()
    spec["display_name"] = display_name
    metadata = dict(spec.get("metadata") or {})
    metadata["kernel_provisioner"] = {
        "provisioner_name": PROVISIONER_NAME,
        "config": request.config(),
    }
    spec["metadata"] = metadata
    return spec


def install(
    request: GpuKernelRequest,
    *,
    name: str | None = None,
    display_name: str | None = None,
    user: bool = False,
    prefix: str | None = None,
) -> Path:
    """Install (or replace) a GPU kernelspec; returns its folder."""
    from ipykernel.kernelspec import write_kernel_spec
    from jupyter_client.kernelspec import KernelSpecManager

    request.check()
    name = name or default_name(request)
    if not _KERNEL_NAME.match(name):
        raise SpecError("name", name, "1 to 64 letters, digits, '.', '_' or '-'")
    display = display_name or default_display_name(request)
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_kernel_spec(Path(tmp) / name)
        (Path(folder) / "kernel.json").write_text(
            json.dumps(kernel_json(request, display), indent=1) + "\n"
        )
        destination = KernelSpecManager().install_kernel_spec(
            str(folder), name, user=user, prefix=prefix
        )
    return Path(destination)


def _ours(spec: dict[str, Any]) -> dict[str, Any] | None:
    provisioner = (spec.get("metadata") or {}).get("kernel_provisioner") or {}
    if provisioner.get("provisioner_name") != PROVISIONER_NAME:
        return None
    config = provisioner.get("config")
    return config if isinstance(config, dict) else {}


def list_specs() -> list[dict[str, Any]]:
    """The GPU kernelspecs Jupyter finds: name, display name, request, folder."""
    from jupyter_client.kernelspec import KernelSpecManager

    found = []
    for name, entry in sorted(KernelSpecManager().get_all_specs().items()):
        config = _ours(entry.get("spec") or {})
        if config is not None:
            found.append(
                {
                    "name": name,
                    "display_name": entry["spec"].get("display_name", name),
                    "request": config,
                    "folder": entry.get("resource_dir"),
                }
            )
    return found


def remove(name: str) -> Path:
    """Remove a GPU kernelspec by name (never a kernelspec that is not ours)."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    manager = KernelSpecManager()
    try:
        spec = manager.get_kernel_spec(name)
    except NoSuchKernel:
        raise SpecError(
            "name", name, "the name of an installed GPU kernelspec (`dlsched kernels list`)"
        ) from None
    if _ours(spec.to_dict()) is None:
        raise SpecError(
            "name",
            name,
            "a GPU kernelspec of dlsched (this one is not; `jupyter kernelspec remove` "
            "removes other kernels)",
        )
    return Path(manager.remove_kernel_spec(name))
