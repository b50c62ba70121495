"""The GPU check's logic, run as on a device but on simulated GPUs with CPU PyTorch: every
promise's check runs by name and passes, and the page gets one simulated row per check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
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


@pytest.mark.timeout(600)
def test_every_gpu_promise_has_a_check_that_passes_on_simulated_gpus(tmp_path: Path) -> None:
    page = tmp_path / "gpu.md"
    page.write_text((ROOT / "docs" / "gpu.md").read_text())
    out = tmp_path / "out.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DLSCHED_", "JUPYTER_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    run = subprocess.run(
        [
            sys.executable,
            "benchmarks/gpu_check.py",
            "--cpu",
            "--json",
            str(out),
            "--doc",
            str(page),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=580,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]

    checks = json.loads(out.read_text())["checks"]
    assert tuple(checks) == CHECKS
    assert {name: result for name, (result, _) in checks.items()} == dict.fromkeys(CHECKS, "ok")
    # the suspend check says why it shut the kernel down (no GPU to checkpoint here)
    assert "not suspended: " in checks["kernel-suspend"][1]
    # and, with the stand-in cuda-checkpoint, suspends the kernel and restores it at its next cell
    assert "toggled to ['checkpointed', 'running']" in checks["kernel-suspend"][1]

    simulated = page.read_text().split("<!-- simulated rows -->")[1]
    rows = [line for line in simulated.splitlines() if line.startswith("| `")]
    assert [row.split("|")[1].strip(" `") for row in rows] == list(CHECKS)
    assert all("| simulated: ok |" in row for row in rows)
    # the device rows are the page's own until a run on a GPU writes them
    device = page.read_text().split("<!-- device rows -->")[1].split("<!-- end device rows")[0]
    assert (
        device
        == (ROOT / "docs" / "gpu.md")
        .read_text()
        .split("<!-- device rows -->")[1]
        .split("<!-- end device rows")[0]
    )
