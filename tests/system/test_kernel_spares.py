"""Warm GPU kernels through ``jupyter_client.KernelManager``: the spare kernel the provisioner
keeps per GPU kernelspec becomes the next kernel, with the lease's grant, and holds no GPU
while it waits. Real kernels, a real pool with one simulated GPU; this test process plays
the Jupyter server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import alive, wait_for
from jupyter_client import KernelManager

from jupyter_dlsched.client.scheduler import Scheduler
from jupyter_dlsched.kernels import control, spares
from jupyter_dlsched.kernels.kernelspecs import GpuKernelRequest, install

DLSCHED = str(Path(sys.executable).with_name("dlsched"))


@pytest.fixture
def pool(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Scheduler]:
    monkeypatch.setenv("DLSCHED_SIMULATE_GPUS", "1x16GiB")
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.delenv("DLSCHED_PRELOAD", raising=False)
    monkeypatch.chdir(tmp_path)
    install(GpuKernelRequest(gpus=1, idle="never"), user=True, name="gpu")
    with Scheduler(home, loop=False) as s:
        yield s
        for job in s.jobs(state=("queued", "running")):
            s.cancel(job.id)
    spares.stop_all()


class Kernel:
    def __init__(self) -> None:
        self.manager = KernelManager(kernel_name="gpu")
        self.client: Any = None

    def start(self) -> Kernel:
        self.manager.start_kernel()
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=60)
        return self

    def run(self, code: str, timeout: float = 120) -> str:
        out: list[str] = []

        def hook(msg: dict[str, Any]) -> None:
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])

        reply = self.client.execute_interactive(code, output_hook=hook, timeout=timeout)
        assert reply["content"]["status"] == "ok", reply["content"]
        return "".join(out)

    @property
    def pid(self) -> int:
        return int(self.manager.provisioner.pid)  # type: ignore[union-attr]

    @property
    def folder(self) -> Path:
        return Path(self.manager.provisioner.folder)  # type: ignore[union-attr]

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


def spare_with(module: str, besides: int = 0) -> dict[str, Any]:
    """The waiting spare (not pid ``besides``) once it has imported ``module``."""
    return wait_for(
        lambda: next(
            (s for s in spares.waiting() if s["pid"] != besides and module in s["modules"]),
            None,
        ),
        timeout=120,
        what=lambda: spares.waiting(),
    )


FIRST_CELL = (
    "import json, os, sys\n"
    "had = 'torch' in sys.modules\n"
    "import torch\n"
    "print(json.dumps({'had_torch': had, 'cuda_initialized': torch.cuda.is_initialized(), "
    "'devices': os.environ.get('CUDA_VISIBLE_DEVICES'), 'cwd': os.getcwd(), "
    "'pid': os.getpid()}))"
)


def test_the_next_gpu_kernel_and_a_restart_are_the_warm_spare_with_the_leases_grant(
    pool: Scheduler, kernels: list[Kernel], tmp_path: Path
) -> None:
    first = Kernel().start()
    kernels.append(first)
    cold = json.loads(first.run(FIRST_CELL))
    assert cold["had_torch"] is False and cold["pid"] == first.pid  # spawned, and it learns

    spare = spare_with("torch")
    assert spare["kernelspec"] == "gpu" and "ipykernel" in spare["modules"]
    # while it waits the spare sees no GPU and the pool counts none for it
    environ = Path(f"/proc/{spare['pid']}/environ").read_bytes().split(b"\0")
    assert b"CUDA_VISIBLE_DEVICES=" in environ
    first.shutdown()
    wait_for(lambda: pool.status()["gpus"]["busy"] == 0, timeout=30)
    assert alive(spare["pid"])
    status = subprocess.run(
        [DLSCHED, "status"], capture_output=True, text=True, timeout=60, env=dict(os.environ)
    )
    [line] = [x for x in status.stdout.splitlines() if x.startswith("spare GPU kernels")]
    assert "1 (gpu)" in line and "torch" in line and "iB" in line, line
    listed = json.loads(
        subprocess.run(
            [DLSCHED, "status", "--json"], capture_output=True, text=True, timeout=60
        ).stdout
    )["spare_kernels"]
    assert [s["pid"] for s in listed] == [spare["pid"]] and listed[0]["rss"] > 0

    asked = time.time()
    second = Kernel().start()
    kernels.append(second)
    assert second.pid == spare["pid"]
    assert psutil.Process(second.pid).create_time() < asked  # started ahead of the request
    warm = json.loads(second.run(FIRST_CELL))
    grant = control.read(second.folder, "grant.json")
    assert grant is not None
    assert warm == {
        "had_torch": True,  # imported ahead
        "cuda_initialized": False,  # but CUDA not: the grant applies
        "devices": grant["env"]["CUDA_VISIBLE_DEVICES"],
        "cwd": str(tmp_path),  # where a spawned kernel would run
        "pid": spare["pid"],
    }
    assert warm["devices"] == "0"

    # the kernel's signals reach the spare's process: an interrupt stops a running cell
    msg_id = second.client.execute("import time; time.sleep(60)")
    time.sleep(0.5)
    second.manager.interrupt_kernel()
    reply = wait_for(
        lambda: second.client.get_shell_msg(timeout=30), timeout=60
    )  # the cell's reply
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = second.client.get_shell_msg(timeout=30)
    assert reply["content"]["status"] == "error"
    assert reply["content"]["ename"] == "KeyboardInterrupt"

    # a restart takes the next spare, on the same lease and GPU
    lease = second.manager.provisioner.job_id  # type: ignore[union-attr]
    following = spare_with("torch", besides=spare["pid"])
    second.manager.restart_kernel()
    second.client.wait_for_ready(timeout=60)
    assert second.pid == following["pid"]
    assert second.manager.provisioner.job_id == lease  # type: ignore[union-attr]
    restarted = json.loads(second.run(FIRST_CELL))
    assert restarted["had_torch"] and not restarted["cuda_initialized"]
    assert restarted["devices"] == "0"
    assert not alive(spare["pid"])  # the kernel restarted away is gone

    second.shutdown()
    assert not alive(following["pid"])


def test_preload_none_turns_spare_kernels_off(
    pool: Scheduler, kernels: list[Kernel], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DLSCHED_PRELOAD", "none")
    first = Kernel().start()
    kernels.append(first)
    first.shutdown()
    second = Kernel().start()
    kernels.append(second)
    assert second.run("import sys; print('torch' in sys.modules)").strip() == "False"
    assert not [p for p in psutil.Process().children(recursive=True) if _is_spare(p)]
    assert spares.waiting() == []
    assert psutil.Process(second.pid).cmdline()[1:3] == ["-m", "ipykernel_launcher"]


def _is_spare(process: psutil.Process) -> bool:
    try:
        return any(part.endswith("spare.py") for part in process.cmdline())
    except psutil.Error:
        return False


SERVER = """
import sys, time
from jupyter_client import KernelManager
km = KernelManager(kernel_name="gpu")
km.start_kernel()
print(km.provisioner.pid, flush=True)
time.sleep(600)
"""


def test_a_spare_kernel_ends_with_its_server_even_on_kill_9(pool: Scheduler) -> None:
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True, env=dict(os.environ)
    )
    try:
        assert server.stdout is not None
        kernel_pid = int(server.stdout.readline())
        spare = spare_with("ipykernel")
        assert spare["server_pid"] == server.pid and spare["pid"] != kernel_pid
        server.kill()
        server.wait()
        wait_for(lambda: not alive(spare["pid"]), timeout=30)
        wait_for(lambda: spares.waiting() == [], timeout=10)
    finally:
        server.kill()
        server.wait()


def test_a_module_that_fails_to_import_ahead_is_dropped_and_named(tmp_path: Path) -> None:
    """The spare process alone: it imports what kernels learnt; one that raises is dropped
    (never tried again), named on stderr, and the spare exits for the next one to start."""
    from jupyter_dlsched.kernels import spare

    base, modules = tmp_path / "dlsched-kernels", tmp_path / "modules"
    (base / "spares").mkdir(parents=True)
    modules.mkdir()
    (modules / "breaks_on_import.py").write_text("raise RuntimeError('no such device')\n")
    learnt = {"breaks_on_import": str(modules / "breaks_on_import.py")}
    (base / spare.IMPORTS_FILE).write_text(json.dumps(learnt))
    env = {k: v for k, v in os.environ.items() if k != "DLSCHED_PRELOAD"}
    env["PYTHONPATH"] = os.pathsep.join([str(modules), env.get("PYTHONPATH", "")])
    process = subprocess.Popen(
        [sys.executable, str(spares.SPARE_SCRIPT), str(base / "spares"), "gpu", "0"],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    process.wait(timeout=120)  # its stdin open: it is let go on end of file
    assert process.stderr is not None and process.stdin is not None
    err = process.stderr.read()
    process.stdin.close()
    assert process.returncode == spare.EXIT_DROPPED, err
    assert "breaks_on_import is no longer imported ahead" in err
    assert "RuntimeError: no such device" in err
    assert (base / spare.DROPPED_FILE).read_text().split() == ["breaks_on_import"]
    assert spare.wanted(base) == []
    assert list((base / "spares").iterdir()) == []  # no state file left behind
