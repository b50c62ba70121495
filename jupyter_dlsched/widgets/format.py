"""The words and colours of UI.md, as escaped HTML fragments for the widgets.

Everything user-controlled (job names, owners, notebooks, reasons, metric
names, log lines) goes through ``html.escape`` before it reaches an HTML
widget: a job named ``<img src=x onerror=alert(1)>`` shows as text.
"""

from __future__ import annotations

import html
from typing import Any

from ..vocab.schema import JobInfo
from ..vocab.units import format_size
from ..vocab.words import (  # noqa: F401  (used as fmt.*)
    kernel_idle_words,
    last_metric,
    notebook_words,
    owner_words,
    priority_words,
    progress_share,
    progress_words,
    ran_for,
    state_words,
    wait_words,
    waited_for,
)

# JupyterLab theme variables (so themes work), with fallbacks for front ends without them
MUTED = "color:var(--jp-ui-font-color2, #757575)"  # a style: text that says less
COLOURS = {
    "queued": "var(--jp-layout-color3, #bdbdbd)",
    "running": "var(--jp-brand-color1, #1976d2)",
    "succeeded": "var(--jp-success-color1, #388e3c)",
    "failed": "var(--jp-error-color1, #d32f2f)",
    "lost": "var(--jp-error-color1, #d32f2f)",
    "timeout": "var(--jp-error-color1, #d32f2f)",
    "cancelled": "var(--jp-ui-font-color2, #757575)",
    "preempted": "var(--jp-warn-color1, #f57c00)",
}
ICONS = {
    "queued": "⏳",
    "running": "▶",
    "succeeded": "✔",
    "failed": "✖",
    "lost": "✖",
    "timeout": "✖",
    "cancelled": "⊘",
    "preempted": "↻",
}
CHIP_WORDS = {"succeeded": "done", "lost": "failed", "timeout": "failed"}


def esc(value: object) -> str:
    """``html.escape`` of ``str(value)``, quotes included."""
    return html.escape(str(value), quote=True)


def chip(state: str) -> str:
    """A coloured state chip (HTML)."""
    colour = COLOURS.get(state, COLOURS["queued"])
    word = CHIP_WORDS.get(state, state)
    text_colour = "inherit" if state in ("queued", "cancelled") else "white"
    if state == "cancelled":
        return (
            f'<span class="dlsched-chip dlsched-{esc(state)}" style="border:1px solid {colour};'
            f'color:{colour};border-radius:8px;padding:0 6px">{esc(word)}</span>'
        )
    return (
        f'<span class="dlsched-chip dlsched-{esc(state)}" style="background:{colour};'
        f'color:{text_colour};border-radius:8px;padding:0 6px">{esc(word)}</span>'
    )


def coloured(state: str, text: str) -> str:
    """``text`` (already escaped) in the colour of ``state``."""
    colour = COLOURS.get(state, COLOURS["queued"])
    if state == "queued":
        colour = "var(--jp-ui-font-color1, inherit)"
    return f'<span class="dlsched-{esc(state)}" style="color:{colour}">{text}</span>'


def bar_html(share: float, colour: str = COLOURS["running"], width: int = 110) -> str:
    """A horizontal bar filled to ``share`` (0..1), drawn with CSS (it scales with the theme)."""
    share = max(0.0, min(1.0, share))
    return (
        f'<span class="dlsched-bar" style="display:inline-block;width:{width}px;height:9px;'
        "vertical-align:middle;background:var(--jp-layout-color3, #ddd);border-radius:2px;"
        f'overflow:hidden"><span style="display:block;height:100%;width:{share * 100:.1f}%;'
        f'background:{colour}"></span></span>'
    )


def spark_html(
    values: list[float], maximum: float = 100.0, colour: str = COLOURS["running"]
) -> str:
    """Recent readings as a row of thin columns (a sparkline), one per reading."""
    columns = []
    for v in values:
        share = 0.0 if maximum <= 0 else max(0.0, min(1.0, v / maximum))
        columns.append(
            f'<span style="display:inline-block;width:4px;margin-right:1px;'
            f"height:{max(1.0, share * 14):.0f}px;background:{colour};"
            'vertical-align:bottom"></span>'
        )
    return (
        '<span class="dlsched-spark" style="display:inline-flex;align-items:flex-end;'
        f'height:14px;vertical-align:middle">{"".join(columns)}</span>'
    )


def devices_words(job: JobInfo) -> str:
    """``"GPU 1"``, ``"GPUs 0,1"`` or ``"CPU"``."""
    devices = job.devices
    if not devices:
        return "CPU"
    if len(devices) == 1:
        return f"GPU {devices[0]}"
    return "GPUs " + ",".join(map(str, devices))


def owner_html(job: JobInfo) -> str:
    """``anna · sweep.ipynb`` with the notebook's full path as a tooltip (escaped HTML)."""
    words = owner_words(job)
    if notebook_words(job.origin) and job.origin != notebook_words(job.origin):
        return f'<span title="{esc(job.origin)}">{esc(words)}</span>'
    return esc(words)


def request_words(job: JobInfo) -> str:
    return job.request_text


def size(value: Any) -> str:
    return format_size(value)


def log_html(text: str) -> str:
    """Escaped output lines (callers pass only the last few, so no scrolling is needed)."""
    return f'<pre style="margin:0;white-space:pre-wrap">{esc(text)}</pre>'


#: The question every view asks before cancelling (the JupyterLab sidebar and cell line word
#: their dialog the same, labextension/src/steer.ts): the title, then the two answers.
CANCEL_KEEP = "Keep it"
CANCEL_CONFIRM = "Cancel job"


def cancel_question(job: JobInfo) -> tuple[str, str]:
    """``("Cancel job k3f9x2ab?", "resnet (running) will be stopped and will not be retried.")``"""
    return (
        f"Cancel job {job.id}?",
        f"{job.name} ({job.state}) will be stopped and will not be retried.",
    )


def live_usage_words(job: JobInfo) -> str:
    """``"cpu 180% · 1.2 GiB"``: what a running job uses now; ``""`` when nothing was measured.

    ``cpu_now`` is in percent of one core, ``rss_now`` in bytes; a ledger without these
    readings (or a job not running) has neither, and the words are left out.
    """
    if job.state != "running":
        return ""
    cpu = getattr(job, "cpu_now", None)
    rss = getattr(job, "rss_now", None)
    words = []
    if isinstance(cpu, int | float) and cpu == cpu:
        words.append(f"cpu {cpu:.0f}%")
    if isinstance(rss, int | float) and rss == rss and rss >= 0:
        words.append(format_size(rss))
    return " · ".join(words)
