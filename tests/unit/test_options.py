"""One table of resource options: dls.submit's keywords, %%schedule's flags and
dlsched submit's flags accept the same set, each spelled from RESOURCE_OPTIONS."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from IPython.core.error import UsageError

from jupyter_dlsched.vocab.options import FLAG_OPTIONS

DLSCHED = str(Path(sys.executable).with_name("dlsched"))


def test_dlsched_submit_help_lists_every_resource_flag():
    shown = subprocess.run(
        [DLSCHED, "submit", "--help"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    for option in FLAG_OPTIONS:
        assert option.flag in shown, option.flag


def test_the_magic_usage_lists_every_resource_flag():
    from jupyter_dlsched.notebook.magics import SCHEDULE_USAGE

    for option in FLAG_OPTIONS:
        assert option.flag in SCHEDULE_USAGE, option.flag


def test_the_magic_takes_flags_it_lacked_before(ip, tmp_path):
    import jupyter_dlsched as dls

    data = tmp_path / "data"
    data.mkdir()
    (data / "x.txt").write_text("staged")
    ip.run_cell_magic(
        "schedule",
        f"--retries 2 --deadline 2h --stage-in train={data} --name flagged --out text --wait",
        "import jupyter_dlsched as dls, pathlib\n"
        "text = (pathlib.Path(dls.data('train')) / 'x.txt').read_text()",
    )
    job = [j for j in dls.jobs() if j.name == "flagged"][0]
    assert job.state == "succeeded"
    assert job.retries == 2 and job.deadline is not None
    assert ip.user_ns["text"] == "staged"


def test_a_bad_flag_value_is_the_same_one_line_error_in_the_magic_and_the_cli(ip, home):
    with pytest.raises(UsageError, match="argument --retries: expected a whole number"):
        ip.run_cell_magic("schedule", "--retries 1e20", "x = 1")
    done = subprocess.run(
        [DLSCHED, "submit", "--retries", "1e20", "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "argument --retries: expected a whole number" in done.stderr
