"""The ledger's schedules part: a schedule is added with the job it copies, listed by
owner, removed by its owner only, and each tick is claimed once and recorded."""

from __future__ import annotations

import pytest

from jupyter_dlsched.store import Store
from jupyter_dlsched.vocab.every import parse_every
from jupyter_dlsched.vocab.resources import Capacity
from jupyter_dlsched.vocab.spec import build_spec

POOL = Capacity.empty(n_gpus=2, gpu_mem=16 * 2**30, cpus=4, mem=64 * 2**30)
NOW = 1_000_000.0


@pytest.fixture
def store(tmp_path):
    return Store(tmp_path / "h")


def scheduled_job(store, every="1h", uid=1000, owner="anna", payload=b"x"):
    spec = build_spec(capacity=POOL, every=every, now=NOW)
    job = store.insert_job(spec, {"payload.pkl": payload}, owner=owner, uid=uid)
    [schedule] = [s for s in store.timetable.schedules() if s.template == job.id]
    return job, schedule


def refs(store, job):
    [digest] = store.db.execute(
        "SELECT f.value FROM jobs j, json_each(j.files) f WHERE j.id=?", (job.id,)
    ).fetchone()
    row = store.db.execute("SELECT refs FROM blob_refs WHERE hash=?", (digest,)).fetchone()
    return row[0] if row else None


def test_a_job_submitted_with_every_adds_its_schedule_in_the_same_submit(store):
    job, schedule = scheduled_job(store, every="30m")
    assert (schedule.owner, schedule.uid, schedule.every) == ("anna", 1000, "30m")
    assert schedule.last_job == job.id and schedule.last_state == "queued"
    assert schedule.next_run == pytest.approx(parse_every("30m").next_after(job.submitted))
    assert (schedule.runs, schedule.skipped) == (0, 0)
    assert store.timetable.schedule(schedule.id) == schedule
    assert store.timetable.schedule_count() == 1
    assert refs(store, job) == 2  # the queued job and the schedule that copies it


def test_schedules_are_listed_next_first_and_by_owner(store):
    _, daily = scheduled_job(store, every="1d", uid=1000)
    _, hourly = scheduled_job(store, every="1h", uid=1001, owner="ben", payload=b"y")
    assert [s.id for s in store.timetable.schedules()] == [hourly.id, daily.id]
    assert [s.id for s in store.timetable.schedules(1000)] == [daily.id]
    assert store.timetable.schedules(4242) == []
    assert store.timetable.schedule("snothere") is None


def test_only_schedules_whose_tick_came_are_due(store):
    _, hourly = scheduled_job(store, every="1h")
    _, daily = scheduled_job(store, every="1d", payload=b"y")
    assert store.timetable.due_schedules(hourly.next_run - 1) == []
    assert [s.id for s in store.timetable.due_schedules(hourly.next_run)] == [hourly.id]
    assert [s.id for s in store.timetable.due_schedules(daily.next_run)] == [hourly.id, daily.id]


def test_a_tick_is_claimed_once_and_moves_the_next_run_on(store):
    _, schedule = scheduled_job(store)
    now = schedule.next_run + 1
    assert store.timetable.claim_schedule_tick(schedule.id, now, now + 3600) == (True, "queued")
    assert store.timetable.claim_schedule_tick(schedule.id, now, now + 3600) == (False, None)
    assert store.timetable.schedule(schedule.id).next_run == now + 3600
    assert store.timetable.due_schedules(now) == []
    assert store.timetable.claim_schedule_tick("snothere", now, now + 3600) == (False, None)


def test_a_run_made_becomes_the_last_and_a_skip_is_counted(store):
    job, schedule = scheduled_job(store)
    store.timetable.record_schedule_skip(schedule.id)
    store.transition(job.id, "cancelled", finished=NOW + 1)
    run = store.requeue(job.id, now=NOW + 2)
    store.timetable.record_schedule_run(schedule.id, run.id)
    after = store.timetable.schedule(schedule.id)
    assert (after.runs, after.skipped) == (1, 1)
    assert (after.last_job, after.last_state, after.template) == (run.id, "queued", job.id)


def test_a_schedule_is_removed_by_its_owner_and_stays_for_anyone_else(store):
    job, schedule = scheduled_job(store)
    kept = store.timetable.remove_schedule(schedule.id, uid=1001)
    assert kept == schedule and store.timetable.schedule(schedule.id) == schedule
    assert refs(store, job) == 2
    assert store.timetable.remove_schedule(schedule.id, uid=1000) == schedule
    assert store.timetable.schedules() == [] and store.timetable.schedule_count() == 0
    assert refs(store, job) == 1  # the job itself still runs: its payload stays
    assert store.timetable.remove_schedule(schedule.id) is None


def test_anyone_may_remove_a_schedule_when_no_owner_is_named(store):
    _, schedule = scheduled_job(store, uid=1001, owner="ben")
    assert store.timetable.remove_schedule(schedule.id) == schedule
    assert store.timetable.schedule(schedule.id) is None


def test_a_schedules_payload_outlives_its_first_run_and_goes_with_the_schedule(store, monkeypatch):
    monkeypatch.setenv("DLSCHED_PAYLOAD_KEEP", "0")
    job, schedule = scheduled_job(store)
    store.transition(job.id, "running", started=NOW + 1)
    store.transition(job.id, "succeeded", finished=NOW + 2)
    assert store.read_file(job.id, "payload.pkl") == b"x"
    store.collect_leftovers()  # counts again from the jobs, and from the schedules
    assert store.read_file(job.id, "payload.pkl") == b"x"
    store.timetable.remove_schedule(schedule.id)
    store.collect_leftovers()
    assert store.read_file(job.id, "payload.pkl") is None
