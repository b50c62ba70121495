"""Default policies know no job's duration before it finishes, as a live scheduler.

Each default policy is replayed blindfolded: every duration the replay could
show it (the true remaining time, a time limit made from the duration) fails
the test when read. What it learns from finished jobs is allowed.
``--time-limits exact`` (an oracle, labelled so) is the opposite.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import NoReturn

import pytest

from jupyter_dlsched.policy import PresortedQueue, get_policy
from jupyter_dlsched.policy.base import PolicyGate, RunningSet
from jupyter_dlsched.sim import TraceJob, simulate
from jupyter_dlsched.sim.cli import DEFAULT_POLICIES

BLIND = [p for p in DEFAULT_POLICIES.split(",") if p != "srtf"] + ["fair", "sjf-gputime"]


def trace(seed: int) -> list[TraceJob]:
    rng = random.Random(seed)
    jobs = []
    for i in range(80):
        gpus = rng.choice([1, 1, 2, 4])
        duration = rng.uniform(600, 7200)
        owner, name = rng.choice(["ana", "bob"]), rng.choice(["train", "probe"])
        jobs.append(TraceJob(f"j{i}", i * 20.0, gpus, duration, owner, 50, name))
    return jobs


class Unknown:
    """A duration a live scheduler does not have: any use of it fails the test."""

    def _read(self, *args: object) -> NoReturn:
        raise AssertionError("the policy read a job's true duration")

    __float__ = __bool__ = __lt__ = __le__ = __gt__ = __ge__ = _read
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _read
    __truediv__ = __rtruediv__ = __neg__ = _read


def _hide(limit: float | None) -> object:
    return None if limit is None else Unknown()


class Blindfold(PolicyGate):
    """The wrapped policy, shown jobs whose remaining run time (and the time limit the
    replay derived from their duration, if any) is ``Unknown``."""

    def __call__(self, queued, running, capacity, now):  # type: ignore[no-untyped-def]
        hidden = [replace(j, remaining=Unknown(), time_limit=_hide(j.time_limit)) for j in queued]
        queued = queued.narrowed(hidden) if isinstance(queued, PresortedQueue) else hidden
        running = RunningSet(
            [replace(r, remaining=Unknown(), time_limit=_hide(r.time_limit)) for r in running],
            getattr(running, "ranks", None),
        )
        return self._policy(queued, running, capacity, now)


@pytest.mark.parametrize("policy", BLIND)
def test_default_policies_never_read_a_duration(policy: str) -> None:
    jobs = trace(1)
    seen = simulate(jobs, policy, gpus=8)
    blind = simulate(jobs, Blindfold(get_policy(policy)), gpus=8)
    assert [(j.first_start, j.finish) for j in blind.jobs] == [
        (j.first_start, j.finish) for j in seen.jobs
    ]
    assert "oracle" not in seen.policy and "exact" not in seen.policy


@pytest.mark.parametrize(("policy", "limits"), [("srtf", None), ("priority", "exact")])
def test_the_blindfold_catches_a_policy_that_reads_durations(policy: str, limits: object) -> None:
    with pytest.raises(AssertionError, match="true duration"):
        simulate(trace(1), Blindfold(get_policy(policy)), gpus=8, time_limits=limits)


@pytest.mark.parametrize("policy", ["sjf", "priority"])
def test_exact_limits_are_an_oracle_and_say_so(policy: str) -> None:
    result = simulate(trace(1), policy, gpus=8, time_limits="exact")
    assert result.policy == f"{policy} (oracle)"


def test_learnt_sizes_order_sjf_without_limits() -> None:
    # after three finished 'probe' runs of 10 s and three 'train' runs of 1000 s, a waiting
    # probe goes before a train submitted earlier
    jobs = [TraceJob(f"p{i}", 0, 1, 10.0, "ana", 50, "probe") for i in range(3)]
    jobs += [TraceJob(f"t{i}", 0, 1, 1000.0, "ana", 50, "train") for i in range(3)]
    jobs += [TraceJob("blocker", 1, 1, 5000.0, "ana", 50, "other")]
    jobs += [TraceJob("train", 2000, 1, 1000.0, "ana", 50, "train")]
    jobs += [TraceJob("probe", 2001, 1, 10.0, "ana", 50, "probe")]
    done = {j.id: j for j in simulate(jobs, "sjf", gpus=1).jobs}
    assert done["probe"].first_start < done["train"].first_start


def test_dlsched_sim_by_default_labels_only_srtf_an_oracle(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(
        "submit_time,num_gpus,duration\n"
        + "".join(f"{j.submit},{j.gpus},{j.duration}\n" for j in trace(2))
    )
    script = Path(sys.executable).with_name("dlsched")
    command = str(script) if script.exists() else shutil.which("dlsched")
    assert command
    done = subprocess.run(
        [command, "sim", str(path), "--gpus", "8", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    labels = [row["policy"] for row in json.loads(done.stdout)["rows"]]
    assert [label for label in labels if "oracle" in label or "exact" in label] == ["srtf (oracle)"]
