"""gittins: a grid coarse enough to re-rank a long job rarely, fine enough to tell jobs apart (#52).

A job's rank is the Gittins index at the start of its cell of the grid, over quanta
of at least the cell's width (it runs at least to the cell's end). With cells that
double, one rank covers jobs from 64 to 128 GPU-seconds (in the scale below): a job
about to end and one that outlived every job like it rank alike and wait in submit
order. On Philly cluster 7f04ca one rank covered 43 to 341 GPU-hours, and 8-GPU jobs
of a few hours waited in line behind jobs of weeks: average JCT 721 h on 32 GPUs,
545 h with the finer grid before. Cells now grow by √2 (1.41).
"""

from __future__ import annotations

from jupyter_dlsched.policy import GittinsPolicy, QueuedJob
from jupyter_dlsched.vocab.resources import Capacity, Request

# nine jobs in ten use 80 GPU-seconds, one in ten 5,000
SIZES = [80.0] * 90 + [5000.0] * 10


def first_started(policy: GittinsPolicy) -> str:
    # one GPU free. giant (submitted first) has had 120 GPU-s: past every job of 80,
    # it is one of the 5,000. nearly (submitted next) has had 70: nine in ten end
    # within 10 more. Cells of quantum 1: 64-128 with growth 2 (one rank for both,
    # submit order decides); 61.7-87.0 and 87.0-122.7 with growth 1.41 (ranks 510 and
    # 4,913 GPU-s per completion).
    capacity = Capacity.empty(n_gpus=1, gpu_mem=16 * 2**30, cpus=0, mem=0)
    giant = QueuedJob("giant", 1, 0.0, Request(gpus=1, cpus=0), attained=120.0)
    nearly = QueuedJob("nearly", 2, 1.0, Request(gpus=1, cpus=0), attained=70.0)
    return policy([giant, nearly], [], capacity, 10.0).starts[0].job_id


def test_a_job_near_its_end_goes_before_one_that_outlived_its_kind():
    policy = GittinsPolicy(sizes=SIZES, learn_sizes=False, quantum=1.0)
    assert first_started(policy) == "nearly"


def test_with_doubling_cells_both_ranked_alike_and_submit_order_decided():
    policy = GittinsPolicy(sizes=SIZES, learn_sizes=False, quantum=1.0, growth=2.0)
    assert first_started(policy) == "giant"
