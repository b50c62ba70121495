"""The JupyterLab sidebar of a server whose pool is a real (single-node) SLURM cluster."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from slurm_cluster import SKIP_WITHOUT_SLURM, running_cluster

from jupyter_dlsched.client.scheduler import Scheduler

from .conftest import start_lab, stop_lab
from .test_sidebar import open_lab, open_sidebar, row

pytestmark = SKIP_WITHOUT_SLURM
pytest.importorskip("submitit")


@pytest.fixture(scope="module")
def cluster() -> Iterator[SimpleNamespace]:
    with running_cluster() as started:
        yield started


def test_the_sidebar_lists_a_slurm_job_on_the_partitions_gpus(
    cluster: SimpleNamespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, browser_context: Any
) -> None:
    monkeypatch.setenv("DLSCHED_BACKEND", "slurm")  # the server's pool is the partition
    lab = start_lab(tmp_path / "lab")
    try:
        with Scheduler(home=lab.home, backend="slurm", poll=0.5) as s:
            job = s.submit_command(["sleep", "120"], gpus=1, name="on-slurm")
            page = browser_context.new_page()
            open_lab(page, lab)
            open_sidebar(page)
            page.wait_for_selector(row(job.id, "running"), timeout=60_000)
            assert "on-slurm" in page.inner_text(row(job.id, "running"))
            cards = page.query_selector_all("#jupyter-dlsched-sidebar .jp-dlsched-gpu")
            assert len(cards) == 2, "the partition's two GPUs, from sinfo"
            s.cancel(job.id)
    finally:
        stop_lab(lab)
