"""Property tests of every public way in: any input is either accepted within its stated
bounds or refused with ``SpecError``, and a refused request writes nothing to the ledger."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from jupyter_dlsched.client.scheduler import Scheduler
from jupyter_dlsched.policy.base import Decisions
from jupyter_dlsched.vocab.errors import SpecError
from jupyter_dlsched.vocab.resources import Capacity
from jupyter_dlsched.vocab.spec import (
    MAX_PRIORITY,
    MAX_RETRIES,
    MAX_TIME_LIMIT,
    MIN_GPU_MEM,
    MIN_SHARE,
    build_spec,
    parse_priority,
)
from jupyter_dlsched.vocab.units import MAX_DURATION, MAX_SIZE, parse_duration, parse_size

GiB = 2**30

# Anything a user might type or pass: numbers of every size, special floats, text with
# units, control characters and lone surrogates, and things of the wrong type.
numbers = st.one_of(
    st.integers(min_value=-(2**80), max_value=2**80),
    st.integers().map(lambda n: n * 10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, -1, 0.5, 1e-300, 1e308, 2**63, 2**64, 10**30, 10**400]),
)
unit_text = st.builds(
    lambda n, unit: f"{n}{unit}",
    st.one_of(st.integers(-(10**25), 10**25), st.floats(allow_nan=True, allow_infinity=True)),
    st.sampled_from(["", "B", "KiB", "MiB", "GiB", "TiB", "G", "s", "m", "h", "d", "x", " GiB"]),
)
texts = st.one_of(
    st.text(max_size=40),
    st.text(alphabet=st.characters(codec=None, categories=("Cc", "Cs", "L", "N")), max_size=12),
    unit_text,
    st.sampled_from(["1e400", "1e400GiB", "nan", "inf", "-inf", "99999999999999999999", "high"]),
)
anything = st.one_of(
    st.none(), st.booleans(), numbers, texts, st.lists(texts, max_size=3), st.just(object())
)

POOL = Capacity.empty(n_gpus=2, gpu_mem=16 * GiB, cpus=4, mem=64 * GiB)


@given(anything)
def test_a_size_is_bytes_within_bounds_or_a_spec_error(value):
    try:
        size = parse_size(value, "mem")
    except SpecError as error:
        assert error.field == "mem"
    else:
        assert isinstance(size, int) and 0 <= size <= MAX_SIZE


@given(anything)
def test_a_duration_is_finite_seconds_within_bounds_or_a_spec_error(value):
    try:
        seconds = parse_duration(value, "time_limit")
    except SpecError as error:
        assert error.field == "time_limit"
    else:
        assert math.isfinite(seconds) and 0 <= seconds <= MAX_DURATION


@given(anything)
def test_a_priority_is_a_bounded_integer_or_a_spec_error(value):
    try:
        priority = parse_priority(value)
    except SpecError as error:
        assert error.field == "priority"
    else:
        assert isinstance(priority, int) and -MAX_PRIORITY <= priority <= MAX_PRIORITY


FIELDS = ("gpus", "gpu_mem", "cpus", "mem", "priority", "deadline", "time_limit", "retries")
# Values a user would mean, so that a good share of the drawn requests is accepted.
SENSIBLE = {
    "gpus": st.sampled_from([0, 1, 2, 0.5, 0.25, "1"]),
    "gpu_mem": st.sampled_from(["1GiB", "4G", 2**30]),
    "cpus": st.sampled_from([1, 2, 0.5, "2"]),
    "mem": st.sampled_from(["1GiB", "512MiB", 10**9]),
    "priority": st.one_of(st.sampled_from(["high", "low"]), st.integers(-1000, 1000)),
    "deadline": st.sampled_from(["2h", "30m", 1.8e9 + 60]),
    "time_limit": st.sampled_from(["90s", "2h", 60]),
    "retries": st.integers(0, 5),
    "name": st.text(st.characters(categories=("L", "N")), min_size=1, max_size=20),
}
field_values = st.sampled_from(sorted(SENSIBLE)).flatmap(
    lambda name: st.tuples(st.just(name), st.one_of(SENSIBLE[name], anything))
)
requests = st.lists(field_values, max_size=4).map(dict)


@given(requests)
@example({"gpu_mem": 64 * 2**20})  # found: 64 MiB of a 16 GiB card was a 1/256 share
def test_a_request_is_valid_within_bounds_or_refused_naming_one_field(kwargs):
    try:
        spec = build_spec(capacity=POOL, now=1.8e9, **kwargs)
    except SpecError as error:
        assert error.field in (*FIELDS, "name", "after")
        assert str(error).startswith(f"{error.field}=")
        return
    request = spec.request
    assert request.gpus == 0 or MIN_SHARE <= request.gpus <= 2
    assert request.gpu_mem is None or MIN_GPU_MEM <= request.gpu_mem <= 16 * GiB
    assert MIN_SHARE <= request.cpus <= 4 and 0 <= request.mem <= 64 * GiB
    assert -MAX_PRIORITY <= spec.priority <= MAX_PRIORITY
    assert 0 <= spec.retries <= MAX_RETRIES
    assert spec.time_limit is None or 0 < spec.time_limit <= MAX_TIME_LIMIT
    assert spec.deadline is None or math.isfinite(spec.deadline)
    spec.name.encode("utf-8")  # the ledger stores UTF-8: no lone surrogates get through


class HoldEverything:
    """A policy that starts nothing, so accepted jobs stay queued while the test counts rows."""

    name = "hold"

    def __call__(self, queued: Sequence, running: Sequence, capacity, now: float) -> Decisions:
        return Decisions()


@pytest.fixture(scope="module")
def held(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scheduler]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("DLSCHED_SIMULATE_GPUS", "2x16GiB")
        home: Path = tmp_path_factory.mktemp("props") / "home"
        s = Scheduler(home, policy=HoldEverything(), loop=False)  # type: ignore[arg-type]
    yield s
    s.close()


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kwargs=requests)
def test_a_refused_submission_writes_no_row_and_an_accepted_one_writes_one(held, kwargs):
    before = sum(held.store.count_jobs().values())
    try:
        handle = held.submit(print, "hi", **kwargs)
    except SpecError:
        assert sum(held.store.count_jobs().values()) == before
    else:
        assert sum(held.store.count_jobs().values()) == before + 1
        assert held.info(handle.id).state == "queued"
        event("accepted")


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(anything)
def test_changing_a_priority_to_any_value_is_bounded_or_refused(held, value):
    job = held.submit(print, "hi")
    try:
        info = held.set_priority(job.id, value)
    except SpecError:
        assert held.info(job.id).priority == 50
    else:
        assert -MAX_PRIORITY <= info.priority <= MAX_PRIORITY
