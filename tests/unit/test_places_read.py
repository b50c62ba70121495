"""Places in line as people read them: the ledger keeps ranks, numbered 1..n per backend's
line as they are read (``store/job_reads.py``)."""

from __future__ import annotations

from pathlib import Path

from jupyter_dlsched.store import Store
from jupyter_dlsched.vocab.resources import Capacity
from jupyter_dlsched.vocab.spec import build_spec

POOL = Capacity.empty(n_gpus=2, gpu_mem=16 * 2**30, cpus=4, mem=64 * 2**30)


def queued(store: Store, backend: str = "local") -> str:
    spec = build_spec(capacity=POOL, gpus=1)
    job = store.insert_job(spec, {"payload.pkl": b"x"}, owner="anna", uid=1000, backend=backend)
    return job.id


def ranked(store: Store, ranks: dict[str, float | None]) -> None:
    with store.transaction() as db:
        store.queue.set_queue_positions(
            db, [(rank, None, job_id) for job_id, rank in ranks.items()]
        )


def test_places_read_are_1_to_n_in_rank_order_whatever_the_ranks(tmp_path: Path) -> None:
    store = Store(tmp_path / "h")
    a, b, c, d = (queued(store) for _ in range(4))
    ranked(store, {a: 7.0, b: -3.0, c: 7.5, d: None})  # d has no place yet
    places = {j.id: j.position for j in store.jobs(states=["queued"])}
    assert places == {b: 1, a: 2, c: 3, d: None}
    assert [store.get(x).position for x in (a, b, c, d)] == [2, 1, 3, None]
    assert {j.id: j.position for j in store.jobs(ids=[c, d])} == {c: 3, d: None}


def test_a_job_that_leaves_the_line_moves_everyone_behind_it_up_at_once(tmp_path: Path) -> None:
    store = Store(tmp_path / "h")
    a, b, c, d = (queued(store) for _ in range(4))
    ranked(store, {a: 1.0, b: 2.0, c: 3.0, d: 4.0})
    store.transition(a, "running", started=1.0, position=None)  # a start clears its rank
    store.cancel(c, unsupervised_ends=True)  # a cancel leaves it, but not in the line
    assert [store.get(x).position for x in (a, b, c, d)] == [None, 1, None, 2]
    assert [j.position for j in store.jobs()] == [None, 1, None, 2]


def test_each_backend_has_a_line_of_its_own(tmp_path: Path) -> None:
    store = Store(tmp_path / "h")
    here, there = queued(store), queued(store, backend="ray")
    ranked(store, {here: 5.0, there: 2.0})
    assert store.get(here).position == 1 and store.get(there).position == 1


def test_a_page_of_a_long_line_numbers_each_job_as_the_whole_line_does(tmp_path: Path) -> None:
    """A page numbers only its part of the line (the jobs ahead of it counted), in both
    reads of a list: ``jobs`` and the agent's ``job_rows``."""
    store = Store(tmp_path / "h")
    ids = [queued(store) for _ in range(40)]
    other = [queued(store, backend="ray") for _ in range(12)]
    # ranks out of submit order: a page's jobs are scattered over the line
    ranked(store, {job_id: float((i * 17) % 40) for i, job_id in enumerate(ids)})
    ranked(store, {job_id: float(-i) for i, job_id in enumerate(other)})
    whole = {j.id: j.position for j in store.jobs()}
    assert sorted(whole[x] for x in ids) == list(range(1, 41))
    assert sorted(whole[x] for x in other) == list(range(1, 13))
    for offset in range(0, 52, 10):
        page = store.jobs(limit=10, offset=offset)
        assert {j.id: j.position for j in page} == {j.id: whole[j.id] for j in page}
        rows = store.job_rows(limit=10, offset=offset, newest_first=True)
        assert {r["id"]: r["position"] for r in rows} == {r["id"]: whole[r["id"]] for r in rows}
