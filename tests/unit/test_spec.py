"""Every bad input raises SpecError naming the field, the value and what is allowed."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta

import pytest

from jupyter_dlsched.vocab.errors import SpecError
from jupyter_dlsched.vocab.resources import Capacity
from jupyter_dlsched.vocab.spec import build_spec, parse_priority, pickle_payload
from jupyter_dlsched.vocab.units import format_duration, format_size, parse_duration, parse_size

GiB = 2**30
POOL = Capacity.empty(n_gpus=2, gpu_mem=16 * GiB, cpus=4, mem=64 * GiB)


def spec(**kw):
    return build_spec(capacity=POOL, **kw)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("8GiB", 8 * GiB),
        ("512MiB", 512 * 2**20),
        ("8G", 8 * 10**9),
        ("1.5GiB", int(1.5 * GiB)),
        (1024, 1024),
        ("100", 100),
    ],
)
def test_sizes_parse(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    "text, expected", [("90s", 90), ("30m", 1800), ("2h", 7200), (5, 5), ("1.5h", 5400)]
)
def test_durations_parse(text, expected):
    assert parse_duration(text) == expected


def test_formatting_reads_like_the_ui():
    assert format_size(8 * GiB) == "8.0 GiB"
    assert format_size(96 * GiB) == "96 GiB"
    assert format_duration(724) == "12m 04s"
    assert format_duration(3 * 3600 + 60) == "3h 01m"


def test_priority_names_map_to_numbers():
    assert [parse_priority(p) for p in ("low", "normal", "high", "urgent", 7, "12")] == [
        0,
        50,
        100,
        1000,
        7,
        12,
    ]


def test_a_valid_request_is_normalised():
    s = spec(gpus=1, cpus=2, mem="8GiB", priority="high", time_limit="2h", name="resnet")
    assert (s.request.gpus, s.request.cpus, s.request.mem) == (1.0, 2.0, 8 * GiB)
    assert (s.priority, s.time_limit, s.name) == (100, 7200.0, "resnet")


def test_gpu_memory_alone_means_a_share_of_one_gpu():
    s = spec(gpu_mem="4GiB")
    assert s.request.shared and s.request.gpu_mem == 4 * GiB
    assert s.request.gpus == pytest.approx(0.25)


def test_deadline_accepts_datetime_and_duration():
    at = datetime.now() + timedelta(hours=1)
    assert spec(deadline=at).deadline == pytest.approx(at.timestamp())
    assert spec(deadline="30m", now=1000.0).deadline == 2800.0


@pytest.mark.parametrize(
    "kwargs, field, words",
    [
        ({"gpus": -1}, "gpus", "whole number"),
        ({"gpus": "two"}, "gpus", "whole number"),
        ({"gpus": 1.5}, "gpus", "fraction"),
        ({"gpus": 4}, "gpus", "requests 4 GPUs; this pool has 2"),
        ({"gpu_mem": "32GiB"}, "gpu_mem", "largest GPU here has 16 GiB"),
        ({"gpus": 2, "gpu_mem": "20GiB"}, "gpu_mem", "largest GPU here has 16 GiB"),
        ({"gpus": 0, "gpu_mem": "1GiB"}, "gpu_mem", "CPU-only"),
        ({"cpus": 0}, "cpus", "CPU cores from 1/64"),
        ({"cpus": 64}, "cpus", "this pool has 4"),
        ({"mem": "1TiB"}, "mem", "this pool has 64 GiB"),
        ({"mem": "lots"}, "mem", "a size such as"),
        ({"mem": "1KiB"}, "mem", "at least 16 MiB (a process needs that much to start)"),
        ({"mem": 16 * 2**20 - 1}, "mem", "at least 16 MiB"),
        ({"priority": "asap"}, "priority", "low=0, normal=50"),
        ({"priority": True}, "priority", "an integer"),
        ({"time_limit": "soon"}, "time_limit", "a duration above zero"),
        ({"time_limit": 0}, "time_limit", "above zero"),
        ({"deadline": "whenever"}, "deadline", "a datetime"),
        ({"retries": -2}, "retries", "whole number from 0 to 100"),
        ({"preemptible": "yes"}, "preemptible", "True or False"),
        ({"name": ""}, "name", "non-empty"),
        ({"after": 42}, "after", "a job id"),
        ({"gpus": 0.5, "distributed": True}, "distributed", "whole GPUs"),
        ({"kind": "lambda"}, "kind", "function, cell, command"),
        # bounded to what the ledger and the machine can hold
        ({"priority": 10**30}, "priority", "from -1,000,000,000 to 1,000,000,000"),
        ({"priority": "99999999999999999999"}, "priority", "to 1,000,000,000"),
        ({"retries": 2**63}, "retries", "from 0 to 100"),
        ({"mem": 10**30}, "mem", "at most 1 EiB"),
        ({"mem": "1e400GiB"}, "mem", "at most 1 EiB"),
        ({"gpus": 10**30}, "gpus", "from 0 to 4096"),
        ({"gpus": 10**400}, "gpus", "from 0 to 4096"),
        ({"gpus": 1e-7}, "gpus", "from 1/64 up to 1"),
        ({"cpus": 1e-300}, "cpus", "from 1/64"),
        ({"gpu_mem": 1}, "gpu_mem", "at least 64 MiB"),
        ({"time_limit": 10**30}, "time_limit", "at most 365 days"),
        ({"time_limit": "1e400"}, "time_limit", "at most 365 days"),
        ({"deadline": float("inf")}, "deadline", "within ten years"),
        ({"deadline": 9.2e18}, "deadline", "within ten years"),
        ({"deadline": -9.2e18}, "deadline", "within ten years"),
        ({"deadline": "9999-12-31"}, "deadline", "within ten years"),
        ({"name": "\ud800"}, "name", "without control characters"),
        ({"name": "a\x00b"}, "name", "without control characters"),
        ({"name": "two\nlines"}, "name", "without control characters"),
        ({"name": "x" * 201}, "name", "at most 200 characters"),
        # bidirectional controls make a queue line read in another order than it is
        ({"name": "\u202e"}, "name", "without bidirectional controls (U+202E"),
        ({"name": "evil\u202egnp.exe"}, "name", "U+202E found"),
        ({"name": "a\u2066b\u2069"}, "name", "U+2066, U+2069 found"),
        ({"name": "x\u200fy"}, "name", "U+200F"),
        ({"name": "x\u061c"}, "name", "U+061C"),
        ({"name": "x\u202a"}, "name", "U+202A"),
        ({"after": ["\ud800"]}, "after", "a job id"),
        ({"after": ["../../etc"]}, "after", "a job id"),
        ({"env": {"A": "x\x00y"}}, "env", "without NUL"),
        ({"env": {"A=B": "x"}}, "env", "environment variable names"),
    ],
)
def test_each_bad_input_names_field_value_and_what_is_allowed(kwargs, field, words):
    with pytest.raises(SpecError) as caught:
        spec(**kwargs)
    assert caught.value.field == field
    message = str(caught.value)
    assert message.startswith(f"{field}=")
    assert words in message
    assert len(message) < 400, "a huge bad value is shown cut short"


def test_an_unpicklable_argument_is_named():
    lock = threading.Lock()
    with pytest.raises(SpecError) as caught:
        pickle_payload({"fn": print, "args": (1, lock), "kwargs": {}})
    assert caught.value.field == "args[1]"
    assert "lock" in str(caught.value).lower()


def test_an_unpicklable_keyword_argument_is_named():
    with pytest.raises(SpecError) as caught:
        pickle_payload({"fn": print, "args": (), "kwargs": {"handle": threading.Lock()}})
    assert caught.value.field == "kwargs['handle']"


def test_whole_gpus_with_a_memory_floor_count_only_big_enough_cards():
    from dataclasses import replace

    mixed = replace(POOL, gpus=(POOL.gpus[0], replace(POOL.gpus[1], mem_total=80 * GiB)))
    assert build_spec(capacity=mixed, gpus=1, gpu_mem="40GiB").request.whole_gpus == 1
    with pytest.raises(SpecError, match="requests 2 GPUs with 40 GiB each; this pool has 1"):
        build_spec(capacity=mixed, gpus=2, gpu_mem="40GiB")


def test_names_in_any_script_are_kept():
    for name in ("résumé-lr3", "训练", "نموذج", "emoji-🧪", "a\u200db"):
        assert spec(name=name).name == name


@pytest.mark.parametrize(
    ("cores", "asked", "cpus"),
    [
        (2, {"gpus": 1}, 0.5),  # 2 cores for 4 GPUs: half a core a GPU
        (2, {"gpus": 2}, 1.0),  # at most the one core a job gets without a GPU
        (2, {"gpus": 0.5}, 0.25),  # a share of a GPU, that share of its cores
        (2, {"gpus": "1:4", "preemptible": True}, 0.5),  # an elastic job: its least GPUs
        (2, {"gpu_mem": "8GiB"}, 0.25),  # sized by memory: half a card
        (3, {"gpus": 1}, 0.75),
        (16, {"gpus": 1}, 1.0),
        (2, {}, 1.0),  # a CPU job
        (2, {"gpus": 1, "cpus": 1}, 1.0),  # asked for: what was asked
    ],
)
def test_a_gpu_job_that_names_no_cpus_takes_its_gpus_share_of_the_cores(cores, asked, cpus):
    pool = Capacity.empty(n_gpus=4, gpu_mem=16 * GiB, cpus=cores, mem=64 * GiB)
    assert build_spec(capacity=pool, **asked).request.cpus == cpus


@pytest.mark.parametrize(
    ("gpus", "kept"),
    [
        ("1:2", (1.0, None, 2)),  # a bare range waits in line at its minimum
        ((1, 2), (1.0, None, 2)),
        ("1:2:2", (1.0, 2, 2)),  # the size it waits in line at, kept when above the minimum
        ((1, 1, 2), (1.0, None, 2)),
        (" 1 : 2 : 2 ", (1.0, 2, 2)),
    ],
)
def test_an_elastic_range_keeps_its_minimum_asked_size_and_maximum(gpus, kept):
    made = spec(gpus=gpus, preemptible=True)
    assert (made.request.gpus, made.asked_gpus, made.max_gpus) == kept


@pytest.mark.parametrize(
    ("gpus", "words"),
    [
        ("2:1:2", "MIN:ASKED:MAX"),
        ("1:3:2", "MIN:ASKED:MAX"),
        ("1:2:2:2", "MIN:ASKED:MAX"),
        ("1::2", "MIN:ASKED:MAX"),
        ((1, True, 2), "MIN:ASKED:MAX"),
        ((1, 1.5, 2), "MIN:ASKED:MAX"),
        ("1:3:3", "an asked size this pool can satisfy (requests 3 GPUs; this pool has 2)"),
    ],
)
def test_a_bad_asked_size_is_refused_naming_the_field(gpus, words):
    with pytest.raises(SpecError, match="gpus=") as err:
        spec(gpus=gpus, preemptible=True)
    assert words in str(err.value)
