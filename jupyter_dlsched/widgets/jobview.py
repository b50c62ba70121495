"""``JobView(handle)``: one job's live status line, progress, output tail, result or error.

The line grows as the job moves (UI.md, "Live cell status")::

    ⏳ queued #2 — waiting for 1 GPU
    ▶ running on GPU 1 · 3m 12s · ███████░░░ 70% loss 0.31   [Cancel]
    ✔ done in 4m 40s · y, model returned
    ✖ failed: CUDA out of memory (limit 10 GiB)               [show traceback]

with the job's streamed output folded below it.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import ipywidgets as w

from ..handle import JobHandle
from ..store import TERMINAL, JobInfo
from ..units import format_duration
from . import format as fmt
from .live import refresher

LOG_TAIL_LINES = 15
LOG_TAIL_BYTES = 64 * 1024

# what to do when the job has ended: returns the words after "done in 4m 40s · "
FinishHook = Callable[[JobHandle, JobInfo], str]


def read_log_tail(handle: JobHandle, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a job's output, reading only the end of the file."""
    path = handle._scheduler.log_path(handle.id)
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            end = f.tell()
            f.seek(max(0, end - LOG_TAIL_BYTES))
            data = f.read()
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    if end > LOG_TAIL_BYTES:
        text = text.split("\n", 1)[-1]
    # a carriage return redraws a line (progress bars): keep what the terminal would show
    shown = [line.rsplit("\r", 1)[-1] for line in text.rstrip("\n").split("\n")]
    return "\n".join(shown[-lines:]) if text else ""


def remote_traceback(handle: JobHandle) -> str:
    """The traceback the job process recorded, or ''."""
    try:
        data = handle._scheduler.store.read_spool_file(handle.id, "error.json")
        return str(json.loads(data or b"{}").get("traceback") or "")
    except (OSError, ValueError):
        return ""


def trim_traceback(tb: str) -> str:
    """Drop the scheduler's own frames above a scheduled cell's first frame."""
    lines = tb.splitlines()
    for i, line in enumerate(lines):
        if line.lstrip().startswith('File "<scheduled cell'):
            return "\n".join([lines[0], *lines[i:]])
    return tb


class JobView(w.VBox):
    """A live view of one job; updates itself in the background until the job ends.

    >>> h = dls.submit(train, 1e-3, gpus=1)  # doctest: +SKIP
    >>> dls.JobView(h)  # doctest: +SKIP
    """

    def __init__(
        self,
        handle: JobHandle | str,
        *,
        on_finish: FinishHook | None = None,
        live: bool = True,
    ) -> None:
        if isinstance(handle, str):
            from .. import get

            handle = get(handle)
        self.handle = handle
        self.on_finish = on_finish
        self.info: JobInfo | None = None
        self.summary = ""
        self.finished = False
        self._finish_lock = threading.Lock()
        self._refresh_lock = threading.RLock()
        self.status = w.HTML()
        self.bar = w.FloatProgress(
            value=0.0, min=0.0, max=1.0, layout=w.Layout(width="140px", display="none")
        )
        self.progress_label = w.HTML()
        self.cancel_button = w.Button(
            description="Cancel", tooltip="Cancel this job", layout=w.Layout(width="auto")
        )
        self.cancel_button.on_click(lambda _: self.cancel())
        self.traceback_button = w.ToggleButton(
            description="show traceback", layout=w.Layout(width="auto", display="none")
        )
        self.traceback = w.HTML(layout=w.Layout(display="none"))
        self.traceback_button.observe(self._toggle_traceback, names="value")
        self.log_html = w.HTML()
        self.output = w.Accordion(children=[self.log_html], selected_index=None)
        self.output.set_title(0, "output")
        self.output.layout.display = "none"
        self.result_area = w.Output()
        line = w.HBox(
            [self.status, self.bar, self.progress_label, self.cancel_button, self.traceback_button],
            layout=w.Layout(align_items="center", flex_flow="row wrap"),
        )
        super().__init__([line, self.traceback, self.result_area, self.output])
        self.add_class("dlsched-jobview")
        self.refresh()
        if live and not self.finished:
            refresher.add(self)

    # -- actions ------------------------------------------------------------------------------
    def cancel(self) -> None:
        """What the Cancel button does."""
        self.cancel_button.disabled = True
        self.cancel_button.description = "Cancelling…"
        try:
            self.handle.cancel()
        except Exception as error:  # the job may be gone from the ledger
            self.cancel_button.description = "Cancel"
            self.cancel_button.disabled = False
            self.progress_label.value = fmt.esc(f"cancel failed: {error}")
        self.refresh()

    def close(self) -> None:
        refresher.remove(self)
        super().close()

    def _toggle_traceback(self, change: dict[str, Any]) -> None:
        self.traceback.layout.display = "" if change["new"] else "none"
        self.traceback_button.description = "hide traceback" if change["new"] else "show traceback"

    # -- refreshing ---------------------------------------------------------------------------
    def refresh(self) -> bool:
        """Read the ledger and update the widgets; False once the job has ended."""
        # the refresh thread and the Cancel button (the kernel's main thread) both get here
        with self._refresh_lock:
            return self._refresh()

    def _refresh(self) -> bool:
        info = self.handle.info()
        self.info = info
        now = time.time()
        if info.state in TERMINAL and not self.finished:
            self._finish(info)
        self.status.value = self._status_html(info, now)
        share = fmt.fraction(info)
        show_bar = info.state == "running" and share is not None
        self.bar.layout.display = "" if show_bar else "none"
        if share is not None:
            self.bar.value = share
        self.progress_label.value = (
            fmt.esc(fmt.progress_words(info)) if info.state == "running" else ""
        )
        self.cancel_button.layout.display = "none" if info.state in TERMINAL else ""
        tail = read_log_tail(self.handle)
        if tail:
            self.output.layout.display = ""
            self.output.set_title(0, f"output (last {len(tail.splitlines())} lines)")
            self.log_html.value = fmt.log_html(tail)
        return info.state not in TERMINAL

    def _status_html(self, info: JobInfo, now: float) -> str:
        icon = fmt.ICONS.get(info.state, "•")
        if info.state == "queued":
            words = "queued"
            if info.position:
                words += f" #{info.position}"
            if info.waiting:
                words += f" — {info.waiting}"
        elif info.state == "running":
            words = (
                f"running on {fmt.devices_words(info)} · {format_duration(fmt.ran_for(info, now))}"
            )
        elif info.state == "succeeded":
            words = f"done in {format_duration(fmt.ran_for(info, now))}"
            if self.summary:
                words += f" · {self.summary}"
        else:
            words = fmt.state_words(info, now)
        who = f"{info.name} · {info.id}"
        return (
            f"{fmt.coloured(info.state, fmt.esc(f'{icon} {words}'))}"
            f' <span style="color:var(--jp-ui-font-color2, #757575)">'
            f"&nbsp;{fmt.esc(who)}</span>"
        )

    def _finish(self, info: JobInfo) -> None:
        with self._finish_lock:
            if self.finished:
                return
            self.finished = True
        if self.on_finish is not None:
            try:
                self.summary = self.on_finish(self.handle, info)
            except Exception as error:
                self.summary = f"could not bring the result back: {error}"
        elif info.state == "succeeded":
            self.summary = self._result_summary()
        if info.state in ("failed", "lost", "timeout"):
            tb = trim_traceback(remote_traceback(self.handle)) or info.reason
            self.traceback.value = (
                '<pre style="max-height:24em;overflow:auto;margin:0;'
                f'color:var(--jp-error-color1, #d32f2f)">{fmt.esc(tb)}</pre>'
            )
            self.traceback_button.layout.display = ""

    def _result_summary(self) -> str:
        try:
            value = self.handle.result(timeout=0)
        except Exception as error:
            return f"result unavailable: {error}"
        text = repr(value)
        return f"returned {text[:77] + '...' if len(text) > 80 else text}"

    def __repr__(self) -> str:
        info = self.info
        return f"<JobView {self.handle.id} {info.state if info else ''}>"
