"""Commands that read the queue: ``dlsched status``, ``queue`` and ``history``."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any

from ..client.data import data_words
from ..kernels import spares
from ..nbjobs.record import read_record
from ..vocab import words
from ..vocab.history import history_table, period_words, totals_by_owner
from ..vocab.schema import ACTIVE, JobInfo
from ..vocab.units import format_size
from ..vocab.words import owner_words, priority_words, state_words
from .common import EXIT_OK, _flatten, _name_matches, _print_json, _scheduler


def cmd_status(args: argparse.Namespace) -> int:
    with _scheduler(args) as s:
        s.tick()
        status = s.status()
        pool = s.pool()
    waiting = spares.waiting()
    if args.json:
        _print_json({**status, "pool": pool.to_json(), "spare_kernels": waiting})
        return EXIT_OK
    counts = status["counts"]
    gpus = status["gpus"]
    sim = f" ({gpus['simulated']} simulated)" if gpus["simulated"] else ""
    print(
        f"GPU {gpus['busy']}/{gpus['total']}{sim} busy · {counts['running']} running · "
        f"{counts['queued'] + counts['preempted']} queued · policy {status['policy']}"
    )
    print(_pool_words(status))
    if "data" in status:
        print(data_words(status["data"]))
    if status.get("pool", {}).get("mode") == "user":
        print(_preload_words(status))
    if waiting:
        print(spares.words(waiting))
    print(pool)
    return EXIT_OK


def _preload_words(status: dict[str, Any]) -> str:
    """What a pool of one's own imports ahead of its jobs, and the memory that takes."""
    import psutil

    # the agent's own setting: the shell asking may have another DLSCHED_PRELOAD, or none
    setting = status["pool"].get("preload") or {"launcher": [], "pinned": False}
    launcher = ", ".join(setting["launcher"]) or "none"
    learnt = ", ".join(status.get("preload") or []) or "nothing yet"
    try:
        ahead = psutil.Process(int(status["pool"]["agent_pid"])).children(recursive=True)
        size = sum(p.memory_info().rss for p in ahead)
        where = f"{len(ahead)} processes ahead of jobs, {format_size(size)}"
    except (psutil.Error, KeyError, TypeError, ValueError):
        where = "no process ahead of jobs"
    if not setting["pinned"]:
        learning = f"learnt: {learnt}"
    else:
        learning = (
            "pinned by DLSCHED_PRELOAD" if setting["launcher"] else "turned off by DLSCHED_PRELOAD"
        )
    return f"preload: {launcher} in the launcher; {learning} ({where}; DLSCHED_PRELOAD=none turns it off)"


def _pool_words(status: dict[str, Any]) -> str:
    """Which pool this is: a shared service, this user's agent, or the ledger directly."""
    pool = status.get("pool") or {}
    if pool.get("mode") == "shared":
        role = ", an admin" if pool.get("admin") else ""
        return f"pool: shared by every user of this machine, service at {pool.get('socket')} (you: {pool.get('you')}{role})"
    if pool.get("mode") == "user":
        return f"pool: yours alone, agent pid {pool.get('agent_pid')}, state in {status['home']}"
    return f"pool: yours alone, state in {status['home']}"


def _queue_order(jobs: list[JobInfo]) -> list[JobInfo]:
    """Running (newest first), then waiting in line order, then finished newest first."""
    running = sorted((j for j in jobs if j.state == "running"), key=lambda j: -j.seq)
    waiting = sorted(
        (j for j in jobs if j.state in ("queued", "preempted")),
        key=lambda j: (j.position or 10**9, j.seq),
    )
    finished = sorted((j for j in jobs if j.state not in ACTIVE), key=lambda j: -j.seq)
    return [*running, *waiting, *finished]


def cmd_queue(args: argparse.Namespace) -> int:
    states = _flatten(args.state)
    with _scheduler(args) as s:
        s.tick()
        owner = s.owner if args.mine else args.user
        wanted = states or (None if args.all else list(ACTIVE))
        jobs = [j for j in s.jobs(state=wanted, owner=owner) if _name_matches(args.name, j.name)]
    jobs = _queue_order(jobs)
    if args.json:
        _print_json([j.to_json() for j in jobs])
        return EXIT_OK
    if not jobs:
        if states or owner or args.name:
            print("no jobs match" + ("" if args.all or states else " (--all includes finished)"))
        else:
            print("no jobs" if args.all else "no queued or running jobs (--all shows finished)")
        return EXIT_OK
    rows = [("ID", "NAME", "OWNER", "PRIORITY", "REQUEST", "DEVICES", "STATE")]
    for j in jobs:
        devices = ",".join(map(str, j.devices)) or "-"
        rows.append(
            (
                j.id,
                j.name[:24],
                owner_words(j),
                priority_words(j.priority),
                j.request_text,
                devices,
                " · ".join(
                    part for part in (state_words(j), progress_words(j), use_words(j)) if part
                ),
            )
        )
    _print_table(rows)
    return EXIT_OK


def progress_words(job: JobInfo) -> str:
    """A running job's last ``dls.progress``: ``"67% cell 2/3"``, ``"step 12 loss 0.31"``;
    a GPU kernel's ``"3 cells · idle 12 min"`` (the words every view uses)."""
    return words.progress_words(job) if job.state == "running" else ""


def use_words(job: JobInfo) -> str:
    """What a running job uses now, as its supervisor last read it: ``"cpu 180% · 1.2 GiB"``."""
    if job.state != "running" or job.cpu_now is None or job.rss_now is None:
        return ""
    return f"cpu {job.cpu_now:.0f}% · {format_size(job.rss_now)}"


def _print_table(rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1])


def cmd_history(args: argparse.Namespace) -> int:
    since = time.time() - args.since
    with _scheduler(args) as s:
        owner = s.owner if args.mine else args.user
        jobs = [
            j
            for j in s.store.finished_jobs(since=since, owner=owner)
            if _name_matches(args.name, j.name)
        ]
        totals = totals_by_owner(jobs)
        shown = jobs[: args.limit]
        notebooks = {
            j.id: record
            for j in shown
            if j.kind == "notebook" and (record := read_record(s.log_path(j.id).parent)) is not None
        }
    if args.json:
        _print_json(
            {
                "since": since,
                "jobs": [
                    {**j.to_json(), **({"notebook": notebooks[j.id]} if j.id in notebooks else {})}
                    for j in shown
                ],
                "totals": [t.to_json() for t in totals],
            }
        )
        return EXIT_OK
    period = period_words(args.since)
    if not jobs:
        print(f"no jobs finished in the last {period}")
        return EXIT_OK
    _print_table(history_table(shown))
    if len(shown) < len(jobs):
        print(f"... {len(jobs) - len(shown)} more (-n/--limit shows more)")
    if notebooks:
        print("\nexecuted notebooks:")
        for job_id, record in notebooks.items():
            print(f"  {job_id}  {record['output']}")
    print(f"\nin the last {period}:")
    for total in totals:
        print("  " + total.words())
    return EXIT_OK
