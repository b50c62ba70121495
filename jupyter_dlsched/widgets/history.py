"""The utilisation history plot: one line per GPU, job spans as a Gantt strip underneath.

Readings come from the ledger's ``samples`` table (written by the server's
sampler); when there are none, the dashboard keeps its own readings of
``scheduler.pool()`` while it is open. Drawn with matplotlib's object API
(no pyplot), so it is safe from the refresh thread.
"""

from __future__ import annotations

import io
import time
from collections import deque
from typing import Any

from ..pool import PoolInfo
from ..store import JobInfo

# readings kept when the dashboard samples the pool itself
OWN_SAMPLES = 2000


class History:
    """Per-GPU utilisation over time: ``{gpu_index: [(time, util_percent), ...]}``."""

    def __init__(self) -> None:
        self._own: deque[tuple[float, int, float]] = deque(maxlen=OWN_SAMPLES)

    def record(self, pool: PoolInfo, now: float) -> None:
        """Keep a reading of the pool (used when the ledger has no samples)."""
        for gpu in pool.gpus:
            self._own.append((now, gpu.index, float(gpu.util or 0.0)))

    def series(self, store: Any, since: float) -> tuple[dict[int, list[tuple[float, float]]], str]:
        """Utilisation lines per GPU since ``since``, and where they came from."""
        lines: dict[int, list[tuple[float, float]]] = {}
        for row in store.samples(since):
            source = str(row.get("source", ""))
            if source.startswith("gpu:") and row.get("util") is not None:
                try:
                    index = int(source[4:])
                except ValueError:
                    continue
                lines.setdefault(index, []).append((float(row["time"]), float(row["util"])))
        if lines:
            return lines, "sampler"
        for t, index, util in self._own:
            if t >= since:
                lines.setdefault(index, []).append((t, util))
        return lines, "dashboard"

    def latest(self, gpu_index: int, count: int = 8) -> list[float]:
        """The last ``count`` utilisation readings of one GPU (for a sparkline)."""
        values = [u for _, i, u in self._own if i == gpu_index]
        return values[-count:]


def _label(text: str) -> str:
    # matplotlib reads $...$ as maths; a job name is plain text
    return text.replace("$", r"\$")


def render_png(
    lines: dict[int, list[tuple[float, float]]],
    jobs: list[JobInfo],
    gpu_indices: list[int],
    since: float,
    now: float | None = None,
) -> bytes:
    """PNG of utilisation lines (top) and per-GPU job spans (bottom)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    now = time.time() if now is None else now
    fig = Figure(figsize=(7.5, 2.6), dpi=90)
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(
        2, 1, sharex=True, gridspec_kw={"height_ratios": [3, max(1, len(gpu_indices))]}
    )
    for index in sorted(lines):
        points = lines[index]
        top.plot(
            [(t - now) / 60 for t, _ in points],
            [u for _, u in points],
            label=f"GPU {index}",
            linewidth=1.4,
        )
    top.set_ylim(0, 105)
    top.set_ylabel("util %")
    if lines:
        top.legend(loc="upper left", fontsize=7, ncol=min(4, len(lines)))
    else:
        top.text(0.5, 0.5, "no readings yet", ha="center", va="center", transform=top.transAxes)
    palette = [f"C{i}" for i in range(10)]
    rows = {index: row for row, index in enumerate(gpu_indices)}
    for n, job in enumerate(jobs):
        if job.started is None or not job.placement:
            continue
        end = job.finished or now
        if end < since:
            continue
        start = max(job.started, since)
        for index in job.placement.gpus:
            if index not in rows:
                continue
            bottom.barh(
                rows[index],
                (end - start) / 60,
                left=(start - now) / 60,
                height=0.7,
                color=palette[n % len(palette)],
                alpha=0.8,
            )
            bottom.text(
                (start - now) / 60,
                rows[index],
                " " + _label(job.name[:20]),
                va="center",
                fontsize=7,
                clip_on=True,
            )
    bottom.set_yticks(list(rows.values()), [f"GPU {i}" for i in rows])
    bottom.set_ylim(-0.5, max(0.5, len(rows) - 0.5))
    bottom.invert_yaxis()
    # show the stretch that has something in it (at least a minute), not an empty window
    starts = [t for points in lines.values() for t, _ in points[:1]]
    starts += [j.started for j in jobs if j.started is not None and (j.finished or now) >= since]
    left = max(since, min(min(starts, default=since), now - 60.0))
    bottom.set_xlim((left - now) / 60, 0)
    bottom.set_xlabel("minutes ago")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()
