"""The dashboard's queue table: its columns and layout, and one job's row of widgets with
its buttons (cancel, priority up and down, the log).

A row updates only the cells whose text changed, so a refresh of a long queue sends
few messages to the front end. Every name in it is escaped.
"""

from __future__ import annotations

from typing import Protocol

import ipywidgets as w

from ..vocab.schema import ACTIVE, WAITING, JobInfo
from ..vocab.units import format_duration
from . import format as fmt
from .format import MUTED

PRIORITY_STEP = 10
COLUMNS = (
    "state",
    "id",
    "name",
    "owner/notebook",
    "priority",
    "request",
    "waited",
    "ran",
    "progress",
    "",
)
# Fits a notebook beside an open sidebar (about 900 px of output at a 1400 px window):
# the text columns shrink to an ellipsis (the whole text is the cell's tooltip) and the
# buttons' column is never narrower than its buttons.
GRID = (
    "68px 70px minmax(48px,1.3fr) minmax(48px,1.2fr) 60px minmax(48px,1fr) 58px 56px "
    "minmax(64px,1.6fr) max-content"
)
HEADER = (
    '<div style="white-space:nowrap;overflow:hidden;text-overflow:ellipsis" title="{0}">'
    "<b>{0}</b></div>"
)
CELL_LAYOUT = {"overflow": "hidden", "min_width": "0", "width": "auto"}
BUTTON_LAYOUT = {"width": "28px", "padding": "0", "margin": "1px"}


class RowActions(Protocol):
    """What a row's buttons ask of the panel that holds it (``Dashboard``)."""

    def ask_cancel(self, job_id: str) -> None: ...

    def change_priority(self, job_id: str, step: int) -> None: ...

    def show_log(self, job_id: str) -> None: ...


def cell_html(html: str, tooltip: str) -> str:
    """One table cell: one line per row, cut with an ellipsis, the whole text on hover."""
    return (
        '<div style="white-space:nowrap;overflow:hidden;text-overflow:ellipsis"'
        f' title="{fmt.esc(tooltip)}">{html}</div>'
    )


class QueueRow:
    """The widgets of one job's row; ``update(job)`` changes only what changed.

    A row outlives its job: the dashboard hands it to the next job that needs a row
    (``job_id`` changes, the buttons act on the new job), so the widgets a kernel holds,
    and a reloaded page must ask for one by one, do not grow with every job it ran.
    """

    def __init__(self, dashboard: RowActions, job_id: str) -> None:
        self.job_id = job_id
        self.cells = {name: w.HTML(layout=w.Layout(**CELL_LAYOUT)) for name in COLUMNS[:-1]}
        self.cancel_button = w.Button(
            icon="times", tooltip="Cancel this job", layout=w.Layout(**BUTTON_LAYOUT)
        )
        self.up_button = w.Button(
            description="↑", tooltip="Raise priority", layout=w.Layout(**BUTTON_LAYOUT)
        )
        self.down_button = w.Button(
            description="↓", tooltip="Lower priority", layout=w.Layout(**BUTTON_LAYOUT)
        )
        self.log_button = w.Button(
            description="log",
            tooltip="Show output",
            layout=w.Layout(**{**BUTTON_LAYOUT, "width": "36px"}),
        )
        # asks first, as every view does before it stops work (UI.md)
        self.cancel_button.on_click(lambda _: dashboard.ask_cancel(self.job_id))
        self.up_button.on_click(lambda _: dashboard.change_priority(self.job_id, +PRIORITY_STEP))
        self.down_button.on_click(lambda _: dashboard.change_priority(self.job_id, -PRIORITY_STEP))
        self.log_button.on_click(lambda _: dashboard.show_log(self.job_id))
        self.actions = w.HBox(
            [self.cancel_button, self.up_button, self.down_button, self.log_button],
            layout=w.Layout(flex_flow="row nowrap", min_width="max-content"),
        )
        self.widgets: list[w.Widget] = [*self.cells.values(), self.actions]
        self.job: JobInfo | None = None
        self.texts: dict[str, str] = {}  # each cell's tooltip: its words, as plain text

    @property
    def state(self) -> str:
        return self.job.state if self.job else ""

    def update(self, job: JobInfo, now: float) -> None:
        self.job = job
        progress = fmt.wait_words(job) if job.state in WAITING else fmt.progress_words(job)
        waited = format_duration(fmt.waited_for(job, now))
        ran = format_duration(fmt.ran_for(job, now))
        # (html, tooltip): one line per row, the whole text on hover
        values = {
            "state": (fmt.chip(job.state), fmt.state_words(job, now)),
            "id": (f"<code>{fmt.esc(job.id)}</code>", job.id),
            "name": (fmt.esc(job.name), job.name),
            "owner/notebook": (
                fmt.esc(fmt.owner_words(job)),
                f"{job.owner} · {job.origin}" if job.origin else job.owner,
            ),
            "priority": (fmt.esc(fmt.priority_words(job.priority)), f"priority {job.priority}"),
            "request": (fmt.esc(fmt.request_words(job)), fmt.request_words(job)),
            "waited": (fmt.esc(waited), waited),
            "ran": (fmt.esc(ran), ran),
            "progress": (self._progress_html(job, progress), progress),
        }
        using = fmt.live_usage_words(job)
        if using:
            html, tooltip = values["progress"]
            values["progress"] = (
                f'{html}<br><span class="dlsched-using" style="{MUTED}">{fmt.esc(using)}</span>',
                f"{tooltip} · now using {using}" if tooltip else f"now using {using}",
            )
        self.texts = {name: tooltip for name, (_, tooltip) in values.items()}
        for name, (html, tooltip) in values.items():
            value = cell_html(html, tooltip)
            if self.cells[name].value != value:
                self.cells[name].value = value
        active = job.state in ACTIVE
        self.cancel_button.disabled = not active
        self.up_button.disabled = self.down_button.disabled = not active

    @staticmethod
    def _progress_html(job: JobInfo, words: str) -> str:
        if job.state in ("queued", "preempted"):
            return f'<span style="{MUTED}">{fmt.esc(words)}</span>'
        share = fmt.progress_share(job)
        if share is None:
            return fmt.esc(words)
        colour = fmt.COLOURS.get(job.state, fmt.COLOURS["running"])
        bar = (
            '<span style="display:inline-block;width:56px;height:8px;margin-right:4px;'
            'background:var(--jp-layout-color3, #ddd);border-radius:2px;overflow:hidden">'
            f'<span style="display:block;height:100%;width:{share * 100:.0f}%;'
            f'background:{colour}"></span></span>'
        )
        return bar + fmt.esc(words)
