"""The ledger's runs part: one claim hands its winner a ``Lease`` (a run's on one attempt
or any, a monitor's that follows a job in any state), renewed while it is held (alone or
all of one holder's at once) and ended by the one rule."""

from __future__ import annotations

import os

import pytest

from jupyter_dlsched.engine import tick
from jupyter_dlsched.engine.queue_index import QueueIndex
from jupyter_dlsched.policy import get_policy
from jupyter_dlsched.store import Lease, RunEnd, Store
from jupyter_dlsched.vocab.errors import IllegalTransition
from jupyter_dlsched.vocab.resources import Capacity, Placement
from jupyter_dlsched.vocab.spec import build_spec

POOL = Capacity.empty(n_gpus=2, gpu_mem=16 * 2**30, cpus=4, mem=64 * 2**30)
INVENTORY = {
    "gpus": [{"index": i, "mem_total": 16 * 2**30} for i in range(2)],
    "cpus": 4,
    "mem_total": 64 * 2**30,
}
TTL = 60.0


@pytest.fixture
def store(tmp_path):
    return Store(tmp_path / "h")


def queued_job(store, retries=0):
    spec = build_spec(capacity=POOL, retries=retries)
    return store.insert_job(spec, {"payload.pkl": b"x"}, owner="anna", uid=1)


def allocated_job(store, retries=0):
    """A job the queue started (attempt 1) that no runner has claimed yet."""
    job = queued_job(store, retries)
    return store.transition(job.id, "running", started=100.0, attempts=1)


def taken_back(store, job_id):
    """The reaper's move on a run whose lease lapsed: lost, and retried if it may be."""
    with store.transaction() as db:
        return store.finish_run(
            db, store.get(job_id), RunEnd("lost", "lease expired"), 150.0, supervisor_pid=None
        )


# -- the claim -----------------------------------------------------------------------------


def test_only_the_first_claim_of_an_allocated_job_wins(store):
    job = allocated_job(store)
    lease = store.claim(job, TTL, now=200.0)
    assert lease is not None
    assert store.claim(job, TTL, now=210.0) is None
    assert store.claim(job.id, TTL, now=210.0) is None
    after = store.get(job.id)
    assert (after.supervisor_pid, after.lease_expires) == (os.getpid(), 260.0)
    assert (lease.job.id, lease.pid, lease.host, lease.attempt) == (
        job.id,
        os.getpid(),
        after.host,
        1,
    )
    assert after.host


def test_a_claim_of_an_attempt_that_no_longer_runs_fails(store):
    job = allocated_job(store, retries=1)
    taken_back(store, job.id)
    store.transition(job.id, "running", started=160.0, attempts=2)
    assert store.claim(job, TTL) is None  # the JobInfo of attempt 1
    assert store.get(job.id).supervisor_pid is None
    by_id = store.claim(job.id, TTL)  # an inline cell's claim: whichever attempt runs
    assert by_id is not None and by_id.attempt is None and by_id.job.attempts == 2


def test_a_queued_job_cannot_be_claimed_to_run(store):
    job = queued_job(store)
    assert store.claim(job, TTL) is None
    assert store.claim(job.id, TTL) is None
    assert store.get(job.id).supervisor_pid is None


def test_a_monitor_follows_a_queued_job_nobody_alive_follows(store):
    job = queued_job(store)
    with store.transaction() as db:
        lease = store.claim(job.id, TTL, follow=True, now=100.0, db=db)
    assert lease is not None and lease.follows and lease.host is None
    after = store.get(job.id)
    assert (after.state, after.supervisor_pid, after.lease_expires) == (
        "queued",
        os.getpid(),
        160.0,
    )


def test_a_monitor_takes_over_only_once_the_followers_lease_ran_out(store):
    job = queued_job(store)
    store.update(job.id, supervisor_pid=4242, lease_expires=160.0)
    assert store.claim(job.id, TTL, follow=True, now=150.0) is None
    assert store.get(job.id).supervisor_pid == 4242
    assert store.claim(job.id, TTL, follow=True, now=170.0) is not None
    assert store.get(job.id).supervisor_pid == os.getpid()


def test_a_finished_job_cannot_be_followed(store):
    job = allocated_job(store)
    store.claim(job, TTL).finish(RunEnd("succeeded"), 150.0)
    assert store.claim(job.id, TTL, follow=True, now=1e12) is None


# -- renewals ------------------------------------------------------------------------------


def test_a_renewal_extends_a_lease_still_held(store):
    lease = store.claim(allocated_job(store), TTL, now=200.0)
    assert lease.renew(300.0)
    assert store.get(lease.job.id).lease_expires == 300.0


def test_a_renewal_after_the_job_was_taken_back_returns_false(store):
    lease = store.claim(allocated_job(store), TTL, now=200.0)
    taken_back(store, lease.job.id)
    assert not lease.renew(300.0)
    assert store.get(lease.job.id).lease_expires is None


def test_a_renewal_of_a_job_another_process_holds_returns_false(store):
    lease = store.claim(allocated_job(store), TTL, now=200.0)
    store.update(lease.job.id, supervisor_pid=4343)
    assert not lease.renew(300.0)
    assert store.get(lease.job.id).lease_expires == 260.0


def test_a_stale_attempts_renewal_does_nothing(store):
    first = store.claim(allocated_job(store, retries=1), TTL, now=200.0)
    taken_back(store, first.job.id)
    store.transition(first.job.id, "running", started=160.0, attempts=2)
    second = store.claim(store.get(first.job.id), TTL, now=210.0)  # this process again
    assert not first.renew(400.0)
    assert store.get(first.job.id).lease_expires == 270.0
    assert second.renew(300.0)
    assert store.get(first.job.id).lease_expires == 300.0


def test_an_any_attempt_lease_renews_whichever_attempt_it_holds(store):
    job = allocated_job(store, retries=1)
    taken_back(store, job.id)
    store.transition(job.id, "running", started=160.0, attempts=2)
    lease = store.claim(job.id, TTL, now=200.0)
    assert lease.renew(300.0)


def test_a_run_lease_is_not_renewed_once_the_job_stopped_running(store):
    job = allocated_job(store, retries=1)
    lease = store.claim(job.id, TTL, now=200.0)
    store.update(job.id, state="queued")  # what the lease's renewal must check, alone
    assert not lease.renew(300.0)


def test_a_follow_lease_is_renewed_in_any_state(store):
    job = queued_job(store)
    lease = store.claim(job.id, TTL, follow=True, now=100.0)
    assert lease.renew(300.0)
    store.transition(job.id, "running", started=200.0, attempts=1)
    assert lease.renew(400.0)
    assert store.get(job.id).lease_expires == 400.0


def test_a_follow_lease_another_follower_took_over_is_not_renewed(store):
    job = queued_job(store)
    lease = store.claim(job.id, TTL, follow=True, now=100.0)
    store.update(job.id, supervisor_pid=4343, lease_expires=500.0)
    assert not lease.renew(300.0)
    Lease.renew_all([lease], 300.0)
    assert store.get(job.id).lease_expires == 500.0


def test_the_beat_renews_only_leases_still_held(store):
    mine, theirs, reaped = allocated_job(store), allocated_job(store), allocated_job(store)
    held = [store.claim(mine.id, TTL, now=200.0), store.claim(theirs.id, TTL, now=200.0)]
    held.append(store.claim(reaped.id, TTL, now=200.0))
    store.update(theirs.id, supervisor_pid=4343)
    taken_back(store, reaped.id)
    Lease.renew_all(held, 300.0)
    assert store.get(mine.id).lease_expires == 300.0
    assert store.get(theirs.id).lease_expires == 260.0
    assert store.get(reaped.id).lease_expires is None


def test_the_beat_checks_each_leases_attempt(store):
    stale = store.claim(allocated_job(store, retries=1), TTL, now=200.0)
    taken_back(store, stale.job.id)
    store.transition(stale.job.id, "running", started=160.0, attempts=2)
    store.claim(store.get(stale.job.id), TTL, now=210.0)
    current = store.claim(allocated_job(store), TTL, now=200.0)
    Lease.renew_all([stale, current], 400.0)
    assert store.get(stale.job.id).lease_expires == 270.0
    assert store.get(current.job.id).lease_expires == 400.0


def test_a_monitor_hands_its_leases_back_with_a_time_past(store):
    jobs = [queued_job(store), queued_job(store)]
    leases = [store.claim(j.id, TTL, follow=True, now=100.0) for j in jobs]
    Lease.renew_all(leases, 99.0)
    assert [store.get(j.id).lease_expires for j in jobs] == [99.0, 99.0]
    store.update(jobs[0].id, supervisor_pid=4343)  # another participant, now gone
    assert store.claim(jobs[0].id, TTL, follow=True, now=100.0) is not None


def test_the_beat_renews_one_holders_leases_only(store):
    lease = store.claim(allocated_job(store), TTL)
    other = Lease(lease.job, lease.pid + 1, lease.host, store=store.runs)
    with pytest.raises(ValueError, match="one holder"):
        Lease.renew_all([lease, other], 300.0)


# -- the run's end -------------------------------------------------------------------------


def test_a_run_ends_by_the_one_rule_in_its_own_transaction(store):
    lease = store.claim(allocated_job(store), TTL, now=120.0)
    assert lease.finish(RunEnd("failed", "boom", retry=False), 150.0) == "failed"
    after = store.get(lease.job.id)
    assert (after.state, after.finished, after.lease_expires) == ("failed", 150.0, None)
    assert "boom" in after.reason
    with pytest.raises(IllegalTransition):
        lease.finish(RunEnd("succeeded"), 160.0)


def test_a_failed_run_with_retries_left_is_queued_again(store):
    lease = store.claim(allocated_job(store, retries=1), TTL, now=120.0)
    with store.transaction() as db:
        assert lease.finish(RunEnd("failed", "boom"), 150.0, db, cpu_time=2.5) == "queued"
    after = store.get(lease.job.id)
    assert (after.state, after.supervisor_pid, after.placement) == ("queued", None, None)
    assert "retry 1/1" in after.reason
    assert after.cpu_time == 2.5


def test_a_stalled_holders_end_does_not_end_the_attempt_that_runs_now(store):
    # the supervisor of attempt 1 stalled past its lease: the reaper took the job back,
    # the queue started attempt 2 and another supervisor claimed it
    stalled = store.claim(allocated_job(store, retries=1), TTL, now=120.0)
    taken_back(store, stalled.job.id)
    store.transition(stalled.job.id, "running", started=160.0, attempts=2)
    store.update(stalled.job.id, supervisor_pid=os.getpid() + 1, lease_expires=1e12)
    with pytest.raises(IllegalTransition, match="no longer holds"):
        stalled.finish(RunEnd("succeeded"), 170.0)
    after = store.get(stalled.job.id)
    assert (after.state, after.attempts, after.supervisor_pid) == (
        "running",
        2,
        os.getpid() + 1,
    )


def test_an_any_attempt_lease_ends_only_while_its_process_holds_the_job(store):
    lease = store.claim(allocated_job(store).id, TTL, now=120.0)
    store.update(lease.job.id, supervisor_pid=os.getpid() + 1)
    with pytest.raises(IllegalTransition, match="no longer holds"):
        lease.finish(RunEnd("succeeded"), 150.0)
    assert store.get(lease.job.id).state == "running"


# -- what remote runners record --------------------------------------------------------------


def test_a_run_lease_records_where_its_job_process_runs(store):
    lease = store.claim(allocated_job(store), TTL, now=120.0)
    assert lease.record_process(4321, "node-7")
    after = store.get(lease.job.id)
    assert (after.job_pid, after.host) == (4321, "node-7")


def test_a_lease_taken_back_records_no_job_process(store):
    lease = store.claim(allocated_job(store, retries=1), TTL, now=120.0)
    taken_back(store, lease.job.id)
    assert not lease.record_process(4321, "node-7")
    assert store.get(lease.job.id).job_pid is None


def test_a_run_handed_back_is_queued_again_without_counting_the_attempt(store):
    lease = store.claim(allocated_job(store), TTL, now=120.0)
    assert lease.hand_back("requeued: the process that ran it exited", 150.0)
    after = store.get(lease.job.id)
    assert (after.state, after.attempts, after.supervisor_pid, after.lease_expires) == (
        "queued",
        0,
        None,
        None,
    )
    assert after.placement is None and "process that ran it exited" in after.reason


def test_a_run_handed_back_after_it_was_taken_back_is_left_alone(store):
    lease = store.claim(allocated_job(store, retries=1), TTL, now=120.0)
    taken_back(store, lease.job.id)
    store.transition(lease.job.id, "running", started=160.0, attempts=2)
    assert not lease.hand_back("requeued", 170.0)
    assert (store.get(lease.job.id).state, store.get(lease.job.id).attempts) == ("running", 2)


def test_a_job_allocated_but_never_launched_is_cancelled_where_it_stands(store):
    job = allocated_job(store)
    assert store.cancel_unlaunched(job.id, now=150.0)
    after = store.get(job.id)
    assert (after.state, after.finished) == ("cancelled", 150.0)


def test_a_launched_job_is_not_cancelled_as_unlaunched(store):
    lease = store.claim(allocated_job(store), TTL, now=120.0)
    assert not store.cancel_unlaunched(lease.job.id, now=150.0)
    assert store.get(lease.job.id).state == "running"
    assert not store.cancel_unlaunched(queued_job(store).id, now=150.0)


def test_a_waiting_reason_is_said_only_while_the_job_waits(store):
    job = queued_job(store)
    store.queue.set_waiting_reason(job.id, "SLURM: Priority")
    assert store.get(job.id).waiting == "SLURM: Priority"
    running = allocated_job(store)
    store.queue.set_waiting_reason(running.id, "SLURM: Priority")
    assert store.get(running.id).waiting is None


# -- a follower's run: started and ended by what it follows -------------------------------


def followed(store, job=None):
    job = job or queued_job(store)
    return store.claim(job.id, TTL, follow=True, now=100.0)


def test_a_followed_job_that_started_elsewhere_runs_with_its_node_and_start(store):
    lease = followed(store)
    store.update(lease.job.id, submitted=200.0)
    assert lease.started(150.0, placement=None, host="node-3") == 200.0  # never before submit
    after = store.get(lease.job.id)
    assert (after.state, after.attempts, after.host, after.started) == (
        "running",
        1,
        "node-3",
        200.0,
    )
    assert lease.started(300.0, placement=None, host="node-3") == 200.0  # its start stays
    assert store.get(lease.job.id).attempts == 1


def test_a_follower_taken_over_does_not_start_the_job(store):
    lease = followed(store)
    store.update(lease.job.id, supervisor_pid=os.getpid() + 1)
    assert lease.started(150.0, placement=None, host="node-3") is None
    assert store.get(lease.job.id).state == "queued"


def test_a_followed_run_ends_by_the_one_rule(store):
    lease = followed(store)
    lease.started(150.0, placement=None, host="node-3")
    assert lease.end_followed(RunEnd("succeeded", exit_code=0), 200.0) == "succeeded"
    after = store.get(lease.job.id)
    assert (after.state, after.finished, after.supervisor_pid) == ("succeeded", 200.0, None)


def test_a_followed_job_that_ended_before_it_was_seen_to_start_is_started_first(store):
    lease = followed(store)
    assert lease.end_followed(RunEnd("succeeded", exit_code=0), 200.0) == "succeeded"
    after = store.get(lease.job.id)
    assert (after.state, after.attempts, after.started) == ("succeeded", 1, 200.0)
    kinds = [(e["from_state"], e["to_state"]) for e in store.events(lease.job.id)]
    assert ("queued", "running") in kinds and ("running", "succeeded") in kinds


def test_a_followed_job_cancelled_in_the_queue_ends_from_the_queue(store):
    lease = followed(store)
    assert lease.end_followed(RunEnd("cancelled", "cancelled by user"), 200.0) == "cancelled"
    after = store.get(lease.job.id)
    assert (after.state, after.started, after.attempts) == ("cancelled", None, 0)


def test_a_follower_taken_over_records_no_end(store):
    lease = followed(store)
    store.update(lease.job.id, supervisor_pid=os.getpid() + 1)
    assert lease.end_followed(RunEnd("succeeded", exit_code=0), 200.0) is None
    assert store.get(lease.job.id).state == "queued"


# -- a success whose process still exits holds its grant -----------------------------------


def on_gpu(store, gpu=0):
    """A (preemptible) job the queue started on GPU ``gpu``, claimed by this process at
    120 s."""
    spec = build_spec(capacity=POOL, gpus=1, preemptible=True)
    job = store.insert_job(spec, {"payload.pkl": b"x"}, owner="anna", uid=1)
    placement = Placement(gpus=(gpu,), gpu_mem=(16 * 2**30,), cpus=(0,))
    store.transition(job.id, "running", started=100.0, attempts=1, placement=placement)
    return store.claim(store.get(job.id), TTL, now=120.0)


def holding(store):
    with store.transaction() as db:
        return [r["id"] for r in store.queue.snapshot_running(db, "local")]


def test_a_success_held_past_its_end_keeps_its_grant_until_it_is_released(store):
    lease = on_gpu(store)
    assert lease.finish(RunEnd("succeeded"), 150.0, hold=True, cpu_time=1.5) == "succeeded"
    after = store.get(lease.job.id)
    # its client sees the end; the lease, and with it the GPU, is still held
    assert (after.state, after.finished, after.cpu_time) == ("succeeded", 150.0, 1.5)
    assert after.lease_expires == 180.0
    assert holding(store) == [lease.job.id]
    # what the pool's views count as busy: the job with its grant, beside a running one
    other = on_gpu(store)
    assert [j.id for j in store.jobs(holding=True)] == [lease.job.id, other.job.id]
    assert [j.id for j in store.jobs(holding=True, states=["succeeded"])] == [lease.job.id]
    other.finish(RunEnd("succeeded"), 160.0)
    with store.transaction() as db:
        assert store.queue.held_grants(db, "local") == 1
    assert store.holding_attempts() == [(lease.job.id, 1)]
    assert lease.renew_held(400.0)
    assert not lease.renew(500.0)  # the run's own renewal: it no longer runs
    assert store.get(lease.job.id).lease_expires == 400.0
    assert lease.release("killed 1 process left behind")
    after = store.get(lease.job.id)
    assert (after.state, after.lease_expires) == ("succeeded", None)
    assert after.reason == "killed 1 process left behind"
    assert holding(store) == [] and store.holding_attempts() == []
    assert store.jobs(holding=True) == []
    assert not lease.release() and not lease.renew_held(600.0)  # released once


def test_only_a_success_holds_its_grant_past_its_end(store):
    lease = on_gpu(store)
    with pytest.raises(ValueError, match="only a success"):
        lease.finish(RunEnd("failed", "boom", retry=False), 150.0, hold=True)
    assert store.get(lease.job.id).state == "running"


def test_a_held_grant_is_released_only_by_the_process_that_holds_it(store):
    lease = on_gpu(store)
    lease.finish(RunEnd("succeeded"), 150.0, hold=True)
    other = Lease(lease.job, lease.pid + 1, lease.host, store=store.runs)
    assert not other.release() and not other.renew_held(400.0)
    assert holding(store) == [lease.job.id]


def test_a_held_grant_whose_lease_lapsed_is_released_by_the_reaper(store):
    lease = on_gpu(store)
    lease.finish(RunEnd("succeeded"), 150.0, hold=True)
    with store.transaction() as db:
        assert tick.reap(store, db, "local", 170.0) == []  # not yet: held until 180 s
        assert store.queue.held_grants(db, "local") == 1
        waiting, expired, _, _ = store.queue.tick_inputs("local", 190.0)
    assert expired  # the tick's cue that there is something to reap
    with store.transaction() as db:
        assert tick.reap(store, db, "local", 190.0) == []  # nothing to end: it succeeded
        assert store.queue.held_grants(db, "local") == 0
    after = store.get(lease.job.id)
    assert (after.state, after.lease_expires, after.reason) == ("succeeded", None, "")


def test_a_follow_lease_is_not_renewed_once_the_job_ended(store):
    lease = followed(store)
    lease.started(150.0, placement=None, host="node-3")
    # ended while the follower still names itself (it has not seen the end yet): its
    # renewal must not make the success look like one that holds its grant
    store.transition(lease.job.id, "succeeded", finished=200.0, lease_expires=None)
    assert not lease.renew(300.0)
    assert store.get(lease.job.id).lease_expires is None
    assert holding(store) == []


@pytest.mark.parametrize("kept", [False, True], ids=["whole snapshot", "queue index"])
def test_a_decision_leaves_a_held_grants_gpu_taken_and_sees_it_about_to_be_free(store, kept):
    lease = on_gpu(store)
    spec = build_spec(capacity=POOL, gpus=1)
    waiting = [store.insert_job(spec, {"payload.pkl": b"x"}, owner="anna", uid=1) for _ in "ab"]
    lease.finish(RunEnd("succeeded"), 150.0, hold=True)
    index = QueueIndex() if kept else None
    seen: list[list[tuple[str, bool, bool]]] = []

    def decide(now):
        policy = get_policy("fifo")

        def spy(queued, running, capacity, now):
            seen.append([(r.id, r.stopping, r.preemptible) for r in running])
            return policy(queued, running, capacity, now)

        with store.transaction() as db:
            return tick.decide(
                store,
                db,
                backend="local",
                policy=spy,
                inventory=INVENTORY,
                external_gpu_mem={},
                lease_ttl=30.0,
                now=now,
                index=index,
            )

    # two GPUs: one is free, the other is the held grant's
    assert [s.job_id for s in decide(160.0).starts] == [waiting[0].id]
    # the policy sees the held success as a job about to free its GPU: no victim
    assert seen == [[(lease.job.id, True, False)]]
    assert decide(161.0).starts == []
    lease.release()
    assert [s.job_id for s in decide(162.0).starts] == [waiting[1].id]
