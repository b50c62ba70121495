"""A DDP elastic job (gloo on CPU, two simulated GPUs) resized 2 → 1 → 2 trains the same
model as a rigid run: the global batch is kept by gradient accumulation."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import jupyter_dlsched.torch as dlt  # noqa: E402
from jupyter_dlsched.client.scheduler import Scheduler  # noqa: E402
from tests.conftest import wait_for  # noqa: E402

GLOBAL, PER_GPU, LR = 8, 2, 0.05


def batch(step: int, chunk: int):
    """Chunk ``chunk`` (of 4) of the global batch of ``step``: the same on every size."""
    g = torch.Generator().manual_seed(1000 * step + chunk)
    x = torch.randn(PER_GPU, 4, generator=g)
    return x, x.sum(dim=1, keepdim=True) * 0.5


def elastic_ddp(total: int, out_dir: str):
    """Trains until the test has seen the resizes it waits for (``release`` in ``out_dir``),
    at most ``total`` steps: a job that ran a fixed number of steps could end, on a loaded
    machine, before its shrink came."""
    import time

    import torch.distributed as dist

    import jupyter_dlsched.torch as dlt

    info = dlt.init_process_group()
    torch.manual_seed(0)
    model = dlt.ddp(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    ckpt = dlt.Checkpoint(model=model, optimizer=opt)
    micro = dlt.accumulation_steps(GLOBAL, PER_GPU)
    release = Path(out_dir, "release")
    with open(Path(out_dir, f"steps-rank{info.rank}.log"), "a") as log:
        for step in ckpt.steps(total):
            opt.zero_grad()
            for m in range(micro):
                x, y = batch(step, m * info.world_size + info.rank)
                loss = torch.nn.functional.mse_loss(model(x), y) / micro
                loss.backward()
            opt.step()
            log.write(f"{step} {info.world_size}\n")
            log.flush()
            # every rank stops after the same step: rank 0 tells whether the test released it
            stop = torch.tensor([float(info.rank == 0 and release.exists())])
            dist.broadcast(stop, 0)
            if stop.item():
                break
            time.sleep(0.1)
    dlt.destroy_process_group()
    return model.module.weight.detach().tolist()


def rigid_reference(total: int) -> torch.Tensor:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(total):
        opt.zero_grad()
        for chunk in range(GLOBAL // PER_GPU):
            x, y = batch(step, chunk)
            (torch.nn.functional.mse_loss(model(x), y) / (GLOBAL // PER_GPU)).backward()
        opt.step()
    return model.weight.detach()


def hold_until(path: str) -> None:
    import time
    from pathlib import Path

    while not Path(path).exists():
        time.sleep(0.05)


def world_sizes(log: Path) -> list[int]:
    """The world size of each step rank 0 trained, in order."""
    return [int(line.split()[1]) for line in log.read_text().splitlines()] if log.exists() else []


def sizes_seen(log: Path) -> list[int]:
    """The world sizes rank 0 trained at, each change once: ``[2, 1, 2]``."""
    sizes = world_sizes(log)
    return sizes[:1] + [b for a, b in zip(sizes, sizes[1:], strict=False) if a != b]


def test_a_ddp_elastic_job_resized_2_1_2_ends_with_the_rigid_runs_model(home, tmp_path):
    with Scheduler(home, lease_ttl=5, grace=20, resize_every=1, resize_cost=0.1) as s:
        job = s.submit(
            elastic_ddp,
            2000,
            str(tmp_path),
            gpus="1:2",
            cpus=0.5,
            distributed=True,
            preemptible=True,
        )
        log0 = tmp_path / "steps-rank0.log"
        wait_for(lambda: log0.exists() and log0.read_text().count("\n") >= 10, 90)
        # the rigid job holds its GPU until the shrunk run has trained a few steps: a fixed
        # hold could end, on a loaded machine, before that run got past its start
        done = tmp_path / "rigid-done"
        rigid = s.submit(hold_until, str(done), gpus=1, cpus=0.25)
        wait_for(
            lambda: sizes_seen(log0) == [2, 1] and world_sizes(log0)[-5:] == [1] * 5,
            120,
            what=lambda: (sizes_seen(log0), rigid.info()),
        )
        done.touch()
        rigid.result(timeout=120)
        # grown back, and a few steps at two again
        wait_for(
            lambda: sizes_seen(log0) == [2, 1, 2] and world_sizes(log0)[-5:] == [2] * 5,
            120,
            what=lambda: sizes_seen(log0),
        )
        (tmp_path / "release").touch()
        weight = job.result(timeout=240)
    runs = [line.split() for line in log0.read_text().splitlines()]
    total = len(runs)
    assert [int(step) for step, _ in runs] == list(range(total))  # none lost or repeated
    assert sizes_seen(log0) == [2, 1, 2]
    assert torch.allclose(torch.tensor(weight), rigid_reference(total), atol=1e-5)
    assert dlt.accumulation_steps(GLOBAL, PER_GPU, replicas=1) == 4
