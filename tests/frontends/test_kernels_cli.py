"""``dlsched kernels install|list|remove``, called as a program (``python -m`` and the script)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

DLSCHED = str(Path(sys.executable).with_name("dlsched"))
SPELLINGS = [[DLSCHED], [sys.executable, "-m", "jupyter_dlsched.cli"]]


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "JUPYTER_DATA_DIR": str(tmp_path / "data")}


def run(
    env: dict[str, str], *args: str, status: int = 0, program: list[str] = SPELLINGS[0]
) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(
        [*program, "kernels", *args], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == status, (out.returncode, out.stdout, out.stderr)
    if status:
        assert "Traceback" not in out.stderr and len(out.stderr.splitlines()) == 1, out.stderr
        assert out.stderr.startswith("dlsched kernels"), out.stderr
    return out


@pytest.mark.parametrize("program", SPELLINGS, ids=["dlsched", "python -m"])
def test_install_writes_this_pythons_kernel_with_the_provisioner(
    env: dict[str, str], tmp_path: Path, program: list[str]
) -> None:
    out = run(env, "install", "--gpus", "2", "--cpus", "4", "--mem", "32GiB", program=program)
    assert "python3-2gpu" in out.stdout
    spec = json.loads((tmp_path / "data/kernels/python3-2gpu/kernel.json").read_text())
    assert spec["display_name"] == f"Python {sys.version_info.major} · 2 GPUs"
    assert spec["argv"][:3] == [sys.executable, "-m", "ipykernel_launcher"]
    provisioner = spec["metadata"]["kernel_provisioner"]
    assert provisioner["provisioner_name"] == "dlsched-gpu"
    assert provisioner["config"] == {
        "gpus": 2,
        "gpu_mem": None,
        "cpus": 4,
        "mem": "32GiB",
        "priority": "normal",
        "idle": "30m",
        "idle_grace": "5m",
        "wait_limit": "10m",
    }
    assert (tmp_path / "data/kernels/python3-2gpu/logo-64x64.png").exists()


def test_a_kernel_that_names_no_cpus_takes_the_pools_default(
    env: dict[str, str], tmp_path: Path
) -> None:
    """No default of 1 core that keeps a GPU idle on a machine with fewer cores than GPUs:
    the lease asks for none, and the pool gives its GPUs' share (``default_cpus``)."""
    run(env, "install", "--gpus", "1", "--name", "plain")
    spec = json.loads((tmp_path / "data/kernels/plain/kernel.json").read_text())
    assert spec["metadata"]["kernel_provisioner"]["config"]["cpus"] is None


def gpu_kernelspecs(env: dict[str, str]) -> set[str]:
    return {spec["name"] for spec in json.loads(run(env, "list", "--json").stdout)}


def test_install_share_settings_name_and_prefix_then_list_and_remove(
    env: dict[str, str], tmp_path: Path
) -> None:
    # what the environment has of its own, which the test leaves alone (`make lab` installs
    # one in the venv's prefix, where every Jupyter of that venv finds it)
    before = gpu_kernelspecs(env)
    run(
        env,
        "install",
        "--gpus",
        "0.5",
        "--gpu-mem",
        "8GiB",
        "--priority",
        "high",
        "--idle",
        "never",
        "--idle-grace",
        "1m",
        "--name",
        "half",
        "--display-name",
        "Half a GPU",
    )
    prefix = tmp_path / "prefix"
    run(env, "install", "--prefix", str(prefix), "--name", "elsewhere")
    assert (prefix / "share/jupyter/kernels/elsewhere/kernel.json").exists()

    listed = json.loads(run(env, "list", "--json").stdout)
    [half] = [s for s in listed if s["name"] == "half"]
    assert half["display_name"] == "Half a GPU"
    assert half["request"]["gpus"] == 0.5 and half["request"]["gpu_mem"] == "8GiB"
    assert half["request"]["idle"] == "never" and half["request"]["priority"] == "high"
    assert "Half a GPU" in run(env, "list").stdout

    run(env, "remove", "half")
    assert not (tmp_path / "data/kernels/half").exists()
    assert gpu_kernelspecs(env) == before
    if not before:
        assert "no GPU kernelspecs" in run(env, "list").stdout


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["install", "--gpus", "1.5"], "gpus=1.5 is invalid"),
        (["install", "--gpus", "two"], "expected a number"),
        (["install", "--gpu-mem", "lots"], "gpu_mem='lots' is invalid"),
        (["install", "--idle", "3x"], "idle='3x' is invalid"),
        (["install", "--priority", "very"], "priority='very' is invalid"),
        (["install", "--name", "no spaces"], "name='no spaces' is invalid"),
        (["install", "--user", "--sys-prefix"], "not allowed with argument"),
        (["remove", "nothing-here"], "name='nothing-here' is invalid"),
        (["remove", "python3"], "is not; `jupyter kernelspec remove`"),
    ],
)
def test_bad_input_is_one_line(env: dict[str, str], args: list[str], words: str) -> None:
    out = run(env, *args, status=2)
    assert words in out.stderr, out.stderr
