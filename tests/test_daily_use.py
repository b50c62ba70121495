"""What a researcher meets in the first hour: interpreter spellings, reasons, the pool's
shape, cells with missing names, steering finished jobs, short errors, sweeps, requeue."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import stop_agent, wait_for

from jupyter_dlsched.placement import place
from jupyter_dlsched.policy import QueuedJob, RunningJob, get_policy
from jupyter_dlsched.policy.base import describe_shortfall
from jupyter_dlsched.resources import Capacity, Request
from jupyter_dlsched.scheduler import Scheduler

GIB = 2**30
BIN = Path(sys.executable).parent
DLSCHED = str(BIN / "dlsched")


def console_env(home: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "DLSCHED_HOME": str(home), "DLSCHED_SIMULATE_GPUS": "2x16GiB"}
    for name in ("DLSCHED_POLICY", "DLSCHED_BACKEND", "DLSCHED_SOCKET"):
        env.pop(name, None)
    env.update(extra)
    return env


def cli(
    env: dict[str, str], *args: str, python: str | None = None, status: int = 0
) -> subprocess.CompletedProcess[str]:
    """``dlsched ARGS`` as the console script, or as ``PYTHON -m jupyter_dlsched.cli``."""
    argv = [python, "-m", "jupyter_dlsched.cli", *args] if python else [DLSCHED, *args]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == status, (out.returncode, out.stdout, out.stderr)
    return out


def agent_pid(env: dict[str, str], python: str | None = None) -> int:
    """The pid ``dlsched status`` names: "pool: yours alone, agent pid 123, state in ..."."""
    text = cli(env, "status", python=python).stdout
    match = re.search(r"agent pid (\d+)", text)
    assert match, text
    return int(match.group(1))


# 1. one interpreter, two spellings


@pytest.mark.parametrize(
    "submitter, reader",
    [("python", "python3"), ("python3", None), (None, "python")],
    ids=["python-then-python3", "python3-then-script", "script-then-python"],
)
def test_both_spellings_of_the_interpreter_share_one_agent(tmp_path, submitter, reader):
    spellings = {name: str(BIN / name) for name in ("python", "python3")}
    assert all(Path(p).exists() for p in spellings.values())
    home = tmp_path / "home"
    env = console_env(home)
    try:
        sub = spellings[submitter] if submitter else None
        read = spellings[reader] if reader else None
        job_id = cli(
            env, "submit", "--cpus", "0.25", "--name", "long", "--", "sleep", "60", python=sub
        ).stdout.strip()
        pid = agent_pid(env, python=sub)
        started = time.monotonic()
        out = cli(env, "queue", "--json", python=read)
        listed = {j["id"]: j["state"] for j in json.loads(out.stdout)}
        # the job is listed as running: the reader did not replace the agent and wait
        # for a new one to re-adopt it
        assert listed.get(job_id) == "running", listed
        assert agent_pid(env, python=read) == pid
        assert agent_pid(env, python=sub) == pid
        assert time.monotonic() - started < 60  # a safety net: the job sleeps for 60 s
        cli(env, "cancel", job_id, python=read)
    finally:
        stop_agent(home)


# 2. the reason a shared-GPU job waits


def test_a_shared_gpu_job_short_of_cpus_says_cpus_not_gpu_memory():
    idle = Capacity.empty(n_gpus=2, gpu_mem=16 * GIB, cpus=2, mem=64 * GIB)
    hog = place(Request(cpus=2), idle)
    assert hog is not None
    no_cpus = idle.take(hog)
    assert describe_shortfall(Request(gpus=0.5, cpus=1), no_cpus) == "waiting for 1 CPU"
    assert describe_shortfall(Request(gpus=1, cpus=1), no_cpus) == "waiting for 1 CPU"
    # GPU memory is the reason when that is what is missing
    both = place(Request(gpus=2, cpus=0), idle)
    assert both is not None
    assert describe_shortfall(Request(gpus=0.5, cpus=1), idle.take(both)) == (
        "waiting for GPU memory"
    )


def test_every_policy_words_a_cpu_shortfall_of_a_shared_gpu_job_as_cpus():
    idle = Capacity.empty(n_gpus=2, gpu_mem=16 * GIB, cpus=2, mem=64 * GIB)
    request = Request(cpus=2)
    placement = place(request, idle)
    assert placement is not None
    running = RunningJob("hog", 0, request=request, placement=placement, submitted=0, started=0)
    queued = [
        QueuedJob("half", 1, request=Request(gpus=0.5, cpus=1), submitted=1),
        QueuedJob("whole", 2, request=Request(gpus=1, cpus=1), submitted=2),
    ]
    for name in ("priority", "fifo-ff", "fair", "sjf"):
        decisions = get_policy(name)(queued, [running], idle.take(placement), now=5)
        assert decisions.starts == []
        assert decisions.waiting == {"half": "waiting for 1 CPU", "whole": "waiting for 1 CPU"}, (
            name
        )


def test_a_queued_shared_gpu_job_says_it_waits_for_cpus(home):
    with Scheduler(home, agent=False) as s:
        cpus = s.inventory["cpus"]
        hog = s.submit(time.sleep, 60, cpus=cpus, name="hog")
        half = s.submit(time.sleep, 0, gpus=0.5, cpus=1, name="half")
        whole = s.submit(time.sleep, 0, gpus=1, cpus=1, name="whole")
        wait_for(lambda: hog.state == "running", timeout=60)
        s.tick()
        assert whole.info().waiting == "waiting for 1 CPU"
        assert half.info().waiting == "waiting for 1 CPU"
        hog.cancel()


# 3. the pool's shape is the ledger's, whoever asks and whoever started the agent


def pool_views(env: dict[str, str]) -> tuple[dict, str]:
    data = json.loads(cli(env, "status", "--json").stdout)
    return data, cli(env, "status").stdout


def assert_four_simulated(env: dict[str, str]) -> None:
    data, text = pool_views(env)
    assert data["gpus"]["total"] == 4 and data["gpus"]["simulated"] == 4, data["gpus"]
    simulated = [g for g in data["pool"]["gpus"] if g["simulated"]]
    assert len(simulated) == 4, data["pool"]
    assert "GPU 0/4 (4 simulated) busy" in text, text
    assert "no GPUs" not in text, text
    assert text.count("[simulated]") == 4, text


def test_a_simulated_pool_stays_simulated_whoever_starts_its_agent(tmp_path):
    home = tmp_path / "home"
    lab = console_env(home, DLSCHED_SIMULATE_GPUS="4x16GiB")
    plain = console_env(home)
    plain.pop("DLSCHED_SIMULATE_GPUS")
    try:
        assert_four_simulated(lab)  # the agent `make lab` started
        assert_four_simulated(plain)  # a plain terminal beside it sees the same pool
        stop_agent(home)  # the lab's agent idles out
        assert_four_simulated(plain)  # the plain terminal's own agent keeps the GPUs
        # said explicitly, the ledger forgets them, and a plain terminal after that too
        stop_agent(home)
        data, text = pool_views(console_env(home, DLSCHED_SIMULATE_GPUS="none"))
        assert data["gpus"]["simulated"] == 0 and "[simulated]" not in text, text
        stop_agent(home)
        data, text = pool_views(plain)
        assert data["gpus"]["simulated"] == 0 and "[simulated]" not in text, text
        assert not [g for g in data["pool"]["gpus"] if g["simulated"]]
    finally:
        stop_agent(home)


def test_a_simulated_pool_survives_without_an_agent(tmp_path):
    home = tmp_path / "home"
    lab = console_env(home, DLSCHED_SIMULATE_GPUS="4x16GiB", DLSCHED_AGENT="0")
    plain = console_env(home, DLSCHED_AGENT="0")
    plain.pop("DLSCHED_SIMULATE_GPUS")
    assert_four_simulated(lab)
    # a kernel started from a plain terminal opens the ledger and probes the machine again
    kernel = subprocess.run(
        [sys.executable, "-c", "import jupyter_dlsched as dls; print(len(dls.pool().gpus))"],
        env=plain,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert kernel.stdout.strip() == "4", kernel.stderr
    assert_four_simulated(plain)
