"""Widget state (rows, values, buttons) while real jobs change state."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import jupyter_dlsched as dls
from jupyter_dlsched.store import JobInfo
from jupyter_dlsched.widgets import JobView, dashboard
from jupyter_dlsched.widgets import format as fmt
from jupyter_dlsched.widgets.live import refresher

EVIL = "<img src=x onerror=alert(1)>"


def wait_for(condition, timeout=60.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(autouse=True)
def stop_refreshing():
    yield
    refresher.stop_all()


# -- functions that run as jobs -----------------------------------------------------------------


def hold_until(path, done=7, total=10):
    """Report progress, print, then wait until ``path`` exists."""
    dls.progress(done, total, loss=0.31)
    print("epoch 1 loss 0.31", flush=True)
    while not Path(path).exists():
        time.sleep(0.05)
    return "trained"


def fail_loudly():
    print("<script>alert(2)</script>", flush=True)
    raise RuntimeError("<b>CUDA out of memory</b>")


# -- JobView ------------------------------------------------------------------------------------


def refreshed(view: JobView, text: str) -> bool:
    view.refresh()
    return text in view.status.value


def test_jobview_follows_a_job_from_queued_to_running_to_done(sched, tmp_path):
    gate = tmp_path / "go"
    blocker = sched.submit(time.sleep, 60, gpus=2, name="blocker")
    wait_for(lambda: blocker.state == "running", what="the blocker to run")
    handle = sched.submit(hold_until, str(gate), gpus=1, name="trainer")
    view = JobView(handle, live=False)
    wait_for(lambda: refreshed(view, "queued #1"), what="a queue position")
    assert "GPU" in view.status.value  # it says why it waits
    assert view.cancel_button.layout.display != "none"
    assert view.bar.layout.display == "none"
    blocker.cancel()
    wait_for(lambda: refreshed(view, "running on GPU"), what="the job to run")
    wait_for(lambda: refreshed(view, "running") and view.bar.value == 0.7, what="progress")
    assert view.bar.layout.display != "none"
    assert "70% loss 0.31" in view.progress_label.value
    wait_for(lambda: view.refresh() and "epoch 1 loss 0.31" in view.log_html.value, what="log")
    assert view.output.selected_index is None  # folded until opened
    gate.touch()
    wait_for(lambda: refreshed(view, "done in"), what="the job to finish")
    assert "✔" in view.status.value and "returned &#x27;trained&#x27;" in view.status.value
    assert view.cancel_button.layout.display == "none"
    assert view.refresh() is False  # nothing more to watch


def test_jobview_refreshes_itself_in_the_background(sched, tmp_path):
    gate = tmp_path / "go"
    handle = sched.submit(hold_until, str(gate), cpus=0.5)
    view = JobView(handle)
    assert refresher.watching(view)
    wait_for(lambda: "running" in view.status.value, what="a background refresh")
    gate.touch()
    wait_for(lambda: "done in" in view.status.value, what="the done state")
    wait_for(lambda: not refresher.watching(view), what="the refresh to stop")


def test_the_cancel_button_cancels_the_running_job(sched, tmp_path):
    handle = sched.submit(hold_until, str(tmp_path / "never"), cpus=0.5)
    view = JobView(handle, live=False)
    wait_for(lambda: refreshed(view, "running"), what="the job to run")
    view.cancel_button.click()
    assert view.cancel_button.disabled
    assert handle.wait(timeout=60).state == "cancelled"
    wait_for(lambda: refreshed(view, "cancelled"), what="the cancelled state")
    assert view.cancel_button.layout.display == "none"


def test_a_failed_job_shows_its_reason_and_remote_traceback(sched):
    handle = sched.submit(fail_loudly, cpus=0.5)
    handle.wait(timeout=60)
    view = JobView(handle, live=False)
    assert "✖ failed: RuntimeError: &lt;b&gt;CUDA out of memory&lt;/b&gt;" in view.status.value
    assert view.traceback_button.layout.display != "none"
    assert view.traceback.layout.display == "none"
    view.traceback_button.value = True
    assert view.traceback.layout.display != "none"
    assert "fail_loudly" in view.traceback.value and "<b>CUDA" not in view.traceback.value
    assert "&lt;script&gt;" in view.log_html.value and "<script>" not in view.log_html.value


def test_a_job_name_with_html_renders_as_text(sched):
    handle = sched.submit(time.sleep, 0, cpus=0.5, name=EVIL)
    view = JobView(handle, live=False)
    assert EVIL not in view.status.value
    assert fmt.esc(EVIL) in view.status.value
    handle.wait(timeout=60)
    board = dashboard(sched, live=False)
    row = board.rows[handle.id]
    assert all(EVIL not in cell.value for cell in row.cells.values())
    assert fmt.esc(EVIL) in row.cells["name"].value
    board.close()


# -- dashboard ----------------------------------------------------------------------------------


def test_the_dashboard_shows_running_then_queued_jobs_and_acts_on_them(sched, tmp_path):
    gate = tmp_path / "go"
    runner = sched.submit(hold_until, str(gate), gpus=2, name="big-run")
    wait_for(lambda: runner.info().progress is not None, what="the first job's progress")
    first = sched.submit(time.sleep, 0, gpus=1, name="first-in-line")
    second = sched.submit(time.sleep, 0, gpus=1, name="second-in-line")
    wait_for(lambda: second.info().position == 2, what="queue positions")
    board = dashboard(sched, live=False)
    order = [r.job_id for r in board.rows.values() if r.widgets[0] in board.active_table.children]
    assert set(order) == {runner.id, first.id, second.id}
    children = board.active_table.children
    positions = {job: children.index(board.rows[job].widgets[0]) for job in order}
    assert positions[runner.id] < positions[first.id] < positions[second.id]
    assert board.rows[runner.id].state == "running" and board.rows[first.id].state == "queued"
    assert ">running<" in board.rows[runner.id].cells["state"].value
    assert "70% loss 0.31" in board.rows[runner.id].cells["progress"].value
    assert "2 GPU" in board.rows[runner.id].cells["request"].value
    assert board.rows[first.id].texts["progress"] == "waiting for 1 GPU · #1 in line"
    # the GPU cards name the job on each GPU
    card_text = " ".join(card.value for card in board.gpu_cards.values())
    assert card_text.count("big-run") == 2 and "[simulated]" in card_text
    # ↑ and ↓ change the priority in the ledger
    board.rows[second.id].up_button.click()
    assert sched.info(second.id).priority == 60
    assert board.rows[second.id].texts["priority"] == "60"
    board.rows[first.id].down_button.click()
    assert sched.info(first.id).priority == 40
    # log shows the job's output
    board.rows[runner.id].log_button.click()
    assert board.log_box.layout.display != "none"
    assert "epoch 1 loss 0.31" in board.log_view.value
    # cancel from the table
    board.rows[first.id].cancel_button.click()
    assert sched.info(first.id).state == "cancelled"
    assert board.rows[first.id].widgets[0] in board.recent_table.children
    assert board.rows[first.id].cancel_button.disabled
    assert board.recent_box.get_title(0) == "recent (1)"
    gate.touch()
    second.wait(timeout=60)
    board.refresh(force=True)
    assert board.active_table.children == tuple(board.headers["active"])
    assert board.empty.layout.display != "none"
    assert board.recent_box.get_title(0) == "recent (3)"
    assert "0 running · 0 queued" in board.summary.value
    board.close()


def test_the_dashboard_stops_refreshing_when_closed(sched):
    board = dashboard(sched)
    assert refresher.watching(board)
    board.close_button.click()
    assert not refresher.watching(board)
    assert board.refresh() is False


def test_the_history_plot_uses_the_ledgers_samples_when_there_are_some(sched):
    board = dashboard(sched, live=False)
    now = time.time()
    assert board.history.series(sched.store, now - 600)[1] == "dashboard"
    assert board.plot.value[:4] == b"\x89PNG"
    sched.store.add_samples(
        [(now - 60, "gpu:0", 40.0, 1, 2, None), (now - 30, "gpu:0", 80.0, 1, 2, None)]
    )
    lines, source = board.history.series(sched.store, now - 600)
    assert source == "sampler" and [u for _, u in lines[0]] == [40.0, 80.0]
    board.refresh(force=True)
    assert board.plot.value[:4] == b"\x89PNG"
    board.close()


def _job(**changes) -> JobInfo:
    base = {name: None for name in JobInfo.__dataclass_fields__}
    base.update(
        id="abcd1234",
        name="n",
        state="queued",
        owner="anna",
        origin="sweep.ipynb",
        submitted=100.0,
        after=(),
        progress=None,
        placement=None,
        env={},
        gpus=1.0,
        cpus=1.0,
        mem=0,
    )
    base.update(changes)
    return JobInfo(**base)


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        (
            {"position": 3, "waiting": "waiting for 2 GPUs"},
            "queued · #3 in line · waiting for 2 GPUs",
        ),
        ({"state": "running", "started": 100.0}, "running · 12m 04s"),
        ({"state": "succeeded", "started": 100.0, "finished": 160.0}, "done · 1m 00s"),
        ({"state": "timeout", "reason": "time limit 2h reached"}, "failed: time limit 2h reached"),
        ({"state": "cancelled"}, "cancelled"),
        ({"state": "preempted"}, "preempted · requeued"),
    ],
)
def test_state_words_are_the_ones_ui_md_uses(changes, words):
    assert fmt.state_words(_job(**changes), now=824.0) == words
