"""Job requests: validate every field before anything is stored.

Every bad input raises ``SpecError`` naming the field, the value and what is allowed.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import cloudpickle

from .errors import SpecError
from .placement import fits_ever
from .resources import Capacity, Request
from .units import parse_duration, parse_size

PRIORITY_NAMES = {"low": 0, "normal": 50, "high": 100, "urgent": 1000}
PRIORITY_HELP = "an integer or one of low=0, normal=50, high=100, urgent=1000"
KINDS = ("function", "cell", "command")


def parse_priority(value: object) -> int:
    """``parse_priority("high") == 100``; integers pass through."""
    if isinstance(value, bool):
        raise SpecError("priority", value, PRIORITY_HELP)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        key = value.strip().lower()
        if key in PRIORITY_NAMES:
            return PRIORITY_NAMES[key]
        try:
            return int(key)
        except ValueError:
            pass
    raise SpecError("priority", value, PRIORITY_HELP)


@dataclass(frozen=True)
class JobSpec:
    """A validated job request (what to run is stored separately as the payload)."""

    name: str
    kind: str
    request: Request
    priority: int = 50
    deadline: float | None = None
    time_limit: float | None = None
    retries: int = 0
    preemptible: bool = False
    after: tuple[str, ...] = ()
    distributed: bool = False
    origin: str = ""
    env: dict[str, str] = field(default_factory=dict)


def build_spec(
    *,
    capacity: Capacity,
    kind: str = "function",
    name: str | None = None,
    default_name: str = "job",
    gpus: object = None,
    gpu_mem: object = None,
    cpus: object = 1,
    mem: object = None,
    priority: object = "normal",
    deadline: object = None,
    time_limit: object = None,
    retries: object = 0,
    preemptible: object = False,
    after: object = (),
    distributed: object = False,
    origin: str = "",
    env: dict[str, str] | None = None,
    now: float | None = None,
) -> JobSpec:
    """Validate a request against the shape of this pool (``capacity`` of an idle machine)."""
    if kind not in KINDS:
        raise SpecError("kind", kind, "one of " + ", ".join(KINDS))
    request = _request(gpus, gpu_mem, cpus, mem, capacity)
    never = fits_ever(request, capacity)
    if never:
        field_name = "gpus" if "GPU" in never else ("cpus" if "CPU" in never else "mem")
        if "GPU memory" in never or "with" in never:
            field_name = "gpu_mem" if gpu_mem is not None else "gpus"
        value = {"gpus": gpus, "gpu_mem": gpu_mem, "cpus": cpus, "mem": mem}[field_name]
        raise SpecError(field_name, value, f"a request this pool can satisfy ({never})")
    if name is None:
        name = default_name
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        raise SpecError("name", name, "a non-empty string of at most 200 characters")
    if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
        raise SpecError("retries", retries, "a whole number >= 0")
    for flag_name, flag in (("preemptible", preemptible), ("distributed", distributed)):
        if not isinstance(flag, bool):
            raise SpecError(flag_name, flag, "True or False")
    if distributed and request.shared:
        raise SpecError("distributed", distributed, "whole GPUs (gpus >= 1) or a CPU job")
    return JobSpec(
        name=name.strip(),
        kind=kind,
        request=request,
        priority=parse_priority(priority),
        deadline=_deadline(deadline, now if now is not None else time.time()),
        time_limit=_time_limit(time_limit),
        retries=retries,
        preemptible=bool(preemptible),
        after=_after(after),
        distributed=bool(distributed),
        origin=origin,
        env=dict(env or {}),
    )


def _request(gpus: object, gpu_mem: object, cpus: object, mem: object, cap: Capacity) -> Request:
    mem_bytes = 0 if mem is None else parse_size(mem, "mem")
    gpu_mem_bytes = None if gpu_mem is None else parse_size(gpu_mem, "gpu_mem")
    if gpu_mem_bytes is not None and gpu_mem_bytes <= 0:
        raise SpecError("gpu_mem", gpu_mem, "a size above zero")
    cpu_count = _number(cpus, "cpus", "a number of CPU cores > 0 (fractions share a core)")
    if cpu_count <= 0:
        raise SpecError("cpus", cpus, "a number of CPU cores > 0 (fractions share a core)")
    if gpus is None:
        if gpu_mem_bytes is None:
            return Request(0.0, None, cpu_count, mem_bytes)
        biggest = max((g.mem_total for g in cap.gpus), default=0)
        share = min(1.0, gpu_mem_bytes / biggest) if biggest else 0.5
        # a request for a whole card's memory is a whole GPU
        return Request(share if share < 1.0 else 1.0, gpu_mem_bytes, cpu_count, mem_bytes)
    allowed = "a whole number of GPUs >= 0 or a fraction of one GPU in (0, 1)"
    count = _number(gpus, "gpus", allowed)
    if count < 0 or (count > 1 and not float(count).is_integer()):
        raise SpecError("gpus", gpus, allowed)
    if count == 0 and gpu_mem_bytes is not None:
        raise SpecError("gpu_mem", gpu_mem, "no gpu_mem for a CPU-only job (gpus=0)")
    return Request(float(count), gpu_mem_bytes, cpu_count, mem_bytes)


def _number(value: object, name: str, allowed: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise SpecError(name, value, allowed)
    try:
        number = float(value)
    except ValueError:
        raise SpecError(name, value, allowed) from None
    if not math.isfinite(number):
        raise SpecError(name, value, allowed)
    return number


def _time_limit(value: object) -> float | None:
    if value is None:
        return None
    seconds = parse_duration(value, "time_limit")
    if seconds <= 0:
        raise SpecError("time_limit", value, "a duration above zero such as '90s' or '2h'")
    return seconds


def _deadline(value: object, now: float) -> float | None:
    allowed = "a datetime, an ISO date-time string, a duration from now ('2h') or epoch seconds"
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value).timestamp()
        except ValueError:
            pass
        try:
            return now + parse_duration(value, "deadline")
        except SpecError:
            raise SpecError("deadline", value, allowed) from None
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    raise SpecError("deadline", value, allowed)


def _after(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    items: Iterable[Any]
    if isinstance(value, str) or hasattr(value, "id"):
        items = [value]
    elif isinstance(value, Iterable):
        items = value
    else:
        raise SpecError("after", value, "a job id, a JobHandle, or a list of them")
    ids = []
    for item in items:
        job_id = getattr(item, "id", item)
        if not isinstance(job_id, str):
            raise SpecError("after", item, "a job id, a JobHandle, or a list of them")
        ids.append(job_id)
    return tuple(dict.fromkeys(ids))


def pickle_payload(payload: dict[str, Any]) -> bytes:
    """Pickle what a job runs; name the object that cannot travel if pickling fails."""
    try:
        return cloudpickle.dumps(payload)
    except Exception as whole_error:
        for label, obj in _parts(payload):
            try:
                cloudpickle.dumps(obj)
            except Exception as error:
                raise SpecError(
                    label,
                    _short_repr(obj),
                    f"an object that can be pickled ({type(error).__name__}: {error})",
                ) from error
        raise SpecError(
            "payload", "…", f"an object that can be pickled ({whole_error})"
        ) from whole_error


def _parts(payload: dict[str, Any]) -> Iterable[tuple[str, object]]:
    if "fn" in payload:
        yield "fn", payload["fn"]
    for i, arg in enumerate(payload.get("args", ())):
        yield f"args[{i}]", arg
    for key, arg in payload.get("kwargs", {}).items():
        yield f"kwargs[{key!r}]", arg
    for key, arg in payload.get("variables", {}).items():
        yield f"variable {key!r}", arg


class _ShortRepr(str):
    def __repr__(self) -> str:
        return str(self)


def _short_repr(obj: object) -> str:
    try:
        text = repr(obj)
    except Exception:
        text = f"<{type(obj).__name__}>"
    if len(text) > 80:
        text = text[:77] + "..."
    return _ShortRepr(text)
