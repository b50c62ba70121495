"""The dashboard's cards as HTML: one per GPU (its jobs, what NVML measured or what was
allocated on a simulated GPU, processes outside the scheduler) and one for the host (CPU,
RAM, the stage-in cache).

``dls.dashboard()`` refreshes them in place; ``%dlsched pool`` shows them once.
Every name in them is escaped.
"""

from __future__ import annotations

from typing import Any

from ..machine.inventory import GpuInfo, PoolInfo
from ..vocab.schema import JobInfo
from . import format as fmt
from .format import MUTED

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
        grant = f"{job.gpus_held:g} GPU" + (f" · {fmt.size(granted)}" if granted else "")
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
