"""Places in line stored as ranks: a decision rewrites only the jobs whose order changed
(``engine/line_ranks.py``); reads number them, ``test_places_read.py``."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from jupyter_dlsched.engine.line_ranks import rerank


def applied(old: list[float | None]) -> list[float | None]:
    new = rerank(old)
    return [new.get(i, rank) for i, rank in enumerate(old)]


def increasing(ranks: list[float | None]) -> bool:
    pairs = zip(ranks, ranks[1:], strict=False)
    return None not in ranks and all(a < b for a, b in pairs)  # type: ignore[operator]


def test_the_head_leaving_the_line_rewrites_no_rank() -> None:
    # jobs 1 and 2 started: the others keep theirs, and so their order
    assert rerank([3.0, 4.0, 5.0, 6.0]) == {}
    assert rerank([]) == {}


def test_new_jobs_are_ranked_around_the_ranks_kept() -> None:
    assert rerank([None, None]) == {0: 1.0, 1: 2.0}  # a new line is numbered 1..n
    assert rerank([3.0, 4.0, None, None]) == {2: 5.0, 3: 6.0}  # submitted last
    assert rerank([None, 3.0, 4.0]) == {0: 2.0}  # ahead of everyone
    new = rerank([3.0, None, 4.0])  # between two
    assert list(new) == [1] and 3.0 < new[1] < 4.0


def test_a_job_moved_to_the_front_is_the_only_one_ranked_again() -> None:
    old: list[float | None] = [9.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 10.0]
    new = rerank(old)
    assert list(new) == [0] and new[0] < 1.0
    # and one moved to the back, or into the middle
    assert list(rerank([1.0, 3.0, 4.0, 5.0, 6.0, 2.0])) == [5]
    assert list(rerank([1.0, 2.0, 6.0, 3.0, 4.0, 5.0, 7.0])) == [2]


def test_a_gap_used_up_by_insertions_is_widened_around_it() -> None:
    ranks: list[float | None] = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    written = 0
    for _ in range(200):  # each time a job goes in right behind the first one
        ranks.insert(1, None)
        new = rerank(ranks)
        written += len(new)
        ranks = [new.get(i, rank) for i, rank in enumerate(ranks)]
        assert increasing(ranks)
    assert written < 200 * 10  # far fewer than renumbering the whole line each time


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(st.none(), st.integers(-50, 50).map(float), st.floats(-1e6, 1e6)), max_size=60
    )
)
def test_ranks_increase_along_the_line_after_any_change(old: list[float | None]) -> None:
    new = rerank(old)
    assert increasing(applied(old))
    # every job without a rank is given one
    assert all(i in new for i, rank in enumerate(old) if rank is None)
