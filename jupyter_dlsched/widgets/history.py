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

from ..machine.inventory import PoolInfo
from ..vocab.schema import JobInfo

# readings kept when the dashboard samples the pool itself
OWN_SAMPLES = 2000


class History:
    """Per-GPU utilisation over time: ``{gpu_index: [(time, util_percent), ...]}``."""

    def __init__(self) -> None:
        self._own: deque[tuple[float, int, float]] = deque(maxlen=OWN_SAMPLES)

    def record(self, pool: PoolInfo, now: float) -> None:
        """Keep a reading of the pool (used when the ledger has no samples)."""
        for gpu in pool.gpus:
            self._own.append((now, gpu.index, gpu.reading))

    def series(self, store: Any, since: float) -> tuple[dict[int, list[tuple[float, float]]], str]:
        """Utilisation lines per GPU since ``since``, and where they came from."""
        lines: dict[int, list[tuple[float, float]]] = {}
        for row in store.usage.samples(since):
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


#: a label needs room for this many characters, or it is left out
MIN_LABEL_CHARS = 3


def plan_labels(
    spans: list[tuple[int, float, float, str]], px_per_unit: float, char_px: float
) -> list[tuple[int, float, str]]:
    """Where the job names go on the Gantt strip so that no two overlap.

    ``spans`` are ``(row, start, end, name)`` in axis units, ``px_per_unit`` how wide one
    unit is drawn and ``char_px`` one character. A name starts at its span (or after the
    previous label on its row, when spans overlap) and is cut with ``…`` to the room its
    span has; a span with room for fewer than ``MIN_LABEL_CHARS`` characters gets none.
    Returns ``(row, x, text)``.
    """
    placed: list[tuple[int, float, str]] = []
    taken: dict[int, float] = {}  # per row: where the last label drawn ends
    for row, start, end, name in sorted(spans, key=lambda s: (s[0], s[1])):
        x = max(start, taken.get(row, start))
        room = int((end - x) * px_per_unit / char_px) - 1  # a space before the name
        if room < MIN_LABEL_CHARS or not name:
            continue
        text = name if len(name) <= room else name[: room - 1] + "…"
        placed.append((row, x, text))
        taken[row] = x + (len(text) + 1) * char_px / px_per_unit
    return placed


def render_png(
    lines: dict[int, list[tuple[float, float]]],
    jobs: list[JobInfo],
    gpu_indices: list[int],
    since: float,
    now: float | None = None,
    simulated: frozenset[int] = frozenset(),
) -> bytes:
    """PNG of utilisation lines (top) and per-GPU job spans (bottom).

    For a simulated GPU (``simulated``) the line is the share the scheduler allocated,
    not a measurement, and the legend says so.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    now = time.time() if now is None else now
    fig = Figure(figsize=(7.5, 2.6), dpi=90)
    canvas = FigureCanvasAgg(fig)
    top, bottom = fig.subplots(
        2, 1, sharex=True, gridspec_kw={"height_ratios": [3, max(1, len(gpu_indices))]}
    )
    for index in sorted(lines):
        points = lines[index]
        top.plot(
            [(t - now) / 60 for t, _ in points],
            [u for _, u in points],
            label=f"GPU {index} (allocated)" if index in simulated else f"GPU {index}",
            linewidth=1.4,
        )
    top.set_ylim(0, 105)
    measured = [i for i in lines if i not in simulated]
    top.set_ylabel("util %" if measured or not lines else "allocated %")
    if lines:
        top.legend(loc="upper left", fontsize=7, ncol=min(4, len(lines)))
    else:
        top.text(0.5, 0.5, "no readings yet", ha="center", va="center", transform=top.transAxes)
    palette = [f"C{i}" for i in range(10)]
    rows = {index: row for row, index in enumerate(gpu_indices)}
    spans: list[tuple[int, float, float, str]] = []
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
            spans.append((rows[index], (start - now) / 60, (end - now) / 60, job.name))
    bottom.set_yticks(list(rows.values()), [f"GPU {i}" for i in rows])
    bottom.set_ylim(-0.5, max(0.5, len(rows) - 0.5))
    bottom.invert_yaxis()
    # show the stretch that has something in it (at least a minute), not an empty window
    starts = [t for points in lines.values() for t, _ in points[:1]]
    starts += [j.started for j in jobs if j.started is not None and (j.finished or now) >= since]
    left = max(since, min(min(starts, default=since), now - 60.0))
    xmin = (left - now) / 60
    bottom.set_xlim(xmin, 0)
    bottom.set_xlabel("minutes ago")
    fig.tight_layout()
    # names go on last, once the axis has its final width in pixels
    fontsize = 7
    width_px = bottom.get_window_extent(canvas.get_renderer()).width
    px_per_minute = width_px / max(1e-9, -xmin)
    char_px = 0.62 * fontsize * fig.dpi / 72
    visible = [(r, max(a, xmin), min(b, 0.0), name) for r, a, b, name in spans if b > xmin]
    for row, x, text in plan_labels(visible, px_per_minute, char_px):
        bottom.text(x, row, " " + _label(text), va="center", fontsize=fontsize, clip_on=True)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()
