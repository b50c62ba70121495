"""Where each kind of pool's big buffers go (``client/data.py``): no Scheduler reaches a
shared pool's service with Ray or SLURM jobs, so none of its jobs' data goes in band."""

from __future__ import annotations

from pathlib import Path

import pytest

from jupyter_dlsched.client.data import data_folder
from jupyter_dlsched.client.scheduler import Scheduler
from jupyter_dlsched.store import buffers
from jupyter_dlsched.vocab.errors import SpecError


@pytest.mark.parametrize("backend", ["ray", "slurm"])
def test_a_shared_pools_service_is_refused_ray_and_slurm_jobs(tmp_path: Path, backend: str):
    socket = tmp_path / "service.sock"  # never reached: refused before any connection
    with pytest.raises(SpecError, match="a shared pool runs local jobs only"):
        Scheduler(home=tmp_path / "h", backend=backend, socket_path=str(socket))


def test_a_pool_of_ones_own_writes_its_buffers_where_its_jobs_map_them(tmp_path: Path):
    home = tmp_path / "h"
    assert data_folder(home, shared=False, backend="local") == buffers.buffer_folder(home)
    assert data_folder(home, shared=True, backend="local") == buffers.buffer_folder(home)
    assert data_folder(home, shared=False, backend="ray") == buffers.buffer_folder(home)
    slurm = data_folder(home, shared=False, backend="slurm")
    assert slurm == buffers.buffer_folder(home, in_home=True)
    assert slurm is not None and slurm.is_relative_to(home)  # the nodes see the state folder
