"""Warm GPU kernels in a real ``jupyter server`` process: a notebook's GPU kernel is the
server's spare kernel, and a server that shuts down leaves no spare (and no kernel) behind."""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
from conftest import alive, stop_agent, wait_for

from jupyter_dlsched.kernels import spares
from jupyter_dlsched.local import launcher

TOKEN = secrets.token_hex(16)


@dataclass
class Server:
    url: str
    process: subprocess.Popen[bytes]
    root: Path
    log: Path

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = requests.post(
            self.url + path,
            json=body,
            headers={"Authorization": f"token {TOKEN}"},
            timeout=120,
        )
        assert response.status_code < 300, (response.status_code, response.text)
        data: dict[str, Any] = response.json()
        return data

    def serving(self) -> bool:
        assert self.process.poll() is None, self.log.read_text()[-4000:]
        try:
            return requests.get(self.url + "/api/status", timeout=5).status_code < 500
        except requests.ConnectionError:
            return False

    def kernel_pid(self, kernel_id: str) -> int:
        """The kernel's pid, as its lease reads it (``kernel.json`` of its control folder)."""
        path = self.root / "runtime" / "dlsched-kernels" / kernel_id / "kernel.json"
        return int(wait_for(lambda: path.exists() and json.loads(path.read_text()))["pid"])

    def spare(self, besides: int = 0) -> dict[str, Any]:
        base = self.root / "runtime" / "dlsched-kernels"
        return wait_for(
            lambda: next((s for s in spares.waiting(base) if s["pid"] != besides), None),
            timeout=120,
            what=lambda: self.log.read_text()[-4000:],
        )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    home, config = tmp_path / "dlsched", tmp_path / "config"
    config.mkdir()
    (config / "jupyter_server_config.json").write_text(
        json.dumps({"ServerApp": {"jpserver_extensions": {"jupyter_dlsched": True}}})
    )
    env = {
        **os.environ,
        "DLSCHED_HOME": str(home),
        "DLSCHED_SIMULATE_GPUS": "2x16GiB",
        "JUPYTER_CONFIG_DIR": str(config),
        "JUPYTER_DATA_DIR": str(tmp_path / "data"),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
    }
    for name in ("DLSCHED_POLICY", "DLSCHED_BACKEND", "DLSCHED_PRELOAD"):
        env.pop(name, None)
    dlsched = str(Path(sys.executable).with_name("dlsched"))
    install = [dlsched, "kernels", "install", "--gpus", "1", "--idle", "never", "--name", "gpu"]
    subprocess.run(install, env=env, check=True, capture_output=True, timeout=60)
    port, log = free_port(), tmp_path / "server.log"
    script = Path(sys.executable).parent / "jupyter-server"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "jupyter_server"]
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [
                *command,
                "--ip=127.0.0.1",
                f"--port={port}",
                "--ServerApp.port_retries=0",
                f"--IdentityProvider.token={TOKEN}",
                "--no-browser",
                "--allow-root",
                f"--ServerApp.root_dir={tmp_path}",
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    server = Server(f"http://127.0.0.1:{port}", process, tmp_path, log)
    try:
        wait_for(server.serving, timeout=90)
        yield server
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        launcher.stop(home)
        stop_agent(home)


def test_a_notebooks_gpu_kernel_is_the_servers_spare_and_shutdown_leaves_none(
    server: Server,
) -> None:
    first = server.post(
        "/api/sessions", {"path": "a.ipynb", "type": "notebook", "kernel": {"name": "gpu"}}
    )
    first_pid = server.kernel_pid(first["kernel"]["id"])
    spare = server.spare()
    assert spare["kernelspec"] == "gpu" and spare["server_pid"] == server.process.pid
    assert spare["pid"] != first_pid

    second = server.post(
        "/api/sessions", {"path": "b.ipynb", "type": "notebook", "kernel": {"name": "gpu"}}
    )
    assert server.kernel_pid(second["kernel"]["id"]) == spare["pid"]  # the spare took it
    following = server.spare(besides=spare["pid"])  # and the next one waits

    server.process.send_signal(signal.SIGTERM)  # as Ctrl-C twice, or a service manager
    server.process.wait(timeout=60)
    for pid in (first_pid, spare["pid"], following["pid"]):
        wait_for(lambda pid=pid: not alive(pid), timeout=30)
