"""A real single-node SLURM for tests (two pretend GPUs, no accounting), started in the
foreground with everything in one temporary folder. Needs root and Debian's
``slurmctld slurmd slurm-client munge`` packages (CI installs them); a module that
uses it sets ``pytestmark = SKIP_WITHOUT_SLURM`` and wraps ``running_cluster()`` in a
module-scoped fixture.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo", "scontrol")
SKIP_WITHOUT_SLURM = [
    pytest.mark.skipif(os.geteuid() != 0, reason="starting a SLURM cluster needs root"),
    pytest.mark.skipif(
        any(shutil.which(d) is None and not os.path.exists(f"/usr/sbin/{d}") for d in DAEMONS),
        reason="needs SLURM and munge: apt-get install slurmctld slurmd slurm-client munge",
    ),
]
pytest.importorskip("submitit")

SLURM_CONF = """ClusterName=dlstest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={dir}/munge/munge.sock
SlurmUser=root
SlurmdUser=root
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
SlurmdParameters=config_overrides
GresTypes=gpu
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
ReturnToService=2
KillWait=2
MinJobAge=600
DefMemPerCPU=100
PriorityType=priority/basic
NodeName=localhost NodeAddr=127.0.0.1 CPUs=4 RealMemory=1000 Gres=gpu:2 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""


def until(predicate: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"condition not met within {timeout}s")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def tool(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=30).stdout


@contextmanager
def running_cluster() -> Iterator[SimpleNamespace]:
    """Start munged, slurmctld and slurmd; yield ``(folder, conf)``; stop them after."""
    # readable by a second Unix user, who needs the configuration and munge's socket
    folder = Path(tempfile.mkdtemp(prefix="dlslurm", dir="/tmp"))
    folder.chmod(0o755)
    for sub in ("state", "spool", "dev", "munge"):
        (folder / sub).mkdir()
    (folder / "munge").chmod(0o755)
    key = folder / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    for i in range(2):  # pretend GPUs: SLURM only needs a character device per card
        os.mknod(folder / "dev" / f"gpu{i}", 0o666 | 0o020000, os.makedev(1, 3))
    (folder / "gres.conf").write_text(f"NodeName=localhost Name=gpu File={folder}/dev/gpu[0-1]\n")
    conf = folder / "slurm.conf"
    conf.write_text(
        SLURM_CONF.format(
            host=socket.gethostname(), ctld_port=free_port(), d_port=free_port(), dir=folder
        )
    )
    patch = pytest.MonkeyPatch()
    patch.setenv("SLURM_CONF", str(conf))
    munge = folder / "munge"
    daemons = []
    try:
        for argv in (
            [
                "munged",
                "-F",
                "--force",
                f"--socket={munge}/munge.sock",
                f"--key-file={key}",
                f"--pid-file={munge}/munged.pid",
                f"--log-file={munge}/munged.log",
                f"--seed-file={munge}/seed",
            ],
            ["slurmctld", "-D", "-c", "-f", str(conf)],
            ["slurmd", "-D", "-f", str(conf), "-N", "localhost"],
        ):
            daemons.append(
                subprocess.Popen(
                    argv,
                    stdout=subprocess.DEVNULL,
                    stderr=open(folder / f"{argv[0]}.out", "wb"),  # noqa: SIM115
                )
            )
            if argv[0] == "munged":
                until(lambda: (munge / "munge.sock").exists(), timeout=20)
        (munge / "munge.sock").chmod(0o777)

        def idle() -> bool:
            try:
                return tool("sinfo", "--noheader", "--format=%t").strip() == "idle"
            except subprocess.CalledProcessError:
                return False

        until(idle, timeout=30)
        yield SimpleNamespace(folder=folder, conf=conf)
    finally:
        subprocess.run(["scancel", "--partition=debug"], check=False, capture_output=True)
        for daemon in reversed(daemons):
            daemon.terminate()
            try:
                daemon.wait(timeout=10)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
        patch.undo()
        shutil.rmtree(folder, ignore_errors=True)
