"""``dls.dashboard()``: the pool (a card per GPU), the queue table and utilisation history.

The panel refreshes itself from a background thread and stops when closed
(the ✕ button or ``.close()``), and leaves a plain snapshot of itself in the
notebook. Everything user-controlled is escaped. The cards are ``widgets.cards``;
the table's rows ``widgets.queue_table``.
"""

from __future__ import annotations

import threading
import time
import uuid
from html import unescape
from typing import Any

import ipywidgets as w

from ..vocab.schema import ACTIVE, TERMINAL, WAITING, JobInfo
from ..vocab.units import parse_duration
from ..vocab.words import renumber
from . import format as fmt
from .cards import gpu_card_html, host_card_html
from .confirm import Confirm
from .format import MUTED
from .history import History, render_png
from .live import refresher
from .queue_table import CELL_LAYOUT, COLUMNS, GRID, HEADER, QueueRow

ELLIPSIS = (
    "white-space:nowrap;overflow:hidden;text-overflow:ellipsis;padding:1px 4px;text-align:left"
)
#: The dashboard's output for the JupyterLab extension, beside the live widget and a plain
#: snapshot: the extension shows the widget while its kernel holds it, and the snapshot with
#: a note once the kernel restarted or the page was reloaded without it (docs/notebooks.md).
DASHBOARD_MIME = "application/vnd.dlsched.dashboard+json"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
#: Seconds between two updates of the saved snapshot (each marks the notebook modified).
SNAPSHOT_EVERY = 5.0


class Dashboard(w.VBox):
    """Pool, queue and utilisation history in one panel; see ``dls.dashboard()``."""

    def __init__(
        self,
        scheduler: Any,
        *,
        refresh: float = 1.0,
        history: str | float = "10m",
        recent: int = 10,
        live: bool = True,
    ) -> None:
        self.scheduler = scheduler
        self.interval = float(refresh)
        self.history_seconds = parse_duration(history, "history")
        self.recent = int(recent)
        self.rows: dict[str, QueueRow] = {}
        self._free_rows: list[QueueRow] = []
        self._refresh_lock = threading.RLock()
        self.history = History()
        self.closed = False
        self._last = {"queue": 0.0, "pool": 0.0, "plot": 0.0}
        self.summary = w.HTML()
        self.close_button = w.Button(
            icon="times", tooltip="Close the dashboard", layout=w.Layout(width="32px")
        )
        self.close_button.on_click(lambda _: self.close())
        self.cards = w.HBox(layout=w.Layout(flex_flow="row wrap", grid_gap="6px"))
        self.gpu_cards: dict[int, w.HTML] = {}
        self.simulated_gpus: frozenset[int] = frozenset()
        self.host_card = w.HTML()
        # each table carries its own header row, so its columns line up with it
        self.headers = {
            "active": [
                w.HTML(HEADER.format(fmt.esc(c)), layout=w.Layout(**CELL_LAYOUT)) for c in COLUMNS
            ],
            "recent": [
                w.HTML(HEADER.format(fmt.esc(c)), layout=w.Layout(**CELL_LAYOUT)) for c in COLUMNS
            ],
        }
        self.active_table = w.GridBox(
            layout=w.Layout(grid_template_columns=GRID, grid_gap="2px 6px")
        )
        self.recent_table = w.GridBox(
            layout=w.Layout(grid_template_columns=GRID, grid_gap="2px 6px")
        )
        self.recent_box = w.Accordion(children=[self.recent_table], selected_index=None)
        self.recent_box.set_title(0, "recent (0)")
        self.empty = w.HTML(f'<span style="{MUTED}">no queued or running jobs</span>')
        self.log_title = w.HTML()
        self.log_view = w.HTML()
        self.log_box = w.VBox([self.log_title, self.log_view], layout=w.Layout(display="none"))
        self.log_job: str | None = None
        self.plot = w.Image(format="png", layout=w.Layout(max_width="100%"))
        self.message = w.HTML()
        self.confirm = Confirm()
        self.display_id: str | None = None
        self._snapshot_key: tuple[Any, ...] = ()
        self._snapshot_at = 0.0
        super().__init__(
            [
                w.HBox(
                    [self.summary, self.close_button],
                    layout=w.Layout(justify_content="space-between"),
                ),
                self.cards,
                self.active_table,
                self.empty,
                self.recent_box,
                self.confirm,
                self.message,
                self.log_box,
                self.plot,
            ]
        )
        self.add_class("dlsched-dashboard")
        self.refresh(force=True)
        if live:
            refresher.add(self)

    # -- showing ------------------------------------------------------------------------------
    def _ipython_display_(self) -> None:
        """Shown with an id, so that the snapshot left in the notebook can follow the queue."""
        from IPython.display import display

        with self._refresh_lock:
            self.display_id = f"dlsched-dashboard-{uuid.uuid4().hex[:12]}"
            self._snapshot_at = time.time()
            self._snapshot_key = self._queue_key()
            display(self._repr_mimebundle_(), raw=True, display_id=self.display_id)

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        bundle: dict[str, Any] = {
            "text/plain": self.summary_text(),
            "text/html": self.snapshot_html(),
        }
        if not self.closed:
            live = super()._repr_mimebundle_(**kwargs) or {}
            if WIDGET_MIME in live:
                bundle[WIDGET_MIME] = live[WIDGET_MIME]
            bundle[DASHBOARD_MIME] = {"as_of": self._snapshot_at or time.time()}
        return bundle

    def summary_text(self) -> str:
        return unescape(self.summary.value) or "dls.dashboard()"

    def snapshot_html(self) -> str:
        """The panel as plain HTML, no widgets: what a reloaded page shows without the kernel."""
        as_of = time.strftime("%H:%M:%S", time.localtime(self._snapshot_at or time.time()))
        if self.closed:
            return (
                f'<div class="dlsched-dashboard-snapshot" style="{MUTED}">the dashboard was '
                "closed; <code>dls.dashboard()</code> opens a new one</div>"
            )
        head = "".join(
            f'<th style="text-align:left;{ELLIPSIS}" title="{fmt.esc(c)}">{fmt.esc(c)}</th>'
            for c in COLUMNS[:-1]
        )
        rows = []
        for row in self._shown_rows():
            cells = "".join(
                f'<td style="{ELLIPSIS}" title="{fmt.esc(row.texts.get(name, ""))}">'
                f"{row.cells[name].value}</td>"
                for name in COLUMNS[:-1]
            )
            rows.append(f"<tr>{cells}</tr>")
        table = (
            '<table class="dlsched-queue" style="table-layout:fixed;width:100%;'
            f'border-collapse:collapse"><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table>"
            if rows
            else f'<div style="{MUTED}">no queued or running jobs</div>'
        )
        cards = "".join(f"<div>{card.value}</div>" for card in self.cards.children)
        return (
            '<div class="dlsched-dashboard-snapshot">'
            f"<div>{self.summary.value}</div>"
            f'<div style="display:flex;flex-wrap:wrap;gap:6px">{cards}</div>'
            f"{table}"
            f'<div style="{MUTED};font-size:90%">a snapshot as of {as_of}: '
            "run the cell again for a live view</div></div>"
        )

    def _shown_rows(self) -> list[QueueRow]:
        return [
            row
            for row in self.rows.values()
            if row.widgets[0] in self.active_table.children
            or row.widgets[0] in self.recent_table.children
        ]

    def _queue_key(self) -> tuple[Any, ...]:
        return tuple(
            (r.job_id, r.state, r.texts.get("progress"), r.texts.get("priority"))
            for r in self._shown_rows()
        )

    def _publish(self, now: float) -> None:
        """Update the snapshot left in the notebook when the queue changed (now and then)."""
        if self.display_id is None or now - self._snapshot_at < SNAPSHOT_EVERY:
            return
        key = self._queue_key()
        if key == self._snapshot_key:
            return
        from IPython.display import update_display

        self._snapshot_key = key
        self._snapshot_at = now
        update_display(self._repr_mimebundle_(), raw=True, display_id=self.display_id)

    # -- actions ------------------------------------------------------------------------------
    def ask_cancel(self, job_id: str) -> None:
        """What a row's ✕ does: ask (as the sidebar does), and cancel on "Cancel job"."""
        row = self.rows.get(job_id)
        job = row.job if row is not None else None
        if job is None:
            job = self.scheduler.info(job_id)
        self.confirm.ask(job, lambda: self.cancel(job_id))

    def cancel(self, job_id: str) -> None:
        self._act(lambda: self.scheduler.cancel(job_id), f"cancel {job_id}")

    def change_priority(self, job_id: str, step: int) -> None:
        def act() -> None:
            job = self.scheduler.info(job_id)
            self.scheduler.set_priority(job_id, job.priority + step)

        self._act(act, f"priority of {job_id}")

    def show_log(self, job_id: str) -> None:
        self.log_job = None if self.log_job == job_id else job_id
        self._refresh_log()

    def _act(self, action: Any, what: str) -> None:
        try:
            action()
            self.message.value = ""
        except Exception as error:
            colour = fmt.COLOURS["failed"]
            self.message.value = (
                f'<span style="color:{colour}">{fmt.esc(what)}: {fmt.esc(error)}</span>'
            )
        self.refresh(force=True)

    def close(self) -> None:
        """Stop refreshing and close the panel (the notebook keeps a line saying so)."""
        self.closed = True
        refresher.remove(self)
        if self.display_id is not None:
            from IPython.display import update_display

            update_display(self._repr_mimebundle_(), raw=True, display_id=self.display_id)
        super().close()

    # -- refreshing ---------------------------------------------------------------------------
    def refresh(self, force: bool = False) -> bool:
        """Bring every part up to date (each at its own pace); False once closed."""
        # the refresh thread and button clicks (the kernel's main thread) both get here
        with self._refresh_lock:
            return self._refresh(force)

    def _refresh(self, force: bool) -> bool:
        if self.closed:
            return False
        now = time.time()
        if force or now - self._last["queue"] >= self.interval:
            self._last["queue"] = now
            jobs = self._refresh_queue(now)
            if force or now - self._last["pool"] >= max(2.0, self.interval):
                self._last["pool"] = now
                self._refresh_pool(jobs, now)
            if force or now - self._last["plot"] >= max(5.0, self.interval):
                self._last["plot"] = now
                self._refresh_plot(now)
            self._refresh_log()
            self._publish(now)
        return not self.closed

    def _refresh_queue(self, now: float) -> dict[str, JobInfo]:
        store = self.scheduler.store
        # close the gaps a cancel leaves in the line at once, not at the pool's next decision
        active = renumber(store.jobs(states=ACTIVE))
        finished = store.jobs(states=TERMINAL, newest_first=True, limit=self.recent)
        running = sorted((j for j in active if j.state == "running"), key=lambda j: -j.seq)
        waiting = sorted(
            (j for j in active if j.state in WAITING), key=lambda j: (j.position or 10**9, j.seq)
        )
        shown = {j.id for j in [*active, *finished]}
        # rows of jobs no longer shown wait, out of sight, for the next job that needs a row
        # (never closed: see QueueRow); there are never more than the tables once showed
        self._free_rows.extend(self.rows.pop(i) for i in [i for i in self.rows if i not in shown])
        for job in [*running, *waiting, *finished]:
            row = self.rows.get(job.id)
            if row is None:
                row = self._free_rows.pop() if self._free_rows else QueueRow(self, job.id)
                self.rows[job.id] = row
                row.job_id = job.id
            row.update(job, now)
        self._set_children(
            self.active_table,
            self.headers["active"],
            [self.rows[j.id] for j in [*running, *waiting]],
        )
        self._set_children(
            self.recent_table, self.headers["recent"], [self.rows[j.id] for j in finished]
        )
        self.recent_box.set_title(0, f"recent ({len(finished)})")
        self.empty.layout.display = "none" if active else ""
        if self.confirm.asking and self.confirm.job_id not in {j.id for j in active}:
            self.confirm.dismiss()  # it ended meanwhile: nothing left to cancel
        counts = store.count_jobs()
        status = self.scheduler.status()
        gpus = status["gpus"]
        sim = f" ({gpus['simulated']} simulated)" if gpus["simulated"] else ""
        self.summary.value = fmt.esc(
            f"GPU {gpus['busy']}/{gpus['total']}{sim} busy · {counts['running']} running · "
            f"{counts['queued'] + counts['preempted']} queued · policy {status['policy']}"
        )
        return {j.id: j for j in [*active, *finished]}

    @staticmethod
    def _set_children(table: w.GridBox, header: list[w.HTML], rows: list[QueueRow]) -> None:
        children = (*header, *(widget for row in rows for widget in row.widgets))
        if tuple(table.children) != children:
            table.children = children

    def _refresh_pool(self, jobs: dict[str, JobInfo], now: float) -> None:
        try:
            pool = self.scheduler.pool()
        except Exception as error:  # a cluster that does not answer must not stop the queue view
            self.message.value = fmt.esc(f"pool unavailable: {error}")
            return
        self.history.record(pool, now)
        missing = {g.jobs[i] for g in pool.gpus for i in range(len(g.jobs))} - set(jobs)
        if missing:
            jobs = {**jobs, **{j.id: j for j in self.scheduler.store.jobs(ids=sorted(missing))}}
        self.simulated_gpus = frozenset(g.index for g in pool.gpus if g.simulated)
        cards: list[w.Widget] = []
        for gpu in pool.gpus:
            card = self.gpu_cards.get(gpu.index)
            if card is None:
                card = self.gpu_cards[gpu.index] = w.HTML()
            value = gpu_card_html(gpu, jobs, self.history.latest(gpu.index))
            if card.value != value:
                card.value = value
            cards.append(card)
        self.host_card.value = host_card_html(pool, self.scheduler.cache_info())
        cards.append(self.host_card)
        if tuple(self.cards.children) != tuple(cards):
            self.cards.children = tuple(cards)

    def _refresh_plot(self, now: float) -> None:
        since = now - self.history_seconds
        lines, _ = self.history.series(self.scheduler.store, since)
        gpu_indices = sorted({*self.gpu_cards, *lines})
        if not gpu_indices:
            self.plot.layout.display = "none"
            return
        jobs = [
            j
            for j in self.scheduler.store.jobs(newest_first=True, limit=200)
            if (j.finished or now) >= since
        ]
        self.plot.value = render_png(
            lines, jobs, gpu_indices, since, now, simulated=self.simulated_gpus
        )

    def _refresh_log(self) -> None:
        if self.log_job is None:
            self.log_box.layout.display = "none"
            return
        from .jobview import read_log_tail

        handle = self.scheduler.get(self.log_job)
        self.log_title.value = f"<b>output of {fmt.esc(handle.id)}</b>"
        self.log_view.value = fmt.log_html(read_log_tail(handle, 30) or "(no output yet)")
        self.log_box.layout.display = ""


def dashboard(scheduler: Any, **options: Any) -> Dashboard:
    """The panel for ``scheduler``: ``dls.dashboard(refresh=1, history="30m", recent=20)``."""
    return Dashboard(scheduler, **options)
