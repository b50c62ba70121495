"""The one table of resource options: Python keywords, ``%%schedule`` flags and
``dlsched submit`` flags are all derived from ``RESOURCE_OPTIONS``, so they accept the
same set. ``build_spec`` checks the values; a flag only turns its text into the value
the Python keyword takes (``--after a,b`` → ``["a", "b"]``).

>>> parser = argparse.ArgumentParser()
>>> add_resource_flags(parser)
>>> flag_resources(parser.parse_args(["--gpus", "0.5", "--after", "k3x9m2ab", "--preemptible"]))
{'gpus': 0.5, 'after': ['k3x9m2ab'], 'preemptible': True}
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def _number(text: str) -> float | int:
    """A finite number; a whole one stays an int (``--gpus 2`` asks for two whole GPUs)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a number such as 2 or 0.5, got {text!r}")
    return int(value) if value.is_integer() else value


def _gpus(text: str) -> float | int | str:
    """A GPU count, or an elastic range ``MIN:MAX`` kept as text for the spec to check."""
    if ":" in text:
        return text
    return _number(text)


def _whole_number(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a whole number such as 3, got {text!r}"
        ) from None


def _job_ids(text: str) -> list[str]:
    ids = [item.strip() for item in text.split(",") if item.strip()]
    if not ids:
        raise argparse.ArgumentTypeError(
            f"expected job ids separated by commas, such as k3x9m2ab,q8r2m4za, got {text!r}"
        )
    return ids


def _name_and_source(text: str) -> tuple[str, str]:
    name, sep, source = text.partition("=")
    if not sep or not name.strip() or not source.strip():
        raise argparse.ArgumentTypeError(
            f"expected NAME=PATH such as train=/mnt/share/train, got {text!r}"
        )
    return name.strip(), source.strip()


@dataclass(frozen=True)
class ResourceOption:
    """One resource keyword and how a shell or a magic spells it."""

    name: str
    help: str
    metavar: str | None = None
    #: flag text → the keyword's value (None: the text itself; build_spec parses it)
    convert: Callable[[str], Any] | None = None
    #: a flag without a value that sets the keyword to True
    switch: bool = False
    #: ``NAME=VALUE`` given as often as needed, collected into a dict
    pairs: bool = False
    #: Python only (a dict of environment variables has no flag)
    python_only: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def usage(self) -> str:
        return f"[{self.flag}]" if self.switch else f"[{self.flag} {self.metavar}]"


RESOURCE_OPTIONS: tuple[ResourceOption, ...] = (
    ResourceOption(
        "gpus",
        "whole GPUs, a share of one (0.5), or an elastic range (1:4; 1:2:4 waits in line at 2)",
        "N|0.5|MIN:MAX",
        _gpus,
    ),
    ResourceOption("gpu_mem", "GPU memory the job needs, e.g. 8GiB", "SIZE"),
    ResourceOption("cpus", "CPU cores (a fraction shares one)", "N", _number),
    ResourceOption("mem", "memory, e.g. 16GiB", "SIZE"),
    ResourceOption("priority", "an integer or low, normal, high, urgent", "P"),
    ResourceOption("name", "the job's name in the queue", "NAME"),
    ResourceOption("deadline", "finish by: an ISO date-time or a duration from now", "WHEN"),
    ResourceOption(
        "begin", "start no earlier than: 90s, now+5m, 14:30 or an ISO date-time", "WHEN"
    ),
    ResourceOption(
        "every",
        "submit a new run on each tick of SCHEDULE (a duration such as 1h, or cron such as "
        "'0 2 * * *') while the last run is not still going; `dlsched schedules` lists them",
        "SCHEDULE",
    ),
    ResourceOption("time_limit", "stop the job after this long, e.g. 90s, 30m, 2h", "DURATION"),
    ResourceOption("retries", "run a failed job again up to N times", "N", _whole_number),
    ResourceOption("after", "job ids that must succeed first, comma-separated", "ID,...", _job_ids),
    ResourceOption("preemptible", "a higher priority job may stop and requeue it", switch=True),
    ResourceOption(
        "distributed", "one process per granted GPU, as torchrun starts them", switch=True
    ),
    ResourceOption(
        "stage_in",
        "stage PATH (or a URL) into the local cache before the job starts; the job reads it "
        "from dls.data(NAME) or $DLSCHED_DATA_NAME (repeatable)",
        "NAME=PATH",
        _name_and_source,
        pairs=True,
    ),
    ResourceOption("env", "extra environment variables for the job", python_only=True),
)
#: Every keyword ``submit``, ``map`` and ``@job`` take besides the function's own.
RESOURCE_ARGS = tuple(option.name for option in RESOURCE_OPTIONS)
FLAG_OPTIONS = tuple(option for option in RESOURCE_OPTIONS if not option.python_only)


def add_resource_flags(parser: argparse.ArgumentParser) -> None:
    """Add a flag for every resource option (``%%schedule`` and ``dlsched submit``)."""
    for option in FLAG_OPTIONS:
        if option.switch:
            parser.add_argument(
                option.flag, dest=option.name, action="store_true", help=option.help
            )
        else:
            parser.add_argument(
                option.flag,
                dest=option.name,
                metavar=option.metavar,
                type=option.convert or str,
                action="append" if option.pairs else "store",
                help=option.help,
            )


def flag_resources(args: argparse.Namespace) -> dict[str, Any]:
    """The keywords the flags in ``args`` ask for (flags not given are left out)."""
    resources: dict[str, Any] = {}
    for option in FLAG_OPTIONS:
        value = getattr(args, option.name, None)
        if value is None or value is False:
            continue
        resources[option.name] = dict(value) if option.pairs else value
    return resources


def flags_usage() -> str:
    """``[--gpus N|0.5] [--gpu-mem SIZE] ...`` for one-line usage messages."""
    return " ".join(option.usage() for option in FLAG_OPTIONS)
