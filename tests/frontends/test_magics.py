"""``%%schedule`` and ``%dlsched`` in a real IPython shell, with real jobs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from html.parser import HTMLParser

import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

import jupyter_dlsched as dls
from jupyter_dlsched.notebook.cells import CellResult
from jupyter_dlsched.widgets.live import refresher

PACKAGE = os.path.dirname(dls.__file__) + os.sep


def wait_for(condition, timeout=60.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def schedule(shell, line, cell):
    return shell.run_cell_magic("schedule", line, cell)


def last_view(shell):
    return shell.magics_manager.registry["SchedulerMagics"].last_view


# -- default mode -------------------------------------------------------------------------------


def test_a_cell_runs_as_a_job_and_its_out_names_come_back(ip):
    # `unused` cannot be pickled: the job runs only because just what the cell reads is sent
    ip.user_ns.update(x=21, unused=threading.Lock())
    assert schedule(ip, "--out y,z", "y = x * 2\nz = 'zed'\nprint('in job')\ny + 1") is None
    handle = ip.user_ns["_job"]
    assert handle.info().kind == "cell"
    result = handle.result(timeout=60)
    assert isinstance(result, CellResult) and result.value == 43
    # the refresh thread of the cell's status brings the names back
    wait_for(lambda: ip.user_ns.get("y") == 42, what="y back in the namespace")
    assert ip.user_ns["z"] == "zed" and ip.user_ns["_"] == 43
    assert "in job" in handle.logs()


@pytest.mark.parametrize(
    ("line", "field", "expected"),
    [
        ("--gpus 0.5", "gpus", 0.5),
        ("--gpus 1 --gpu-mem 2GiB", "gpu_mem", 2 * 2**30),
        ("--cpus 0.5", "cpus", 0.5),
        ("--mem 256MiB", "mem", 256 * 2**20),
        ("--priority high", "priority", 100),
        ("--priority 7", "priority", 7),
        ("--name 'exp 1'", "name", "exp 1"),
        ("--time-limit 30m", "time_limit", 1800.0),
        ("--preemptible", "preemptible", True),
        ("--gpus 2 --cpus 0.5 --distributed", "distributed", True),
    ],
)
def test_each_resource_flag_reaches_the_job(ip, line, field, expected):
    schedule(ip, line, "1")
    handle = ip.user_ns["_job"]
    assert getattr(handle.info(), field) == expected
    assert handle.result(timeout=60).value == 1


def test_a_distributed_cell_runs_once_per_gpu_and_rank_0_answers(ip):
    schedule(
        ip, "--gpus 2 --cpus 0.5 --distributed --out rank", "import os\nrank = os.environ['RANK']"
    )
    handle = ip.user_ns["_job"]
    ip.run_cell(f"%dlsched wait {handle.id}")  # brings the --out names back before it returns
    assert handle.info().state == "succeeded"
    assert ip.user_ns.get("rank") == "0"


def test_distributed_and_inline_do_not_mix(ip):
    result = ip.run_cell("%%schedule --distributed --inline\n1\n")
    assert "cannot be --inline" in str(result.error_in_exec)


def test_time_limit_stops_a_cell_that_runs_too_long(ip):
    schedule(ip, "--time-limit 1s", "import time\ntime.sleep(60)")
    info = ip.user_ns["_job"].wait(timeout=60)
    assert info.state == "timeout"


def test_after_waits_for_the_named_jobs(ip):
    schedule(ip, "--name first", "import time\ntime.sleep(1.5)")
    first = ip.user_ns["_job"]
    ip.user_ns["first"] = first
    result = ip.run_cell("%%schedule --after {first.id} --name second\n'second'\n")  # expands
    assert result.success, result.error_before_exec or result.error_in_exec
    second = ip.user_ns["_job"]
    assert second.info().after == (first.id,)
    wait_for(lambda: second.info().waiting is not None or second.done(), what="a reason")
    if not second.done():
        assert first.id in second.info().waiting
    assert second.result(timeout=60).value == "second"
    assert second.info().started >= first.info().finished


def test_wait_blocks_and_returns_the_trailing_value(ip):
    ip.user_ns["base"] = 10
    value = schedule(ip, "--wait --out doubled", "doubled = base * 2\ndoubled + 1")
    assert value == 21
    assert ip.user_ns["doubled"] == 20
    assert ip.user_ns["_job"].info().state == "succeeded"


def test_wait_raises_what_the_cell_raised(ip):
    with pytest.raises(ValueError, match="learning rate too high"):
        schedule(ip, "--wait", "raise ValueError('learning rate too high')")
    assert ip.user_ns["_job"].info().state == "failed"


def test_a_failure_under_wait_shows_only_the_users_frames(ip, capsys):
    ip.run_cell("def helper(x):\n    raise ValueError(f'bad lr {x}')\n")
    capsys.readouterr()
    result = ip.run_cell("%%schedule --wait\ny = 1\nhelper(y)\n")
    assert isinstance(result.error_in_exec, ValueError)  # "Run all" stops here
    shown = capsys.readouterr().out
    assert "<scheduled cell" in shown and "helper(y)" in shown and "ValueError: bad lr 1" in shown
    for own in ("jobproc.py", "runtime.py", "cells.py", "magics.py", "run_cell_magic"):
        assert own not in shown, own
    assert f"%dlsched logs {ip.user_ns['_job'].id}" in shown


def test_a_failed_function_job_shows_the_users_frames_with_their_source(ip, capsys):
    ip.run_cell("import jupyter_dlsched as dls\n\ndef boom(x):\n    return 1/x\n")
    capsys.readouterr()
    result = ip.run_cell("h = dls.submit(boom, 0, cpus=0.25)\nh.result(timeout=60)\n")
    assert isinstance(result.error_in_exec, ZeroDivisionError)
    shown = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)
    # the job's frame, named by the cell that defined it, with its source line
    assert "in boom" in shown and "return 1/x" in shown, shown
    assert "<dynamic-code>" not in shown
    assert "h.result(timeout=60)" in shown  # the user's own line in this kernel
    for own in (PACKAGE, "jobproc.py", "runtime.py", "handle.py"):
        assert own not in shown, own
    # the job's log, read after a kernel restart, has the source line too
    assert "return 1/x" in ip.user_ns["h"].logs()


def test_a_job_exception_that_cannot_come_back_still_shows_the_users_frames(ip, capsys):
    ip.run_cell(
        "import jupyter_dlsched as dls\n\nclass Odd(Exception):\n"
        "    def __init__(self, a, b):\n        super().__init__(a)\n\n"
        "def odd():\n    raise Odd('odd one', 2)\n"
    )
    capsys.readouterr()
    result = ip.run_cell("dls.submit(odd, cpus=0.25).result(timeout=60)\n")
    assert isinstance(result.error_in_exec, dls.JobFailed)  # Odd('odd one') cannot be rebuilt
    shown = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)
    assert "raise Odd('odd one', 2)" in shown and "Odd: odd one" in shown, shown
    for own in (PACKAGE, "jobproc.py", "handle.py"):
        assert own not in shown, own


# -- inline mode --------------------------------------------------------------------------------


def test_inline_runs_in_the_kernel_with_the_notebook_namespace(ip):
    ip.user_ns["lock"] = threading.Lock()  # could never travel to a job process
    value = schedule(
        ip,
        "--inline --gpus 1 --wait",
        "import os, threading\n"
        "with lock:\n"
        "    where = threading.current_thread().name\n"
        "print('inline says hi')\n"
        "import jupyter_dlsched as dls\n"
        "dls.progress(3, 4, loss=0.5)\n"
        "os.environ['DLSCHED_DEVICES']",
    )
    handle = ip.user_ns["_job"]
    info = handle.info()
    assert info.state == "succeeded" and info.inline
    assert value == str(info.devices[0])
    assert ip.user_ns["where"] == f"dlsched-inline-{handle.id}"
    assert "inline says hi" in handle.logs()
    assert info.progress["done"] == 3 and info.progress["metrics"] == {"loss": 0.5}


def test_a_cancel_the_cell_never_saw_is_sent_again_until_it_stops(ip):
    # the stop is an exception raised at the cell's next instruction; where it lands in code
    # that swallows it (a garbage-collector callback, a __del__, a bare except), the cell runs
    # on: it is sent again while the cell runs
    code = (
        "import time\nswallowed = 0\nwhile True:\n    try:\n        time.sleep(0.01)\n"
        "    except BaseException:\n        if swallowed:\n            raise\n"
        "        swallowed += 1"
    )
    schedule(ip, "--inline", code)
    handle = ip.user_ns["_job"]
    wait_for(lambda: handle.info().state == "running", what="the inline job to start")
    wait_for(lambda: "swallowed" in ip.user_ns, what="the cell to run")
    handle.cancel()
    assert handle.wait(timeout=30).state == "cancelled"
    assert ip.user_ns["swallowed"] == 1


def test_cancel_stops_an_inline_cell_at_its_next_python_instruction(ip):
    schedule(ip, "--inline", "import time\nwhile True:\n    time.sleep(0.01)")
    handle = ip.user_ns["_job"]
    wait_for(lambda: handle.info().state == "running", what="the inline job to start")
    view = last_view(ip)
    view.cancel_button.click()  # asks first, as every view does
    view.confirm.yes_button.click()
    assert handle.wait(timeout=60).state == "cancelled"


# -- errors: one line, no traceback -------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "cell", "message"),
    [
        ("--gpu 1", "1", "unrecognized arguments: --gpu 1"),
        ("--gpus", "1", "argument --gpus: expected one argument"),
        ("--gpus many", "1", "argument --gpus: expected a number such as 2 or 0.5, got 'many'"),
        ("--gpus 8", "1", "this pool has 2"),
        ("--mem lots", "1", "mem='lots' is invalid"),
        ("--priority extreme", "1", "priority='extreme' is invalid"),
        ("--time-limit soon", "1", "time_limit='soon' is invalid"),
        ("--out 1x", "1", "--out '1x' is not a variable name"),
        ("--after nosuchjob", "1", "after='nosuchjob' is invalid"),
        ("--name 'exp", "1", "No closing quotation"),
        ("", "   \n", "the cell is empty"),
        ("", "x = (1,", "syntax error in the cell, line 1"),
        ("", "with lock:\n    pass", "variable 'lock' (lock) cannot be sent"),
    ],
)
def test_bad_input_gives_a_one_line_usage_error(ip, line, cell, message):
    ip.user_ns["lock"] = threading.Lock()
    with pytest.raises(UsageError) as caught:
        schedule(ip, line, cell)
    text = str(caught.value)
    assert message in text and "\n" not in text
    assert text.startswith("%%schedule")
    assert "_job" not in ip.user_ns


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            "--gpus many",
            "%%schedule: argument --gpus: expected a number such as 2 or 0.5, got 'many' "
            "(--gpus N|0.5|MIN:MAX)",
        ),
        ("--gpus", "%%schedule: argument --gpus: expected one argument (--gpus N|0.5|MIN:MAX)"),
    ],
)
def test_a_bad_flag_value_names_the_flag_and_what_it_takes_not_every_flag(ip, line, message):
    with pytest.raises(UsageError) as caught:
        schedule(ip, line, "1")
    assert str(caught.value) == message


def test_a_usage_error_in_a_cell_prints_one_line_not_a_traceback(ip, capsys):
    result = ip.run_cell("%%schedule --gpu 1\n1\n")
    assert isinstance(result.error_before_exec or result.error_in_exec, UsageError)
    err = capsys.readouterr()
    shown = (err.out + err.err).strip().splitlines()
    assert len(shown) == 1 and shown[0].startswith("UsageError: %%schedule")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("", "say what to do"),
        ("frobnicate", "unknown command 'frobnicate'"),
        ("cancel", "the following arguments are required: id"),
        ("cancel nosuchjob", "no job with id 'nosuchjob'"),
        ("logs abc --tail x", "invalid int value: 'x'"),
        ("queue --everything", "unrecognized arguments: --everything"),
        ("attach nosuchjob", "no job with id 'nosuchjob'"),
        ("outputs", "the following arguments are required: id"),
        ("wait abc --out 1x", "--out '1x' is not a variable name"),
    ],
)
def test_dlsched_errors_are_one_line(ip, line, message):
    with pytest.raises(UsageError) as caught:
        ip.run_line_magic("dlsched", line)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_dlsched_priority_rejects_a_bad_priority(ip):
    handle = dls.submit(time.sleep, 0, cpus=0.5)
    with pytest.raises(UsageError, match="priority='sky-high' is invalid"):
        ip.run_line_magic("dlsched", f"priority {handle.id} sky-high")


# -- %dlsched -----------------------------------------------------------------------------------


def test_dlsched_queue_shows_running_and_waiting_jobs_escaped(ip):
    blocker = dls.submit(time.sleep, 30, gpus=2, name="<b>blocker</b>")
    waiting = dls.submit(time.sleep, 0, gpus=1, name="waits")
    wait_for(lambda: blocker.state == "running", what="the blocker to run")
    with capture_output() as shown:
        ip.run_line_magic("dlsched", "queue")
    data = shown.outputs[0].data
    assert (
        "&lt;b&gt;blocker&lt;/b&gt;" in data["text/html"] and "<b>blocker" not in data["text/html"]
    )
    text = data["text/plain"]
    assert text.index(blocker.id) < text.index(waiting.id)
    assert "running" in text and "queued" in text
    blocker.cancel()


def test_dlsched_queue_all_includes_finished_jobs(ip):
    done = dls.submit(time.sleep, 0, cpus=0.5, name="finished-one")
    done.result(timeout=60)
    with capture_output() as active:
        ip.run_line_magic("dlsched", "queue")
    with capture_output() as everything:
        ip.run_line_magic("dlsched", "queue --all")
    assert "finished-one" not in active.outputs[0].data["text/plain"]
    assert "finished-one" in everything.outputs[0].data["text/plain"]
    # JupyterLab's stylesheet right-aligns table cells: each one says its own alignment,
    # the same as its header's, or id and name sit right under left-aligned headings
    aligned = cell_alignments(everything.outputs[0].data["text/html"])
    assert {tag for tag, _ in aligned} == {"th", "td"}
    assert {align for _, align in aligned} == {"left"}


def cell_alignments(html: str) -> list[tuple[str, str | None]]:
    """``(tag, text-align)`` of every header and cell of a table, None where it says none."""
    found: list[tuple[str, str | None]] = []

    class Cells(HTMLParser):
        def handle_starttag(self, tag, attrs):
            if tag in ("th", "td"):
                style = dict(attrs).get("style") or ""
                rules = dict(r.split(":", 1) for r in style.replace(" ", "").split(";") if r)
                found.append((tag, rules.get("text-align")))

    Cells().feed(html)
    return found


def test_dlsched_pool_shows_the_gpu_cards(ip):
    with capture_output() as shown:
        ip.run_line_magic("dlsched", "pool")
    html = shown.outputs[0].data["text/html"]
    assert "GPU 0" in html and "GPU 1" in html and "[simulated]" in html and "CPU" in html


def test_dlsched_dashboard_displays_the_panel(ip):
    with capture_output() as shown:
        ip.run_line_magic("dlsched", "dashboard")
    assert "application/vnd.jupyter.widget-view+json" in shown.outputs[0].data


def test_dlsched_cancel_logs_priority_and_wait(ip, capsys):
    blocker = dls.submit(time.sleep, 30, gpus=2, name="blocker")
    queued = dls.submit(print, "never", gpus=1, name="queued-one")
    ip.run_line_magic("dlsched", f"priority {queued.id} high")
    assert queued.info().priority == 100
    assert "priority 50 -> 100" in capsys.readouterr().out
    ip.run_line_magic("dlsched", f"cancel {queued.id}")
    assert queued.info().state == "cancelled"
    assert "cancelled" in capsys.readouterr().out
    ip.run_line_magic("dlsched", f"cancel {blocker.id}")
    assert blocker.wait(timeout=60).state == "cancelled"
    talker = dls.submit(print, "hello from the log", cpus=0.5, name="talker")
    ip.run_line_magic("dlsched", f"wait {talker.id}")
    assert "done" in capsys.readouterr().out
    ip.run_line_magic("dlsched", f"logs {talker.id}")
    assert "hello from the log" in capsys.readouterr().out


def test_dlsched_wait_brings_a_scheduled_cells_names_back_before_returning(ip, capsys):
    ip.user_ns["seed"] = 3
    schedule(ip, "--out grown", "import time\ntime.sleep(0.5)\ngrown = seed * 100")
    ip.run_line_magic("dlsched", f"wait {ip.user_ns['_job'].id}")
    assert ip.user_ns["grown"] == 300  # no waiting for the background refresh
    assert "done" in capsys.readouterr().out


def test_after_accepts_ids_that_start_with_a_digit(ip):
    schedule(ip, "--name first", "1")
    first = ip.user_ns["_job"]
    first.result(timeout=60)
    # ids are drawn from letters and digits 2-9; force one that starts with a digit
    ip.user_ns["dep"] = "9" + first.id[1:]
    result = ip.run_cell("%%schedule --after {dep}\n2\n")
    assert "is not a variable name" not in str(result.error_in_exec)


def test_outputs_of_an_unfinished_job_says_to_wait(ip):
    handle = dls.submit(time.sleep, 30, cpus=0.5, name="long")
    with pytest.raises(UsageError, match=f"%dlsched wait {handle.id}"):
        ip.run_line_magic("dlsched", f"outputs {handle.id}")
    handle.cancel()


def test_outputs_names_what_it_set_and_refuses_names_the_cell_did_not_send(ip, capsys):
    schedule(ip, "--out a,b --wait", "a = 1\nb = 2")
    job_id = ip.user_ns["_job"].id
    del ip.user_ns["a"], ip.user_ns["b"]
    capsys.readouterr()
    ip.run_line_magic("dlsched", f"outputs {job_id}")
    assert capsys.readouterr().out.strip() == "set in this kernel: a, b"
    assert (ip.user_ns["a"], ip.user_ns["b"]) == (1, 2)
    with pytest.raises(UsageError, match=r"did not send back c \(it sent back: a, b\)"):
        ip.run_line_magic("dlsched", f"outputs {job_id} --out c")


def test_attach_shows_the_live_line_and_brings_the_names_back_at_the_end(ip, tmp_path):
    gate = tmp_path / "go"
    ip.user_ns["gate"] = str(gate)
    schedule(
        ip,
        "--out found",
        "import os, time\nwhile not os.path.exists(gate):\n    time.sleep(0.05)\nfound = 'yes'",
    )
    job_id = ip.user_ns["_job"].id
    magics = ip.magics_manager.registry["SchedulerMagics"]
    magics.cell_views.clear()  # as in a new kernel: no status line knows the job
    refresher.stop_all()
    with capture_output() as shown:
        ip.run_line_magic("dlsched", f"attach {job_id}")
    assert "application/vnd.jupyter.widget-view+json" in shown.outputs[0].data
    view = last_view(ip)
    assert view.handle.id == job_id and not view.finished
    gate.touch()
    wait_for(lambda: not view.refresh(), what="the attached line to see the end")
    assert "done in" in view.status.value and "found returned" in view.status.value
    assert ip.user_ns["found"] == "yes"


IMPORT_THEN_MAGIC = """
from IPython.core.interactiveshell import InteractiveShell

shell = InteractiveShell.instance()
assert shell.run_cell("import jupyter_dlsched as dls").success
assert shell.run_cell("%dlsched queue").success
magics = shell.magics_manager.registry["SchedulerMagics"]
# %load_ext after the import keeps the one set of magics (and what they hold)
assert shell.run_cell("%load_ext jupyter_dlsched").success
assert shell.magics_manager.registry["SchedulerMagics"] is magics
assert shell.run_cell("%load_ext jupyter_dlsched").success
"""


def test_importing_the_package_in_ipython_registers_the_magics(home):
    # a fresh interpreter: this one imported the package before any shell existed
    out = subprocess.run(
        [sys.executable, "-c", IMPORT_THEN_MAGIC],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "no queued or running jobs" in out.stdout
    assert "not found" not in out.stdout + out.stderr
