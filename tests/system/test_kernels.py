"""GPU kernels through ``jupyter_client.KernelManager``: real kernels, one simulated GPU.

Each kernel's lease is a real job of kind ``kernel`` in the test's pool; the waiting work is
a real command job asking for the same GPU. This test process plays the Jupyter server.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_for
from jupyter_client import KernelManager

from jupyter_dlsched.cli.reports import progress_words as cli_progress_words
from jupyter_dlsched.client.scheduler import Scheduler
from jupyter_dlsched.kernels import control, spares
from jupyter_dlsched.kernels.kernelspecs import GpuKernelRequest, install
from jupyter_dlsched.kernels.provisioner import KernelLeaseError
from jupyter_dlsched.widgets.format import progress_words

HOLD_GPU = [sys.executable, "-c", "import time; time.sleep(600)"]


@pytest.fixture
def pool(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Scheduler]:
    """One simulated GPU, kernelspecs and kernels' files in this test's folders."""
    monkeypatch.setenv("DLSCHED_SIMULATE_GPUS", "1x16GiB")
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    install(GpuKernelRequest(gpus=1, idle="never"), user=True, name="gpu")
    install(GpuKernelRequest(gpus=1, idle="never", wait_limit="3s"), user=True, name="gpu-3s")
    install(GpuKernelRequest(gpus=1, idle="2s", idle_grace="3s"), user=True, name="gpu-idle")
    install(GpuKernelRequest(gpus=0.5, gpu_mem="4GiB", idle="never"), user=True, name="share")
    with Scheduler(home, loop=False) as s:
        yield s
        for job in s.jobs(state=("queued", "running")):
            s.cancel(job.id)
    spares.stop_all()  # the spare kernels this test's starts left waiting


class Kernel:
    """A started kernel and its client; ``run`` returns what a cell printed."""

    def __init__(self, name: str) -> None:
        self.manager = KernelManager(kernel_name=name)
        self.client: Any = None

    def start(self) -> Kernel:
        self.manager.start_kernel()
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=60)
        return self

    def run(self, code: str, timeout: float = 60) -> str:
        out: list[str] = []

        def hook(msg: dict[str, Any]) -> None:
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])

        reply = self.client.execute_interactive(code, output_hook=hook, timeout=timeout)
        assert reply["content"]["status"] == "ok", reply["content"]
        return "".join(out)

    def devices(self) -> str:
        return self.run("import os; print(os.environ.get('CUDA_VISIBLE_DEVICES'))").strip()

    @property
    def lease(self) -> str:
        return str(self.manager.provisioner.job_id)  # type: ignore[union-attr]

    def shutdown(self) -> None:
        if self.client is not None:
            self.client.stop_channels()
        if self.manager.has_kernel:
            self.manager.shutdown_kernel(now=False)


@pytest.fixture
def kernels() -> Iterator[list[Kernel]]:
    started: list[Kernel] = []
    yield started
    for kernel in started:
        try:
            kernel.shutdown()
        except Exception:
            pass


def start_in_thread(kernel: Kernel) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def go() -> None:
        try:
            kernel.start()
        except BaseException as error:
            errors.append(error)

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    return thread, errors


def state(s: Scheduler, job_id: str) -> str:
    return s.info(job_id).state


def kernel_jobs(s: Scheduler, *states: str) -> list[Any]:
    return [j for j in s.jobs(state=states or None) if j.kind == "kernel"]


def test_first_kernel_gets_the_gpu_and_a_second_waits_until_it_shuts_down(
    pool: Scheduler, kernels: list[Kernel]
) -> None:
    first = Kernel("gpu").start()
    kernels.append(first)
    assert first.devices() == "0"
    [lease] = kernel_jobs(pool, "running")
    assert lease.id == first.lease and lease.placement is not None
    assert lease.placement.gpus == (0,)
    assert lease.name.startswith("kernel")
    queue = subprocess.run(
        [str(Path(sys.executable).with_name("dlsched")), "queue", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ),
    )
    [row] = [j for j in json.loads(queue.stdout) if j["id"] == lease.id]
    assert (row["kind"], row["state"], row["devices"]) == ("kernel", "running", [0])

    # a job submitted from the GPU kernel gets neither its GPU nor its lease's variables
    env = first.run(
        "import jupyter_dlsched as dls, os\n"
        "h = dls.submit(lambda: {k: v for k, v in os.environ.items() if 'DLSCHED_K' in k "
        "or k == 'CUDA_VISIBLE_DEVICES'}, cpus=0.5)\n"
        "print(h.result(timeout=60))"
    )
    assert env.strip() == "{'CUDA_VISIBLE_DEVICES': ''}", env

    second = Kernel("gpu")
    kernels.append(second)
    thread, errors = start_in_thread(second)
    waiting = wait_for(lambda: kernel_jobs(pool, "queued"), timeout=30)
    assert waiting[0].waiting, waiting[0]  # says why it waits
    time.sleep(1.0)
    assert thread.is_alive(), "the second kernel started while the GPU was leased"

    first.shutdown()
    wait_for(lambda: state(pool, lease.id) == "succeeded", timeout=30)
    thread.join(timeout=60)
    assert not thread.is_alive() and not errors, errors
    assert second.devices() == "0"


def test_a_restart_keeps_the_gpu_while_a_job_waits_and_shutdown_gives_it_to_the_job(
    pool: Scheduler, kernels: list[Kernel]
) -> None:
    kernel = Kernel("gpu").start()
    kernels.append(kernel)
    lease = kernel.lease
    job = pool.submit_command(HOLD_GPU, gpus=1, name="waits-for-gpu")
    wait_for(lambda: pool.info(job.id).waiting, timeout=30)
    old_pid = kernel.manager.provisioner.pid  # type: ignore[union-attr]

    kernel.manager.restart_kernel()
    kernel.client.wait_for_ready(timeout=60)
    assert kernel.manager.provisioner.pid != old_pid  # type: ignore[union-attr]
    assert kernel.lease == lease
    assert kernel.devices() == "0"
    time.sleep(1.0)
    assert state(pool, lease) == "running" and state(pool, job.id) == "queued"

    kernel.shutdown()
    wait_for(lambda: state(pool, job.id) == "running", timeout=30)
    assert state(pool, lease) == "succeeded"
    assert pool.info(job.id).placement.gpus == (0,)  # type: ignore[union-attr]


def test_kill_9_of_a_kernel_frees_its_gpu(pool: Scheduler, kernels: list[Kernel]) -> None:
    kernel = Kernel("gpu").start()
    kernels.append(kernel)
    lease = kernel.lease
    job = pool.submit_command(HOLD_GPU, gpus=1, name="waits-for-gpu")
    wait_for(lambda: pool.info(job.id).waiting, timeout=30)

    os.kill(kernel.manager.provisioner.pid, signal.SIGKILL)  # type: ignore[union-attr,arg-type]
    # no restarter here: the lease waits its restart window (10 s), then lets go
    wait_for(lambda: state(pool, job.id) == "running", timeout=60)
    assert state(pool, lease) == "succeeded"
    assert pool.get(lease).result()["ended"] == "kernel exited"


def test_a_kernel_start_fails_with_the_reason_after_its_wait_limit(
    pool: Scheduler, kernels: list[Kernel]
) -> None:
    pool.submit_command(HOLD_GPU, gpus=1, name="holds-the-gpu")
    wait_for(lambda: [j for j in pool.jobs(state="running") if j.name == "holds-the-gpu"])
    kernel = Kernel("gpu-3s")
    kernels.append(kernel)
    with pytest.raises(KernelLeaseError, match=r"no GPU for this kernel within 3s \(.+\)"):
        kernel.start()
    [lease] = kernel_jobs(pool)
    wait_for(lambda: state(pool, lease.id) == "cancelled", timeout=30)


def test_cancelling_a_waiting_lease_cancels_the_kernel_start(
    pool: Scheduler, kernels: list[Kernel]
) -> None:
    pool.submit_command(HOLD_GPU, gpus=1, name="holds-the-gpu")
    wait_for(lambda: [j for j in pool.jobs(state="running") if j.name == "holds-the-gpu"])
    kernel = Kernel("gpu")
    kernels.append(kernel)
    thread, errors = start_in_thread(kernel)
    [lease] = wait_for(lambda: kernel_jobs(pool, "queued"), timeout=30)
    pool.cancel(lease.id)
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], KernelLeaseError), errors
    assert f"GPU lease {lease.id} was cancelled while it waited" in str(errors[0])


def test_an_idle_kernel_is_reclaimed_only_while_work_waits_and_a_cell_keeps_it(
    pool: Scheduler, kernels: list[Kernel]
) -> None:
    kernel = Kernel("gpu-idle").start()
    kernels.append(kernel)
    folder = Path(kernel.manager.provisioner.folder)  # type: ignore[union-attr,arg-type]
    lease = kernel.lease
    time.sleep(4.0)  # idle past --idle, but nothing waits: no warning, nothing reclaimed
    assert control.read(folder, "warning.json") is None
    assert state(pool, lease) == "running"

    job = pool.submit_command(HOLD_GPU, gpus=1, name="waits-for-gpu")
    warning = wait_for(lambda: control.read(folder, "warning.json"), timeout=30)
    assert warning["waiting"] == 1
    printed = kernel.run("x = 1")  # a cell within the grace keeps the GPU, and says why
    assert "about to be reclaimed" in printed, printed
    wait_for(lambda: control.read(folder, "warning.json") is None, timeout=10)
    assert state(pool, lease) == "running" and state(pool, job.id) == "queued"

    # idle again: warned, then reclaimed after the grace
    wait_for(lambda: state(pool, job.id) == "running", timeout=60)
    assert state(pool, lease) == "succeeded"
    assert pool.get(lease).result()["ended"] == "reclaimed"
    wait_for(lambda: not kernel.manager.is_alive(), timeout=30)
    ended = control.read(folder, "ended.json")
    assert ended is not None and "idle" in ended["message"]
    # Jupyter's restarter (a restart with now=True) does not take the GPU straight back
    with pytest.raises(KernelLeaseError, match="restart the kernel or start a new one"):
        kernel.manager.restart_kernel(now=True)
    # a restart someone asks for waits in line again: the job holds the GPU now
    pool.cancel(job.id)
    kernel.manager.restart_kernel()
    kernel.client.wait_for_ready(timeout=60)
    assert kernel.devices() == "0" and kernel.lease != lease


def test_two_kernels_share_one_gpu_each_with_its_memory_grant(
    pool: Scheduler, kernels: list[Kernel]
) -> None:
    first, second = Kernel("share").start(), Kernel("share").start()
    kernels += [first, second]
    code = "import os; print(os.environ['CUDA_VISIBLE_DEVICES'], os.environ['DLSCHED_GPU_MEM'])"
    assert first.run(code).split() == second.run(code).split() == ["0", str(4 * 2**30)]
    leases = kernel_jobs(pool, "running")
    assert len(leases) == 2 and all(j.placement.shared for j in leases)


def test_a_busy_kernel_is_never_reclaimed(pool: Scheduler, kernels: list[Kernel]) -> None:
    kernel = Kernel("gpu-idle").start()
    kernels.append(kernel)
    lease = kernel.lease
    msg_id = kernel.client.execute("import time; time.sleep(12)")
    job = pool.submit_command(HOLD_GPU, gpus=1, name="waits-for-gpu")
    time.sleep(9.0)  # longer than idle + grace (5 s), the cell still running
    assert state(pool, lease) == "running" and state(pool, job.id) == "queued"
    # the cell's own reply (a kernel_info reply of the start may come first)
    wait_for(lambda: kernel.client.get_shell_msg(timeout=30)["parent_header"]["msg_id"] == msg_id)
    assert kernel.manager.is_alive() and state(pool, lease) == "running"


SERVER = """
import sys, time
from jupyter_client import KernelManager
km = KernelManager(kernel_name="gpu")
km.start_kernel()
print(km.provisioner.pid, km.provisioner.job_id, flush=True)
time.sleep(600)
"""


def test_the_gpu_goes_back_when_the_kernels_server_dies(pool: Scheduler) -> None:
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True, env=dict(os.environ)
    )
    try:
        assert server.stdout is not None
        kernel_pid, lease = server.stdout.readline().split()
        assert state(pool, lease) == "running"
        server.kill()
        server.wait()
        wait_for(lambda: state(pool, lease) == "succeeded", timeout=60)
        assert pool.get(lease).result()["ended"] in ("server gone", "kernel exited")
        assert not Path(f"/proc/{kernel_pid}").exists() or _zombie(int(kernel_pid))
    finally:
        server.kill()
        server.wait()


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


def test_history_counts_a_kernels_gpu_hours_and_the_idle_part(
    pool: Scheduler, kernels: list[Kernel]
) -> None:
    from jupyter_dlsched.machine.metrics import exposition, parse

    kernel = Kernel("gpu").start()
    kernels.append(kernel)
    kernel.run("import time; time.sleep(1.0)")
    time.sleep(2.0)
    lease = kernel.lease
    # Prometheus sees the lease and, once the lease reports it, the GPU time it held idle
    wait_for(lambda: ((pool.info(lease).progress or {}).get("metrics") or {}).get("idle_gpu_h"))
    # the shell's queue reads the lease's row in words, as the widgets and docs/kernels.md do
    queue = subprocess.run(
        [str(Path(sys.executable).with_name("dlsched")), "queue"],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ),
    )
    [row] = [line for line in queue.stdout.splitlines() if line.startswith(lease)]
    assert "running" in row and "1 cell · idle <1 min" in row, row
    assert "idle_min" not in row and "step" not in row, row
    scraped = parse(exposition(pool.store, None, time.time()).decode())
    assert ({"state": "running"}, 1.0) in [(lb, v) for lb, v, _ in scraped["dlsched_kernel_leases"]]
    [(labels, idle, _)] = scraped["dlsched_kernel_idle_gpu_seconds"]
    assert labels == {"user": pool.owner} and idle > 0
    folder = Path(kernel.manager.provisioner.folder)  # type: ignore[union-attr,arg-type]
    kernel.shutdown()
    wait_for(lambda: state(pool, lease) == "succeeded", timeout=30)
    assert not folder.exists()  # a kernel shut down leaves nothing in the runtime folder
    result = pool.get(lease).result()
    assert result["idle_seconds"] >= 1.5, result
    info = pool.info(lease)
    assert info.progress is not None and info.progress["done"] == 1  # one cell ran
    assert info.progress["metrics"]["idle_gpu_h"] > 0
    assert progress_words(info) == "1 cell · idle <1 min"  # too little idle GPU time to say

    out = subprocess.run(
        [str(Path(sys.executable).with_name("dlsched")), "history", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ),
    )
    assert out.returncode == 0, out.stderr
    [total] = json.loads(out.stdout)["totals"]
    assert total["kernels"] == 1
    assert 0 < total["idle_gpu_hours"] < total["kernel_gpu_hours"] <= total["gpu_hours"]


def test_a_kernel_that_cannot_start_gives_its_gpu_back_at_once(
    pool: Scheduler, kernels: list[Kernel], tmp_path: Path
) -> None:
    folder = install(GpuKernelRequest(gpus=1, idle="never"), user=True, name="broken")
    spec = json.loads((folder / "kernel.json").read_text())
    spec["argv"][0] = str(tmp_path / "no-such-python")
    (folder / "kernel.json").write_text(json.dumps(spec))
    kernel = Kernel("broken")
    kernels.append(kernel)
    with pytest.raises(OSError):
        kernel.start()
    [lease] = kernel_jobs(pool)
    wait_for(lambda: state(pool, lease.id) == "succeeded", timeout=10)
    assert pool.get(lease.id).result()["ended"] == "shut down"


@pytest.mark.parametrize(
    ("gpus", "gpu_mem", "waiting", "helped"),
    [
        (1, None, "waiting for 1 GPU", True),
        (0.5, 2**30, "waiting for GPU memory (1 GiB)", True),
        (1, None, "behind abc (higher in line)", True),
        (1, None, None, True),
        (0, None, "waiting for 2 CPUs", False),
        (1, None, "waiting for job abc to finish", False),
        (1, None, "anna holds 1 GPU, the limit per user is 1", False),
        (1, None, "staging data 43 %, 1.2 GB/s", False),
    ],
)
def test_only_work_a_free_gpu_could_start_counts_as_waiting_for_gpus(
    gpus: float, gpu_mem: int | None, waiting: str | None, helped: bool
) -> None:
    from types import SimpleNamespace

    from jupyter_dlsched.kernels.lease import waits_for_gpus

    job = SimpleNamespace(gpus=gpus, gpu_mem=gpu_mem, waiting=waiting)
    assert waits_for_gpus(job) is helped


def test_a_lease_whose_server_died_before_its_kernel_started_lets_go(pool: Scheduler) -> None:
    from jupyter_dlsched.kernels.lease import hold

    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    folder = control.runtime_folder("no-kernel-yet")
    lease = pool.submit_payload(
        "kernel",
        {
            "fn": hold,
            "args": (str(folder),),
            "kwargs": {
                "home": str(pool.home),
                "idle": None,
                "grace": 0.0,
                "server_pid": server.pid,
            },
        },
        gpus=1,
    )
    wait_for(lambda: control.read(folder, "grant.json"), timeout=30)
    server.kill()
    server.wait()
    wait_for(lambda: state(pool, lease.id) == "succeeded", timeout=30)
    assert lease.result()["ended"] == "server gone"


def test_a_request_the_pool_can_never_satisfy_fails_the_start_with_the_reason(
    pool: Scheduler, kernels: list[Kernel]
) -> None:
    install(GpuKernelRequest(gpus=3, idle="never"), user=True, name="too-big")
    kernel = Kernel("too-big")
    kernels.append(kernel)
    with pytest.raises(KernelLeaseError, match="could not be queued: gpus=3 is invalid"):
        kernel.start()
    assert kernel_jobs(pool) == []


def test_cancelling_a_running_lease_stops_its_kernel_and_frees_the_gpu(
    pool: Scheduler, kernels: list[Kernel]
) -> None:
    kernel = Kernel("gpu").start()
    kernels.append(kernel)
    lease = kernel.lease
    job = pool.submit_command(HOLD_GPU, gpus=1, name="waits-for-gpu")
    wait_for(lambda: pool.info(job.id).waiting, timeout=30)

    pool.cancel(lease)
    wait_for(lambda: not kernel.manager.is_alive(), timeout=30)
    wait_for(lambda: state(pool, job.id) == "running", timeout=30)
    assert state(pool, lease) == "cancelled"
    # Jupyter's restarter does not bring it back onto a GPU it gave up
    with pytest.raises(KernelLeaseError, match="the lease was cancelled"):
        kernel.manager.restart_kernel(now=True)


def test_a_kernel_whose_lease_process_is_killed_stops_rather_than_use_freed_gpus(
    pool: Scheduler, kernels: list[Kernel]
) -> None:
    kernel = Kernel("gpu").start()
    kernels.append(kernel)
    info = pool.info(kernel.lease)
    assert info.job_pid is not None
    os.kill(info.job_pid, signal.SIGKILL)
    wait_for(lambda: not kernel.manager.is_alive(), timeout=30)
    wait_for(lambda: state(pool, info.id) == "failed", timeout=30)


@pytest.mark.parametrize("words", [progress_words, cli_progress_words], ids=["widgets", "cli"])
def test_a_kernels_row_says_cells_idle_time_and_idle_gpu_hours(words: Any) -> None:
    from types import SimpleNamespace

    job = SimpleNamespace(
        kind="kernel",
        state="running",
        progress={"done": 3, "total": None, "metrics": {"idle_gpu_h": 0.4, "idle_min": 12.2}},
    )
    assert words(job) == "3 cells · idle 12 min · 0.40 GPU-h idle"


def test_a_notebook_job_on_a_gpu_kernelspec_uses_the_jobs_gpus_without_a_second_lease(
    pool: Scheduler, tmp_path: Path
) -> None:
    """A notebook job whose kernel is a GPU kernelspec: the job holds the GPU, so its kernel
    starts on the job's grant; a lease would wait for the job's own GPU (here 3 s, then fail)."""
    import nbformat

    path = tmp_path / "on-gpu.ipynb"
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import os; print(os.environ['CUDA_VISIBLE_DEVICES'])")]
    nbformat.write(nb, path)
    handle = pool.submit_notebook(path, kernel="gpu-3s", gpus=1, cpus=0.25)
    executed = nbformat.read(handle.result(timeout=120), as_version=4)
    [output] = executed.cells[0].outputs
    assert output["text"].strip() == "0"
    assert [j.kind for j in pool.jobs()] == ["notebook"]
