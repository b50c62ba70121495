"""``dlsched schedules``: list the schedules ``--every`` made; ``remove ID...`` stops them."""

from __future__ import annotations

import argparse
import time
from datetime import datetime

from ..vocab.schedule_info import ScheduleInfo
from ..vocab.units import format_duration
from .common import EXIT_OK, _print_json, _scheduler


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "schedules",
        help="schedules made with --every: list them, or remove ID...",
        description="Schedules made with `dlsched submit --every` (or every= in Python): "
        "each tick submits a new run of the first job unless its last run still waits or "
        "runs. `dlsched schedules remove ID...` stops them (a run going on goes on).",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("action", nargs="?", choices=["list", "remove"], default="list")
    p.add_argument("schedule_ids", nargs="*", metavar="ID")
    p.set_defaults(run=cmd_schedules)


def next_run_words(at: float, now: float | None = None) -> str:
    """``"in 3s (14:30:05)"``; a tick that is due now reads ``"now"``."""
    now = time.time() if now is None else now
    clock = datetime.fromtimestamp(at).strftime("%H:%M:%S")
    if at <= now:
        return f"now ({clock})"
    return f"in {format_duration(at - now)} ({clock})"


def cmd_schedules(args: argparse.Namespace) -> int:
    from .common import CommandError

    with _scheduler(args) as s:
        if args.action == "remove":
            if not args.schedule_ids:
                raise CommandError("say which schedules: dlsched schedules remove ID...")
            # every id is checked before any schedule is removed: a typo removes nothing
            known = {x.id for x in s.schedules()}
            unknown = [i for i in args.schedule_ids if i not in known]
            if unknown:
                raise CommandError(f"no schedule {unknown[0]}; `dlsched schedules` lists them", 1)
            removed = [s.remove_schedule(i) for i in dict.fromkeys(args.schedule_ids)]
            if args.json:
                _print_json([x.to_json() for x in removed])
            else:
                print("\n".join(f"{x.id} removed (every {x.every}, {x.name})" for x in removed))
            return EXIT_OK
        if args.schedule_ids:
            raise CommandError("give ids only to remove: dlsched schedules remove ID...")
        rows = s.schedules()
    if args.json:
        _print_json([x.to_json() for x in rows])
        return EXIT_OK
    if not rows:
        print("no schedules (dlsched submit --every 1h ... makes one)")
        return EXIT_OK
    _print(rows)
    return EXIT_OK


def _print(rows: list[ScheduleInfo]) -> None:
    table = [("ID", "NAME", "OWNER", "EVERY", "NEXT RUN", "RUNS", "LAST RUN")]
    for x in rows:
        last = f"{x.last_job} {x.last_state}" if x.last_job else "-"
        skipped = f" ({x.skipped} skipped)" if x.skipped else ""
        table.append(
            (
                x.id,
                x.name[:24],
                x.owner,
                x.every,
                next_run_words(x.next_run),
                f"{x.runs + 1}{skipped}",
                last,
            )
        )
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]) - 1)]
    for r in table:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1])
