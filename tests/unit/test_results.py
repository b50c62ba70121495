"""A job's result's buffers: in the buffer folder (memory) first, then settled beside the
result's pickle in the spool folder (``store/results.py``)."""

from __future__ import annotations

import numpy as np

from jupyter_dlsched.store import buffers, results

MIB = 2**20


def _folders(tmp_path):
    spool, memory = tmp_path / "spool", tmp_path / "memory"
    spool.mkdir(mode=0o700)
    memory.mkdir(mode=0o700)
    return spool, memory


def test_a_result_is_read_the_same_before_and_after_it_is_settled(tmp_path):
    spool, memory = _folders(tmp_path)
    name = results.result_name("k3x9m2ab", 1)
    data = buffers.dumps((np.full(MIB, 2.0), np.full(MIB, 3.0)), memory, named=name)
    (spool / "result.pkl").write_bytes(data)
    assert sorted(p.name for p in memory.iterdir()) == [f"{name}.0", f"{name}.1"]
    size = results.result_bytes(spool, memory, name)
    assert size == len(data) + 2 * 8 * MIB  # counted in memory
    before = buffers.loads(data, moved=spool)

    assert results.settle(spool, memory, name) == 2 * 8 * MIB
    assert list(memory.iterdir()) == []
    assert sorted(p.name for p in spool.iterdir()) == ["result.0", "result.1", "result.pkl"]
    assert results.result_bytes(spool, memory, name) == size  # counted on disk, the same
    after = buffers.loads(data, moved=spool)
    for a, b, value in zip(before, after, (2.0, 3.0), strict=True):
        assert float(a.sum()) == float(b.sum()) == value * MIB  # mapped before: still whole


def test_buffers_of_a_job_that_left_no_result_are_deleted_not_settled(tmp_path):
    spool, memory = _folders(tmp_path)
    name = results.result_name("k3x9m2ab", 1)
    buffers.dumps(np.ones(MIB), memory, named=name)  # killed before result.pkl was written
    assert results.settle(spool, memory, name) == 0
    assert list(memory.iterdir()) == [] and list(spool.iterdir()) == []


def test_a_new_attempt_clears_what_earlier_ones_left_and_nothing_else(tmp_path):
    spool, memory = _folders(tmp_path)
    for path in (
        spool / "result.0",
        spool / "result.3.part",
        spool / "log",
        memory / "result-k3x9m2ab-1.0",
        memory / "result-otherjob-1.0",
        memory / ("a" * 64),  # an argument's buffer, by its digest
    ):
        path.write_bytes(b"x")
    results.clear(spool, memory, "k3x9m2ab")
    assert sorted(p.name for p in spool.iterdir()) == ["log"]
    assert sorted(p.name for p in memory.iterdir()) == ["a" * 64, "result-otherjob-1.0"]


def test_only_a_results_buffer_names_are_read_as_one():
    assert results.parse_name("result-k3x9m2ab-12.3") == ("k3x9m2ab", 12, 3)
    for other in ("result.0", "result-k3x9m2ab.0", "result-k3x9m2ab-1", "a" * 64, ".x.part"):
        assert results.parse_name(other) is None
    assert results.settled_name("result-k3x9m2ab-2.5") == "result.5"
