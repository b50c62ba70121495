"""The GPU check's report: every promise by name, each check's rows, and the page they go
into (``docs/gpu.md``: one row per check, device rows and simulated rows)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: every promise the check covers, by name, in the order it runs them
CHECKS = (
    "inventory",
    "throughput",
    "sharing",
    "memory",
    "kernel-lease",
    "kernel-restart",
    "kernel-suspend",
    "warm-start-cuda",
    "ddp-nccl",
    "outside-process",
)


class Report:
    """Each check's rows (what was measured, the result, the target, ok/FAIL), by name."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str, str, str]] = []
        self.skipped: dict[str, str] = {}
        self.data: dict[str, Any] = {}

    def add(
        self, check: str, what: str, result: str, target: str = "", ok: bool | None = None
    ) -> None:
        assert check in CHECKS, check
        verdict = "" if ok is None else ("ok" if ok else "FAIL")
        self.rows.append((check, what, result, target, verdict))
        print(f"  {what}: {result} {('[' + verdict + ']') if verdict else ''}", flush=True)

    def skip(self, check: str, why: str) -> None:
        self.skipped[check] = why
        print(f"  {check}: skipped: {why}", flush=True)

    def table(self) -> str:
        header = ("check", "what", "result", "target", "")
        lines = ["| " + " | ".join(header) + " |", "|---|---|---|---|---|"]
        lines += ["| " + " | ".join(row) + " |" for row in self.rows]
        lines += [f"| {name} | skipped | {why} | | |" for name, why in self.skipped.items()]
        return "\n".join(lines)

    def verdict(self, check: str) -> tuple[str, str]:
        """One check's result (``ok``, ``FAIL``, ``skipped: why``, ``not run``) and figure."""
        rows = [row for row in self.rows if row[0] == check]
        figure = "; ".join(f"{what}: {result}" for _, what, result, _, _ in rows)
        if any(row[4] == "FAIL" for row in rows):
            return "FAIL", figure
        if check in self.skipped:
            return f"skipped: {self.skipped[check]}", figure
        if rows and all(row[4] == "ok" for row in rows if row[4]):
            return ("ok" if any(row[4] for row in rows) else "measured"), figure
        return "not run", figure

    def failed(self) -> list[str]:
        return [name for name in CHECKS if self.verdict(name)[0] in ("FAIL", "not run")]


def guarded(report: Report, check: str, run: Any, *args: Any) -> Any:
    """Run one check; an exception is that check's failure, and the others still run."""
    try:
        return run(report, *args)
    except Exception as error:  # a check that crashes failed; say how, then go on
        report.add(check, "the check itself", f"{type(error).__name__}: {error}"[:300], ok=False)
        return None


def machine(cpu: bool) -> tuple[str, str]:
    """The device and driver a run's rows name."""
    import torch

    if cpu:
        return "simulated 1x16GiB (CPU)", f"none (torch {torch.__version__}, CPU)"
    from jupyter_dlsched.machine import nvml

    nv = nvml.module()
    count = nv.nvmlDeviceGetCount()
    name = nv.nvmlDeviceGetName(nv.nvmlDeviceGetHandleByIndex(0))
    name = name.decode() if isinstance(name, bytes) else name
    version = nv.nvmlSystemGetDriverVersion()
    version = version.decode() if isinstance(version, bytes) else version
    return f"{count}x {name}", f"{version} (torch {torch.__version__}, CUDA {torch.version.cuda})"


DEVICE_ROWS = ("<!-- device rows -->", "<!-- end device rows -->")
SIMULATED_ROWS = ("<!-- simulated rows -->", "<!-- end simulated rows -->")


def render(doc: Path, report: Report, cpu: bool, device: str, driver: str, date: str) -> None:
    """Write this run's rows, one per check, into ``doc`` between its markers (device rows
    for a run on a GPU, simulated rows for ``--cpu``); the other table is left as it is."""
    begin, end = SIMULATED_ROWS if cpu else DEVICE_ROWS
    lines = ["| check | device | driver | date | result | figure |", "|---|---|---|---|---|---|"]
    for name in CHECKS:
        result, figure = report.verdict(name)
        if cpu:
            result = f"simulated: {result}"
        figure = figure.replace("|", "/").replace("\n", " ")
        lines.append(f"| `{name}` | {device} | {driver} | {date} | {result} | {figure} |")
    text = doc.read_text()
    head, found, rest = text.partition(begin)
    _, found_end, tail = rest.partition(end)
    if not (found and found_end):
        raise SystemExit(f"{doc} lacks the markers {begin} ... {end}")
    doc.write_text(head + begin + "\n" + "\n".join(lines) + "\n" + end + tail)
