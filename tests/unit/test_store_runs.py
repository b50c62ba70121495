"""The ledger's runs part, the methods that open their own transaction: an inline job's
claim (one claimant wins), its lease beat (only leases still held), and its end."""

from __future__ import annotations

import pytest

from jupyter_dlsched.errors import IllegalTransition
from jupyter_dlsched.resources import Capacity
from jupyter_dlsched.spec import build_spec
from jupyter_dlsched.store import RunEnd, Store

POOL = Capacity.empty(n_gpus=2, gpu_mem=16 * 2**30, cpus=4, mem=64 * 2**30)


@pytest.fixture
def store(tmp_path):
    return Store(tmp_path / "h")


def allocated_job(store):
    job = store.insert_job(build_spec(capacity=POOL), {"payload.pkl": b"x"}, owner="anna", uid=1)
    store.transition(job.id, "running", started=100.0)
    return job


def test_only_the_first_claim_of_an_allocated_job_wins(store):
    job = allocated_job(store)
    assert store.claim_inline_run(job.id, 4242, "node1", 200.0)
    assert not store.claim_inline_run(job.id, 4343, "node2", 300.0)
    after = store.get(job.id)
    assert (after.supervisor_pid, after.host, after.lease_expires) == (4242, "node1", 200.0)


def test_a_queued_job_cannot_be_claimed(store):
    job = store.insert_job(build_spec(capacity=POOL), {"payload.pkl": b"x"}, owner="anna", uid=1)
    assert not store.claim_inline_run(job.id, 4242, "node1", 200.0)
    assert store.get(job.id).supervisor_pid is None


def test_the_lease_beat_renews_only_leases_still_held(store):
    mine, theirs = allocated_job(store), allocated_job(store)
    store.claim_inline_run(mine.id, 4242, "node1", 200.0)
    store.claim_inline_run(theirs.id, 4343, "node1", 200.0)
    store.renew_held_leases([mine.id, theirs.id], 4242, 260.0)
    assert store.get(mine.id).lease_expires == 260.0
    assert store.get(theirs.id).lease_expires == 200.0


def test_a_run_ends_by_the_one_rule_in_its_own_transaction(store):
    job = allocated_job(store)
    store.claim_inline_run(job.id, 4242, "node1", 200.0)
    assert store.end_run(store.get(job.id), RunEnd("failed", "boom", retry=False), 150.0) == (
        "failed"
    )
    after = store.get(job.id)
    assert (after.state, after.finished) == ("failed", 150.0)
    assert "boom" in after.reason
    with pytest.raises(IllegalTransition):
        store.end_run(after, RunEnd("succeeded"), 160.0)
