"""Snapshots for ``%dlsched queue`` and ``%dlsched pool``: HTML in notebooks, text elsewhere."""

from __future__ import annotations

import time

from ..machine.inventory import PoolInfo
from ..vocab.schema import ACTIVE, WAITING, JobInfo
from ..vocab.units import format_duration
from ..vocab.words import renumber
from . import format as fmt
from .cards import gpu_card_html, host_card_html

HEAD = (
    "state",
    "id",
    "name",
    "owner / notebook",
    "priority",
    "request",
    "waited",
    "ran",
    "progress",
)
#: Every header and cell says its alignment: JupyterLab's stylesheet right-aligns table
#: cells, which put ids and names under headings that read from the left.
ALIGN = "text-align:left"


def queue_order(jobs: list[JobInfo]) -> list[JobInfo]:
    """Running newest first, then waiting in queue order, then finished newest first."""
    running = sorted((j for j in jobs if j.state == "running"), key=lambda j: -j.seq)
    waiting = sorted(
        (j for j in jobs if j.state in WAITING), key=lambda j: (j.position or 10**9, j.seq)
    )
    finished = sorted((j for j in jobs if j.state not in ACTIVE), key=lambda j: -j.seq)
    return [*running, *waiting, *finished]


class QueueSnapshot:
    """The queue at one moment; shows as a table."""

    def __init__(self, jobs: list[JobInfo], now: float | None = None) -> None:
        self.jobs = queue_order(renumber(jobs))
        self.now = time.time() if now is None else now

    def _cells(self, job: JobInfo) -> list[str]:
        progress = fmt.wait_words(job) if job.state in WAITING else fmt.progress_words(job)
        return [
            job.id,
            job.name,
            fmt.owner_words(job),
            fmt.priority_words(job.priority),
            fmt.request_words(job),
            format_duration(fmt.waited_for(job, self.now)),
            format_duration(fmt.ran_for(job, self.now)),
            progress,
        ]

    def _repr_html_(self) -> str:
        if not self.jobs:
            return "<i>no queued or running jobs</i>"
        head = "".join(f"<th style='{ALIGN}'>{fmt.esc(h)}</th>" for h in HEAD)
        rows = []
        for job in self.jobs:
            cells = [fmt.chip(job.state), *(fmt.esc(c) for c in self._cells(job))]
            cells[3] = fmt.owner_html(job)  # the short name, the full path on hover
            rows.append("<tr>" + "".join(f"<td style='{ALIGN}'>{c}</td>" for c in cells) + "</tr>")
        return (
            f'<table class="dlsched-queue"><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table>"
        )

    def __repr__(self) -> str:
        if not self.jobs:
            return "no queued or running jobs"
        rows = [["STATE", *(h.upper() for h in HEAD[1:])]]
        for job in self.jobs:
            rows.append([fmt.CHIP_WORDS.get(job.state, job.state), *self._cells(job)])
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        return "\n".join(
            "  ".join(c.ljust(wd) for c, wd in zip(r, widths, strict=False)).rstrip() for r in rows
        )


class PoolSnapshot:
    """The pool at one moment: GPU cards and the CPU/RAM card."""

    def __init__(self, pool: PoolInfo, jobs: list[JobInfo]) -> None:
        self.pool = pool
        self.jobs = {j.id: j for j in jobs}

    def _repr_html_(self) -> str:
        cards = [gpu_card_html(g, self.jobs, []) for g in self.pool.gpus]
        cards.append(host_card_html(self.pool))
        return (
            '<div style="display:flex;flex-wrap:wrap;gap:6px">'
            + "".join(f"<div>{c}</div>" for c in cards)
            + "</div>"
        )

    def __repr__(self) -> str:
        return repr(self.pool)
