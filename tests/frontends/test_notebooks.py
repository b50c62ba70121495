"""The example notebooks, executed headless in a real kernel against a private state folder."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parent.parent.parent / "notebooks"
WIDGET = "application/vnd.jupyter.widget-view+json"


def run_notebook(name: str) -> nbformat.NotebookNode:
    """Execute a notebook; the kernel inherits DLSCHED_HOME and DLSCHED_SIMULATE_GPUS."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = NotebookClient(
        nb,
        timeout=240,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOKS)}},
    )
    client.execute()
    return nb


def tagged(nb: nbformat.NotebookNode, tag: str) -> nbformat.NotebookNode:
    return next(c for c in nb.cells if tag in c.get("metadata", {}).get("tags", []))


def text_of(cell: nbformat.NotebookNode) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            parts.append(out["text"])
        elif "data" in out:
            parts.append(out["data"].get("text/plain", ""))
    return "".join(parts)


def no_errors(nb: nbformat.NotebookNode) -> None:
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            assert out.get("output_type") != "error", (cell.source, out)
            assert out.get("name") != "stderr", (cell.source, out["text"])


@pytest.fixture
def simulated(home, monkeypatch):
    monkeypatch.setenv("DLSCHED_SIMULATE_GPUS", "2x16GiB")
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    return home


def test_quickstart_runs_jobs_by_priority_and_brings_results_back(simulated, monkeypatch):
    monkeypatch.setenv("QUICKSTART_LONG_SECONDS", "2")  # the long job, kept short here
    nb = run_notebook("quickstart.ipynb")
    no_errors(nb)
    assert "are SIMULATED" in text_of(tagged(nb, "setup"))
    results = text_of(tagged(nb, "results"))
    assert "started in this order: important-high, baseline-low" in results
    assert "'warm-up': 0.8179" in results
    assert "'mean': 2.25" in text_of(tagged(nb, "cell-result"))
    assert text_of(tagged(nb, "inline")).strip().endswith("20")
    queue = text_of(tagged(nb, "queue"))
    for name in ("warm-up", "baseline-low", "important-high", "cell-demo", "inline-demo"):
        assert name in queue
    assert "failed" not in queue
    widgets = [o for c in nb.cells for o in c.get("outputs", []) if WIDGET in o.get("data", {})]
    assert widgets  # the dashboard (left open: "Run all" ends with something to look at)
    # the status lines of ended scheduled cells are plain HTML now, kept when the kernel goes
    for tag in ("cell-demo", "inline"):
        status = next(
            o["data"] for o in tagged(nb, tag).outputs if "text/html" in o.get("data", {})
        )
        assert "done in" in status["text/html"] and WIDGET not in status
    assert "long-training" in text_of(tagged(nb, "long"))
    final = text_of(tagged(nb, "final"))
    assert "long-training" in final and "next-in-line" in final
    assert (simulated / "ledger.sqlite").exists()  # the kernel used the private state folder


def test_sweep_trains_every_config_and_plots_them(simulated):
    pytest.importorskip("torch")
    nb = run_notebook("sweep.ipynb")
    no_errors(nb)
    assert "are SIMULATED" in text_of(tagged(nb, "setup"))
    results = tagged(nb, "results")
    html = next(o["data"]["text/html"] for o in results.outputs if "text/html" in o.get("data", {}))
    assert html.count("<tr>") == 5 and "held-out accuracy" in html and "cpu" in html
    summary = text_of(results)
    assert "4 runs; best:" in summary
    best = float(summary.split("accuracy=")[1].split("%")[0])
    assert best > 80.0
    plot = tagged(nb, "plot")
    assert any("image/png" in o.get("data", {}) for o in plot.outputs)
