"""sjf learns run times from what a trace gives: owner, name and GPU count (#52).

A Philly virtual cluster names no users and no jobs: every job had one owner and
no name, so sjf learnt one run time for all and ordered as fifo-ff on every slice.
Run times are now learnt by GPU count too; where every job shares owner, name and
GPU count, ``dlsched sim`` says sjf has nothing to learn from.
"""

from __future__ import annotations

import json
import subprocess
import sys

from jupyter_dlsched.policy import FinishedJob, QueuedJob, SjfPolicy
from jupyter_dlsched.sim import TraceJob, simulate
from jupyter_dlsched.vocab.resources import Capacity, Request


def test_jobs_of_one_owner_without_names_are_told_apart_by_gpu_count():
    # one owner, no names. 1-GPU jobs ran 100 s, 2-GPU jobs 10 s. Two GPUs free; the
    # 1-GPU job was submitted first. Learnt by GPU count the 2-GPU job is shorter and
    # starts; with one run time for all (before) submit order started the 1-GPU job
    policy = SjfPolicy()
    policy.learn(
        [FinishedJob("vc", "", 100.0, 0.0, gpus=1)] * 3
        + [FinishedJob("vc", "", 20.0, 0.0, gpus=2)] * 3
    )
    capacity = Capacity.empty(n_gpus=2, gpu_mem=16 * 2**30, cpus=0, mem=0)
    long = QueuedJob("long", 1, 0.0, Request(gpus=1, cpus=0), owner="vc")
    short = QueuedJob("short", 2, 1.0, Request(gpus=2, cpus=0), owner="vc")
    assert [s.job_id for s in policy([long, short], [], capacity, 5.0).starts] == ["short"]


def burst() -> list[TraceJob]:
    # 2 GPUs, one owner, no names. To learn from, alone: three 1-GPU jobs of 1,000 s
    # and three 2-GPU jobs of 10 s. Then holder (2 GPUs, 100 s) runs from 7,000 while
    # one (1 GPU, 1,000 s) and two (2 GPUs, 10 s) come, one first
    jobs = [TraceJob(f"teach1-{i}", i * 2000.0, 1, 1000.0, "vc") for i in range(3)]
    jobs += [TraceJob(f"teach2-{i}", 6000.0 + i * 100.0, 2, 10.0, "vc") for i in range(3)]
    return jobs + [
        TraceJob("holder", 7000.0, 2, 100.0, "vc"),
        TraceJob("one", 7001.0, 1, 1000.0, "vc"),
        TraceJob("two", 7002.0, 2, 10.0, "vc"),
    ]


def test_a_replay_of_one_owner_without_names_is_no_longer_fifo_ff():
    # when holder ends at 7,100: fifo-ff starts one, and two waits for it (8,100). sjf
    # has learnt that 2-GPU jobs run 10 s: two runs 7,100-7,110, then one. With one
    # run time for all (the median of all six, 10 s) sjf was fifo-ff
    def starts(policy: str) -> dict[str, float]:
        return {j.id: j.first_start for j in simulate(burst(), policy, gpus=2).jobs}

    assert {k: starts("fifo-ff")[k] for k in ("one", "two")} == {"one": 7100.0, "two": 8100.0}
    assert {k: starts("sjf")[k] for k in ("one", "two")} == {"one": 7110.0, "two": 7100.0}


def test_sim_says_when_sjf_has_nothing_to_learn_from(tmp_path):
    same = tmp_path / "same.csv"
    same.write_text("0,1,100\n1,1,50\n2,1,10\n")
    mixed = tmp_path / "mixed.csv"
    mixed.write_text("0,1,100\n1,2,50\n2,1,10\n")

    def notes(path) -> list[str]:
        out = subprocess.run(
            [sys.executable, "-m", "jupyter_dlsched.cli", "sim", str(path), "--gpus", "2"]
            + ["--policy", "fifo,sjf", "--json"],
            capture_output=True,
            text=True,
            check=True,
        )
        return json.loads(out.stdout)["notes"]

    assert notes(same) == [
        "sjf: every job has the same owner, name and GPU count, so the run times it learns "
        "cannot tell jobs apart; it orders them as fifo-ff does"
    ]
    assert notes(mixed) == []
