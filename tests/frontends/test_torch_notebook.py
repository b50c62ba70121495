"""The PyTorch example notebook runs top to bottom: training, preemption, resume."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")

NOTEBOOK = Path(__file__).parent.parent.parent / "notebooks" / "torch_training.ipynb"


def test_the_torch_training_notebook_trains_is_preempted_and_resumes(home, tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the notebook's scratch queue lands here
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        timeout=300,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOK.parent)}},
    )
    client.execute()  # the notebook's last checks raise if anything went wrong

    outputs = "\n".join(
        out.get("text", "") for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs
    )
    assert "preempted 1 time(s)" in outputs
    assert "resumed from step" in outputs
    assert "checkpoint saved at step" in outputs
    assert any(
        "image/png" in out.get("data", {}) for cell in nb.cells for out in cell.get("outputs", [])
    )
