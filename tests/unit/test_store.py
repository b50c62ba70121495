"""The ledger: state machine, audit trail, change detection, schema versions, privacy."""

from __future__ import annotations

import json
import stat

import pytest

from jupyter_dlsched import store as store_mod
from jupyter_dlsched.agent.protocol import encode
from jupyter_dlsched.store import TRANSITIONS, Store
from jupyter_dlsched.vocab.errors import IllegalTransition, JobNotFound, SpecError
from jupyter_dlsched.vocab.resources import Capacity, Placement
from jupyter_dlsched.vocab.schema import info_to_json
from jupyter_dlsched.vocab.spec import build_spec

POOL = Capacity.empty(n_gpus=2, gpu_mem=16 * 2**30, cpus=4, mem=64 * 2**30)


def queued_job(store, **kw):
    spec = build_spec(capacity=POOL, **kw)
    return store.insert_job(spec, {"payload.pkl": b"x"}, owner="anna", uid=1000)


def test_a_new_job_is_queued_with_an_event_and_its_files(tmp_path):
    store = Store(tmp_path / "h")
    job = queued_job(store, gpus=1, name="resnet")
    assert job.state == "queued" and job.owner == "anna" and job.name == "resnet"
    assert store.read_file(job.id, "payload.pkl") == b"x"
    assert store.read_file(job.id, "missing") is None
    assert [(e["from_state"], e["to_state"]) for e in store.events(job.id)] == [(None, "queued")]


def test_every_state_change_is_checked_and_recorded(tmp_path):
    store = Store(tmp_path / "h")
    job = queued_job(store)
    store.transition(job.id, "running", started=1.0)
    store.transition(job.id, "succeeded", finished=2.0)
    with pytest.raises(IllegalTransition, match="succeeded -> running is not allowed"):
        store.transition(job.id, "running")
    assert [e["to_state"] for e in store.events(job.id)] == ["queued", "running", "succeeded"]
    assert store.get(job.id).state == "succeeded"


def test_terminal_states_are_final():
    for state in store_mod.TERMINAL:
        assert TRANSITIONS[state] == frozenset()


def test_an_expected_state_guards_the_transition(tmp_path):
    store = Store(tmp_path / "h")
    job = queued_job(store)
    with pytest.raises(IllegalTransition, match="expected running"):
        store.transition(job.id, "succeeded", expect=["running"])


def test_other_connections_see_changes_through_data_version(tmp_path):
    reader, writer = Store(tmp_path / "h"), Store(tmp_path / "h")
    before = reader.data_version()
    queued_job(writer)
    assert reader.data_version() != before


def test_the_state_folder_is_private(tmp_path):
    store = Store(tmp_path / "h")
    assert stat.S_IMODE(store.home.stat().st_mode) == 0o700
    assert stat.S_IMODE(store.spool_root.stat().st_mode) == 0o700


@pytest.mark.parametrize("bad", ["../etc", "a/b", "", "UPPER", "x" * 40, None])
def test_ids_that_could_escape_the_spool_are_refused(tmp_path, bad):
    store = Store(tmp_path / "h")
    with pytest.raises(JobNotFound):
        store.spool(bad)
    with pytest.raises(JobNotFound):
        store.get(bad)


def test_the_schema_migrates_forward(tmp_path, monkeypatch):
    Store(tmp_path / "h")
    extra = "ALTER TABLE jobs ADD COLUMN note TEXT"
    monkeypatch.setattr(store_mod.ledger, "MIGRATIONS", [*store_mod.MIGRATIONS, extra])
    store = Store(tmp_path / "h")
    assert store.get_meta("schema_version") == len(store_mod.ledger.MIGRATIONS)
    columns = [r[1] for r in store.db.execute("PRAGMA table_info(jobs)")]
    assert "note" in columns


def ledger_at(home, version: int, *rows: str):
    """A ledger as ``version`` left it, holding ``rows`` (values of ``OLD_JOB``)."""
    import sqlite3

    home.mkdir(mode=0o700)
    db = sqlite3.connect(home / "ledger.sqlite")
    for script in store_mod.MIGRATIONS[:version]:
        db.executescript(script)
    db.execute("INSERT INTO meta VALUES('schema_version', ?)", (str(version),))
    for values in rows:
        db.execute(OLD_JOB + values)
    db.commit()
    db.close()
    (home / "ledger.sqlite").chmod(0o600)
    return Store(home)


OLD_JOB = (
    "INSERT INTO jobs(id, name, kind, owner, uid, state, priority, gpus, cpus, mem, "
    "max_gpus, submitted, started, finished, attained, lease_expires) VALUES"
)


def test_migrating_to_held_grants_clears_leases_left_on_finished_jobs(tmp_path):
    # before version 12 a follower's renewal could set a lease on a job that had ended;
    # from 12 on, a success with a lease holds its grant: none of those may look held
    store = ledger_at(
        tmp_path / "h",
        11,
        "('leftjob1', 'j', 'function', 'anna', 1000, 'succeeded', 50, 1, 1, 0, NULL, "
        "0, 1, 2, 1, 1e12)",
    )
    assert store.get_meta("schema_version") == len(store_mod.MIGRATIONS)
    assert store.get("leftjob1").lease_expires is None
    with store.transaction() as db:
        assert store.queue.held_grants(db, "local") == 0


def test_migrating_to_run_times_keeps_what_is_known_of_finished_jobs(tmp_path):
    # a rigid GPU job's time over all its runs is its GPU-seconds over its GPUs; of any
    # other only its last run was kept
    store = ledger_at(
        tmp_path / "h",
        12,
        "('rigidgp1', 'j', 'function', 'anna', 1000, 'succeeded', 50, 2, 1, 0, NULL, "
        "0, 90, 100, 60, NULL)",
        "('elastic1', 'j', 'function', 'anna', 1000, 'succeeded', 50, 1, 1, 0, 4, "
        "0, 90, 100, 70, NULL)",
        "('waiting1', 'j', 'function', 'anna', 1000, 'queued', 50, 1, 1, 0, NULL, "
        "0, NULL, NULL, 0, NULL)",
    )
    assert store.get("rigidgp1").run_time == 30.0
    assert store.get("elastic1").run_time == 10.0
    assert store.get("waiting1").run_time is None


def test_a_ledger_from_a_newer_version_is_refused(tmp_path):
    store = Store(tmp_path / "h")
    store.set_meta("schema_version", 99)
    with pytest.raises(RuntimeError, match="schema version 99"):
        Store(tmp_path / "h")


def test_samples_are_kept_and_pruned(tmp_path):
    store = Store(tmp_path / "h")
    store.usage.add_samples(
        [(10.0, "gpu0", 50.0, 1, 2, None), (20.0, "gpu0", 70.0, 1, 2, {"j": 1})]
    )
    assert [s["util"] for s in store.usage.samples(since=0)] == [50.0, 70.0]
    assert store.usage.prune_samples(older_than=15.0) == 1
    assert [s["data"] for s in store.usage.samples()] == [{"j": 1}]


def test_a_list_read_as_json_is_each_jobs_info_to_json(tmp_path):
    """The agent's list replies are made from the rows straight (``job_rows``,
    ``finished_rows``): the same JSON as each job's ``JobInfo`` through ``info_to_json``."""
    store = Store(tmp_path / "h")
    first = queued_job(store, gpus=1, name="first")
    store.transition(first.id, "running", started=1.0)
    store.update(
        first.id,
        placement=Placement(gpus=(1,), gpu_mem=(2**30,), cpus=(0, 1), cpu_share=0.5, mem=5),
        progress={"step": 3, "metrics": {"loss": 0.5}},
        env={"SEED": "1"},
        stage_in=json.dumps({"data": "/srv/data"}),
        after=[first.id],
        cancel_requested=True,
    )
    ended = queued_job(store, name="ended")
    store.transition(ended.id, "running", started=2.0)
    store.transition(ended.id, "failed", finished=3.0, reason="ValueError: no", exit_code=1)
    waiting = [queued_job(store, gpus=2) for _ in range(12)]
    with store.transaction() as db:
        store.queue.set_queue_positions(db, [(-i, None, j.id) for i, j in enumerate(waiting)])
    for kwargs in ({}, {"newest_first": True, "limit": 5, "offset": 3}, {"states": ["queued"]}):
        rows, infos = store.job_rows(**kwargs), [info_to_json(j) for j in store.jobs(**kwargs)]
        assert rows == infos and encode({"jobs": rows}) == encode({"jobs": infos})
    assert store.finished_rows() == [info_to_json(j) for j in store.finished_jobs()]
    assert store.finished_rows(limit=1, offset=0) == [info_to_json(store.get(ended.id))]


def test_counts_by_state(tmp_path):
    store = Store(tmp_path / "h")
    queued_job(store)
    queued_job(store)
    counts = store.count_jobs()
    assert counts["queued"] == 2 and counts["running"] == 0


def blob_rows(store):
    """``(rows, bytes)`` of the ``blobs`` table: what payloads take in the ledger."""
    return tuple(
        store.db.execute("SELECT COUNT(*), COALESCE(SUM(length(data)), 0) FROM blobs").fetchone()
    )


@pytest.fixture
def no_keep(monkeypatch):
    """Ended jobs' payloads deleted at once (kept a day by default, for a requeue)."""
    monkeypatch.setenv("DLSCHED_PAYLOAD_KEEP", "0")


@pytest.mark.parametrize("end", ["succeeded", "failed", "cancelled", "timeout", "lost"])
def test_a_jobs_payload_is_deleted_when_it_ends(tmp_path, end, no_keep):
    store = Store(tmp_path / "h")
    spec = build_spec(capacity=POOL)
    job = store.insert_job(
        spec, {"payload.pkl": b"p" * 1000, "context.json": b"{}"}, owner="anna", uid=1000
    )
    assert blob_rows(store) == (2, 1002)
    store.transition(job.id, "running", started=1.0)
    store.transition(job.id, end, finished=2.0)
    assert blob_rows(store) == (0, 0)
    assert store.read_file(job.id, "payload.pkl") is None


def test_a_retried_or_preempted_job_keeps_its_payload(tmp_path, no_keep):
    store = Store(tmp_path / "h")
    job = queued_job(store)
    store.transition(job.id, "running", started=1.0)
    store.transition(job.id, "queued", "retry after a failure")
    store.transition(job.id, "running", started=2.0)
    store.transition(job.id, "preempted", "preempted")
    assert store.read_file(job.id, "payload.pkl") == b"x"
    store.transition(job.id, "cancelled", finished=3.0)
    assert blob_rows(store) == (0, 0)


def test_a_maps_shared_blob_stays_while_any_of_its_jobs_can_still_run(tmp_path, no_keep):
    store = Store(tmp_path / "h")
    spec = build_spec(capacity=POOL)
    shared = b"the function and context of a map" * 100
    ids = ["aaaaaaa1", "aaaaaaa2", "aaaaaaa3"]
    store.insert_jobs(
        [(i, spec, {"payload.pkl": i.encode(), "context.json": shared}) for i in ids],
        owner="anna",
        uid=1000,
    )
    later = store.insert_job(
        spec, {"payload.pkl": b"later", "context.json": shared}, owner="anna", uid=1000
    )
    assert blob_rows(store)[0] == 5
    for n, job_id in enumerate(ids):
        store.transition(job_id, "cancelled", finished=1.0)
        assert store.read_file(later.id, "context.json") == shared
        assert blob_rows(store)[0] == 5 - (n + 1)
    store.transition(later.id, "failed", "a dependency failed", finished=2.0)
    assert blob_rows(store) == (0, 0)


def test_leftover_payloads_are_collected_and_live_ones_counted_again(tmp_path, no_keep):
    store = Store(tmp_path / "h")
    live = queued_job(store)
    with store.transaction() as db:
        # what older code left: a payload no job names, and counts that are wrong
        db.execute("INSERT INTO blobs(hash, data) VALUES('left', zeroblob(5000))")
        db.execute("DELETE FROM blob_refs")
    assert store.collect_leftovers() == (1, 5000)
    assert blob_rows(store) == (1, 1)
    store.transition(live.id, "cancelled", finished=1.0)
    assert blob_rows(store) == (0, 0)


def test_a_users_payload_bytes_count_each_blob_of_their_unfinished_jobs_once(tmp_path, no_keep):
    store = Store(tmp_path / "h")
    spec = build_spec(capacity=POOL)
    context = b"c" * 100
    store.insert_jobs(
        [
            (i, spec, {"payload.pkl": i.encode() * 10, "context.json": context})
            for i in ("bbbbbbb1", "bbbbbbb2")
        ],
        owner="anna",
        uid=1000,
    )
    store.insert_job(spec, {"payload.pkl": b"z" * 999}, owner="ben", uid=1001)
    assert store.payload_bytes(1000) == 80 + 80 + 100
    store.transition("bbbbbbb1", "cancelled", finished=1.0)
    assert store.payload_bytes(1000) == 80 + 100
    assert store.payload_bytes(1001) == 999


def test_a_ledger_that_kept_every_payload_keeps_only_those_of_unfinished_jobs(tmp_path, no_keep):
    import sqlite3

    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    db = sqlite3.connect(home / "ledger.sqlite")
    for script in store_mod.MIGRATIONS[:3]:
        db.executescript(script)
    db.execute("INSERT INTO meta VALUES('schema_version', '3')")
    db.execute(
        "INSERT INTO blobs VALUES('ctx', zeroblob(100)), ('p1', zeroblob(10)), ('p2', x'02')"
    )
    for job_id, state, files in (
        ("donejob2", "succeeded", '{"payload.pkl": "p1", "context.json": "ctx"}'),
        ("waitjob2", "queued", '{"payload.pkl": "p2", "context.json": "ctx"}'),
    ):
        db.execute(
            "INSERT INTO jobs(id, name, kind, owner, uid, state, priority, gpus, cpus, mem, "
            "submitted, files) VALUES(?, 'old', 'function', 'ann', 1000, ?, 50, 0, 1, 0, 1, ?)",
            (job_id, state, files),
        )
    db.commit()
    db.close()
    (home / "ledger.sqlite").chmod(0o600)

    store = Store(home)
    assert blob_rows(store) == (2, 101)
    assert store.payload_bytes(1000) == 101
    assert store.read_file("waitjob2", "context.json") == bytes(100)
    store.transition("waitjob2", "cancelled", finished=2.0)
    assert blob_rows(store) == (0, 0)


def test_an_ended_jobs_payload_is_kept_for_a_requeue_and_deleted_after(tmp_path, monkeypatch):
    monkeypatch.setenv("DLSCHED_PAYLOAD_KEEP", "1h")
    store = Store(tmp_path / "h")
    job = queued_job(store)
    store.transition(job.id, "cancelled")
    assert store.read_file(job.id, "payload.pkl") is not None  # kept for a requeue
    again = store.requeue(job.id)
    assert store.read_file(again.id, "payload.pkl") == store.read_file(job.id, "payload.pkl")
    store.transition(again.id, "cancelled")
    monkeypatch.setenv("DLSCHED_PAYLOAD_KEEP", "0")
    store.transition(queued_job(store).id, "cancelled")  # a later end deletes what is past
    assert store.read_file(job.id, "payload.pkl") is None
    with pytest.raises(SpecError, match="a job whose payload is still kept"):
        store.requeue(job.id)
