"""Widget state (rows, values, buttons) while real jobs change state."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import jupyter_dlsched as dls
from jupyter_dlsched.store import JobInfo
from jupyter_dlsched.widgets import JobView, dashboard
from jupyter_dlsched.widgets import format as fmt
from jupyter_dlsched.widgets.jobview import JOB_MIME
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
    wait_for(lambda: refreshed(view, "queued · #1 in line"), what="a queue position")
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
    view.cancel_button.click()  # asks first
    assert view.confirm.asking and handle.info().state == "running"
    view.confirm.yes_button.click()
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
    assert board.rows[first.id].texts["progress"] == "#1 in line · waiting for 1 GPU"
    assert ">normal<" in board.rows[first.id].cells["priority"].value
    # the GPU cards name the job on each GPU
    card_text = " ".join(card.value for card in board.gpu_cards.values())
    assert card_text.count("big-run") == 2 and "[simulated]" in card_text
    # ↑ and ↓ change the priority in the ledger
    board.rows[second.id].up_button.click()
    assert sched.info(second.id).priority == 60
    assert ">priority 60<" in board.rows[second.id].cells["priority"].value
    board.rows[first.id].down_button.click()
    assert sched.info(first.id).priority == 40
    # log shows the job's output
    board.rows[runner.id].log_button.click()
    assert board.log_box.layout.display != "none"
    assert "epoch 1 loss 0.31" in board.log_view.value
    # cancel from the table
    board.rows[first.id].cancel_button.click()
    board.confirm.yes_button.click()
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
    sched.store.usage.add_samples(
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


# -- what a notebook keeps when the kernel is gone ----------------------------------------------


def test_a_running_jobs_output_carries_a_plain_summary_with_the_attach_command(sched, tmp_path):
    gate = tmp_path / "go"
    handle = sched.submit(hold_until, str(gate), cpus=0.5, name=EVIL)
    view = JobView(handle, live=False)
    wait_for(lambda: refreshed(view, "running"), what="the job to run")
    bundle = view._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle  # live while the kernel is
    html, text = bundle["text/html"], bundle["text/plain"]
    assert handle.id in text and "running" in text and f"%dlsched attach {handle.id}" in text
    assert handle.id in html and "running" in html and f"%dlsched attach {handle.id}" in html
    assert EVIL not in html and fmt.esc(EVIL) in html
    gate.touch()
    wait_for(lambda: refreshed(view, "done in"), what="the job to finish")
    bundle = view._repr_mimebundle_()
    # once ended, the output is plain HTML only: nothing to break when the kernel goes
    assert "application/vnd.jupyter.widget-view+json" not in bundle
    assert (
        "done in" in bundle["text/html"] and "returned &#x27;trained&#x27;" in bundle["text/html"]
    )
    assert "<details><summary>output" in bundle["text/html"]
    assert "epoch 1 loss 0.31" in bundle["text/html"]
    assert "attach" not in bundle["text/plain"]


def test_a_failed_jobs_summary_folds_the_users_traceback_only(sched):
    handle = sched.submit(fail_loudly, cpus=0.5)
    handle.wait(timeout=60)
    view = JobView(handle, live=False)
    html = view._repr_mimebundle_()["text/html"]
    assert "<details><summary>traceback</summary>" in html
    assert "fail_loudly" in html and "jobproc.py" not in html and "runtime.py" not in html
    assert "&lt;b&gt;CUDA out of memory" in html and "<b>CUDA" not in html


# -- GPU cards ----------------------------------------------------------------------------------


def test_a_simulated_gpu_card_shows_allocation_labelled_as_allocated_with_drawn_bars(sched):
    handle = sched.submit(time.sleep, 60, gpus=1, name="sleeper")
    wait_for(lambda: handle.state == "running", what="the job to run")
    board = dashboard(sched, live=False)
    card = board.gpu_cards[handle.info().devices[0]].value
    assert "[simulated]" in card and "sleeper" in card
    assert "allocated" in card and "100%" in card and "16 GiB / 16 GiB" in card
    assert "no utilisation readings" in card and "util" not in card.replace("utilisation", "")
    assert card.count('class="dlsched-bar"') == 2
    assert not any(block in card for block in "█░▁▂▃▄▅▆▇")  # bars are drawn, not typed
    other = board.gpu_cards[1 - handle.info().devices[0]].value
    assert "idle" in other and "0%" in other
    board.close()
    handle.cancel()


def test_a_real_gpu_card_shows_measured_utilisation_as_bars_and_a_sparkline():
    from jupyter_dlsched.machine.inventory import GpuInfo
    from jupyter_dlsched.widgets.cards import gpu_card_html

    gpu = GpuInfo(0, "GPU-x", "NVIDIA H200", 141 * 2**30, mem_used=96 * 2**30, util=87.0)
    card = gpu_card_html(gpu, {}, [10.0, 50.0, 87.0])
    assert "[simulated]" not in card and "allocated" not in card
    assert "util" in card and "87%" in card and "96 GiB / 141 GiB" in card
    assert card.count('class="dlsched-bar"') == 2 and 'class="dlsched-spark"' in card
    assert "width:87.0%" in card


# -- the timeline -------------------------------------------------------------------------------


def test_timeline_labels_never_overlap_and_narrow_spans_get_none_or_a_cut_name():
    from jupyter_dlsched.widgets.history import plan_labels

    char = 5.0  # pixels per character; one unit is 100 pixels
    spans = [
        (0, 0.0, 2.0, "resnet-lr3"),  # 200 px: the whole name
        (0, 2.0, 2.05, "tiny-one"),  # 5 px: no label
        (0, 2.05, 2.5, "a-rather-long-job-name"),  # 45 px: cut
        (1, 0.0, 3.0, "shared-a"),  # two spans at once on one GPU (fractional GPUs)
        (1, 0.1, 3.0, "shared-b"),
    ]
    placed = plan_labels(spans, px_per_unit=100.0, char_px=char)
    texts = {text for _, _, text in placed}
    assert "resnet-lr3" in texts and "tiny-one" not in texts
    cut = next(t for t in texts if t.startswith("a-r"))
    assert cut.endswith("…") and (len(cut) + 1) * char <= 45
    assert {"shared-a", "shared-b"} <= texts
    for row in (0, 1):
        on_row = sorted((x, t) for r, x, t in placed if r == row)
        for (x1, t1), (x2, _) in zip(on_row, on_row[1:], strict=False):
            assert x1 + (len(t1) + 1) * char / 100.0 <= x2 + 1e-9, (t1, x1, x2)


def test_the_history_plot_draws_many_short_jobs(sched):
    from jupyter_dlsched.widgets.history import render_png

    jobs = [sched.submit(time.sleep, 0, gpus=1, name=f"short-{n}") for n in range(6)]
    for job in jobs:
        job.wait(timeout=60)
    infos = [j.info() for j in jobs]
    png = render_png({}, infos, [0, 1], time.time() - 600, simulated=frozenset({0, 1}))
    assert png[:4] == b"\x89PNG"


# -- one wording --------------------------------------------------------------------------------


def test_queue_positions_close_up_at_once_after_a_cancel(sched):
    blocker = sched.submit(time.sleep, 60, gpus=2, name="blocker")
    wait_for(lambda: blocker.state == "running", what="the blocker to run")
    line = [sched.submit(time.sleep, 0, gpus=1, name=f"in-line-{n}") for n in range(3)]
    wait_for(lambda: line[2].info().position == 3, what="queue positions")
    board = dashboard(sched, live=False)
    last = JobView(line[2], live=False)
    assert board.rows[line[2].id].texts["progress"].startswith("#3 in line")
    board.rows[line[1].id].cancel_button.click()
    board.confirm.yes_button.click()
    # what the ledger says until the pool decides again may still be #3; the views renumber
    assert board.rows[line[2].id].texts["progress"].startswith("#2 in line")
    assert board.rows[line[0].id].texts["progress"].startswith("#1 in line")
    last.refresh()
    assert "queued · #2 in line" in last.status.value
    board.close()
    blocker.cancel()


def test_renumber_closes_gaps_in_the_line_and_leaves_the_rest():
    from jupyter_dlsched.vocab.words import renumber

    jobs = [
        _job(id="a", seq=1, position=1),
        _job(id="c", seq=3, position=3),
        _job(id="d", seq=4, position=None, waiting="waiting for job x to finish"),
        _job(id="r", seq=5, state="running", position=None),
    ]
    fixed = {j.id: j.position for j in renumber(jobs)}
    assert fixed == {"a": 1, "c": 2, "d": None, "r": None}


@pytest.mark.parametrize(
    ("priority", "words"),
    [(0, "low"), (50, "normal"), (100, "high"), (1000, "urgent"), (60, "priority 60")],
)
def test_priorities_read_as_words_for_named_levels(priority, words):
    assert fmt.priority_words(priority) == words


def test_the_notebook_shows_by_its_short_name_with_the_full_path_on_hover():
    job = _job(origin="/home/anna/work/sweep.ipynb")
    assert fmt.owner_words(job) == "anna · sweep.ipynb"
    assert fmt.owner_html(job) == (
        '<span title="/home/anna/work/sweep.ipynb">anna · sweep.ipynb</span>'
    )
    assert fmt.owner_words(_job(origin="notebook")) == "anna"
    evil = _job(origin=f"/tmp/{EVIL}.ipynb")
    assert EVIL not in fmt.owner_html(evil)


def test_the_wait_reason_reads_place_first_everywhere():
    job = _job(position=2, waiting="waiting for 1 GPU")
    assert fmt.wait_words(job) == "#2 in line · waiting for 1 GPU"
    assert fmt.state_words(job) == "queued · #2 in line · waiting for 1 GPU"
    assert fmt.wait_words(_job(state="running", position=2)) == ""


def read_staged(name: str) -> str:
    return (Path(dls.data(name)) / "x.txt").read_text()


def test_the_dashboard_shows_the_data_cache_once_it_is_used(sched, tmp_path):
    board = dashboard(sched, live=False)
    try:
        board.refresh(force=True)
        assert "data cache" not in board.host_card.value, "an unused cache stays out of sight"
        source = tmp_path / "set"
        source.mkdir()
        (source / "x.txt").write_text("staged")
        assert sched.submit(read_staged, "d", stage_in={"d": str(source)}).result(60) == "staged"
        sched.submit(read_staged, "d", stage_in={"d": str(source)}).result(60)
        board.refresh(force=True)
        card = board.host_card.value
        assert "data cache" in card
        assert "1 entry" in card and "1 hits" in card
    finally:
        board.close()


def burn_a_little_cpu() -> int:
    start = time.process_time()
    while time.process_time() - start < 0.2:
        pass
    return 1


def test_a_finished_jobs_view_says_what_it_used(sched):
    handle = sched.submit(burn_a_little_cpu, gpus=1)
    assert handle.result(timeout=60) == 1
    html = JobView(handle, live=False)._repr_mimebundle_()["text/html"]
    assert "used: " in html
    assert "GPU-hours" in html and "CPU " in html and "peak RAM" in html
    assert "peak GPU memory" not in html, "simulated GPUs: not measured, so not shown"


def test_a_running_jobs_output_names_the_job_for_jupyterlabs_line_and_says_when_it_ended(
    sched, tmp_path
):
    gate = tmp_path / "go"
    handle = sched.submit(hold_until, str(gate), cpus=0.5)
    view = JobView(handle, live=False)
    wait_for(lambda: refreshed(view, "running"), what="the job to run")

    assert view._repr_mimebundle_()[JOB_MIME] == {"id": handle.id}
    gate.touch()
    wait_for(lambda: refreshed(view, "done in"), what="the job to finish")
    ended = view._repr_mimebundle_()
    # the summary, and for JupyterLab the id with what an ended job can still do
    assert ended[JOB_MIME] == {"id": handle.id, "ended": True}
    assert "application/vnd.jupyter.widget-view+json" not in ended
    assert "done in" in ended["text/html"]


def test_the_dashboard_reuses_its_rows_so_the_widgets_a_page_restores_stay_few(sched):
    # Every widget lives on in the kernel until closed, and a page reloaded beside it asks
    # for each one's state before it shows any. A row per job ever shown made that list
    # grow with every job (ten widgets a job); rows that leave the table now go to the
    # next job instead, and none is closed under a page that may be restoring it.
    import gc
    import weakref

    board = dashboard(sched, live=False, recent=2)
    seen: dict[str, weakref.ref] = {}  # by model id: every widget a row ever showed
    for _ in range(3):
        for handle in [sched.submit(time.sleep, 0, gpus=1) for _ in range(3)]:
            handle.wait(timeout=60)
        board.refresh(force=True)
        seen.update(
            (w.model_id, weakref.ref(w)) for row in board._shown_rows() for w in row.widgets
        )
        gc.collect()
        closed = [m for m, ref in seen.items() if ref() is None or ref().comm is None]
        assert not closed, f"{len(closed)} widgets of rows closed by a refresh"
    assert board.recent_box.get_title(0) == "recent (2)"
    assert len(seen) == 2 * len(board._shown_rows()[0].widgets)  # two rows, reused
    # a reused row's buttons act on the job it shows now
    for job_id, row in board.rows.items():
        row.log_button.click()
        assert row.job_id == job_id and job_id in board.log_title.value
    board.close()
