"""What a researcher meets in the first hour: interpreter spellings, reasons, the pool's
shape, cells with missing names, steering finished jobs, short errors, sweeps, requeue."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import stop_agent, wait_for
from nbformat.v4 import new_notebook

from jupyter_dlsched.client.scheduler import Scheduler
from jupyter_dlsched.policy import QueuedJob, RunningJob, describe_shortfall, get_policy
from jupyter_dlsched.vocab.errors import SpecError
from jupyter_dlsched.vocab.placement import place
from jupyter_dlsched.vocab.resources import Capacity, Request

GIB = 2**30
BIN = Path(sys.executable).parent
DLSCHED = str(BIN / "dlsched")


def console_env(home: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "DLSCHED_HOME": str(home), "DLSCHED_SIMULATE_GPUS": "2x16GiB"}
    for name in ("DLSCHED_POLICY", "DLSCHED_BACKEND", "DLSCHED_SOCKET"):
        env.pop(name, None)
    env.update(extra)
    return env


def cli(
    env: dict[str, str], *args: str, python: str | None = None, status: int = 0
) -> subprocess.CompletedProcess[str]:
    """``dlsched ARGS`` as the console script, or as ``PYTHON -m jupyter_dlsched.cli``."""
    argv = [python, "-m", "jupyter_dlsched.cli", *args] if python else [DLSCHED, *args]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == status, (out.returncode, out.stdout, out.stderr)
    return out


def agent_pid(env: dict[str, str], python: str | None = None) -> int:
    """The pid ``dlsched status`` names: "pool: yours alone, agent pid 123, state in ..."."""
    text = cli(env, "status", python=python).stdout
    match = re.search(r"agent pid (\d+)", text)
    assert match, text
    return int(match.group(1))


# 1. one interpreter, two spellings


@pytest.mark.parametrize(
    "submitter, reader",
    [("python", "python3"), ("python3", None), (None, "python")],
    ids=["python-then-python3", "python3-then-script", "script-then-python"],
)
def test_both_spellings_of_the_interpreter_share_one_agent(tmp_path, submitter, reader):
    spellings = {name: str(BIN / name) for name in ("python", "python3")}
    assert all(Path(p).exists() for p in spellings.values())
    home = tmp_path / "home"
    env = console_env(home)
    try:
        sub = spellings[submitter] if submitter else None
        read = spellings[reader] if reader else None
        job_id = cli(
            env, "submit", "--cpus", "0.25", "--name", "long", "--", "sleep", "60", python=sub
        ).stdout.strip()
        pid = agent_pid(env, python=sub)
        out = cli(env, "queue", "--json", python=read)
        listed = {j["id"]: j["state"] for j in json.loads(out.stdout)}
        # the job is listed as running: the reader did not replace the agent and wait
        # for a new one to re-adopt it
        assert listed.get(job_id) == "running", listed
        assert agent_pid(env, python=read) == pid
        assert agent_pid(env, python=sub) == pid
        cli(env, "cancel", job_id, python=read)
    finally:
        stop_agent(home)


# 2. the reason a shared-GPU job waits


def test_a_shared_gpu_job_short_of_cpus_says_cpus_not_gpu_memory():
    idle = Capacity.empty(n_gpus=2, gpu_mem=16 * GIB, cpus=2, mem=64 * GIB)
    hog = place(Request(cpus=2), idle)
    assert hog is not None
    no_cpus = idle.take(hog)
    assert describe_shortfall(Request(gpus=0.5, cpus=1), no_cpus) == "waiting for 1 CPU"
    assert describe_shortfall(Request(gpus=1, cpus=1), no_cpus) == "waiting for 1 CPU"
    # GPU memory is the reason when that is what is missing
    both = place(Request(gpus=2, cpus=0), idle)
    assert both is not None
    assert describe_shortfall(Request(gpus=0.5, cpus=1), idle.take(both)) == (
        "waiting for GPU memory"
    )


def test_every_policy_words_a_cpu_shortfall_of_a_shared_gpu_job_as_cpus():
    idle = Capacity.empty(n_gpus=2, gpu_mem=16 * GIB, cpus=2, mem=64 * GIB)
    request = Request(cpus=2)
    placement = place(request, idle)
    assert placement is not None
    running = RunningJob("hog", 0, request=request, placement=placement, submitted=0, started=0)
    queued = [
        QueuedJob("half", 1, request=Request(gpus=0.5, cpus=1), submitted=1),
        QueuedJob("whole", 2, request=Request(gpus=1, cpus=1), submitted=2),
    ]
    for name in ("priority", "fifo-ff", "fair", "sjf"):
        decisions = get_policy(name)(queued, [running], idle.take(placement), now=5)
        assert decisions.starts == []
        assert decisions.waiting == {"half": "waiting for 1 CPU", "whole": "waiting for 1 CPU"}, (
            name
        )


def test_a_queued_shared_gpu_job_says_it_waits_for_cpus(home):
    with Scheduler(home, agent=False) as s:
        cpus = s.inventory["cpus"]
        hog = s.submit(time.sleep, 60, cpus=cpus, name="hog")
        half = s.submit(time.sleep, 0, gpus=0.5, cpus=1, name="half")
        whole = s.submit(time.sleep, 0, gpus=1, cpus=1, name="whole")
        wait_for(lambda: hog.state == "running", timeout=60)
        s.tick()
        wait_for(lambda: whole.info().waiting == "waiting for 1 CPU", timeout=30)
        assert half.info().waiting == "waiting for 1 CPU"
        hog.cancel()


# 3. the pool's shape is the ledger's, whoever asks and whoever started the agent


def pool_views(env: dict[str, str]) -> tuple[dict, str]:
    data = json.loads(cli(env, "status", "--json").stdout)
    return data, cli(env, "status").stdout


def assert_four_simulated(env: dict[str, str]) -> None:
    data, text = pool_views(env)
    assert data["gpus"]["total"] == 4 and data["gpus"]["simulated"] == 4, data["gpus"]
    simulated = [g for g in data["pool"]["gpus"] if g["simulated"]]
    assert len(simulated) == 4, data["pool"]
    assert "GPU 0/4 (4 simulated) busy" in text, text
    assert "no GPUs" not in text, text
    assert text.count("[simulated]") == 4, text


def test_a_simulated_pool_stays_simulated_whoever_starts_its_agent(tmp_path):
    home = tmp_path / "home"
    lab = console_env(home, DLSCHED_SIMULATE_GPUS="4x16GiB")
    plain = console_env(home)
    plain.pop("DLSCHED_SIMULATE_GPUS")
    try:
        assert_four_simulated(lab)  # the agent `make lab` started
        assert_four_simulated(plain)  # a plain terminal beside it sees the same pool
        stop_agent(home)  # the lab's agent idles out
        assert_four_simulated(plain)  # the plain terminal's own agent keeps the GPUs
        # said explicitly, the ledger forgets them, and a plain terminal after that too
        stop_agent(home)
        data, text = pool_views(console_env(home, DLSCHED_SIMULATE_GPUS="none"))
        assert data["gpus"]["simulated"] == 0 and "[simulated]" not in text, text
        stop_agent(home)
        data, text = pool_views(plain)
        assert data["gpus"]["simulated"] == 0 and "[simulated]" not in text, text
        assert not [g for g in data["pool"]["gpus"] if g["simulated"]]
    finally:
        stop_agent(home)


def test_a_simulated_pool_survives_without_an_agent(tmp_path):
    home = tmp_path / "home"
    lab = console_env(home, DLSCHED_SIMULATE_GPUS="4x16GiB", DLSCHED_AGENT="0")
    plain = console_env(home, DLSCHED_AGENT="0")
    plain.pop("DLSCHED_SIMULATE_GPUS")
    assert_four_simulated(lab)
    # a kernel started from a plain terminal opens the ledger and probes the machine again
    kernel = subprocess.run(
        [sys.executable, "-c", "import jupyter_dlsched as dls; print(len(dls.pool().gpus))"],
        env=plain,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert kernel.stdout.strip() == "4", kernel.stderr
    assert_four_simulated(plain)


# 4. a cell whose names do not exist is refused when it is submitted


@pytest.mark.parametrize(
    ("cell", "missing"),
    [
        ("model = fit(data)\nmodel", ["data", "fit"]),
        ("import numpy as np\nx = np.zeros(3)\nprint(helper(x).shape)", ["helper"]),
        ("def go():\n    return later() + y\nresult = go()", ["later", "y"]),
        ("total = sum(step(i) for i in range(3))", ["step"]),
        ("out = [k * scale for k in keys]", ["keys", "scale"]),
        ("class Net:\n    size = width * 2\n", ["width"]),
    ],
)
def test_a_cell_reading_undefined_names_is_refused_naming_them(ip, cell, missing):
    from IPython.core.error import UsageError

    before = len(dls_jobs(ip))
    with pytest.raises(UsageError) as caught:
        ip.run_cell_magic("schedule", "--cpus 0.25", cell)
    text = str(caught.value)
    assert text.startswith("%%schedule: the cell uses " + ", ".join(missing) + ", not defined")
    assert "\n" not in text and "Nothing was queued" in text
    assert len(dls_jobs(ip)) == before and "_job" not in ip.user_ns


def dls_jobs(ip):
    import jupyter_dlsched as dls

    return dls.jobs()


@pytest.mark.parametrize(
    "cell",
    [
        "y = x + 1",  # x is in the notebook
        "print(len(range(3)))",  # builtins
        "import math\nr = math.sqrt(2)",  # imported in the cell
        "for i in range(2):\n    if i:\n        print(acc)\n    acc = i",  # assigned later
        "def f(a, *rest, k=1, **kw):\n    return a, rest, k, kw, g\ng = 2\nf(1)",  # args, later
        "squares = {n: n * n for n in range(3)}\n[s for s in squares]",  # comprehension vars
        "def bump():\n    global counter\n    counter = 1\nbump()\ncounter",  # global
        "import os.path\nos.path.join('a', x.__class__.__name__)",  # attributes
        "%time z = x * 2\nz",  # a magic
        "try:\n    import nothing_here\nexcept ImportError as error:\n    print(error)",
        "with open(__file__ if False else 'x') if False else open('/dev/null') as fh:\n    fh",
        "match x:\n    case {'a': va, **others}:\n        va\n    case [first, *tail]:\n        tail\n"
        "    case other:\n        other",
        "lam = lambda q: q + x\nlam(1)",
    ],
)
def test_a_cell_whose_names_all_exist_is_queued(ip, cell):
    ip.user_ns["x"] = 1
    ip.run_cell_magic("schedule", "--cpus 0.25", cell)
    handle = ip.user_ns["_job"]
    assert handle.info().kind == "cell"
    handle.cancel()


def test_undefined_lists_only_names_nothing_defines():
    from jupyter_dlsched.notebook.cell_names import undefined

    assert undefined("model = fit(x)", {"x": 1}) == ["fit"]
    assert undefined("from torch import *\nnet = Linear(2, 2)", {}) == []
    assert undefined("del gone", {}) == []
    assert undefined("print(get_ipython, __name__)", {}) == []


def test_after_a_kernel_restart_a_cell_using_a_lost_function_is_refused(home, tmp_path):
    nb = new_notebook()
    client = kernel_client(nb, tmp_path)
    with client.setup_kernel():
        run_cell(client, nb, "%load_ext jupyter_dlsched")
        run_cell(client, nb, "def fit(n):\n    return n * 2")
        queued = run_cell(client, nb, "%%schedule --cpus 0.25\nfit(3)")
        assert not errors_of(queued)
        restart(client)
        run_cell(client, nb, "%load_ext jupyter_dlsched")
        refused = run_cell(client, nb, "%%schedule --cpus 0.25\nmodel = fit(3)")
    shown = shown_text(refused)
    assert "UsageError: %%schedule: the cell uses fit, not defined in this kernel" in shown
    assert len(shown.strip().splitlines()) == 1, shown
    with Scheduler(home) as s:
        assert len(s.jobs()) == 1  # only the cell before the restart


# a real kernel driven the way a front end drives it (nbclient)


def kernel_client(nb, path):
    from nbclient import NotebookClient

    return NotebookClient(
        nb,
        timeout=120,
        kernel_name="python3",
        allow_errors=True,
        resources={"metadata": {"path": str(path)}},
    )


def run_cell(client, nb, source):
    from nbformat.v4 import new_code_cell

    nb.cells.append(new_code_cell(source))
    index = len(nb.cells) - 1
    client.execute_cell(nb.cells[index], index)
    return nb.cells[index]


def shown_text(cell) -> str:
    """What the cell shows: its streams, error outputs and plain-text results."""
    parts = []
    for o in cell.outputs:
        if o.get("output_type") == "stream":
            parts.append(o.get("text", ""))
        elif o.get("output_type") == "error":
            parts.append("\n".join(o.get("traceback", [])))
        else:
            parts.append(o.get("data", {}).get("text/plain", ""))
    return "".join(parts)


def errors_of(cell) -> list[dict]:
    return [o for o in cell.outputs if o.get("output_type") == "error"]


def restart(client) -> None:
    from jupyter_core.utils import run_sync

    run_sync(client.km.restart_kernel)(now=True)
    run_sync(client.kc.wait_for_ready)(timeout=60)


# 6. a finished job's record stays as it ended


def finished(env: dict[str, str], name: str = "short") -> str:
    job_id = cli(env, "submit", "--cpus", "0.25", "--name", name, "--wait", "--", "true")
    (info,) = json.loads(cli(env, "queue", "--all", "--name", name, "--json").stdout)
    assert info["state"] == "succeeded", info
    assert job_id.returncode == 0
    return info["id"]


def one_line(out: subprocess.CompletedProcess[str], command: str) -> str:
    assert "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"dlsched {command}: "), out.stderr
    return lines[0]


def test_the_cli_refuses_to_steer_a_finished_job_with_exit_status_1(tmp_path):
    home = tmp_path / "home"
    env = console_env(home)
    try:
        job_id = finished(env)
        line = one_line(cli(env, "priority", job_id, "high", status=1), "priority")
        assert f"job {job_id} already succeeded" in line
        line = one_line(cli(env, "cancel", job_id, status=1), "cancel")
        assert line == f"dlsched cancel: nothing to cancel: {job_id} already succeeded"
        (info,) = json.loads(cli(env, "queue", "--all", "--json").stdout)
        assert info["priority"] == 50 and info["state"] == "succeeded"
    finally:
        stop_agent(home)


def test_the_python_api_refuses_the_priority_of_a_finished_job(home):
    from jupyter_dlsched.vocab.errors import IllegalTransition

    with Scheduler(home) as s:
        handle = s.submit(abs, -1, cpus=0.25)
        assert handle.result(timeout=60) == 1
        with pytest.raises(IllegalTransition, match="a finished job's priority cannot change"):
            s.set_priority(handle.id, "high")
        assert s.info(handle.id).priority == 50


# 9. sweeps: members named by index and argument, gather, requeue


def train(lr):
    if lr < 0:
        raise ValueError(f"lr={lr} is negative")
    return lr * 10


def sleepy(seconds):
    time.sleep(seconds)
    return seconds


@pytest.mark.parametrize("agent", [True, False], ids=["agent", "no-agent"])
def test_sweep_members_are_named_by_index_and_argument(home, agent):
    import jupyter_dlsched as dls

    with Scheduler(home, agent=agent) as s:
        dls.set_default_scheduler(s)
        try:
            sweep = dls.job(cpus=0.25, name="sweep")(train).map([0.1, 0.01, "x" * 100])
            names = [h.name for h in sweep]
            plain = s.map(abs, [-1, -2], cpus=0.25)
        finally:
            dls.set_default_scheduler(None)
        assert names[:2] == ["sweep[0] lr=0.1", "sweep[1] lr=0.01"]
        assert names[2].startswith("sweep[2] lr='xxx") and names[2].endswith("…")
        assert len(names[2]) < 60
        assert [h.name for h in plain] == ["abs[0] -1", "abs[1] -2"]
        for h in [*sweep, *plain]:
            h.cancel()


def test_gather_skips_returns_or_raises_what_did_not_succeed(sched):
    import concurrent.futures

    import jupyter_dlsched as dls

    blocker = sched.submit(sleepy, 60, cpus=sched.inventory["cpus"], name="blocker")
    sweep = sched.map(train, [1, -1, 2, 3], cpus=0.25)
    wait_for(lambda: blocker.state == "running")
    sweep[3].cancel()  # cancelled while it waits
    blocker.cancel()
    assert dls.gather(sweep, errors="skip", timeout=60) == [10, 20]
    returned = dls.gather(sweep, errors="return", timeout=60)
    assert returned[0] == 10 and returned[2] == 20
    assert isinstance(returned[1], ValueError) and "lr=-1 is negative" in str(returned[1])
    assert isinstance(returned[3], concurrent.futures.CancelledError)
    with pytest.raises(ValueError, match="lr=-1 is negative"):
        dls.gather(sweep, timeout=60)
    with pytest.raises(dls.SpecError, match="errors='ignore' is invalid"):
        dls.gather(sweep, errors="ignore")


def test_gather_times_out_on_a_job_still_running(sched):
    import concurrent.futures

    import jupyter_dlsched as dls

    slow = sched.submit(sleepy, 30, cpus=0.25)
    with pytest.raises(concurrent.futures.TimeoutError):
        dls.gather([slow], errors="skip", timeout=0.5)
    slow.cancel()


@pytest.mark.parametrize("agent", [True, False], ids=["agent", "no-agent"])
def test_requeue_runs_a_failed_job_again_as_a_new_linked_job(home, agent):
    import jupyter_dlsched as dls
    from jupyter_dlsched.vocab.errors import IllegalTransition

    with Scheduler(home, agent=agent) as s:
        failed = s.submit(train, -1, cpus=0.25, priority=7, name="neg")
        with pytest.raises(ValueError):
            failed.result(timeout=60)
        dls.set_default_scheduler(s)
        try:
            again = dls.requeue(failed.id)
        finally:
            dls.set_default_scheduler(None)
        info, old = again.info(), s.info(failed.id)
        assert info.id != old.id and info.requeue_of == old.id and old.requeue_of is None
        assert (info.name, info.priority, info.cpus, info.kind) == ("neg", 7, 0.25, "function")
        with pytest.raises(ValueError, match="lr=-1 is negative"):
            again.result(timeout=60)  # the same payload ran again
        assert any(e["reason"] == f"requeued as {info.id}" for e in s.store.events(old.id))
        assert info.to_json()["requeue_of"] == old.id
        running = s.submit(sleepy, 30, cpus=0.25)
        wait_for(lambda: running.state == "running")
        with pytest.raises(IllegalTransition, match="only a finished job"):
            s.requeue(running.id)
        running.cancel()


def test_dlsched_requeue_makes_new_jobs_and_refuses_unfinished_ones(tmp_path):
    home = tmp_path / "home"
    env = console_env(home)
    try:
        first = finished(env, "one")
        out = cli(env, "requeue", first)
        (line,) = out.stdout.splitlines()
        assert line.startswith(f"{first} requeued as ")
        new_id = line.rsplit(" ", 1)[1]
        jobs = {j["id"]: j for j in json.loads(cli(env, "queue", "--all", "--json").stdout)}
        assert jobs[new_id]["requeue_of"] == first and jobs[new_id]["name"] == "one"
        running = cli(env, "submit", "--cpus", "0.25", "--", "sleep", "30").stdout.strip()
        line = one_line(cli(env, "requeue", first, running, status=1), "requeue")
        assert f"{running} is running" in line and "nothing was requeued" in line
        assert len(json.loads(cli(env, "queue", "--all", "--json").stdout)) == 3
        one_line(cli(env, "requeue", "nosuchjob", status=2), "requeue")
        listed = json.loads(cli(env, "requeue", first, "--json").stdout)
        assert [j["requeue_of"] for j in listed] == [first]
        cli(env, "cancel", running)
    finally:
        stop_agent(home)


REQUEUE_AS_USER = """
import json, sys
import jupyter_dlsched as dls
from jupyter_dlsched.vocab.errors import PermissionDenied
s = dls.Scheduler(loop=False)
try:
    print(json.dumps({"new": s.requeue_job(sys.argv[1]).to_json()}))
except PermissionDenied as error:
    print(json.dumps({"denied": str(error)}))
"""


def test_in_a_shared_pool_only_the_owner_may_requeue(team_users):
    from team_pool import RESULT, shared_pool

    a, b = team_users
    with shared_pool() as service:
        [done] = service.submit(a, 0, "a-done", gpus=0)
        assert service.as_user(a, RESULT, done, "60").returncode == 0
        by_b = json.loads(service.as_user(b, REQUEUE_AS_USER, done).stdout)
        assert by_b["denied"].startswith(f"job {done} belongs to {a.name}")
        by_a = service.as_user(a, REQUEUE_AS_USER, done)
        assert by_a.returncode == 0, by_a.stderr
        new = json.loads(by_a.stdout)["new"]
        assert new["requeue_of"] == done and new["owner"] == a.name
        assert service.job(new["id"])["name"] == "a-done"


# 8. an error the user caused through the API is their line and the message


def test_a_refused_submit_in_a_kernel_shows_the_users_line_and_the_error(home, tmp_path):
    nb = new_notebook()
    client = kernel_client(nb, tmp_path)
    with client.setup_kernel():
        run_cell(client, nb, "import jupyter_dlsched as dls\ndef f():\n    return 1")
        refused = run_cell(client, nb, "h = dls.submit(f, gpus=9)")
        decorated = run_cell(client, nb, "dls.job(gpus=9)(f).map([1, 2])")
        caught = run_cell(
            client,
            nb,
            "try:\n    dls.submit(f, gpus=9)\nexcept dls.SpecError as error:\n"
            "    print('caught', error.field)",
        )
        failing = run_cell(
            client,
            nb,
            "def boom():\n    raise ValueError('boom in the job')\n"
            "dls.submit(boom, cpus=0.25).result(timeout=60)",
        )
        run_cell(client, nb, "dls.default_scheduler().close()")
    for cell in (refused, decorated):
        (error,) = errors_of(cell)
        assert error["ename"] == "SpecError"
        shown = strip_colours("\n".join(error["traceback"]))
        assert len(shown.splitlines()) < 10, shown
        assert "gpus=9 is invalid: expected a request this pool can satisfy" in shown
        assert cell.source in shown  # the user's own line
        assert "agent/" not in shown and "protocol.py" not in shown
    assert shown_text(caught).strip() == "caught gpus"
    # a job's own failure is the user's frames, in the job and here, not the job process's
    (error,) = errors_of(failing)
    shown = strip_colours("\n".join(error["traceback"]))
    assert error["ename"] == "ValueError" and "boom in the job" in shown
    assert "raise ValueError('boom in the job')" in shown and ", in boom" in shown
    assert "jobproc.py" not in shown and "handle.py" not in shown


def strip_colours(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


# 11. the notebooks open unmodified: their kernelspec is what the installed kernel says


REPO = Path(__file__).parents[2]


def shipped_notebooks(repo: Path = REPO) -> list[Path]:
    """The notebooks the repository ships: what git tracks under ``notebooks/``, not what a
    lab session left there (the Launcher's ``Untitled.ipynb`` has no kernelspec yet)."""
    listed = subprocess.run(
        ["git", "-C", str(repo), "ls-files", "-z", "--", "notebooks/*.ipynb"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return sorted(repo / name for name in listed.split("\0") if name)


NOTEBOOKS = shipped_notebooks()


def test_the_notebooks_tested_are_those_the_repository_ships(tmp_path):
    """A notebook made from the Launcher in ``notebooks/`` (as ``make lab`` opens it) is the
    user's, not the repository's: it is not among the notebooks tested."""
    repo = tmp_path / "repo"
    (repo / "notebooks").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "notebooks" / "quickstart.ipynb").write_text("{}")
    subprocess.run(["git", "-C", str(repo), "add", "notebooks"], check=True)
    (repo / "notebooks" / "Untitled.ipynb").write_text('{"metadata": {}}')
    assert shipped_notebooks(repo) == [repo / "notebooks" / "quickstart.ipynb"]
    assert "quickstart.ipynb" in [p.name for p in NOTEBOOKS]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_each_notebooks_kernelspec_matches_the_installed_kernel(notebook):
    from jupyter_client.kernelspec import KernelSpecManager

    saved = json.loads(notebook.read_text())["metadata"]["kernelspec"]
    installed = KernelSpecManager().get_kernel_spec(saved["name"])
    # JupyterLab rewrites what differs when the kernel starts, and the notebook is then
    # marked modified before anyone touched it
    assert saved == {
        "display_name": installed.display_name,
        "language": installed.language,
        "name": saved["name"],
    }


def test_a_request_only_a_shared_service_answers_is_refused_by_a_private_pool(home):
    """The server asks a shared pool's service for its metrics and samples; a user's own
    pool (its agent, or no agent) has no such service and says so instead of hanging."""
    for agent in (True, False):
        with Scheduler(home, agent=agent, loop=False) as s:
            with pytest.raises(SpecError, match="shared pool's service"):
                s.ask_service("metrics")
