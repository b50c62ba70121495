"""PyTorch jobs through the real scheduler: device, DDP on gloo, checkpoint and resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

torch = pytest.importorskip("torch")

import jupyter_dlsched as dls  # noqa: E402
import jupyter_dlsched.torch as dlt  # noqa: E402
from jupyter_dlsched.vocab.errors import DlschedError  # noqa: E402


def wait_for(condition, timeout=60.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


# -- functions that run as jobs --------------------------------------------------------------


def job_device():
    dev = dlt.device()
    return {
        "device": str(dev),
        "visible": os.environ["CUDA_VISIBLE_DEVICES"],
        "grants": dlt.memory_grants(),
    }


def ddp_step(out_dir):
    """All-reduce the ranks' numbers, then one DDP backward on data that differs by rank."""
    info = dlt.init_process_group()
    total = torch.tensor([float(info.rank + 1)])
    torch.distributed.all_reduce(total)
    torch.manual_seed(0)
    model = dlt.ddp(torch.nn.Linear(4, 1))
    x = torch.full((8, 4), float(info.rank + 1))
    model(x).sum().backward()
    report = {
        "rank": info.rank,
        "world_size": info.world_size,
        "backend": info.backend,
        "device": str(info.device),
        "sum": total.item(),
        "grad": model.module.weight.grad.tolist(),
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    Path(out_dir, f"rank{info.rank}.json").write_text(json.dumps(report))
    dlt.destroy_process_group()
    return report


def rank_one_fails(out_dir):
    info = dlt.init_process_group()
    Path(out_dir, f"pid{info.rank}").write_text(str(os.getpid()))
    if info.rank == 1:
        raise RuntimeError("rank 1 diverged")
    time.sleep(300)  # only the supervisor can end this rank early
    return "rank 0 finished"


def train_with_checkpoint(total, stall_at, out_dir, path=None):
    """A deterministic regression; on its first run it stalls at ``stall_at`` until asked to stop."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1, dtype=torch.float64)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ckpt = dlt.Checkpoint(path, model=model, optimizer=opt)
    with open(Path(out_dir, "steps.log"), "a") as log:
        for step in ckpt.steps(total):
            x = torch.randn(16, 8, dtype=torch.float64)
            loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            log.write(f"{ckpt.resumed_from} {step}\n")
            log.flush()
            dls.progress(step + 1, total, loss=loss.item())
            if step == stall_at and ckpt.resumed_from is None:
                Path(out_dir, "stalled").touch()
                while not dls.checkpoint_requested():
                    time.sleep(0.02)
    return {
        "resumed_from": ckpt.resumed_from,
        "weight": model.weight.detach().tolist(),
        "loss": loss.item(),
    }


# -- device ----------------------------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_device_is_cpu_without_a_usable_gpu():
    assert dlt.device() == torch.device("cpu")


def test_a_gpu_job_without_cuda_computes_on_cpu_and_sees_its_grant(sched):
    whole = sched.submit(job_device, gpus=1).result(timeout=60)
    assert whole["device"] == "cpu" and whole["visible"] in ("0", "1")
    assert whole["grants"] == {}
    shared = sched.submit(job_device, gpu_mem="6GiB").result(timeout=60)
    assert shared["device"] == "cpu"
    assert shared["grants"] == {0: 6 * 2**30}


def test_device_is_the_ranks_gpu_in_a_distributed_job(monkeypatch):
    # CUDA is the edge here: a machine without a GPU stands in for one with four
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "set_device", calls.append)
    monkeypatch.delenv("DLSCHED_GPU_MEM", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "2")
    assert dlt.device() == torch.device("cuda", 2)
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert dlt.device() == torch.device("cuda", 0)
    assert calls == [2, 0]


def test_importing_the_module_does_not_import_torch():
    code = "import sys, jupyter_dlsched.torch; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- distributed -----------------------------------------------------------------------------


def test_ddp_on_two_simulated_gpus_all_reduces_over_gloo(sched, tmp_path):
    handle = sched.submit(ddp_step, str(tmp_path), gpus=2, distributed=True)
    result = handle.result(timeout=120)
    assert result["rank"] == 0  # the job's result is rank 0's
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for report in ranks:
        assert report["world_size"] == 2
        assert report["backend"] == "gloo" and report["device"] == "cpu"
        assert report["sum"] == 3.0
        # per-rank gradients are 8 and 16 per weight; DDP averages them
        assert report["grad"] == [[12.0, 12.0, 12.0, 12.0]]
        assert report["visible"] == ",".join(map(str, handle.devices))


def test_a_failing_rank_fails_the_job_and_stops_the_other_rank(sched, tmp_path):
    handle = sched.submit(rank_one_fails, str(tmp_path), gpus=0, cpus=2, distributed=True)
    with pytest.raises(Exception, match="rank 1 diverged"):
        handle.result(timeout=120)
    info = handle.info()
    assert info.state == "failed"
    assert "rank 1" in info.reason
    pids = [int((tmp_path / f"pid{r}").read_text()) for r in (0, 1)]
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"


# -- checkpoint and resume -------------------------------------------------------------------


def test_a_preempted_job_resumes_from_its_checkpoint(sched, tmp_path):
    total, stall_at = 30, 10
    handle = sched.submit(
        train_with_checkpoint, total, stall_at, str(tmp_path), cpus=1, preemptible=True
    )
    wait_for((tmp_path / "stalled").exists, what="the job to reach its stall step")
    sched.store.update(handle.id, preempt_requested=1)
    result = handle.result(timeout=120)

    info = handle.info()
    assert info.state == "succeeded"
    assert info.preemptions == 1 and info.attempts == 2
    assert result["resumed_from"] == stall_at + 1
    assert "checkpoint saved at step 11" in handle.logs()
    runs = [line.split() for line in (tmp_path / "steps.log").read_text().splitlines()]
    assert [int(step) for _, step in runs] == list(range(total))  # nothing lost, nothing redone
    assert {resumed for resumed, _ in runs} == {"None", str(stall_at + 1)}

    # model, optimizer and random stream all resumed: same weights as an uninterrupted run
    reference_dir = tmp_path / "reference"
    reference_dir.mkdir()
    reference = train_with_checkpoint(total, -1, str(reference_dir), reference_dir / "ck.pt")
    assert torch.allclose(
        torch.tensor(result["weight"]), torch.tensor(reference["weight"]), rtol=0, atol=1e-12
    )


def test_cancelling_a_job_with_grace_saves_its_checkpoint(sched, tmp_path):
    handle = sched.submit(train_with_checkpoint, 30, 4, str(tmp_path), cpus=1)
    wait_for((tmp_path / "stalled").exists, what="the job to reach its stall step")
    handle.cancel()
    handle.wait(timeout=60)
    assert handle.state == "cancelled"
    saved = torch.load(sched.store.spool(handle.id) / "checkpoint.pt", weights_only=True)
    assert saved["step"] == 5
    assert set(saved) >= {"model", "optimizer", "rng"}


def test_checkpoint_steps_save_every_n_and_restore_in_a_fresh_object(tmp_path):
    model = torch.nn.Linear(2, 1)
    path = tmp_path / "run.pt"
    ckpt = dlt.Checkpoint(path, model=model, every=4)
    seen = list(ckpt.steps(10))
    assert seen == list(range(10))
    assert torch.load(path, weights_only=True)["step"] == 8
    with torch.no_grad():
        model.weight.fill_(3.0)
    ckpt.save(10, note="done")
    fresh_model = torch.nn.Linear(2, 1)
    again = dlt.Checkpoint(path, model=fresh_model)
    assert list(again.steps(12)) == [10, 11]
    assert again.resumed_from == 10 and again.extra == {"note": "done"}
    assert torch.equal(fresh_model.weight, model.weight)


def test_checkpoint_outside_a_job_asks_for_a_path(monkeypatch):
    monkeypatch.delenv("DLSCHED_JOB_ID", raising=False)
    with pytest.raises(DlschedError, match="needs a path"):
        dlt.Checkpoint()


def ddp_train_with_checkpoint(total, stall_at, out_dir):
    """Two ranks; rank 0 stalls once at ``stall_at`` until asked to stop."""
    info = dlt.init_process_group()
    torch.manual_seed(0)
    model = dlt.ddp(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ckpt = dlt.Checkpoint(model=model, optimizer=opt)
    with open(Path(out_dir, f"steps-rank{info.rank}.log"), "a") as log:
        for step in ckpt.steps(total):
            x = torch.full((8, 4), float(info.rank + 1))
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
            log.write(f"{ckpt.resumed_from} {step}\n")
            log.flush()
            if step == stall_at and ckpt.resumed_from is None and info.rank == 0:
                Path(out_dir, "stalled").touch()
                while not dls.checkpoint_requested():
                    time.sleep(0.02)
    dlt.destroy_process_group()
    return {"resumed_from": ckpt.resumed_from, "weight": model.module.weight.tolist()}


def test_a_preempted_ddp_job_stops_all_ranks_at_one_step_and_resumes(sched, tmp_path):
    total, stall_at = 12, 4
    handle = sched.submit(
        ddp_train_with_checkpoint,
        total,
        stall_at,
        str(tmp_path),
        gpus=0,
        cpus=2,
        distributed=True,
        preemptible=True,
    )
    wait_for((tmp_path / "stalled").exists, what="rank 0 to reach its stall step")
    sched.store.update(handle.id, preempt_requested=1)
    result = handle.result(timeout=120)

    assert handle.info().preemptions == 1
    assert result["resumed_from"] == stall_at + 1
    for rank in (0, 1):
        runs = [
            line.split() for line in (tmp_path / f"steps-rank{rank}.log").read_text().splitlines()
        ]
        assert [int(step) for _, step in runs] == list(range(total))
    # every step averages gradients 8 and 16 per weight: 12, at lr 0.01
    torch.manual_seed(0)
    start = torch.nn.Linear(4, 1).weight.detach()
    expected = start - total * 0.01 * 12.0
    assert torch.allclose(torch.tensor(result["weight"]), expected, atol=1e-5)
