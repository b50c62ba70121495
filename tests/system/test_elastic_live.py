"""Elastic jobs on a live pool of two simulated GPUs: real processes, a real ledger.

A checkpointing loop records every step with the number of GPUs it saw; the
scheduler grows it into the idle GPU, shrinks it when a rigid job arrives and
grows it back when that job ends, each time by checkpoint and restart.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jupyter_dlsched.client.scheduler import Scheduler
from jupyter_dlsched.vocab.errors import SpecError
from tests.conftest import wait_for


def recording_loop(log: str, ckpt: str, steps: int) -> int:
    """Counts steps, appending ``step gpus`` to ``log``; on a stop request saves and exits."""
    import os
    import time
    from pathlib import Path

    import jupyter_dlsched as dls

    gpus = len([d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d])
    file = Path(ckpt)
    step = int(file.read_text()) if file.exists() else 0
    with open(log, "a") as out:
        while step < steps:
            if dls.checkpoint_requested():
                file.write_text(str(step))
                raise SystemExit(0)
            step += 1
            out.write(f"{step} {gpus}\n")
            out.flush()
            time.sleep(0.05)
    file.write_text(str(step))
    return step


def hold(seconds: float) -> str:
    import os
    import time

    time.sleep(seconds)
    return os.environ.get("CUDA_VISIBLE_DEVICES", "")


def test_an_elastic_job_grows_shrinks_for_a_rigid_job_and_grows_back(home, tmp_path):
    log, ckpt = tmp_path / "steps", tmp_path / "ckpt"
    with Scheduler(home, lease_ttl=3, grace=5, resize_every=1, resize_cost=0.1) as s:
        elastic = s.submit(
            recording_loop, str(log), str(ckpt), 400, gpus="1:2", cpus=0.25, preemptible=True
        )
        # alone, it starts on both GPUs
        wait_for(lambda: elastic.state == "running" and log.exists(), 30)
        assert len(elastic.info().placement.gpus) == 2
        time.sleep(1.5)
        rigid = s.submit(hold, 3.0, gpus=1, cpus=0.25)
        wait_for(lambda: rigid.state == "running", 30, what=lambda: s.jobs())
        # it took the GPU the elastic job gave back; the elastic job runs on the other one
        wait_for(lambda: elastic.state == "running" and elastic.info().placement, 30)
        shrunk = elastic.info().placement.gpus
        assert len(shrunk) == 1 and shrunk != tuple(rigid.info().placement.gpus)
        assert rigid.result(timeout=30) in ("0", "1")
        # the rigid job ended: it grows back to two
        wait_for(
            lambda: (p := elastic.info().placement) is not None and len(p.gpus) == 2,
            30,
            what=lambda: elastic.info(),
        )
        assert elastic.result(timeout=90) == 400
        info = elastic.info()
    numbers = [int(x) for x in log.read_text().split()[::2]]
    sizes = [int(x) for x in log.read_text().split()[1::2]]
    # no step lost or repeated across the resizes
    assert numbers == list(range(1, 401))
    runs = [sizes[0]] + [b for a, b in zip(sizes, sizes[1:], strict=False) if a != b]
    assert runs[:3] == [2, 1, 2]
    assert info.preemptions == 0  # resizes are not preemptions
    reasons = [e["reason"] for e in s.store.events(info.id)]
    assert any(r.startswith("shrunk to 1 GPU") for r in reasons), reasons
    assert any(r.startswith("grown to 2 GPUs") for r in reasons), reasons
    assert "resizing to 1 GPU" in reasons and "resizing to 2 GPUs" in reasons
    # accounting integrates the GPU-seconds over the sizes it had: more than one GPU's
    # worth of its run, less than two
    ran = info.finished - next(
        e["time"] for e in s.store.events(info.id) if e["to_state"] == "running"
    )
    assert ran < info.attained < 2 * ran


def test_a_job_that_cannot_resume_is_refused_as_elastic(home):
    with Scheduler(home, loop=False) as s, pytest.raises(SpecError) as err:
        s.submit(hold, 0.1, gpus="1:2", cpus=0.25)
    message = str(err.value)
    assert "preemptible=True" in message and "dlt.Checkpoint" in message
    assert "docs/elastic.md" in message


def test_a_range_can_be_given_as_a_tuple_and_is_kept_in_the_ledger(home):
    with Scheduler(home, loop=False) as s:
        handle = s.submit(hold, 0.1, gpus=(1, 2), cpus=0.25, preemptible=True)
        info = handle.info()
        assert (info.gpus, info.max_gpus) == (1.0, 2)
        handle.cancel()


def until_file(path: str) -> str:
    import os
    import time
    from pathlib import Path

    while not Path(path).exists():
        time.sleep(0.05)
    return os.environ.get("CUDA_VISIBLE_DEVICES", "")


def test_an_asked_size_waits_in_line_at_that_size_where_a_bare_range_jumps_ahead(
    home, tmp_path, monkeypatch
):
    # four GPUs, three held; a 4-GPU job waits first in line; first fit starts what fits
    monkeypatch.setenv("DLSCHED_SIMULATE_GPUS", "4x16GiB")
    release = tmp_path / "release"
    with Scheduler(home, policy="fifo-ff", lease_ttl=3, grace=5, resize_every=3600) as s:
        blocker = s.submit(until_file, str(release), gpus=3, cpus=0.25)
        wait_for(lambda: blocker.state == "running", 30)
        wide = s.submit(hold, 0.5, gpus=4, cpus=0.25)
        asked = s.submit(hold, 0.5, gpus="1:2:4", cpus=0.25, preemptible=True)
        # in line as the 2-GPU job it would be: one GPU is free, and it does not take it
        wait_for(lambda: asked.info().waiting and wide.info().waiting, 30)
        info = asked.info()
        assert (info.state, info.gpus, info.asked_gpus, info.max_gpus) == ("queued", 1.0, 2, 4)
        assert info.request_text.startswith("2 GPUs (1–4)")
        assert info.waiting == "waiting for 2 GPUs"
        assert info.to_json()["request"]["asked_gpus"] == 2
        # a bare range waits in line at its minimum: it takes that GPU, ahead of both
        bare = s.submit(hold, 0.5, gpus="1:4", cpus=0.25, preemptible=True)
        wait_for(lambda: bare.state in ("running", "succeeded"), 30)
        assert asked.state == "queued"
        assert bare.result(timeout=30) == "3"
        release.touch()
        assert asked.result(timeout=60) == "0,1,2,3"  # alone at last: it grew to its maximum
        # it started after the job ahead of it in line ended, not before
        assert asked.info().started >= wide.info().finished
        assert bare.info().started < wide.info().started


def test_an_asked_size_starts_narrower_first_in_line(home, tmp_path, monkeypatch):
    monkeypatch.setenv("DLSCHED_SIMULATE_GPUS", "4x16GiB")
    release = tmp_path / "release"
    with Scheduler(home, lease_ttl=3, grace=5, resize_every=3600) as s:
        blocker = s.submit(until_file, str(release), gpus=3, cpus=0.25)
        wait_for(lambda: blocker.state == "running", 30)
        # first in line, its 2 GPUs not free: it starts on the one GPU nobody waits for
        asked = s.submit(until_file, str(release), gpus=(1, 2, 4), cpus=0.25, preemptible=True)
        wait_for(lambda: asked.state == "running", 30, what=lambda: asked.info())
        assert len(asked.info().placement.gpus) == 1
        release.touch()
        assert len(asked.result(timeout=60).split(",")) == 1
        assert blocker.result(timeout=60)


def test_an_asked_size_outside_the_range_or_the_pool_is_refused(home):
    with Scheduler(home, loop=False) as s:
        for gpus, words in (
            ("1:3:2", "MIN:ASKED:MAX"),
            ((2, 1, 4), "MIN:ASKED:MAX"),
            ("1:2:3:4", "MIN:ASKED:MAX"),
            ("1:3:4", "an asked size this pool can satisfy (requests 3 GPUs; this pool has 2)"),
        ):
            with pytest.raises(SpecError, match=re.escape(words)):
                s.submit(hold, 0.1, gpus=gpus, cpus=0.25, preemptible=True)
        assert s.jobs() == []


def test_a_requeued_elastic_job_keeps_its_range_and_asked_size(home):
    with Scheduler(home, loop=False) as s:
        handle = s.submit(hold, 0.1, gpus="1:2:2", cpus=0.25, preemptible=True)
        handle.cancel()
        wait_for(lambda: handle.info().done, 30)  # it may have started: it ends first
        again = s.requeue(handle.id).info()
        assert (again.gpus, again.asked_gpus, again.max_gpus) == (1.0, 2, 2)


def test_no_resize_within_resize_every_on_a_live_pool(home, tmp_path):
    log, ckpt = tmp_path / "steps", tmp_path / "ckpt"
    with Scheduler(home, lease_ttl=3, grace=5, resize_every=3600, resize_cost=0.1) as s:
        elastic = s.submit(
            recording_loop, str(log), str(ckpt), 100, gpus="1:2", cpus=0.25, preemptible=True
        )
        wait_for(lambda: elastic.state == "running" and log.exists(), 30)
        rigid = s.submit(hold, 0.2, gpus=1, cpus=0.25)
        time.sleep(3)
        # the elastic job started less than resize_every ago: it keeps both GPUs
        assert rigid.state == "queued"
        assert len(elastic.info().placement.gpus) == 2
        assert elastic.result(timeout=60) == 100
        assert rigid.result(timeout=30) in ("0", "1")
    assert Path(log).read_text().split()[1::2] == ["2"] * 100


DLSCHED = str(Path(sys.executable).with_name("dlsched"))


def dlsched(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([DLSCHED, *args], capture_output=True, text=True, timeout=120)


def test_the_cli_takes_a_range_shows_it_in_the_queue_and_refuses_a_job_that_cannot_resume(home):
    refused = dlsched("submit", "--gpus", "1:2", "--cpus", "0.25", "--", "sleep", "30")
    assert refused.returncode == 2
    assert refused.stderr.startswith("dlsched submit: gpus='1:2' is invalid: expected an elastic")
    assert len(refused.stderr.splitlines()) == 1
    bad = dlsched("submit", "--gpus", "2:1", "--preemptible", "--", "true")
    assert bad.returncode == 2 and "MIN:MAX" in bad.stderr
    job_id = dlsched(
        "submit", "--gpus", "1:2", "--preemptible", "--cpus", "0.25", "--", "sleep", "30"
    ).stdout.strip()
    wait_for(
        lambda: job_id in dlsched("queue").stdout and "2 GPUs (1–2)" in dlsched("queue").stdout, 30
    )
    rows = json.loads(dlsched("queue", "--json").stdout)
    assert [(r["request"]["text"].split(" · ")[0], r["request"]["max_gpus"]) for r in rows] == [
        ("2 GPUs (1–2)", 2)
    ]
    # an asked size: the job waits in line (both GPUs are held) at it, shown with its range
    asked = dlsched(
        "submit", "--gpus", "1:2:2", "--preemptible", "--cpus", "0.25", "--", "sleep", "30"
    ).stdout.strip()
    rows = {r["id"]: r for r in json.loads(dlsched("queue", "--json").stdout)}
    request = rows[asked]["request"]
    assert (request["gpus"], request["asked_gpus"], request["max_gpus"]) == (1.0, 2, 2)
    assert request["text"].startswith("2 GPUs (1–2)")
    too_wide = dlsched("submit", "--gpus", "1:3:3", "--preemptible", "--", "true")
    assert too_wide.returncode == 2 and "an asked size this pool can satisfy" in too_wide.stderr
    assert dlsched("cancel", asked).returncode == 0
    assert dlsched("cancel", job_id).returncode == 0


def test_the_queue_widget_shows_the_size_and_the_range(home):
    with Scheduler(home, loop=False) as s:
        # both GPUs held by a rigid job: the elastic one waits (else it may start at once on 2)
        blocker = s.submit(hold, 60, gpus=2, cpus=0.25)
        handle = s.submit(hold, 0.1, gpus="1:2", cpus=0.25, preemptible=True)
        info = handle.info()
        assert info.state == "queued"
        assert info.request_text.startswith("1 GPU (1–2)")  # queued: its minimum
        from jupyter_dlsched.widgets.tables import QueueSnapshot

        assert "1 GPU (1–2)" in QueueSnapshot([info])._repr_html_()
        handle.cancel()
        blocker.cancel()


def test_the_schedule_magic_takes_a_range(ip):
    import jupyter_dlsched as dls

    ip.run_cell_magic(
        "schedule", "--gpus 1:2 --preemptible --cpus 0.25 --name el --out x --wait", "x = 41 + 1"
    )
    job = [j for j in dls.jobs() if j.name == "el"][0]
    assert (job.state, job.gpus, job.max_gpus) == ("succeeded", 1.0, 2)
    assert ip.user_ns["x"] == 42
    with pytest.raises(Exception, match="preemptible=True"):
        ip.run_cell_magic("schedule", "--gpus 1:2 --name el2", "y = 1")


def test_resize_settings_are_written_to_the_ledger_and_checked(home, monkeypatch):
    monkeypatch.setenv("DLSCHED_RESIZE_EVERY", "45")
    with Scheduler(home, loop=False) as s:
        assert s.settings.resize_every == 45.0  # a new ledger's default
        assert s.settings.resize_cost == 30.0
    with Scheduler(home, loop=False, resize_every="10m", resize_cost=5) as s:
        assert (s.settings.resize_every, s.settings.resize_cost) == (600.0, 5.0)
    with pytest.raises(SpecError, match="resize_every=-1 is invalid"):
        Scheduler(home, loop=False, resize_every=-1)
