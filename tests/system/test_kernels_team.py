"""GPU kernels in a shared pool: two real users' kernels lease GPUs through the service, each
as its owner, and the service's per-user GPU limit applies to kernels as to jobs."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from conftest import OtherUser
from team_pool import Service, shared_pool, wait_for

#: a Jupyter client of the user's own: installs a GPU kernelspec, starts a kernel, prints
#: the lease and what the kernel sees, then shuts the kernel down when told (stdin closed)
CLIENT = """
import json, sys
from jupyter_client import KernelManager
from jupyter_dlsched.kernels.kernelspecs import GpuKernelRequest, install

install(GpuKernelRequest(gpus=1, idle="never", wait_limit="never"), user=True, name="gpu")
km = KernelManager(kernel_name="gpu")
km.start_kernel()
kc = km.client()
kc.start_channels()
kc.wait_for_ready(timeout=60)
out = []
kc.execute_interactive(
    "import os; print(os.getuid(), os.environ['CUDA_VISIBLE_DEVICES'])",
    output_hook=lambda m: out.append(m["content"].get("text", "")),
)
print(json.dumps({"lease": km.provisioner.job_id, "kernel": "".join(out).split()}), flush=True)
sys.stdin.read()
kc.stop_channels()
km.shutdown_kernel()
"""


class Client:
    """``CLIENT`` running as ``user`` against the shared pool."""

    def __init__(self, user: OtherUser, service: Service) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="dlsched-kernel-client-"))
        os.chown(self.folder, user.uid, user.gid)
        env = user.client_env(
            DLSCHED_SOCKET=str(service.socket),
            JUPYTER_DATA_DIR=str(self.folder / "data"),
            JUPYTER_RUNTIME_DIR=str(self.folder / "runtime"),
            JUPYTER_CONFIG_DIR=str(self.folder / "config"),
        )
        self.proc = subprocess.Popen(
            user.command("/usr/bin/python3", "-c", CLIENT),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd="/",
            env=env,
        )

    def started(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, self.stop()
        return dict(json.loads(line))

    def stop(self) -> str:
        """Tell the client to shut its kernel down (idempotent); its stderr."""
        if self.proc.returncode is not None:
            return ""
        if self.proc.poll() is None:
            try:
                _, err = self.proc.communicate(input="", timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                _, err = self.proc.communicate()
        else:
            err = self.proc.stderr.read() if self.proc.stderr else ""
        subprocess.run(["rm", "-rf", str(self.folder)], check=False)
        return err


def test_two_users_kernels_share_the_pool_each_as_its_owner_within_the_gpu_limit(
    team_users: tuple[OtherUser, OtherUser],
) -> None:
    a, b = team_users
    clients: list[Client] = []
    with ExitStack() as stack:
        service = stack.enter_context(shared_pool("[limits]\nmax_gpus = 1\n"))
        # the clients (and their kernels) end before the service does
        stack.callback(lambda: [client.stop() for client in clients])
        a_client, b_client = Client(a, service), Client(b, service)
        clients += [a_client, b_client]
        a_kernel, b_kernel = a_client.started(), b_client.started()
        a_row, b_row = service.job(a_kernel["lease"]), service.job(b_kernel["lease"])
        assert (a_row["kind"], a_row["owner"], a_row["uid"]) == ("kernel", a.name, a.uid)
        assert (b_row["kind"], b_row["owner"], b_row["uid"]) == ("kernel", b.name, b.uid)
        # each kernel runs as its user, on its own one of the two GPUs
        assert a_kernel["kernel"][0] == str(a.uid) and b_kernel["kernel"][0] == str(b.uid)
        assert {a_kernel["kernel"][1], b_kernel["kernel"][1]} == {"0", "1"}

        # A's second kernel waits: A holds 1 GPU, the limit per user
        second = Client(a, service)
        clients.append(second)

        def second_lease() -> dict[str, Any] | None:
            rows = service_jobs(service)
            waiting = [r for r in rows if r["kind"] == "kernel" and r["state"] == "queued"]
            return waiting[0] if waiting and waiting[0]["waiting"] else None

        row = wait_for(second_lease, timeout=60)
        assert row["owner"] == a.name
        assert row["waiting"] == f"{a.name} holds 1 GPU, the limit per user is 1"

        # A's first kernel shuts down: its GPU goes to A's waiting kernel
        a_client.stop()
        third = second.started()
        assert third["kernel"] == [str(a.uid), a_kernel["kernel"][1]]
        wait_for(lambda: service.job(a_kernel["lease"])["state"] == "succeeded", timeout=60)


def service_jobs(service: Service) -> list[dict[str, Any]]:
    from jupyter_dlsched.agent.client import AgentClient

    return list(AgentClient(str(service.socket)).call("jobs", states=["queued"])["jobs"])
