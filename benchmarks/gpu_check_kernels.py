"""The GPU check's kernel promises: a lease, a restart that keeps it, an idle kernel reclaimed.

Real kernels through ``jupyter_client.KernelManager`` with GPU kernelspecs installed in the
check's scratch ``JUPYTER_DATA_DIR``; each cell computes on the kernel's device
(``dlt.device()``: its GPU on a device, the CPU with simulated GPUs).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: a cell that computes on the kernel's device and prints where and what
CELL = (
    "import jupyter_dlsched.torch as dlt, torch\n"
    "d = dlt.device(); x = torch.ones(1024, 1024, device=d)\n"
    "print(d, int((x @ x).sum().item()))"
)
EXPECTED = str(1024**3)
#: what waits for the kernel's GPU: a command that holds it until cancelled
HOLD_GPU = [sys.executable, "-c", "import time; time.sleep(600)"]


class Kernel:
    """A started kernel and its client; ``run`` returns what a cell printed."""

    def __init__(self, name: str) -> None:
        from jupyter_client import KernelManager

        self.manager = KernelManager(kernel_name=name)
        self.client: Any = None

    def start(self) -> Kernel:
        self.manager.start_kernel()
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=120)
        return self

    def run(self, code: str, timeout: float = 120) -> str:
        out: list[str] = []

        def hook(msg: dict[str, Any]) -> None:
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])

        reply = self.client.execute_interactive(code, output_hook=hook, timeout=timeout)
        if reply["content"]["status"] != "ok":
            raise RuntimeError(f"the cell failed: {reply['content'].get('evalue')}")
        return "".join(out).strip()

    @property
    def lease(self) -> str:
        return str(self.manager.provisioner.job_id)  # type: ignore[union-attr]

    @property
    def pid(self) -> int:
        return int(self.manager.provisioner.pid)  # type: ignore[union-attr]

    def shutdown(self) -> None:
        if self.client is not None:
            self.client.stop_channels()
        if self.manager.has_kernel:
            self.manager.shutdown_kernel(now=False)


def wait_until(test: Any, timeout: float, what: str) -> Any:
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = test()
        if value:
            return value
        time.sleep(0.1)
    raise TimeoutError(f"{what} did not happen within {timeout:.0f} s")


class Kernels:
    """The three kernel checks, in order, over one pool (the first kernel lives on into the
    restart check)."""

    def __init__(self, sched: Any, cpu: bool) -> None:
        from jupyter_dlsched.kernels.kernelspecs import GpuKernelRequest, install

        self.sched = sched
        self.cpu = cpu
        install(GpuKernelRequest(gpus=1, idle="never"), user=True, name="dlsched-check")
        install(
            GpuKernelRequest(gpus=1, idle="2s", idle_grace="2s"),
            user=True,
            name="dlsched-check-idle",
        )
        self.kernel: Kernel | None = None
        self.started: list[Kernel] = []
        self.jobs: list[Any] = []

    def _start(self, name: str) -> tuple[Kernel, float]:
        kernel = Kernel(name)
        self.started.append(kernel)
        t0 = time.perf_counter()
        kernel.start()
        return kernel, time.perf_counter() - t0

    def _state(self, job_id: str) -> str:
        return str(self.sched.info(job_id).state)

    def check_lease(self, report: Any) -> None:
        kernel, seconds = self._start("dlsched-check")
        self.kernel = kernel
        printed = kernel.run(CELL)
        lease = self.sched.info(kernel.lease)
        gpus = lease.placement.gpus if lease.placement is not None else ()
        waiting = self.sched.submit_command(HOLD_GPU, gpus=1, name="waits-for-the-kernel")
        self.jobs.append(waiting)
        wait_until(lambda: self.sched.info(waiting.id).waiting, 60, "the job waiting")
        held = self._state(lease.id) == "running" and self._state(waiting.id) == "queued"
        report.add(
            "kernel-lease",
            "a GPU kernel: start with its lease, a cell on its device",
            f"started in {seconds:.1f} s, lease {lease.id} holds GPU {list(gpus)}, "
            f"cell printed {printed!r}; a gpus=1 job waits",
            "the cell computes; the GPU is the kernel's",
            printed.endswith(EXPECTED) and gpus == (0,) and held,
        )

    def check_restart(self, report: Any) -> None:
        kernel = self.kernel
        if kernel is None:
            report.skip("kernel-restart", "no kernel: kernel-lease failed")
            return
        lease, old_pid = kernel.lease, kernel.pid
        t0 = time.perf_counter()
        kernel.manager.restart_kernel()
        kernel.client.wait_for_ready(timeout=120)
        seconds = time.perf_counter() - t0
        printed = kernel.run(CELL)
        kept = kernel.lease == lease and self._state(lease) == "running"
        waiting = self.jobs[-1]
        kernel.shutdown()
        wait_until(lambda: self._state(waiting.id) == "running", 60, "the waiting job's start")
        self.sched.cancel(waiting.id)
        report.add(
            "kernel-restart",
            "a restart keeps the lease; shutdown gives the GPU to the waiting job",
            f"restarted in {seconds:.1f} s (pid {old_pid} -> {kernel.pid}), lease kept: {kept}, "
            f"cell printed {printed!r}; the job ran after the shutdown",
            "lease kept, cell computes",
            kept and kernel.pid != old_pid and printed.endswith(EXPECTED),
        )

    def check_suspend(self, report: Any) -> None:
        self._reclaim(report, "an idle kernel while a job waits: reclaimed")
        if not self.cpu:
            return
        # the logic of a suspend and a restore, with the stand-in cuda-checkpoint the tests
        # use (a program that records what it is asked and answers as the real one)
        tests = Path(__file__).resolve().parent.parent / "tests"
        sys.path.insert(0, str(tests))
        import standins

        scratch = Path(tempfile.mkdtemp(prefix="dlsched-check-standin-"))
        calls = scratch / "toggles.jsonl"
        standins.install(scratch / "bin", "cuda-checkpoint", calls)
        path = os.environ["PATH"]
        os.environ["PATH"] = f"{scratch / 'bin'}{os.pathsep}{path}"
        try:
            self._reclaim(report, "the same with a stand-in cuda-checkpoint", calls)
        finally:
            os.environ["PATH"] = path
            sys.path.remove(str(tests))
            shutil.rmtree(scratch, ignore_errors=True)

    def _reclaim(self, report: Any, what: str, calls: Path | None = None) -> None:
        """An idle kernel reclaimed while a job waits: suspended where ``cuda-checkpoint``
        can (its next cell restored), else shut down saying why."""
        from jupyter_dlsched.inside.gpu_room import held_by
        from jupyter_dlsched.kernels import control
        from jupyter_dlsched.kernels.suspend import Checkpointer

        wait_until(lambda: not self.sched.jobs(state="running"), 60, "the GPU coming free")
        kernel, _ = self._start("dlsched-check-idle")
        folder = Path(kernel.manager.provisioner.folder)  # type: ignore[union-attr,arg-type]
        before = kernel.run(CELL)
        waiting = self.sched.submit_command(HOLD_GPU, gpus=1, name="waits-for-the-idle-kernel")
        self.jobs.append(waiting)
        t0 = time.perf_counter()
        wait_until(lambda: self._state(waiting.id) == "running", 120, "the reclaim")
        seconds = time.perf_counter() - t0
        ended = control.read(folder, "ended.json") or {}
        message = str(ended.get("message") or "")
        suspended = ended.get("ended") == "suspended"
        after, freed = "", ""
        if suspended:
            # suspended: NVML counts nothing of the kernel on its GPU any more
            held = held_by([kernel.pid])
            freed = f"; the suspended kernel holds {sum(held.values()) / 2**20:.0f} MiB on GPU"
            # the kernel lives on; its next cell waits for a GPU, is restored, and runs
            self.sched.cancel(waiting.id)
            after = kernel.run(CELL, timeout=300)
        self.sched.cancel(waiting.id)
        if calls is not None:
            import standins  # on the path while the stand-in is (check_suspend)

            toggled = [c["to"] for c in standins.recorded(calls)]
            freed += f"; cuda-checkpoint toggled to {toggled}"
        why_not = Checkpointer().supported()
        expected = "suspended, then restored" if why_not is None else "shut down, saying why"
        ok = (
            suspended and after.endswith(EXPECTED)
            if why_not is None
            else (ended.get("ended") == "reclaimed" and why_not in message)
        )
        report.add(
            "kernel-suspend",
            what,
            f"{ended.get('ended')} {seconds:.1f} s after the job queued: {message}"
            + freed
            + (f"; next cell printed {after.splitlines()[-1]!r}" if after else ""),
            expected,
            ok and before.endswith(EXPECTED),
        )

    def close(self) -> None:
        for job in self.jobs:
            try:
                self.sched.cancel(job.id)
            except Exception:
                pass
        for kernel in self.started:
            try:
                kernel.shutdown()
            except Exception:
                pass
