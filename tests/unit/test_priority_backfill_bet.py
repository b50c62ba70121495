"""``priority`` does not count on a job past its estimate while it waits for one within it (#52).

The decision that put cluster e13805 on 48 GPUs above ``fifo``, in six GPUs.
Five finished jobs teach the policy a median run time of 1000 s and a
cautious (0.8 quantile) one of 5000 s. ``o`` (1 GPU) has run past its
median: a reservation takes it to end any moment. ``x`` (3 GPUs, median end
8000) and ``y`` (2 GPUs) run; ``h`` (4 GPUs) is the first blocked job, ``b``
(2 GPUs, 300 s, estimated 5000 s) comes behind it. When ``y`` ends at 7100,
``h``'s reservation is planned for ``x``'s median end on four of the six
devices. It took the lowest-numbered: where those were ``o``'s and ``x``'s,
the two free devices were left to ``b``, which would outrun the
reservation; ``x`` ends early (7200), ``o`` does not, and ``h`` waited for
``b`` (7400 instead of 7200): average JCT 1714.7 s against ``fifo``'s
1709.7 s. With ``y`` on the lower devices the reservation held the free
devices: the numbering decided.

Now a reservation that waits for a job within its estimate takes the
devices of jobs past theirs last. Where it waits for nothing but such jobs
it still leaves free devices to jobs that may outrun it, the bet nearly all
of ``priority``'s gain over ``fifo`` on the Philly slices rests on
(``docs/benchmarks.md``).
"""

from __future__ import annotations

import pytest

from jupyter_dlsched.sim import TraceJob, simulate, summarize

LEARNT = [TraceJob(f"done{i}", 0.0, 1, s) for i, s in enumerate([500, 1000, 1000, 5000, 5000])]


def trace(first: str) -> list[TraceJob]:
    """The jobs above; ``first`` of ``x`` and ``y`` is placed first, on the lower devices."""
    pair = {"x": TraceJob("x", 7000.0, 3, 200.0), "y": TraceJob("y", 7000.0, 2, 100.0)}
    second = "y" if first == "x" else "x"
    return [
        *LEARNT,
        TraceJob("o", 5500.0, 1, 3500.0),
        pair[first],
        pair[second],
        TraceJob("h", 7001.0, 4, 50.0),
        TraceJob("b", 7002.0, 2, 300.0),
    ]


def replay(jobs: list[TraceJob], policy: str) -> tuple[dict[str, float], float]:
    result = simulate(jobs, policy, gpus=6)
    return {j.id: j.first_start for j in result.jobs}, summarize(result)["avg_jct"]


@pytest.mark.parametrize("first", ["x", "y"])
def test_a_reservation_waiting_for_a_job_within_its_estimate_does_not_count_on_one_past_it(
    first: str,
):
    starts, avg = replay(trace(first), "priority")
    assert (starts["h"], starts["b"]) == (7200.0, 7250.0)  # b waits, as under fifo
    assert avg == replay(trace(first), "fifo")[1] == pytest.approx(1709.7)


def test_where_it_waits_only_for_jobs_past_their_estimate_free_devices_still_backfill():
    # o (2 GPUs, past its median) holds devices 0-1, y (4 GPUs) 2-5; h needs 5 of the 6
    # when y ends at 7100, so its reservation is "now", on o's devices and three free
    # ones: b (1 GPU, estimated 5000 s) takes the fourth and h still starts when o ends
    jobs = [
        *LEARNT,
        TraceJob("o", 5500.0, 2, 3500.0),
        TraceJob("y", 7000.0, 4, 100.0),
        TraceJob("h", 7001.0, 5, 50.0),
        TraceJob("b", 7002.0, 1, 300.0),
    ]
    starts, avg = replay(jobs, "priority")
    fifo_starts, fifo_avg = replay(jobs, "fifo")
    assert (starts["h"], starts["b"]) == (9000.0, 7100.0)
    assert (fifo_starts["h"], fifo_starts["b"]) == (9000.0, 9000.0)
    assert avg < fifo_avg
