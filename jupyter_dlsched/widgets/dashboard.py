"""``dls.dashboard()``: the pool (a card per GPU), the queue table and utilisation history.

The panel refreshes itself from a background thread and stops when closed
(the ✕ button or ``.close()``). Everything user-controlled is escaped.
"""

from __future__ import annotations

import threading
import time
import uuid
from html import unescape
from typing import Any

import ipywidgets as w

from ..pool import GpuInfo, PoolInfo
from ..schema import ACTIVE, TERMINAL, WAITING, JobInfo
from ..units import format_duration, parse_duration
from ..words import renumber
from . import format as fmt
from .confirm import Confirm
from .history import History, render_png
from .live import refresher

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
MUTED = "color:var(--jp-ui-font-color2, #757575)"
ELLIPSIS = (
    "white-space:nowrap;overflow:hidden;text-overflow:ellipsis;padding:1px 4px;text-align:left"
)
HEADER = (
    '<div style="white-space:nowrap;overflow:hidden;text-overflow:ellipsis" title="{0}">'
    "<b>{0}</b></div>"
)
CELL_LAYOUT = {"overflow": "hidden", "min_width": "0", "width": "auto"}
BUTTON_LAYOUT = {"width": "28px", "padding": "0", "margin": "1px"}
#: The dashboard's output for the JupyterLab extension, beside the live widget and a plain
#: snapshot: the extension shows the widget while its kernel holds it, and the snapshot with
#: a note once the kernel restarted or the page was reloaded without it (docs/notebooks.md).
DASHBOARD_MIME = "application/vnd.dlsched.dashboard+json"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
#: Seconds between two updates of the saved snapshot (each marks the notebook modified).
SNAPSHOT_EVERY = 5.0


CARD_STYLE = (
    "border:1px solid var(--jp-border-color2, #ccc);border-radius:4px;padding:4px 8px;"
    "font-family:var(--jp-code-font-family, monospace);font-size:12px;line-height:1.6;"
    # a long job name wraps inside its card rather than pushing the card past the notebook
    "max-width:100%;box-sizing:border-box;overflow-wrap:anywhere"
)


def _gpu_share(job: JobInfo) -> float:
    """How much of each of its GPUs a job holds: a fraction, or all of each one."""
    return job.gpus if 0 < job.gpus < 1 else 1.0


def _granted_mem(job: JobInfo, index: int) -> int | None:
    if job.placement and index in job.placement.gpus:
        at = list(job.placement.gpus).index(index)
        if at < len(job.placement.gpu_mem):
            return int(job.placement.gpu_mem[at])
    return None


def gpu_card_html(gpu: GpuInfo, jobs: dict[str, JobInfo], recent_util: list[float]) -> str:
    """The GPU card of UI.md as HTML (every name escaped).

    A real GPU shows what NVML measured (utilisation, memory in use). A simulated one has
    nothing to measure: it shows what the scheduler allocated, labelled as allocated.
    """
    on_gpu = [jobs[j] for j in gpu.jobs if j in jobs]
    colour = fmt.COLOURS["running"]
    sim = f' <span style="{MUTED}">[simulated]</span>' if gpu.simulated else ""
    lines = [
        f"<b>GPU {gpu.index}</b>&nbsp; {fmt.esc(gpu.name)} · "
        f"{fmt.esc(fmt.size(gpu.mem_total))}{sim}"
    ]
    if gpu.simulated:
        held = min(1.0, sum(_gpu_share(j) for j in on_gpu))
        mem = sum(_granted_mem(j, gpu.index) or 0 for j in on_gpu)
        mem_share = mem / gpu.mem_total if gpu.mem_total else 0.0
        lines.append(
            f"allocated {fmt.bar_html(held, colour, 80)} {held * 100:.0f}% &nbsp; "
            f"mem allocated {fmt.bar_html(mem_share, colour, 80)} "
            f"{fmt.esc(fmt.size(mem))} / {fmt.esc(fmt.size(gpu.mem_total))}"
        )
        lines.append(f'<span style="{MUTED}">no utilisation readings: a simulated GPU</span>')
    else:
        util_text = "–" if gpu.util is None else f"{float(gpu.util):.0f}%"
        spark = fmt.spark_html(recent_util, colour=colour) if recent_util else ""
        mem_share = gpu.mem_used / gpu.mem_total if gpu.mem_total else 0.0
        lines.append(
            f"util {spark} {fmt.bar_html(float(gpu.util or 0) / 100, colour, 80)} "
            f"{fmt.esc(util_text)} &nbsp; mem {fmt.bar_html(mem_share, colour, 80)} "
            f"{fmt.esc(fmt.size(gpu.mem_used))} / {fmt.esc(fmt.size(gpu.mem_total))}"
        )
    entries: list[str] = []
    for job_id in gpu.jobs:
        job = jobs.get(job_id)
        if job is None:
            entries.append(fmt.esc(job_id))
            continue
        granted = _granted_mem(job, gpu.index)
        grant = f"{job.gpus:g} GPU" + (f" · {fmt.size(granted)}" if granted else "")
        entries.append(
            f"{fmt.coloured(job.state, fmt.esc(job.name))} "
            f'<span style="{MUTED}">({fmt.owner_html(job)})</span> '
            f"{fmt.esc(grant)}"
        )
    outside = [p for p in gpu.processes if p.job_id is None]
    if outside:
        users = sorted({p.user or "unknown user" for p in outside})
        commands = "; ".join(f"{p.user or '?'} pid {p.pid}: {p.command or '?'}" for p in outside)
        entries.append(
            f'<span title="{fmt.esc(commands)}">'
            f"{len(outside)} process{'es' if len(outside) != 1 else ''} outside the scheduler "
            f"{fmt.esc(fmt.size(gpu.external_mem))} · {fmt.esc(', '.join(users))}</span>"
        )
    for n, entry in enumerate(entries):
        lines.append(("└─ " if n == len(entries) - 1 else "├─ ") + entry)
    if not entries:
        lines.append(f'<span style="{MUTED}">idle</span>')
    return f'<div class="dlsched-gpu" style="{CARD_STYLE}">' + "<br>".join(lines) + "</div>"


def host_card_html(pool: PoolInfo, cache: dict[str, Any] | None = None) -> str:
    colour = fmt.COLOURS["running"]
    mem_share = pool.mem_used / pool.mem_total if pool.mem_total else 0.0
    gpu_note = "" if pool.gpus else f"<br>no GPUs ({fmt.esc(pool.gpu_error or 'none found')})"
    return (
        f'<div class="dlsched-host" style="{CARD_STYLE}">'
        f"<b>CPU</b> {pool.cpus} cores {fmt.bar_html(pool.cpu_percent / 100, colour, 80)} "
        f"{pool.cpu_percent:.0f}%<br>"
        f"<b>RAM</b> {fmt.bar_html(mem_share, colour, 80)} {fmt.esc(fmt.size(pool.mem_used))} / "
        f"{fmt.esc(fmt.size(pool.mem_total))}{gpu_note}{cache_html(cache)}</div>"
    )


def cache_html(cache: dict[str, Any] | None) -> str:
    """The stage-in cache in one line (nothing until it has been used)."""
    if not cache or not (cache.get("entries") or cache.get("staging") or cache.get("misses")):
        return ""
    share = cache["bytes"] / cache["max_bytes"] if cache.get("max_bytes") else 0.0
    staging = len(cache.get("staging") or [])
    words = [
        f"{cache['entries']} entr{'y' if cache['entries'] == 1 else 'ies'}",
        f"{cache.get('hits', 0)} hits",
    ]
    if staging:
        words.append(f"staging {staging}")
    return (
        f"<br><b>data cache</b> {fmt.bar_html(share, fmt.COLOURS['running'], 80)} "
        f"{fmt.esc(fmt.size(cache['bytes']))} / {fmt.esc(fmt.size(cache.get('max_bytes')))}"
        f" · {fmt.esc(' · '.join(words))}"
    )


def cell_html(html: str, tooltip: str) -> str:
    """One table cell: one line per row, cut with an ellipsis, the whole text on hover."""
    return (
        '<div style="white-space:nowrap;overflow:hidden;text-overflow:ellipsis"'
        f' title="{fmt.esc(tooltip)}">{html}</div>'
    )


class QueueRow:
    """The widgets of one job's row; ``update(job)`` changes only what changed."""

    def __init__(self, dashboard: Dashboard, job_id: str) -> None:
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
        self.cancel_button.on_click(lambda _: dashboard.ask_cancel(job_id))
        self.up_button.on_click(lambda _: dashboard.change_priority(job_id, +PRIORITY_STEP))
        self.down_button.on_click(lambda _: dashboard.change_priority(job_id, -PRIORITY_STEP))
        self.log_button.on_click(lambda _: dashboard.show_log(job_id))
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
        share = fmt.fraction(job)
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
        for job_id in [i for i in self.rows if i not in shown]:
            del self.rows[job_id]
        for job in [*running, *waiting, *finished]:
            row = self.rows.get(job.id)
            if row is None:
                row = self.rows[job.id] = QueueRow(self, job.id)
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
