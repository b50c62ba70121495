"""The GPU check's job promises: CUDA in a process forked ahead by a warm launcher, a 2-rank
DDP job, and a GPU process started outside the pool, counted and attributed to its user.

The workloads here run in job processes: the job imports this module by name (the
submitter's import path travels with the job).
"""

from __future__ import annotations

import getpass
import importlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

GiB = 2**30


# -- workloads --------------------------------------------------------------------------------


def cuda_in_job() -> dict[str, Any]:
    """Where this job process came from, and whether its device computes: a process forked
    before CUDA was touched gets a context of its own at its first allocation."""
    import psutil
    import torch

    import jupyter_dlsched.torch as dlt

    initialized_before = torch.cuda.is_initialized()
    dev = dlt.device()
    x = torch.ones(512, 512, device=dev)
    total = int((x @ x).sum().item())
    return {
        "pid": os.getpid(),
        "created": psutil.Process().create_time(),
        "device": str(dev),
        "sum": total,
        "cuda_before": initialized_before,
        "cuda_after": torch.cuda.is_initialized(),
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


def ddp_step() -> dict[str, Any]:
    """All-reduce the ranks' numbers, then one DDP backward on data that differs by rank;
    rank 0's result (the job's) carries what every rank saw."""
    import torch

    import jupyter_dlsched.torch as dlt

    info = dlt.init_process_group()
    total = torch.tensor([float(info.rank + 1)], device=info.device)
    torch.distributed.all_reduce(total)
    torch.manual_seed(0)
    model = dlt.ddp(torch.nn.Linear(4, 1).to(info.device))
    x = torch.full((8, 4), float(info.rank + 1), device=info.device)
    model(x).sum().backward()
    grads = [torch.zeros_like(model.module.weight) for _ in range(info.world_size)]
    torch.distributed.all_gather(grads, model.module.weight.grad)
    same = all(torch.equal(g, grads[0]) for g in grads)
    return {
        "world_size": info.world_size,
        "backend": info.backend,
        "device": str(info.device),
        "sum": total.item(),
        "grads_equal": same,
    }


# -- the checks -------------------------------------------------------------------------------


def _spare_ready(sched: Any) -> bool:
    """A spare supervisor of the agent waits with a job process forked ahead."""
    import psutil

    agent = psutil.Process(int(sched.link.hello["pid"]))
    for spare in agent.children():
        try:
            if spare.name() == "dlsched-sup" and len(spare.children()) == 1:
                return True
        except psutil.NoSuchProcess:
            continue
    return False


def check_warm_start(report: Any, sched: Any, cpu: bool) -> None:
    from gpu_check_kernels import wait_until

    sched.submit(abs, -1).result(timeout=120)  # the agent and its launcher are up
    wait_until(lambda: _spare_ready(sched), 60, "a spare supervisor's process forked ahead")
    queued_at = time.time()
    seen = sched.submit(cuda_in_job, gpus=1).result(timeout=300)
    ahead = seen["created"] < queued_at
    on_device = seen["device"].startswith("cpu" if cpu else "cuda")
    fresh = not seen["cuda_before"] and (cpu or seen["cuda_after"])
    report.add(
        "warm-start-cuda",
        "a gpus=1 job in a process forked ahead by the warm launcher",
        f"forked {queued_at - seen['created']:.1f} s before it was queued: {ahead}; "
        f"computed on {seen['device']} (CUDA_VISIBLE_DEVICES={seen['visible']}), "
        f"sum {seen['sum']}",
        "forked ahead, a CUDA context of its own",
        ahead and on_device and fresh and seen["sum"] == 512**3,
    )


def check_ddp(report: Any, sched: Any, cpu: bool, gpus: int) -> None:
    if cpu:
        # two ranks on gloo, one per CPU core: the process group, ranks, all-reduce, DDP
        request: dict[str, Any] = {"gpus": 0, "cpus": 2}
    elif gpus >= 2:
        request = {"gpus": 2}
    else:
        # NCCL refuses two ranks on one device ("Duplicate GPU detected"), and the pool
        # starts one rank per granted GPU: a one-GPU machine cannot run this check
        report.skip("ddp-nccl", "needs two GPUs (NCCL runs one rank per device)")
        return
    seen = sched.submit(ddp_step, distributed=True, **request).result(timeout=300)
    backend = "gloo" if cpu else "nccl"
    report.add(
        "ddp-nccl",
        f"a 2-rank DDP job ({request})",
        f"{seen['world_size']} ranks on {seen['backend']} ({seen['device']}), "
        f"all-reduce {seen['sum']:.0f}, gradients equal: {seen['grads_equal']}",
        f"2 ranks on {backend}, all-reduce 3, equal gradients",
        seen["world_size"] == 2
        and seen["backend"] == backend
        and seen["sum"] == 3.0
        and seen["grads_equal"],
    )


HOLD_CUDA = """
import sys, time, torch
block = torch.ones(256, 1024, 1024, device="cuda")  # 1 GiB
torch.cuda.synchronize()
print("ready", flush=True)
time.sleep(300)
"""


def check_outside_process(report: Any, sched: Any, cpu: bool, scratch: Path) -> None:
    from gpu_check_kernels import wait_until

    me = getpass.getuser()
    held = 1 * GiB
    if cpu:
        proc = subprocess.Popen(["sleep", "300"])
        restore = _fake_nvml_listing(proc.pid, held)
        from jupyter_dlsched.client.scheduler import Scheduler

        pool = Scheduler(scratch / "outside", agent=False, loop=False)
    else:
        proc = subprocess.Popen(
            [sys.executable, "-c", HOLD_CUDA], stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the process outside the pool could not allocate on the GPU")
        restore, pool = None, sched
    try:

        def listed() -> Any:
            for gpu in pool.pool().gpus:
                for p in gpu.processes:
                    if p.pid == proc.pid:
                        return p
            return None

        found = wait_until(listed, 60, "the outside process in the pool's view")
        near = abs(found.used_mem - held) <= 0.25 * held  # the CUDA context adds its own
        report.add(
            "outside-process",
            "a process on the GPU that no job started",
            f"pid {found.pid}: user {found.user}, job {found.job_id}, "
            f"{found.used_mem / GiB:.2f} GiB, {found.command}",
            f"counted, attributed to {me}",
            found.job_id is None and found.user == me and near,
        )
    finally:
        proc.kill()
        proc.wait()
        if restore is not None:
            pool.close()
            restore()


def _fake_nvml_listing(pid: int, used: int) -> Any:
    """Without a GPU: NVML answers with one GPU whose process list is ``pid`` (the stand-in
    the tests use), in this process only; returns what puts things back."""
    tests = Path(__file__).resolve().parent.parent / "tests"
    sys.path.insert(0, str(tests))
    from nvml_fake import fake_nvml

    inventory = importlib.import_module("jupyter_dlsched.machine.inventory")
    nvml = importlib.import_module("jupyter_dlsched.machine.nvml")
    saved = (
        sys.modules.get("pynvml"),
        dict(nvml._state),
        dict(inventory._cache),
        os.environ.get("DLSCHED_SIMULATE_GPUS"),
    )
    sys.modules["pynvml"] = fake_nvml([("NVIDIA H100", 80 * GiB, 2 * GiB, 10, [(pid, used)])])
    nvml._state.clear()
    inventory._cache.clear()
    os.environ["DLSCHED_SIMULATE_GPUS"] = "none"

    def restore() -> None:
        module, state, cache, simulate = saved
        if module is None:
            sys.modules.pop("pynvml", None)
        else:
            sys.modules["pynvml"] = module
        nvml._state.clear()
        nvml._state.update(state)
        inventory._cache.clear()
        inventory._cache.update(cache)
        if simulate is not None:
            os.environ["DLSCHED_SIMULATE_GPUS"] = simulate
        sys.path.remove(str(tests))

    return restore
