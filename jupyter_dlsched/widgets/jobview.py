"""``JobView(handle)``: one job's live status line, progress, output tail, result or error.

The line grows as the job moves (UI.md, "Live cell status")::

    ⏳ queued #2 — waiting for 1 GPU
    ▶ running on GPU 1 · 3m 12s · ███████░░░ 70% loss 0.31   [Cancel]
    ✔ done in 4m 40s · y, model returned
    ✖ failed: CUDA out of memory (limit 10 GiB)               [show traceback]

with the job's streamed output folded below it.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import ipywidgets as w

from ..client.default import default_scheduler
from ..client.handle import JobHandle
from ..vocab.history import usage_words
from ..vocab.schema import TERMINAL, WAITING, JobInfo
from ..vocab.tracebacks import user_traceback
from ..vocab.units import format_duration
from ..vocab.words import renumber
from . import format as fmt
from .confirm import Confirm
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
    """Only the user's frames of a job's traceback (see ``vocab.tracebacks.user_traceback``)."""
    return user_traceback(tb)


def value_html(value: Any) -> str:
    """A cell's value as a notebook would show it, as one piece of HTML.

    Its own HTML if it has one (a DataFrame's table), a PNG or JPEG picture (a figure),
    else its escaped ``repr``.
    """
    data: dict[str, Any] = {}
    try:
        from IPython.core.interactiveshell import InteractiveShell

        if InteractiveShell.initialized():
            formatter = InteractiveShell.instance().display_formatter
            if formatter is not None:
                data, _ = formatter.format(value)
    except Exception:  # a broken _repr_*_ must not cost the status line
        data = {}
    if isinstance(data.get("text/html"), str):
        return f"<div>{data['text/html']}</div>"
    for mime in ("image/png", "image/jpeg"):
        picture = data.get(mime)
        if isinstance(picture, bytes):
            picture = base64.b64encode(picture).decode("ascii")
        if isinstance(picture, str):
            return f'<div><img src="data:{mime};base64,{fmt.esc(picture)}"></div>'
    text = data.get("text/plain")
    if not isinstance(text, str):
        try:
            text = repr(value)
        except Exception as error:
            text = f"<{type(value).__name__}: repr failed: {error}>"
    return f'<pre style="margin:2px 0">{fmt.esc(text)}</pre>'


WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
#: The job's live line drawn by the JupyterLab extension from the REST API, with no kernel:
#: ``{"id": "k3f9x2ab"}``. JupyterLab prefers it to the widget, and shows the widget
#: through it while the widget's model lives in a kernel (see docs/notebooks.md).
JOB_MIME = "application/vnd.dlsched.job+json"
MUTED = "color:var(--jp-ui-font-color2, #757575)"


class JobView(w.VBox):
    """A live view of one job; updates itself in the background until the job ends.

    >>> h = dls.submit(train, 1e-3, gpus=1)  # doctest: +SKIP
    >>> dls.JobView(h).show()  # doctest: +SKIP

    Shown with ``show()`` it also leaves a plain HTML and text summary in the output,
    kept at the job's last state, and the job's id for JupyterLab (``JOB_MIME``): a page
    reloaded after the kernel restarted shows the line live from the server there, and
    the summary (with the command that brings the live line back) in other front ends,
    instead of a broken widget. Once the job has ended the output is only that summary,
    which needs no kernel at all.
    """

    def __init__(
        self,
        handle: JobHandle | str,
        *,
        on_finish: FinishHook | None = None,
        live: bool = True,
    ) -> None:
        if isinstance(handle, str):
            handle = default_scheduler().get(handle)
        self.handle = handle
        self.on_finish = on_finish
        self.info: JobInfo | None = None
        self.summary = ""
        self.finished = False
        self.display_id: str | None = None
        self._published: tuple[str, bool] | None = None  # what the shown summary says
        self._published_at = 0.0
        self._tail = ""
        self._traceback_text = ""
        self._value_html = ""
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
        # asks first, as every view does before it stops work (UI.md)
        self.cancel_button.on_click(lambda _: self.ask_cancel())
        self.confirm = Confirm()
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
        super().__init__([line, self.confirm, self.traceback, self.result_area, self.output])
        self.add_class("dlsched-jobview")
        self.refresh()
        if live and not self.finished:
            refresher.add(self)

    # -- showing ------------------------------------------------------------------------------
    def show(self) -> None:
        """Display the view in the notebook, with an id that lets it update its summary."""
        from IPython.display import display

        with self._refresh_lock:
            self.display_id = f"dlsched-{self.handle.id}-{uuid.uuid4().hex[:8]}"
            self._published = self._publish_key()
            self._published_at = time.time()
            display(self, display_id=self.display_id)

    def show_value(self, value: Any) -> None:
        """Show a cell's value under the status line (and in the summary left behind)."""
        self._value_html = value_html(value)
        self.result_area.append_display_data(value)

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any] | None:
        bundle: dict[str, Any] = {
            "text/plain": self.summary_text(),
            "text/html": self.summary_html(),
        }
        if not self.finished:
            # the live widget; front ends without its model (a restarted kernel) fall back
            live = super()._repr_mimebundle_(**kwargs) or {}
            if WIDGET_MIME in live:
                bundle[WIDGET_MIME] = live[WIDGET_MIME]
            # JupyterLab's live line, which outlasts the kernel
            bundle[JOB_MIME] = {"id": self.handle.id}
        elif self.info is not None and not self.info.inline:
            # once the job has ended the summary (with the cell's value) is what there is to
            # show; JupyterLab shows it with what an ended job can still do (Run again, log).
            # A cell run in its kernel's thread (--inline) cannot run again without it.
            bundle[JOB_MIME] = {"id": self.handle.id, "ended": True}
        return bundle

    def _publish_key(self) -> tuple[str, bool]:
        return (self.info.state if self.info else "", self.finished)

    def _publish(self) -> None:
        """Update the displayed output when the state changed (not on every tick: a front
        end redraws the widget on each update)."""
        if self.display_id is None or self._publish_key() == self._published:
            return
        from IPython.display import update_display

        self._published = self._publish_key()
        self._published_at = time.time()
        update_display(self, display_id=self.display_id)

    # -- the summary left in the notebook -------------------------------------------------------
    def _line_words(self, info: JobInfo, now: float) -> str:
        icon = fmt.ICONS.get(info.state, "•")
        if info.state == "running":
            words = (
                f"running on {fmt.devices_words(info)} · {format_duration(fmt.ran_for(info, now))}"
            )
        elif info.state == "succeeded":
            words = f"done in {format_duration(fmt.ran_for(info, now))}"
            if self.summary:
                words += f" · {self.summary}"
        else:
            words = fmt.state_words(info, now)
        return f"{icon} {words}"

    def summary_text(self) -> str:
        """The status line as plain text, with how to see it live again while it runs."""
        info = self.info
        if info is None:
            return f"job {self.handle.id}"
        line = f"{self._line_words(info, time.time())} · {info.name} · {info.id}"
        if not self.finished:
            line += f" (as of {self._as_of()}; %dlsched attach {info.id} shows it live)"
        return line

    def _as_of(self) -> str:
        return time.strftime("%H:%M:%S", time.localtime(self._published_at or time.time()))

    def summary_html(self) -> str:
        """The status line, value, traceback and output tail as plain HTML (no widgets)."""
        info = self.info
        if info is None:
            return fmt.esc(f"job {self.handle.id}")
        parts = [f"<div>{self._status_html(info, time.time())}</div>"]
        if not self.finished:
            parts.append(
                f'<div style="{MUTED};font-size:90%">as of {self._as_of()} · if this line '
                "has stopped moving (the kernel restarted), "
                f"<code>%dlsched attach {fmt.esc(info.id)}</code> shows it live again</div>"
            )
        if self._value_html:
            parts.append(self._value_html)
        if self._traceback_text:
            parts.append(
                "<details><summary>traceback</summary>"
                '<pre style="max-height:24em;overflow:auto;margin:0;'
                f'color:var(--jp-error-color1, #d32f2f)">{fmt.esc(self._traceback_text)}</pre>'
                "</details>"
            )
        if self._tail:
            parts.append(
                f"<details><summary>output (last {len(self._tail.splitlines())} lines)"
                f"</summary>{fmt.log_html(self._tail)}</details>"
            )
        used = usage_words(info) if self.finished else ""
        if used:
            parts.append(f'<div style="{MUTED};font-size:90%">used: {fmt.esc(used)}</div>')
        if self.finished and self._sent_names(info):
            parts.append(
                f'<div style="{MUTED};font-size:90%">after a kernel restart, '
                f"<code>%dlsched wait {fmt.esc(info.id)}</code> brings the names back</div>"
            )
        return f'<div class="dlsched-jobview-summary">{"".join(parts)}</div>'

    def _sent_names(self, info: JobInfo) -> bool:
        """Whether a scheduled cell sent ``--out`` names back (which a new kernel can fetch)."""
        if info.state != "succeeded" or info.kind != "cell" or info.inline:
            return False
        try:
            return bool(getattr(self.handle.result(timeout=0), "outputs", None))
        except Exception:
            return False

    # -- actions ------------------------------------------------------------------------------
    def ask_cancel(self) -> None:
        """What the Cancel button does: ask, and cancel on "Cancel job"."""
        info = self.info or self.handle.info()
        self.confirm.ask(info, self.cancel)

    def cancel(self) -> None:
        """Cancel the job (the answer "Cancel job" to the question of the Cancel button)."""
        self.confirm.dismiss()
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
        info = self._read()
        self.info = info
        now = time.time()
        if info.state in TERMINAL and not self.finished:
            self._finish(info)
        self.status.value = self._status_html(info, now)
        share = fmt.progress_share(info)
        show_bar = info.state == "running" and share is not None
        self.bar.layout.display = "" if show_bar else "none"
        if share is not None:
            self.bar.value = share
        # "70% loss 0.31 · cpu 180% · 1.2 GiB": how far it got, and what it uses now
        words = [fmt.progress_words(info), fmt.live_usage_words(info)]
        self.progress_label.value = (
            fmt.esc(" · ".join(w for w in words if w)) if info.state == "running" else ""
        )
        self.cancel_button.layout.display = "none" if info.state in TERMINAL else ""
        if info.state in TERMINAL and self.confirm.asking:
            self.confirm.dismiss()  # nothing left to cancel
        # the job runner prints a failure's traceback to the log with its own frames
        tail = user_traceback(read_log_tail(self.handle))
        if tail:
            self._tail = tail
            self.output.layout.display = ""
            self.output.set_title(0, f"output (last {len(tail.splitlines())} lines)")
            self.log_html.value = fmt.log_html(tail)
        self._publish()
        return info.state not in TERMINAL

    def _read(self) -> JobInfo:
        info = self.handle.info()
        if info.state in WAITING and info.position:
            # the ledger's place in line lags a cancel ahead of it until the pool decides again
            store = self.handle._scheduler.store
            line = renumber(store.jobs(states=list(WAITING)))
            info = next((j for j in line if j.id == info.id), info)
        return info

    def _status_html(self, info: JobInfo, now: float) -> str:
        who = f"{info.name} · {info.id}"
        return (
            f"{fmt.coloured(info.state, fmt.esc(self._line_words(info, now)))}"
            f' <span style="{MUTED}">&nbsp;{fmt.esc(who)}</span>'
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
            self._traceback_text = tb
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
