"""Notebooks as jobs: a whole notebook run on the pool's GPUs with parameters, through the
console script and through ``dls.submit_notebook``; the executed copy is the result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from conftest import stop_agent, wait_for
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from jupyter_dlsched.client.scheduler import Scheduler
from jupyter_dlsched.nbjobs.execute import NotebookCellError
from jupyter_dlsched.nbjobs.params import INJECTED_TAG, inject, parse_parameter
from jupyter_dlsched.vocab.errors import SpecError

BIN = Path(sys.executable).parent
DLSCHED = str(BIN / "dlsched")
PRINT_GPU = 'import os\nprint("gpu", os.environ.get("CUDA_VISIBLE_DEVICES"))\nprint(n * 2)'


def write_notebook(path: Path, *sources: str, parameters: str | None = "n = 1") -> Path:
    cells = [new_markdown_cell("# a notebook job")]
    if parameters is not None:
        cells.append(new_code_cell(parameters, metadata={"tags": ["parameters"]}))
    cells += [new_code_cell(s) for s in sources]
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbformat.write(nb, path)
    return path


def console_env(home: Path) -> dict[str, str]:
    env = {**os.environ, "DLSCHED_HOME": str(home), "DLSCHED_SIMULATE_GPUS": "2x16GiB"}
    for name in ("DLSCHED_POLICY", "DLSCHED_BACKEND", "DLSCHED_SOCKET"):
        env.pop(name, None)
    return env


def cli(env: dict[str, str], *args: str, python: str | None = None) -> subprocess.CompletedProcess:
    argv = [str(BIN / python), "-m", "jupyter_dlsched.cli", *args] if python else [DLSCHED, *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)


def outputs_text(cell: dict) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []))


def test_parameters_parse_as_literals_or_text():
    assert parse_parameter("n=21") == ("n", 21)
    assert parse_parameter("lr = 3e-4") == ("lr", 3e-4)
    assert parse_parameter("name=resnet") == ("name", "resnet")
    assert parse_parameter("tag='7'") == ("tag", "7")
    with pytest.raises(SpecError, match="NAME=VALUE"):
        parse_parameter("21")


def test_parameters_are_injected_after_the_parameters_cell_and_replace_an_old_injection():
    nb = new_notebook(
        cells=[
            new_code_cell("import os"),
            new_code_cell("n = 1", metadata={"tags": ["parameters"]}),
            new_code_cell("print(n)"),
        ]
    )
    inject(nb, {"n": 21})
    inject(nb, {"n": 22})
    sources = [c.source for c in nb.cells]
    assert sources == ["import os", "n = 1", "# Parameters\nn = 22\n", "print(n)"]
    assert nb.cells[2].metadata.tags == [INJECTED_TAG]


@pytest.mark.parametrize("python", [None, "python3"], ids=["dlsched", "python3-m"])
def test_a_notebook_runs_on_its_granted_gpu_with_its_parameters(tmp_path, python):
    home = tmp_path / "home"
    env = console_env(home)
    source = write_notebook(tmp_path / "train.ipynb", PRINT_GPU)
    try:
        out = cli(
            env, "submit", "--notebook", str(source), "-p", "n=21", "--gpus", "1", "--wait",
            python=python,
        )  # fmt: skip
        assert out.returncode == 0, (out.stdout, out.stderr)
        jobs = json.loads(cli(env, "queue", "--all", "--json").stdout)
        [job] = jobs
        assert job["kind"] == "notebook" and job["state"] == "succeeded"
        assert job["name"] == "train"
        assert job["progress"]["metrics"]["cell"] == "3/3"
        executed = tmp_path / f"train.{job['id']}.ipynb"
        assert f"executed notebook: {executed}" in out.stdout
        nb = nbformat.read(executed, as_version=4)
        injected = [c for c in nb.cells if INJECTED_TAG in c.metadata.get("tags", [])]
        assert [c.source for c in injected] == ["# Parameters\nn = 21\n"]
        printed = outputs_text(nb.cells[-1])
        assert "42" in printed.split()
        assert f"gpu {job['devices'][0]}" in printed
        assert nb.metadata["dlsched"]["job"] == job["id"]
        # the input is left as it was
        assert len(nbformat.read(source, as_version=4).cells) == 3
        history = cli(env, "history", python=python)
        assert history.returncode == 0, history.stderr
        assert f"{job['id']}  {executed}" in history.stdout.split("executed notebooks:")[1]
        [listed] = json.loads(cli(env, "history", "--json").stdout)["jobs"]
        assert listed["notebook"]["output"] == str(executed)
    finally:
        stop_agent(home)


def test_submit_notebook_returns_the_executed_copy_at_output(home, tmp_path):
    source = write_notebook(tmp_path / "train.ipynb", PRINT_GPU)
    with Scheduler(home) as s:
        h = s.submit_notebook(
            source, parameters={"n": 21}, output=tmp_path / "out.ipynb", gpus=1, cpus=0.5
        )
        path = h.result(timeout=240)
        assert path == str(tmp_path / "out.ipynb")
        nb = nbformat.read(path, as_version=4)
        printed = outputs_text(nb.cells[-1])
        assert "42" in printed.split()
        assert f"gpu {h.info().devices[0]}" in printed


def test_a_cell_that_raises_fails_the_job_and_keeps_the_outputs_before_it(home, tmp_path):
    source = write_notebook(
        tmp_path / "broken.ipynb",
        'print("first")',
        'print("second")',
        "def f():\n    return 1 / 0\nf()",
        'print("never")',
        parameters=None,
    )
    with Scheduler(home) as s:
        h = s.submit_notebook(source, cpus=0.5)
        error = h.exception(timeout=240)
        assert isinstance(error, NotebookCellError), error
        assert str(error) == "cell 3/4 raised ZeroDivisionError: division by zero"
        assert "return 1 / 0" in error.traceback
        info = h.info()
        assert info.state == "failed"
        assert "cell 3/4 raised ZeroDivisionError" in (info.reason or "")
        assert "return 1 / 0" in h.logs()
        nb = nbformat.read(tmp_path / f"broken.{h.id}.ipynb", as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert outputs_text(code[0]).strip() == "first"
        assert outputs_text(code[1]).strip() == "second"
        assert code[2].outputs[0]["ename"] == "ZeroDivisionError"
        assert code[3].outputs == []


def test_a_notebook_job_refuses_preemptible_and_a_missing_file(home, tmp_path):
    source = write_notebook(tmp_path / "x.ipynb", "print(n)")
    with Scheduler(home) as s:
        with pytest.raises(SpecError, match="cannot go on from where it was stopped"):
            s.submit_notebook(source, preemptible=True)
        with pytest.raises(SpecError, match="one kernel runs the notebook"):
            s.submit_notebook(source, gpus=2, distributed=True)
        with pytest.raises(SpecError, match="an installed kernelspec: .*python3"):
            s.submit_notebook(source, kernel="no-such-kernel")
        nb = nbformat.read(source, as_version=4)
        nb.metadata["kernelspec"]["name"] = "someone-elses-env"
        nbformat.write(nb, tmp_path / "foreign.ipynb")
        with pytest.raises(SpecError, match="the notebook's; --kernel / kernel= names another"):
            s.submit_notebook(tmp_path / "foreign.ipynb")
        assert s.submit_notebook(tmp_path / "foreign.ipynb", kernel="python3", cpus=0.25).result(
            timeout=240
        )
        with pytest.raises(SpecError, match="existing .ipynb"):
            s.submit_notebook(tmp_path / "missing.ipynb")
        with pytest.raises(SpecError, match="parameters"):
            s.submit_notebook(source, parameters={"n": object()})


def test_the_console_script_says_a_notebook_flag_needs_a_notebook(tmp_path):
    env = console_env(tmp_path / "home")
    out = cli(env, "submit", "-p", "n=2", "--", "true")
    assert out.returncode == 2, out
    assert out.stderr.strip().startswith("dlsched submit: -p is for a notebook job")
    out = cli(env, "submit", "--notebook", str(tmp_path / "x.ipynb"), "--preemptible")
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "cannot go on from where it was stopped" in out.stderr
    # refused before anything was asked of the pool: no agent was started for it
    assert not (tmp_path / "home" / "agent.log").exists()


def test_a_time_limit_stops_the_notebook_and_its_kernel_and_keeps_what_ran(home, tmp_path):
    pid_file = tmp_path / "kernel.pid"
    source = write_notebook(
        tmp_path / "slow.ipynb",
        'print("started")',
        f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(600)",
        parameters=None,
    )
    with Scheduler(home, grace=2.0) as s:
        # long enough for a kernel to start and run the first cell on a loaded machine
        h = s.submit_notebook(source, cpus=0.5, time_limit="20s")
        h.wait(timeout=240)
        info = h.info()
        assert info.state == "timeout", info
        nb = nbformat.read(tmp_path / f"slow.{h.id}.ipynb", as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert outputs_text(code[0]).strip() == "started"
        # the kernel that ran the sleeping cell is gone with the job
        kernel_pid = int(pid_file.read_text())
        assert kernel_pid != info.job_pid
        assert not Path(f"/proc/{kernel_pid}").exists()


def test_the_example_notebook_runs_another_notebook_as_a_job(home, tmp_path, monkeypatch):
    from nbclient import NotebookClient

    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    examples = Path(__file__).resolve().parent.parent.parent / "notebooks"
    for name in ("notebook_jobs.ipynb", "report.ipynb"):
        (tmp_path / name).write_bytes((examples / name).read_bytes())
    nb = nbformat.read(tmp_path / "notebook_jobs.ipynb", as_version=4)
    NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    by_tag = {t: c for c in nb.cells for t in c.metadata.get("tags", [])}
    submitted = outputs_text(by_tag["submit"])
    assert " succeeded " in submitted and "report." in submitted
    executed = outputs_text(by_tag["executed"])
    assert "['injected-parameters'] # Parameters" in executed
    assert "demo: running on GPU 0" in executed or "demo: running on GPU 1" in executed
    assert "sum of squares: 285" in executed
    assert "every 0 2 * * *" in outputs_text(by_tag["schedule"])
    assert "schedules left: 0" in outputs_text(by_tag["cleanup"])


def test_a_cancelled_notebook_keeps_the_cells_that_finished(home, tmp_path):
    source = write_notebook(
        tmp_path / "long.ipynb",
        'print("first")',
        "import time\ntime.sleep(600)",
        'print("never")',
        parameters=None,
    )
    with Scheduler(home, grace=2.0) as s:
        h = s.submit_notebook(source, cpus=0.5)
        executed = tmp_path / f"long.{h.id}.ipynb"

        def first_cell_saved() -> bool:
            if not executed.exists():
                return False
            nb = nbformat.read(executed, as_version=4)
            return outputs_text(nb.cells[1]).strip() == "first"

        wait_for(first_cell_saved, timeout=120)
        # the progress line comes through the ledger, just after the copy is saved
        wait_for(lambda: (s.info(h.id).progress or {}).get("metrics", {}).get("cell") == "1/3")
        s.cancel(h.id)
        h.wait(timeout=120)
        info = h.info()
        assert info.state == "cancelled", info
        # the kernel runs in a session of its own (jupyter_client starts every kernel so),
        # so the supervisor stops it as a process the job started outside its group
        assert (info.reason or "").startswith("cancelled by user")
        nb = nbformat.read(executed, as_version=4)
        assert outputs_text(nb.cells[1]).strip() == "first"
        assert nb.cells[3].outputs == []
