"""Job requests: validate every field before anything is stored.

Every bad input raises ``SpecError`` naming the field, the value and what is allowed.
"""

from __future__ import annotations

import math
import os
import re
import time
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import cloudpickle

from .errors import DlschedError, SpecError
from .every import parse_every
from .placement import fits_ever
from .resources import Capacity, Request
from .tracebacks import dumps as dumps_with_sources
from .units import parse_duration, parse_size
from .when import parse_begin

PRIORITY_NAMES = {"low": 0, "normal": 50, "high": 100, "urgent": 1000}
#: Priorities, retries, shares and times are bounded so that every accepted request means
#: something and fits the ledger's 64-bit integers; each bound is stated in its error.
MAX_PRIORITY = 10**9
PRIORITY_HELP = (
    f"an integer from {-MAX_PRIORITY:,} to {MAX_PRIORITY:,} "
    "or one of low=0, normal=50, high=100, urgent=1000"
)
MAX_RETRIES = 100
MAX_GPUS = 4096
MAX_CPUS = 65536
#: The smallest share of a GPU (``gpus``) or of a core (``cpus``) one job may ask for.
MIN_SHARE = 1 / 64
#: The cores a job gets that names none: one, but a GPU job no more than its GPUs' share of
#: the pool's cores (``default_cpus``).
DEFAULT_CPUS = 1.0
MIN_GPU_MEM = 64 * 2**20
#: The smallest memory limit (``mem``): what a process needs to start, measured as peak RSS
#: (``true`` 1.6 MiB, ``python -c pass`` 9 to 13 MiB); below it a job could never run, and a
#: short one would slip past the supervisor's check and "succeed" under a limit it broke.
MIN_MEM = 16 * 2**20
MAX_TIME_LIMIT = 365 * 86400.0
#: A deadline more than this far from now (either way) is a mistake, not a plan.
DEADLINE_RANGE = 10 * 365 * 86400.0
MAX_NAME = 200
#: Unicode's bidirectional controls (embeddings, overrides, isolates, marks): in a name they
#: make a queue line read other than it is ("\u202e" reverses what follows it).
BIDI_CONTROLS = frozenset(
    [chr(c) for c in range(0x202A, 0x202F)]
    + [chr(c) for c in range(0x2066, 0x206A)]
    + ["\u200e", "\u200f", "\u061c"]
)
#: ``kernel``: the GPU lease of a notebook kernel (``jupyter_dlsched.kernels``);
#: ``notebook``: a whole notebook run with nbclient (``jupyter_dlsched.nbjobs``)
KINDS = ("function", "cell", "command", "kernel", "notebook")
#: What a job id looks like (the ledger's ids are 8 letters and digits; 32 leaves room).
_JOB_ID = re.compile(r"^[A-Za-z0-9]{1,32}$")
#: An input's name becomes ``DLSCHED_DATA_<NAME>`` in the job's environment.
_INPUT_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
MAX_INPUTS = 32
MAX_SOURCE = 4096
STAGE_IN_HELP = (
    "a dict of input names (letters, digits, _) to a local path or a URL fsspec can open, "
    "e.g. {'train': '/mnt/share/imagenet/train'}"
)


def parse_priority(value: object) -> int:
    """``parse_priority("high") == 100``; integers pass through."""
    if isinstance(value, bool):
        raise SpecError("priority", value, PRIORITY_HELP)
    number: int | None = None
    if isinstance(value, int):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, str):
        key = value.strip().lower()
        if key in PRIORITY_NAMES:
            return PRIORITY_NAMES[key]
        if len(key) <= 20:  # int() of a long digit string is slow, and out of range anyway
            try:
                number = int(key)
            except ValueError:
                pass
    if number is None or not -MAX_PRIORITY <= number <= MAX_PRIORITY:
        raise SpecError("priority", value, PRIORITY_HELP)
    return number


def check_text(value: object, field: str, *, max_len: int = MAX_NAME) -> str:
    """A name or label the ledger and every view can show: printable, UTF-8, bounded.

    >>> check_text("resnet-lr3", "name")
    'resnet-lr3'
    """
    allowed = (
        f"a non-empty string of at most {max_len} characters "
        "without control characters (newlines, NUL, ...)"
    )
    if not isinstance(value, str) or not value.strip() or len(value) > max_len:
        raise SpecError(field, value, allowed)
    if any(unicodedata.category(c) in ("Cc", "Cs") for c in value):
        raise SpecError(field, value, allowed)
    bidi = sorted({f"U+{ord(c):04X}" for c in value if c in BIDI_CONTROLS})
    if bidi:
        raise SpecError(
            field,
            value,
            f"text without bidirectional controls ({', '.join(bidi)} found: they make the "
            "text display in another order than it is written)",
        )
    return value.strip()


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
    #: inputs staged into the node-local cache before the job starts: name -> source
    stage_in: dict[str, str] = field(default_factory=dict)
    #: an elastic job's most GPUs (``request.gpus`` is its minimum); None for a rigid job
    max_gpus: int | None = None
    #: the size an elastic job waits in line at (``"1:2:4"``), when above its minimum
    asked_gpus: int | None = None
    #: epoch seconds before which the job does not start (``--begin``), else None
    begin: float | None = None
    #: a schedule that submits this job again on each of its ticks (``--every``), else None
    every: str | None = None


def build_spec(
    *,
    capacity: Capacity,
    kind: str = "function",
    name: str | None = None,
    default_name: str = "job",
    gpus: object = None,
    gpu_mem: object = None,
    cpus: object = None,
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
    stage_in: object = None,
    begin: object = None,
    every: object = None,
    now: float | None = None,
) -> JobSpec:
    """Validate a request against the shape of this pool (``capacity`` of an idle machine)."""
    if kind not in KINDS:
        raise SpecError("kind", kind, "one of " + ", ".join(KINDS))
    span = elastic_range(gpus)
    if span is not None and preemptible is not True:
        raise SpecError(
            "gpus",
            gpus,
            "an elastic range only for a job that resumes from a checkpoint: it is resized "
            "by stopping and starting it again, so declare preemptible=True (--preemptible) "
            "and save and restore with dlt.Checkpoint (see docs/elastic.md), or ask for a "
            "fixed number of GPUs",
        )
    span_text = gpus
    if span is not None:
        gpus = span[0]
    request = _request(gpus, gpu_mem, cpus, mem, capacity)
    never = fits_ever(request, capacity)
    if never:
        field_name = "gpus" if "GPU" in never else ("cpus" if "CPU" in never else "mem")
        if "GPU memory" in never or "with" in never:
            field_name = "gpu_mem" if gpu_mem is not None else "gpus"
        value = {"gpus": gpus, "gpu_mem": gpu_mem, "cpus": cpus, "mem": mem}[field_name]
        raise SpecError(field_name, value, f"a request this pool can satisfy ({never})")
    if span is not None and span[1] > span[0]:
        # it waits in line at the asked size: a size that never fits would wait for nothing
        never = fits_ever(replace(request, gpus=float(span[1])), capacity)
        if never:
            raise SpecError("gpus", span_text, f"an asked size this pool can satisfy ({never})")
    name = check_text(default_name if name is None else name, "name")
    if not isinstance(retries, int) or isinstance(retries, bool) or not 0 <= retries <= MAX_RETRIES:
        raise SpecError("retries", retries, f"a whole number from 0 to {MAX_RETRIES}")
    for flag_name, flag in (("preemptible", preemptible), ("distributed", distributed)):
        if not isinstance(flag, bool):
            raise SpecError(flag_name, flag, "True or False")
    if distributed and request.shared:
        raise SpecError("distributed", distributed, "whole GPUs (gpus >= 1) or a CPU job")
    return JobSpec(
        name=name,
        kind=kind,
        request=request,
        priority=parse_priority(priority),
        deadline=_deadline(deadline, now if now is not None else time.time()),
        time_limit=_time_limit(time_limit),
        retries=retries,
        preemptible=bool(preemptible),
        after=_after(after),
        distributed=bool(distributed),
        origin=_printable(origin),
        env=_env(env),
        stage_in=parse_stage_in(stage_in),
        max_gpus=None if span is None else span[2],
        asked_gpus=None if span is None or span[1] == span[0] else span[1],
        begin=_first_begin(begin, every, now),
        every=None if every is None else parse_every(every).text,
    )


ELASTIC_WORDS = (
    "a range of whole GPUs MIN:MAX with 1 <= MIN <= MAX, such as '1:4' or (1, 4), or "
    "MIN:ASKED:MAX with the size it waits in line at, such as '1:2:4'"
)


def elastic_range(gpus: object) -> tuple[int, int, int] | None:
    """``(min, asked, max)`` of an elastic request, ``None`` for a count.

    ``"1:4"`` or ``(1, 4)``: from 1 to 4 GPUs, waiting in line as a 1-GPU job;
    ``"1:2:4"`` or ``(1, 2, 4)``: the same range, waiting in line as the 2-GPU job
    it would be rigid, and starting narrower only when its turn comes
    (``docs/elastic.md``).

    >>> elastic_range("1:4"), elastic_range((2, 8)), elastic_range("1:2:4"), elastic_range(2)
    ((1, 1, 4), (2, 2, 8), (1, 2, 4), None)
    """
    if isinstance(gpus, str) and ":" in gpus:
        parts: Sequence[object] = gpus.split(":")
    elif isinstance(gpus, tuple | list):
        parts = gpus
    else:
        return None
    if len(parts) not in (2, 3):
        raise SpecError("gpus", gpus, ELASTIC_WORDS)
    bounds = []
    for part in parts:
        if isinstance(part, bool):
            raise SpecError("gpus", gpus, ELASTIC_WORDS)
        try:
            number = float(part.strip() if isinstance(part, str) else part)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise SpecError("gpus", gpus, ELASTIC_WORDS) from None
        if not math.isfinite(number) or not number.is_integer():
            raise SpecError("gpus", gpus, ELASTIC_WORDS)
        bounds.append(int(number))
    low, high = bounds[0], bounds[-1]
    asked = bounds[1] if len(bounds) == 3 else low
    if not 1 <= low <= asked <= high <= MAX_GPUS:
        raise SpecError("gpus", gpus, ELASTIC_WORDS + f", MAX at most {MAX_GPUS}")
    return low, asked, high


def _first_begin(begin: object, every: object, now: float | None) -> float | None:
    """The first run of a cron schedule waits for its first tick; of an interval, not."""
    first = parse_begin(begin, now)
    if every is not None and first is None:
        schedule = parse_every(every)
        if schedule.is_cron:
            first = schedule.next_after(time.time() if now is None else now)
    return first


def default_cpus(gpus: float, capacity: Capacity) -> float:
    """The cores of a job that names none: ``DEFAULT_CPUS``, and for a GPU job at most its
    GPUs' share of the pool's cores, so that a default never keeps a GPU idle.

    2 cores and 4 GPUs: half a core a GPU, and four one-GPU jobs run at once, not two.

    >>> default_cpus(1, Capacity.empty(n_gpus=4, gpu_mem=2**34, cpus=2, mem=2**36))
    0.5
    """
    if gpus <= 0 or not capacity.gpus:
        return DEFAULT_CPUS
    share = capacity.cpus_total / len(capacity.gpus) * gpus
    # rounded down (the shares of all GPUs fit the cores), to a figure a person reads
    return min(DEFAULT_CPUS, max(MIN_SHARE, math.floor(share * 100) / 100))


def _request(gpus: object, gpu_mem: object, cpus: object, mem: object, cap: Capacity) -> Request:
    """The request, its cores by ``default_cpus`` when ``cpus`` is None (not given)."""
    request = _parsed_request(gpus, gpu_mem, DEFAULT_CPUS if cpus is None else cpus, mem, cap)
    if cpus is None:
        return replace(request, cpus=default_cpus(request.gpus, cap))
    return request


def _parsed_request(
    gpus: object, gpu_mem: object, cpus: object, mem: object, cap: Capacity
) -> Request:
    mem_bytes = 0 if mem is None else parse_size(mem, "mem")
    if 0 < mem_bytes < MIN_MEM:
        raise SpecError(
            "mem", mem, "a size of at least 16 MiB (a process needs that much to start)"
        )
    gpu_mem_bytes = None if gpu_mem is None else parse_size(gpu_mem, "gpu_mem")
    if gpu_mem_bytes is not None and gpu_mem_bytes < MIN_GPU_MEM:
        raise SpecError("gpu_mem", gpu_mem, "a size of at least 64 MiB")
    cpus_allowed = f"a number of CPU cores from 1/64 to {MAX_CPUS} (fractions share a core)"
    cpu_count = _number(cpus, "cpus", cpus_allowed)
    if not MIN_SHARE <= cpu_count <= MAX_CPUS:
        raise SpecError("cpus", cpus, cpus_allowed)
    if gpus is None:
        if gpu_mem_bytes is None:
            return Request(0.0, None, cpu_count, mem_bytes)
        biggest = max((g.mem_total for g in cap.gpus), default=0)
        # the share of a card its memory is, never below the smallest share a job may ask
        # for (64 MiB of an 80 GiB card counts as 1/64 of it, as gpus=1/64 would)
        share = max(MIN_SHARE, min(1.0, gpu_mem_bytes / biggest)) if biggest else 0.5
        # a request for a whole card's memory is a whole GPU
        return Request(share if share < 1.0 else 1.0, gpu_mem_bytes, cpu_count, mem_bytes)
    allowed = (
        f"a whole number of GPUs from 0 to {MAX_GPUS} or a fraction of one GPU from 1/64 up to 1"
    )
    count = _number(gpus, "gpus", allowed)
    if (
        count < 0
        or count > MAX_GPUS
        or (count > 1 and not count.is_integer())
        or 0 < count < MIN_SHARE
    ):
        raise SpecError("gpus", gpus, allowed)
    if count == 0 and gpu_mem_bytes is not None:
        raise SpecError("gpu_mem", gpu_mem, "no gpu_mem for a CPU-only job (gpus=0)")
    return Request(float(count), gpu_mem_bytes, cpu_count, mem_bytes)


def _number(value: object, name: str, allowed: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise SpecError(name, value, allowed)
    try:
        number = float(value)
    except (ValueError, OverflowError):
        raise SpecError(name, value, allowed) from None
    if not math.isfinite(number):
        raise SpecError(name, value, allowed)
    return number


def _time_limit(value: object) -> float | None:
    if value is None:
        return None
    allowed = "a duration above zero and at most 365 days, such as '90s' or '2h'"
    try:
        seconds = parse_duration(value, "time_limit")
    except SpecError:
        raise SpecError("time_limit", value, allowed) from None
    if not 0 < seconds <= MAX_TIME_LIMIT:
        raise SpecError("time_limit", value, allowed)
    return seconds


def _deadline(value: object, now: float) -> float | None:
    allowed = (
        "a datetime, an ISO date-time string, a duration from now ('2h') or epoch seconds, "
        "within ten years of now"
    )
    if value is None:
        return None
    when: float | None = None
    try:
        if isinstance(value, datetime):
            when = value.timestamp()
        elif isinstance(value, str):
            try:
                when = datetime.fromisoformat(value).timestamp()
            except ValueError:
                when = now + parse_duration(value, "deadline")
        elif isinstance(value, int | float) and not isinstance(value, bool):
            when = float(value)
    except (SpecError, ValueError, OverflowError, OSError):
        when = None
    if when is None or not math.isfinite(when) or abs(when - now) > DEADLINE_RANGE:
        raise SpecError("deadline", value, allowed)
    return when


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
        if not isinstance(job_id, str) or not _JOB_ID.match(job_id):
            raise SpecError("after", item, "a job id, a JobHandle, or a list of them")
        ids.append(job_id)
    return tuple(dict.fromkeys(ids))


def _printable(text: str) -> str:
    """``text`` with what SQLite's UTF-8 cannot hold (lone surrogates) replaced."""
    return text.encode("utf-8", "replace").decode("utf-8")


def _env(env: object) -> dict[str, str]:
    """Extra environment variables for the job: names and values without NUL."""
    if env is None:
        return {}
    allowed = "a dict of environment variable names to string values, without NUL"
    if not isinstance(env, dict):
        raise SpecError("env", env, allowed)
    for key, value in env.items():
        if not (isinstance(key, str) and isinstance(value, str)):
            raise SpecError("env", env, allowed)
        text = key + value
        if not key or "=" in key or "\0" in text or any("\ud800" <= c <= "\udfff" for c in text):
            raise SpecError("env", {key: value}, allowed)
    return dict(env)


def parse_stage_in(value: object) -> dict[str, str]:
    """Check a job's declared inputs; local paths become absolute (the job may run elsewhere).

    >>> parse_stage_in({"train": "/data/train", "labels": "s3://bucket/labels.csv"})
    {'train': '/data/train', 'labels': 's3://bucket/labels.csv'}
    """
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > MAX_INPUTS:
        raise SpecError("stage_in", value, f"{STAGE_IN_HELP}, with at most {MAX_INPUTS} inputs")
    inputs: dict[str, str] = {}
    seen: dict[str, str] = {}
    for name, source in value.items():
        if not isinstance(name, str) or not _INPUT_NAME.match(name):
            raise SpecError(
                "stage_in",
                name,
                "an input name of letters, digits and _ (not starting with a digit)",
            )
        if name.upper() in seen:
            raise SpecError(
                "stage_in",
                name,
                f"names that differ in more than case ({seen[name.upper()]!r} is already "
                f"DLSCHED_DATA_{name.upper()})",
            )
        seen[name.upper()] = name
        if isinstance(source, os.PathLike):
            source = os.fspath(source)
        if not isinstance(source, str):
            raise SpecError(f"stage_in[{name!r}]", source, "a local path or a URL (a string)")
        text = check_text(source, f"stage_in[{name!r}]", max_len=MAX_SOURCE)
        if not _URL.match(text):
            text = os.path.abspath(os.path.expanduser(text))
        inputs[name] = text
    return inputs


def pickle_payload(
    payload: dict[str, Any],
    dumps: Callable[[Any], bytes] = dumps_with_sources,
    check: Callable[[Any], object] = cloudpickle.dumps,
) -> bytes:
    """Pickle what a job runs (with ``dumps``: by default, a function from a notebook keeps
    its cell's name and lines, for its traceback); name the object that cannot travel if
    pickling fails (each part tried with ``check``, which must write nothing)."""
    try:
        return dumps(payload)
    except DlschedError:
        raise
    except Exception as whole_error:
        for label, obj in _parts(payload):
            try:
                check(obj)
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
