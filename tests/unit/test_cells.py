"""Cell analysis (which notebook variables a cell reads) and cells run as real jobs."""

from __future__ import annotations

import threading
from pathlib import Path

import cloudpickle
import pytest

import jupyter_dlsched
from jupyter_dlsched.notebook.cell_names import reads
from jupyter_dlsched.notebook.cells import (
    CellResult,
    UnpicklableVariable,
    capture,
    execute,
    run_cell,
)
from jupyter_dlsched.vocab.tracebacks import user_traceback


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("y = model(x)\nloss = y.mean()", {"model", "x"}),
        ("x = 1\ny = x + 1", set()),
        ("x = x + 1", {"x"}),
        ("total += step", {"total", "step"}),
        ("for i in range(n):\n    acc.append(i)", {"range", "n", "acc"}),
        ("def f(a, b=default):\n    return a + b + scale\n", {"default", "scale"}),
        ("def f():\n    return later\nlater = 3\nf()", set()),
        ("squares = [v * k for v in values if v > cut]", {"values", "cut", "k"}),
        ("d = {k: v for k, v in pairs}", {"pairs"}),
        ("import numpy as np\nnp.zeros(3)", set()),
        ("from math import sqrt\nsqrt(two)", {"two"}),
        ("try:\n    risky()\nexcept ValueError as e:\n    log(e)", {"risky", "ValueError", "log"}),
        ("with open(path) as fh:\n    data = fh.read()", {"open", "path"}),
        ("if (n := size()) > 3:\n    print(n)", {"size", "print"}),
        ("f = lambda a: a * factor", {"factor"}),
        ("class Net(Base):\n    width = hidden\n", {"Base", "hidden"}),
        ("def g():\n    global counter\n    counter = counter + 1", {"counter"}),
        ("def outer():\n    def inner():\n        return free\n    return inner", {"free"}),
        ("x: int = y", {"y"}),
        ("obj.attr = value\nitems[key] = 1", {"obj", "value", "items", "key"}),
    ],
)
def test_reads_finds_the_names_a_cell_takes_from_the_notebook(source, expected):
    assert reads(source) - {"print"} == expected - {"print"}


def test_capture_ships_only_what_the_cell_reads():
    namespace = {"x": 2, "unused": object(), "In": [], "Out": {}, "_3": 1, "_i3": "x"}
    names, variables = capture("y = x * 2\nIn, Out, _3, _i3", namespace)
    assert names == ["x"]
    assert variables == {"x": 2}


def test_capture_keeps_objects_shared_between_variables_shared():
    weights = [1.0, 2.0]
    namespace = {"weights": weights, "optimizer": {"params": weights}}
    _, captured = capture("optimizer['params'][0] = 5.0\nweights", namespace)
    # they travel in one pickle (the job's payload): what they share stays shared
    variables = cloudpickle.loads(cloudpickle.dumps(captured))
    assert variables["optimizer"]["params"] is variables["weights"]


def test_an_unpicklable_variable_is_named_with_what_to_do():
    namespace = {"lock": threading.Lock(), "n": 3}
    with pytest.raises(UnpicklableVariable) as caught:
        capture("with lock:\n    n + 1", namespace)
    message = str(caught.value)
    assert "'lock'" in message and "--inline" in message and "recreate it" in message
    assert caught.value.name == "lock"


def test_execute_returns_the_trailing_expression_and_out_names():
    namespace: dict = {"a": 4}
    result = execute("b = a * 2\nc = b + 1\nb * 10", namespace, "<t>", ["b", "c", "nope"])
    assert result.value == 80 and result.has_value
    assert result.outputs == {"b": 8, "c": 9}
    assert result.missing == ["nope"]
    assert repr(result) == (
        "CellResult(outputs: b, c; value: 80; not assigned by the cell: nope"
        " — %dlsched wait JOB_ID brings them into this kernel)"
    )


def test_a_trailing_semicolon_silences_the_value():
    result = execute("1 + 1;", {}, "<t>")
    assert not result.has_value and result.value is None


def test_a_failing_cell_shows_its_own_source_line_in_the_traceback():
    import traceback

    with pytest.raises(ZeroDivisionError) as caught:
        execute("x = 1\ny = x / 0\n", {}, "<scheduled cell t1>")
    text = "".join(traceback.format_exception(caught.value))
    assert '<scheduled cell t1>", line 2' in text and "y = x / 0" in text


def _notebook_function():
    """A function defined in a notebook: its module is __main__, so it travels by value."""
    namespace = {"__name__": "__main__"}
    exec("def scale(v, by=3):\n    return [e * by for e in v]\n", namespace)
    return namespace["scale"]


def test_a_cell_job_runs_with_notebook_functions_and_returns_its_outputs(sched):
    scale = _notebook_function()
    source = "out = scale(data)\nprint('scaled', len(out))\nsum(out)"
    names, blob = capture(source, {"scale": scale, "data": [1, 2, 3], "other": 9})
    assert names == ["data", "scale"]
    payload = {"runner": run_cell, "source": source, "variables": blob, "out": ["out"]}
    handle = sched.submit_payload("cell", payload, default_name="cell 1")
    result = handle.result(timeout=60)
    assert isinstance(result, CellResult)
    assert result.outputs == {"out": [3, 6, 9]} and result.value == 18
    # its repr says how to get the values, naming the job
    assert repr(result) == (
        f"CellResult(outputs: out; value: 18 — %dlsched wait {handle.id} "
        "brings it into this kernel)"
    )
    assert "scaled 3" in handle.logs()
    assert handle.info().kind == "cell"


def test_an_output_that_cannot_come_back_is_reported_not_fatal(sched):
    source = "import threading\nlock = threading.Lock()\nn = 5"
    payload = {
        "runner": run_cell,
        "source": source,
        "variables": cloudpickle.dumps({}),
        "out": ["lock", "n"],
    }
    result = sched.submit_payload("cell", payload).result(timeout=60)
    assert result.outputs == {"n": 5}
    assert "lock" in result.unsent and "pickle" in result.unsent["lock"]


def test_magics_in_a_job_process_fail_with_advice(sched):
    payload = {
        "runner": run_cell,
        "source": "get_ipython().run_line_magic('time', '1')",
        "variables": cloudpickle.dumps({}),
    }
    handle = sched.submit_payload("cell", payload)
    with pytest.raises(RuntimeError, match="--inline"):
        handle.result(timeout=60)


def test_tqdm_in_a_job_reports_progress(sched):
    pytest.importorskip("tqdm")
    source = (
        "from tqdm.auto import tqdm\n"
        "bar = tqdm(range(50), mininterval=0)\n"
        "for i in bar:\n"
        "    bar.set_postfix(loss=1 / (i + 1))\n"
    )
    payload = {"runner": run_cell, "source": source, "variables": cloudpickle.dumps({})}
    handle = sched.submit_payload("cell", payload)
    handle.result(timeout=60)
    progress = handle.info().progress
    assert progress is not None and progress["done"] == 50 and progress["total"] == 50
    assert progress["metrics"] == {"loss": 0.02}


def test_a_cell_result_without_names_says_so():
    assert repr(CellResult()) == "CellResult(nothing sent back)"
    assert repr(CellResult(value=3, has_value=True)) == "CellResult(value: 3)"


PACKAGE_FILE = str(Path(jupyter_dlsched.__file__).parent / "local" / "jobproc.py")


def test_user_traceback_keeps_only_the_users_frames_in_each_chained_part():
    tb = (
        "Traceback (most recent call last):\n"
        f'  File "{PACKAGE_FILE}", line 187, in _run_python\n'
        "    result = run_payload(data)\n"
        "             ^^^^^^^^^^^^^^^^^\n"
        '  File "<scheduled cell 4>", line 2, in <module>\n'
        "    helper(y)\n"
        '  File "/home/anna/helpers.py", line 9, in helper\n'
        "    open(path)\n"
        "FileNotFoundError: data.csv\n"
        "\n"
        "During handling of the above exception, another exception occurred:\n"
        "\n"
        "Traceback (most recent call last):\n"
        f'  File "{PACKAGE_FILE}", line 190, in _run_python\n'
        "    raise\n"
        '  File "<scheduled cell 4>", line 4, in <module>\n'
        "    raise ValueError('no data')\n"
        "ValueError: no data"
    )
    shown = user_traceback(tb)
    assert "jobproc" not in shown and "run_payload" not in shown
    assert shown.count("Traceback (most recent call last):") == 2
    for kept in (
        "helper(y)",
        "/home/anna/helpers.py",
        "FileNotFoundError: data.csv",
        "During handling",
        "raise ValueError('no data')",
        "ValueError: no data",
    ):
        assert kept in shown
