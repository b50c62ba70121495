"""PyTorch on a machine with NVIDIA GPUs: does the scheduler keep its promises? (<= 8 minutes)

    python benchmarks/gpu_check.py --json out.json  # on a machine with an NVIDIA GPU
    python benchmarks/gpu_check.py --cpu            # the logic without a GPU (simulated GPUs,
                                                    # CPU torch, tiny sizes; numbers mean nothing)

Each promise has a check by name (``CHECKS``; what each promises: ``docs/gpu.md``), whose
rows are printed as one table and written into ``docs/gpu.md``, one row per check
(``--doc PATH`` another page, ``--no-doc`` none). Among them:

* NVML inventory against what PyTorch sees;
* training throughput of a ResNet-18 (synthetic ImageNet-sized batches) run
  directly against the same code run as a scheduled job (target ratio >= 0.99);
* two half-GPU jobs of a small model side by side against one after the other
  (aggregate throughput ratio; target >= 1.5);
* a job that shares a GPU and allocates more than its grant is stopped, both
  when it uses ``dlt.device()`` (PyTorch's own out-of-memory error) and when it
  bypasses it (the supervisor's NVML watch);
* the GPU memory the scheduler attributes to a job against NVML's own count, and the
  peak its supervisor records for ``dlsched history``;
* GPU kernels (``gpu_check_kernels.py``) and jobs forked ahead, DDP and a process outside
  the pool (``gpu_check_jobs.py``).

Every job runs in a scratch state folder; the machine's queue is not touched.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gpu_check_report import CHECKS, Report, guarded, machine, render

GiB = 2**30


# -- workloads (run in job processes or a plain subprocess) -----------------------------------


def resnet18(num_classes: int = 1000) -> Any:
    """ResNet-18 (He et al.), written out so the check needs nothing beyond torch."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.down = (
                None
                if stride == 1 and cin == cout
                else nn.Sequential(
                    nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
                )
            )

        def forward(self, x: Any) -> Any:
            out = torch.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return torch.relu(out + (x if self.down is None else self.down(x)))

    layers: list[Any] = [
        nn.Conv2d(3, 64, 7, 2, 3, bias=False),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.MaxPool2d(3, 2, 1),
    ]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, num_classes)]
    return nn.Sequential(*layers)


def _wait_for_peers(barrier: str | None, parties: int) -> None:
    if not barrier:
        return
    folder = Path(barrier)
    (folder / f"ready-{os.getpid()}").touch()
    deadline = time.time() + 300
    while len(list(folder.glob("ready-*"))) < parties and time.time() < deadline:
        time.sleep(0.01)


def train_throughput(
    batch: int,
    image: int,
    seconds: float = 0.0,
    steps: int = 0,
    warmup: int = 10,
    barrier: str | None = None,
    parties: int = 1,
) -> dict[str, Any]:
    """Images per second of ResNet-18 training steps (SGD, synthetic data), after warm-up.

    Runs for ``seconds`` or for exactly ``steps`` steps. Inside a job the
    device comes from ``dlt.device()`` (memory grant applied); outside, from
    CUDA directly, as a user's plain script would.
    """
    import torch

    import jupyter_dlsched.torch as dlt
    from jupyter_dlsched.inside.runtime import current_job

    if current_job() is not None:
        dev = dlt.device()
    else:
        dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cudnn.benchmark = True
    model = resnet18().to(dev).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, 3, image, image, device=dev).to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (batch,), device=dev)

    def step() -> None:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    for _ in range(warmup):
        step()
    sync()
    _wait_for_peers(barrier, parties)
    start = time.time()
    done = 0
    while (steps and done < steps) or (not steps and time.time() - start < seconds):
        step()
        done += 1
        if done % 10 == 0:
            sync()
    sync()
    end = time.time()
    return {
        "images_per_s": done * batch / (end - start),
        "images": done * batch,
        "start": start,
        "end": end,
        "device": str(dev),
    }


def hold_memory(gib: float, use_device_helper: bool, ready: str, release: str) -> str:
    """Allocate ``gib`` GiB on the job's GPU, say so, and hold it until told to let go."""
    import torch

    import jupyter_dlsched.torch as dlt

    dev = dlt.device() if use_device_helper else torch.device("cuda", 0)
    block = torch.empty(int(gib * GiB), dtype=torch.uint8, device=dev)
    block.fill_(1)
    torch.cuda.synchronize(dev)
    Path(ready).touch()
    deadline = time.time() + 120
    while not Path(release).exists() and time.time() < deadline:
        time.sleep(0.05)
    return f"held {gib} GiB"


def grant_seen() -> dict[str, Any]:
    """What a job that shares a GPU is told of its memory grant."""
    import jupyter_dlsched.torch as dlt

    return {
        "DLSCHED_GPU_MEM": os.environ.get("DLSCHED_GPU_MEM"),
        "grants": dlt.memory_grants(),
    }


def torch_inventory() -> list[dict[str, Any]]:
    """The CUDA devices PyTorch sees (run in a subprocess, so this one never touches CUDA)."""
    import torch

    if not torch.cuda.is_available():
        return []
    return [
        {
            "name": torch.cuda.get_device_properties(i).name,
            "mem_total": torch.cuda.get_device_properties(i).total_memory,
        }
        for i in range(torch.cuda.device_count())
    ]


def _in_subprocess(fn: Any, *args: Any, env: dict[str, str] | None = None, **kwargs: Any) -> Any:
    """Run ``fn`` in a fresh interpreter (spawn) with ``env`` added to the environment."""
    saved = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(1) as pool:
            return pool.apply(fn, args, kwargs)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# -- the checks --------------------------------------------------------------------------------


def check_inventory(report: Report, cpu: bool) -> list[Any]:
    from jupyter_dlsched.machine.inventory import probe

    info = probe(usage=False, max_age=0)
    seen = _in_subprocess(torch_inventory, env={"CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    real = [g for g in info.gpus if not g.simulated]
    nvml = ", ".join(f"{g.index}: {g.name} {g.mem_total / GiB:.0f} GiB" for g in real) or "none"
    torch_text = ", ".join(f"{d['name']} {d['mem_total'] / GiB:.0f} GiB" for d in seen) or "none"
    # CUDA reports slightly less memory than NVML on some cards (driver reservations)
    same = len(real) == len(seen) and all(
        g.name == d["name"] and abs(g.mem_total - d["mem_total"]) <= 0.02 * g.mem_total
        for g, d in zip(real, seen, strict=True)
    )
    report.data["inventory"] = {"nvml": nvml, "torch": seen, "gpu_error": info.gpu_error}
    report.add("inventory", "GPUs, NVML", nvml + (f" ({info.gpu_error})" if info.gpu_error else ""))
    if cpu:  # the logic: simulated GPUs are listed as such, and CUDA is not asked for them
        sim = [g for g in info.gpus if g.simulated]
        listed = ", ".join(f"{g.index}: {g.mem_total / GiB:.0f} GiB [simulated]" for g in sim)
        report.add("inventory", "GPUs, simulated", listed or "none", "listed", bool(sim))
    report.add("inventory", "GPUs, PyTorch", torch_text, "same as NVML", same if not cpu else None)
    return real


def check_throughput(report: Report, sched: Any, cpu: bool, seconds: float) -> None:
    batch, image = (8, 64) if cpu else (128, 224)
    warmup = 2 if cpu else 10  # the CPU check times the logic, not a steady rate
    direct = _in_subprocess(
        train_throughput,
        batch,
        image,
        seconds=seconds,
        warmup=warmup,
        env={"CUDA_VISIBLE_DEVICES": "0"},
    )
    handle = sched.submit(
        train_throughput,
        batch,
        image,
        seconds=seconds,
        warmup=warmup,
        gpus=1,
        cpus=1 if cpu else 4,
    )
    scheduled = handle.result(timeout=600)
    ratio = scheduled["images_per_s"] / direct["images_per_s"]
    report.data["throughput"] = {"direct": direct, "scheduled": scheduled, "ratio": ratio}
    report.add(
        "throughput",
        f"ResNet-18 training, batch {batch}x{image}px, direct",
        f"{direct['images_per_s']:.0f} img/s",
    )
    report.add(
        "throughput",
        "same, as a scheduled job (gpus=1)",
        f"{scheduled['images_per_s']:.0f} img/s on {scheduled['device']}, ratio {ratio:.3f}",
        ">= 0.99" if not cpu else "trains on its device",
        ratio >= 0.99 if not cpu else scheduled["images"] > 0,
    )


def check_sharing(report: Report, sched: Any, cpu: bool, steps: int) -> None:
    batch, image = (4, 32) if cpu else (32, 64)
    args = dict(steps=steps, warmup=2 if cpu else 10, gpus=0.5, cpus=1 if cpu else 2)
    alone = [sched.submit(train_throughput, batch, image, **args).result(timeout=600)]
    alone.append(sched.submit(train_throughput, batch, image, **args).result(timeout=600))
    barrier = tempfile.mkdtemp(prefix="dlsched-barrier-")
    try:
        pair = [
            sched.submit(train_throughput, batch, image, barrier=barrier, parties=2, **args)
            for _ in range(2)
        ]
        together = [h.result(timeout=600) for h in pair]
        devices = [h.info().devices for h in pair]
    finally:
        shutil.rmtree(barrier, ignore_errors=True)
    images = sum(r["images"] for r in alone)
    sequential = images / sum(r["end"] - r["start"] for r in alone)
    span = max(r["end"] for r in together) - min(r["start"] for r in together)
    side_by_side = sum(r["images"] for r in together) / span
    ratio = side_by_side / sequential
    report.data["sharing"] = {"alone": alone, "together": together, "devices": devices}
    # the logic: both halves granted on one GPU, and running at the same time
    overlap = max(r["start"] for r in together) < min(r["end"] for r in together)
    one_gpu = len({tuple(d) for d in devices}) == 1
    report.add(
        "sharing",
        f"two gpus=0.5 jobs (ResNet-18 {batch}x{image}px), side by side vs one after the other",
        f"{side_by_side:.0f} vs {sequential:.0f} img/s, ratio {ratio:.2f} (GPUs {devices})",
        ">= 1.5" if not cpu else "one GPU, at once",
        ratio >= 1.5 if not cpu else one_gpu and overlap,
    )


def check_memory(report: Report, sched: Any, gpus: list[Any]) -> None:
    from jupyter_dlsched.vocab.units import format_size

    if not gpus:  # the logic without a GPU: the job is told its grant, in bytes
        seen = sched.submit(grant_seen, gpus=0.5, gpu_mem="4GiB").result(timeout=600)
        report.add(
            "memory",
            "gpu_mem=4GiB job: the grant it is told",
            f"{seen}",
            "4 GiB on its GPU",
            seen["DLSCHED_GPU_MEM"] == str(4 * GiB) and 4 * GiB in seen["grants"].values(),
        )
        return
    scratch = Path(tempfile.mkdtemp(prefix="dlsched-mem-"))
    try:
        for helper in (True, False):
            ready, release = scratch / f"ready-{helper}", scratch / f"release-{helper}"
            handle = sched.submit(hold_memory, 8, helper, str(ready), str(release), gpu_mem="4GiB")
            info = handle.wait(timeout=60)
            release.touch()
            info = handle.wait(timeout=60)
            how = "with dlt.device()" if helper else "allocator not capped"
            expected = "OutOfMemoryError" if helper else "GPU out of memory"
            report.add(
                "memory",
                f"gpu_mem=4GiB job allocating 8 GiB, {how}",
                f"{info.state}: {info.reason[:120]}",
                f"stopped ({expected})",
                info.state == "failed" and expected in info.reason,
            )

        from jupyter_dlsched.machine.inventory import probe

        ready, release = scratch / "ready-acct", scratch / "release-acct"
        before = [g.mem_used for g in probe(usage=True, max_age=0).gpus]
        handle = sched.submit(hold_memory, 2, True, str(ready), str(release), gpu_mem="8GiB")
        while handle.info().state in ("queued", "running") and not ready.exists():
            time.sleep(0.05)
        time.sleep(1.0)  # let NVML's numbers settle
        index = handle.info().devices[0]
        during = probe(usage=True, max_age=0).gpus[index].mem_used
        attributed = sum(
            p.used_mem for p in sched.pool().gpus[index].processes if p.job_id == handle.id
        )
        release.touch()
        handle.wait(timeout=60)
        delta = during - before[index]
        close = delta > 0 and abs(attributed - delta) <= max(0.01 * delta, 64 * 2**20)
        report.data["accounting"] = {"attributed": attributed, "nvml_delta": delta}
        report.add(
            "memory",
            "GPU memory of a job holding 2 GiB: scheduler's per-job view vs NVML device delta",
            f"{format_size(attributed)} vs {format_size(delta)}",
            "equal within 1% (or 64 MiB)",
            close,
        )
        # what `dlsched history` records for the job: its supervisor's peak reading (NVML)
        ended = handle.info()
        peak = ended.peak_gpu_mem or 0
        report.data["accounting"].update(peak_gpu_mem=peak, gpu_hours=ended.gpu_hours)
        report.add(
            "memory",
            "the same job's recorded peak GPU memory (dlsched history) vs the NVML delta",
            f"{format_size(peak)} vs {format_size(delta)}, {ended.gpu_hours * 3600:.1f} GPU-s",
            "equal within 1% (or 64 MiB)",
            delta > 0 and abs(peak - delta) <= max(0.01 * delta, 64 * 2**20),
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="logic check without a GPU")
    parser.add_argument("--seconds", type=float, default=None, help="per throughput run")
    parser.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    parser.add_argument(
        "--doc",
        type=Path,
        default=Path(__file__).resolve().parent.parent / "docs" / "gpu.md",
        help="the page whose table gets this run's rows (default docs/gpu.md)",
    )
    parser.add_argument("--no-doc", action="store_true", help="leave the page as it is")
    args = parser.parse_args(argv)
    try:
        import torch  # noqa: F401
    except ImportError:
        print("gpu_check needs PyTorch: pip install 'jupyter-dlsched[torch]'", file=sys.stderr)
        return 2

    os.environ.pop("DLSCHED_SIMULATE_GPUS", None)
    if args.cpu:
        os.environ["DLSCHED_SIMULATE_GPUS"] = "1x16GiB"
    from gpu_check_jobs import check_ddp, check_outside_process, check_warm_start
    from gpu_check_kernels import Kernels

    from jupyter_dlsched.client.scheduler import Scheduler

    report = Report()
    started = time.time()
    print("inventory", flush=True)
    real = check_inventory(report, args.cpu)
    if not real and not args.cpu:
        print("no NVIDIA GPU found (NVML); run with --cpu for a logic check", file=sys.stderr)
        return 2
    device, driver = machine(args.cpu)
    scratch = Path(tempfile.mkdtemp(prefix="dlsched-gpu-check-"))
    home = str(scratch / "home")
    os.environ.update(
        DLSCHED_HOME=home,
        JUPYTER_DATA_DIR=str(scratch / "data"),
        JUPYTER_RUNTIME_DIR=str(scratch / "runtime"),
    )
    try:
        with Scheduler(home, grace=5.0) as sched:
            print("throughput, direct vs scheduled", flush=True)
            seconds = args.seconds or (1.0 if args.cpu else 20.0)
            guarded(report, "throughput", check_throughput, sched, args.cpu, seconds)
            print("two half-GPU jobs", flush=True)
            steps = 5 if args.cpu else 500
            guarded(report, "sharing", check_sharing, sched, args.cpu, steps)
            print("memory grants", flush=True)
            guarded(report, "memory", check_memory, sched, [] if args.cpu else real)
            print("GPU kernels", flush=True)
            kernels = Kernels(sched, args.cpu)
            try:
                guarded(report, "kernel-lease", kernels.check_lease)
                guarded(report, "kernel-restart", kernels.check_restart)
                guarded(report, "kernel-suspend", kernels.check_suspend)
            finally:
                kernels.close()
            print("a job from a warm launcher", flush=True)
            guarded(report, "warm-start-cuda", check_warm_start, sched, args.cpu)
            print("a 2-rank DDP job", flush=True)
            guarded(report, "ddp-nccl", check_ddp, sched, args.cpu, len(real))
            print("a GPU process outside the pool", flush=True)
            guarded(report, "outside-process", check_outside_process, sched, args.cpu, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report.data["seconds"] = time.time() - started
    report.data["checks"] = {name: report.verdict(name) for name in CHECKS}
    report.data["device"], report.data["driver"] = device, driver
    print()
    print(report.table())
    print(f"\n({report.data['seconds']:.0f} s{', CPU logic check' if args.cpu else ''})")
    if args.json:
        args.json.write_text(json.dumps(report.data, indent=2, default=str))
    if not args.no_doc:
        date = time.strftime("%Y-%m-%d", time.gmtime())
        render(args.doc, report, args.cpu, device, driver, date)
    return 1 if report.failed() else 0


if __name__ == "__main__":
    sys.exit(main())
