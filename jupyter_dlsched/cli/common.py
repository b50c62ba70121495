"""What every ``dlsched`` command shares: exit statuses, ``CommandError``, the scheduler
it opens, JSON output and the ``--name``/``-u``/``--state`` job filters."""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys
from typing import Any

from ..client.scheduler import Scheduler
from ..vocab.errors import DlschedError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_CLOSED_PIPE = 141  # what a shell reports for a program stopped by SIGPIPE

EXIT_STATUSES = """\
exit status:
  0    done
  1    the job failed (submit --wait), cancel found no unfinished job to cancel,
       the job's state does not allow it (priority of a finished job, requeue of
       an unfinished one), the job ledger could not be read or written, or an
       unexpected error
  2    bad usage or input: an unknown option or value, an unknown job id,
       a state folder you cannot use
  N    submit --wait of a command: the command's own exit status
  130  interrupted (Ctrl-C)
  141  stdout was closed early (dlsched queue --all | head)

A failure prints one line on stderr, `dlsched COMMAND: what was wrong`;
`dlsched --debug COMMAND ...` adds the traceback."""


class CommandError(DlschedError):
    """A command cannot do what was asked; ``status`` is the exit status to end with."""

    def __init__(self, message: str, status: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.status = status


def _scheduler(args: argparse.Namespace) -> Scheduler:
    return Scheduler(home=args.home, loop=False, probe_pool=False)


def _print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def _flatten(groups: list[list[str]] | None) -> list[str] | None:
    return list(dict.fromkeys(s for group in groups for s in group)) if groups else None


def _name_matches(pattern: str | None, name: str) -> bool:
    """``--name`` is an exact name, or a glob when it has ``*``, ``?`` or ``[``."""
    if pattern is None:
        return True
    if any(c in pattern for c in "*?["):
        return fnmatch.fnmatchcase(name, pattern)
    return name == pattern


def _selection(args: argparse.Namespace) -> str:
    """The filters in words, for a message about what they matched."""
    parts = [f"--name {args.name!r}"] if args.name else []
    if args.user:
        parts.append(f"-u {args.user}")
    if args.state:
        parts.append(f"--state {','.join(_flatten(args.state) or [])}")
    return " ".join(parts)
