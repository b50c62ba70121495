"""The notebook widgets' part of one visual language: the same question before a cancel as the
sidebar, what a running job uses now, and a dashboard output that outlives its kernel."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from test_widgets import _job, hold_until, refreshed, stop_refreshing, wait_for  # noqa: F401

from jupyter_dlsched.store import JobInfo
from jupyter_dlsched.widgets import JobView, dashboard
from jupyter_dlsched.widgets import format as fmt
from jupyter_dlsched.widgets.dashboard import DASHBOARD_MIME, WIDGET_MIME
from jupyter_dlsched.widgets.live import refresher
from jupyter_dlsched.widgets.queue_table import QueueRow

STEER_TS = Path(__file__).parents[2] / "labextension" / "src" / "steer.ts"


def live(**changes) -> JobInfo:
    """A running job with these live readings (``cpu_now``, ``rss_now``)."""
    return dataclasses.replace(_job(state="running", started=100.0), **changes)


def test_live_usage_reads_cpu_in_percent_of_a_core_and_resident_memory():
    assert fmt.live_usage_words(live(cpu_now=180.4, rss_now=int(1.2 * 2**30))) == (
        "cpu 180% · 1.2 GiB"
    )
    assert fmt.live_usage_words(live(cpu_now=3.0, rss_now=None)) == "cpu 3%"
    assert fmt.live_usage_words(live(cpu_now=None, rss_now=300 * 2**20)) == "300 MiB"


def test_live_usage_is_hidden_when_not_measured_or_not_running():
    assert fmt.live_usage_words(live()) == ""
    assert fmt.live_usage_words(live(cpu_now=float("nan"))) == ""
    # a ledger without the columns: the job has no such fields at all
    assert fmt.live_usage_words(_job(state="running", started=100.0)) == ""
    ended = live(state="succeeded", finished=200.0, cpu_now=90.0, rss_now=2**30)
    assert fmt.live_usage_words(ended) == ""


def test_the_dashboard_row_shows_what_a_running_job_uses_now(sched):
    board = dashboard(sched, live=False)
    row = QueueRow(board, "abcd1234")
    row.update(live(cpu_now=180.0, rss_now=int(1.2 * 2**30)), now=160.0)
    assert "cpu 180% · 1.2 GiB" in row.cells["progress"].value
    assert "now using cpu 180% · 1.2 GiB" in row.texts["progress"]
    row.update(live(), now=160.0)
    assert "dlsched-using" not in row.cells["progress"].value
    board.close()


def test_the_cancel_question_is_worded_as_the_sidebars():
    title, body = fmt.cancel_question(_job(id="k3f9x2ab", name="resnet", state="running"))
    assert title == "Cancel job k3f9x2ab?"
    assert body == "resnet (running) will be stopped and will not be retried."
    source = STEER_TS.read_text()
    for words in ("`Cancel job ${job.id}?`", "will be stopped and will not be retried."):
        assert words in source
    assert f"'{fmt.CANCEL_KEEP}'" in source and f"'{fmt.CANCEL_CONFIRM}'" in source


def test_the_jobviews_cancel_asks_and_keep_it_keeps_the_job(sched, tmp_path):
    handle = sched.submit(hold_until, str(tmp_path / "never"), cpus=0.5, name="kept")
    view = JobView(handle, live=False)
    wait_for(lambda: refreshed(view, "running"), what="the job to run")
    view.cancel_button.click()
    assert view.confirm.asking
    assert f"Cancel job {handle.id}?" in view.confirm.question.value
    assert "kept (running) will be stopped" in view.confirm.question.value
    view.confirm.keep_button.click()
    assert not view.confirm.asking
    time.sleep(1.0)  # a cancel would have reached the ledger by now
    assert handle.info().state == "running"
    view.cancel_button.click()
    view.confirm.yes_button.click()
    assert handle.wait(timeout=60).state == "cancelled"


def test_the_dashboards_cancel_asks_and_keep_it_keeps_the_job(sched, tmp_path):
    handle = sched.submit(hold_until, str(tmp_path / "never"), cpus=0.5, name="kept")
    wait_for(lambda: handle.info().state == "running", what="the job to run")
    board = dashboard(sched, live=False)
    board.rows[handle.id].cancel_button.click()
    assert board.confirm.asking and board.confirm.job_id == handle.id
    board.confirm.keep_button.click()
    assert not board.confirm.asking and handle.info().state == "running"
    board.rows[handle.id].cancel_button.click()
    board.confirm.yes_button.click()
    assert handle.wait(timeout=60).state == "cancelled"
    board.close()


def test_the_dashboards_output_carries_a_snapshot_for_when_its_kernel_is_gone(sched, tmp_path):
    handle = sched.submit(hold_until, str(tmp_path / "never"), cpus=0.5, name="<b>x</b>")
    wait_for(lambda: handle.info().state == "running", what="the job to run")
    board = dashboard(sched, live=False)
    bundle = board._repr_mimebundle_()
    assert bundle[WIDGET_MIME]["model_id"] == board.model_id
    assert DASHBOARD_MIME in bundle
    snapshot = bundle["text/html"]
    assert (
        handle.id in snapshot and "&lt;b&gt;x&lt;/b&gt;" in snapshot and "<b>x</b>" not in snapshot
    )
    assert "table-layout:fixed;width:100%" in snapshot
    assert "run the cell again for a live view" in snapshot
    assert "1 running" in bundle["text/plain"]
    board.closed = True  # what close() publishes, before the widget itself is closed
    closed = board._repr_mimebundle_()
    assert WIDGET_MIME not in closed and DASHBOARD_MIME not in closed
    assert "closed" in closed["text/html"]
    board.close()
    assert not refresher.watching(board)
    handle.cancel()


def test_the_jobview_line_shows_what_its_running_job_uses_now(sched, tmp_path):
    handle = sched.submit(hold_until, str(tmp_path / "never"), cpus=0.5, name="measured")
    view = JobView(handle, live=False)
    wait_for(lambda: refreshed(view, "running"), what="the job to run")
    real = view._read
    readings: dict[str, object] = {"cpu_now": None, "rss_now": None}

    def with_readings() -> JobInfo:
        return dataclasses.replace(real(), **readings)  # type: ignore[arg-type]

    view._read = with_readings  # type: ignore[method-assign]
    view.refresh()
    assert "cpu" not in view.progress_label.value  # nothing measured yet: nothing shown
    readings.update(cpu_now=95.0, rss_now=300 * 2**20)
    view.refresh()
    assert view.progress_label.value.endswith("cpu 95% · 300 MiB")
    handle.cancel()
