"""Shared fixtures: a private state folder per test, simulated GPUs, launchers stopped after."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from jupyter_dlsched.client.scheduler import Scheduler
from jupyter_dlsched.local import launcher
from jupyter_dlsched.store import buffers

# pytest rewrites the asserts of each test module as it imports it, in every worker; where
# PYTHONDONTWRITEBYTECODE is set (as on CI) it kept none of that, and each worker paid about
# 5 s of CPU a run to do it again. The test modules' rewritten code is kept (beside them,
# in __pycache__); what the suite starts still runs with the environment's setting.
sys.dont_write_bytecode = False


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh DLSCHED_HOME with two simulated 16 GiB GPUs; its launcher is stopped after."""
    path = tmp_path / "home"
    monkeypatch.setenv("DLSCHED_HOME", str(path))
    monkeypatch.setenv("DLSCHED_SIMULATE_GPUS", "2x16GiB")
    monkeypatch.delenv("DLSCHED_POLICY", raising=False)
    monkeypatch.delenv("DLSCHED_BACKEND", raising=False)
    yield path
    launcher.stop(path)
    stop_agent(path)
    # a pool whose agent was killed leaves its buffer folder in shared memory, even empty
    shutil.rmtree(buffers.buffer_folder(path), ignore_errors=True)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its parent counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):  # gone, or going as it was read
        return False


def wait_for(predicate: Any, timeout: float = 60.0, step: float = 0.05, what: Any = None) -> Any:
    """Poll ``predicate`` until it returns something true (returned), or fail after
    ``timeout`` seconds saying ``what()`` when given."""
    import time

    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"condition not met in {timeout:g} s {what() if what else ''}")


def stop_agent(home: Path) -> None:
    """Stop the pool agent of ``home`` if one runs (never starts one)."""
    from jupyter_dlsched.agent.client import AgentClient, user_address
    from jupyter_dlsched.agent.protocol import AgentUnavailable

    try:
        AgentClient(user_address(home)).call("stop")
    except AgentUnavailable:
        pass


@pytest.fixture
def sched(home: Path) -> Iterator[Scheduler]:
    """A scheduler with a short lease so crash tests finish quickly."""
    with Scheduler(home, lease_ttl=3.0, grace=2.0) as s:
        yield s


def pytest_configure(config: pytest.Config) -> None:
    # jobs inherit the test's environment; keep Python quiet and unbuffered there
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    # a launcher a test could not stop (a supervisor started one after the test) exits soon
    os.environ.setdefault("DLSCHED_LAUNCHER_IDLE", "20")
    os.environ.setdefault("DLSCHED_AGENT_IDLE", "20")


#: The files that take longest (seconds of a whole run, heaviest first; the mean of five
#: whole runs). ``make test`` hands whole files to its workers in collection order
#: (``--dist loadfile --no-loadscope-reorder``; xdist's default reorder puts the files with
#: the most tests first, and so these, which have few, last): one of these collected last
#: kept one worker busy for minutes after the others had finished, so they are collected
#: first. A file missing here only runs in its usual place.
HEAVY_FILES = (
    "tests/frontends/browser/daily/test_daily_use_3.py",  # 128 s
    "tests/system/test_ray.py",  # 99 s
    "tests/frontends/browser/daily/test_daily_use_2.py",  # 86 s
    "tests/system/test_kernels.py",  # 81 s
    "tests/system/test_containment.py",  # 73 s
    "tests/system/test_daily_use.py",  # 68 s
    "tests/system/test_notebook_jobs.py",  # 65 s
    "tests/system/test_slurm.py",  # 61 s
    "tests/system/test_gpu_check.py",  # 49 s
    "tests/system/test_service_hardening.py",  # 48 s
    "tests/frontends/test_server.py",  # 48 s
    "tests/system/test_jobs.py",  # 46 s
    "tests/frontends/test_torch_notebook.py",  # 44 s
    "tests/system/test_team_guard.py",  # 43 s
    "tests/system/test_data_path.py",  # 42 s
    "tests/system/test_torch.py",  # 41 s
    "tests/frontends/browser/test_kernel_wait.py",  # 40 s
    "tests/frontends/test_magics.py",  # 37 s
    "tests/frontends/browser/test_sidebar.py",  # 36 s
    "tests/system/test_agent.py",  # 36 s
    "tests/system/test_elastic_live.py",  # 35 s
    "tests/frontends/test_cli_console.py",  # 33 s
    "tests/frontends/browser/test_cell_line.py",  # 31 s
    "tests/system/test_elastic_ddp.py",  # 31 s
    "tests/system/test_team.py",  # 29 s
    "tests/frontends/browser/test_sidebar_start_estimate.py",  # 29 s
    "tests/system/test_warm_job.py",  # 28 s
    "tests/frontends/browser/test_notebook_jobs.py",  # 27 s
    "tests/system/test_uncertain_start.py",  # 27 s
    "tests/frontends/browser/daily/test_daily_use.py",  # 27 s
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The heaviest files first (``HEAVY_FILES``); the rest in their order. The same order in
    every worker, as xdist requires."""
    rank = {name: i for i, name in enumerate(HEAVY_FILES)}
    root = Path(str(config.rootpath))

    def weight(item: pytest.Item) -> int:
        try:
            name = Path(str(item.path)).relative_to(root).as_posix()
        except ValueError:
            return len(HEAVY_FILES)
        return rank.get(name, len(HEAVY_FILES))

    items.sort(key=weight)  # stable: each file's own order is kept


class OtherUser:
    """A real second Unix user; ``python`` runs Python as that user, ``run`` the bare system
    interpreter (for attacks that need nothing of ours)."""

    def __init__(self, name: str, interpreter: UsersPython | None = None) -> None:
        import pwd

        entry = pwd.getpwnam(name)
        self.name, self.uid, self.gid = name, entry.pw_uid, entry.pw_gid
        #: the environment the user's Python runs in (``team_users``), else the system one
        self.interpreter = interpreter

    def command(self, *argv: str) -> list[str]:
        return [
            "setpriv",
            f"--reuid={self.uid}",
            f"--regid={self.gid}",
            "--init-groups",
            "--",
            *argv,
        ]

    def client_env(self, **extra: str) -> dict[str, str]:
        """An environment in which the system interpreter imports this checkout of the package
        and this test environment's packages (both must be readable by the user: the shared
        JupyterLab of the browser tests needs far more than ``UsersPython`` holds)."""
        import sysconfig

        import jupyter_dlsched

        paths = [
            str(Path(jupyter_dlsched.__file__).resolve().parents[1]),
            sysconfig.get_paths()["purelib"],
        ]
        return {
            "PATH": "/usr/bin:/bin",
            "HOME": "/nonexistent",
            "PYTHONPATH": os.pathsep.join(paths),
            "PYTHONUNBUFFERED": "1",
            **extra,
        }

    def python(
        self, script: str, *args: str, env: dict[str, str] | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run ``script`` as this user with the package importable: the user's own virtual
        environment (``interpreter``) with a clean environment, else ``client_env``."""
        if self.interpreter is not None:
            python, base = str(self.interpreter.python), self.interpreter.env()
        else:
            python, base = "/usr/bin/python3", self.client_env()
        return subprocess.run(
            self.command(python, "-c", script, *args),
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd="/",
            env={**base, **(env or {})},
        )

    def run(self, script: str, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                "setpriv",
                f"--reuid={self.uid}",
                f"--regid={self.gid}",
                "--init-groups",
                "--",
                "/usr/bin/python3",
                "-c",
                script,
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            cwd="/",
            env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"},
        )


#: What the test users' jobs and clients import besides the package itself.
USER_PACKAGES = ("cloudpickle", "psutil", "nvidia-ml-py", "numpy")


class UsersPython:
    """A virtual environment every user can run: Debian's interpreter with a copy of this
    checkout's package and its runtime dependencies, in a world-readable temporary folder.

    The checkout and the test environment may be private (CI clones under /root, 0700),
    so the users get a copy rather than a path into them; a job of theirs runs with the
    interpreter that submitted it (``context["executable"]``), which is this one.
    """

    def __init__(self) -> None:
        import tempfile

        self.root = Path(tempfile.mkdtemp(prefix="dlsched-users-python-"))
        os.chmod(self.root, 0o755)
        self.venv = self.root / "venv"
        self.python = self.venv / "bin" / "python"

    def create(self) -> None:
        import importlib.metadata
        import shutil
        import sys

        import jupyter_dlsched

        subprocess.run(
            ["/usr/bin/python3", "-m", "venv", "--without-pip", str(self.venv)],
            check=True,
            capture_output=True,
        )
        # the same versions as this test environment's (pip's cache has them)
        wanted = [f"{name}=={importlib.metadata.version(name)}" for name in USER_PACKAGES]
        installed = subprocess.run(
            [sys.executable, "-m", "pip", "--python", str(self.python), "install"]
            + ["--quiet", "--disable-pip-version-check", "--no-input", *wanted],
            capture_output=True,
            text=True,
        )
        if installed.returncode != 0:
            raise RuntimeError(f"cannot install {wanted} for the test users: {installed.stderr}")
        site = subprocess.run(
            [str(self.python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        shutil.copytree(
            Path(jupyter_dlsched.__file__).parent,
            Path(site) / "jupyter_dlsched",
            ignore=shutil.ignore_patterns("__pycache__", "labextension"),
        )
        # compiled once here: the users cannot write beside the copy, so each of their
        # processes (clients, jobs, a shared pool's service) would compile it again
        subprocess.run(
            [str(self.python), "-m", "compileall", "-q", str(Path(site) / "jupyter_dlsched")],
            check=True,
            capture_output=True,
        )
        # readable and runnable by everyone, whatever the umask of the test run
        subprocess.run(["chmod", "-R", "a+rX", str(self.root)], check=True)

    def env(self) -> dict[str, str]:
        """A clean environment: nothing of the test run's (no PYTHONPATH, no DLSCHED_*)."""
        return {
            "PATH": f"{self.venv / 'bin'}:/usr/bin:/bin",
            "HOME": "/nonexistent",
            "PYTHONUNBUFFERED": "1",
        }

    def remove(self) -> None:
        import shutil

        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="session")
def users_python() -> Iterator[UsersPython]:
    """The test users' own Python (``UsersPython``), made once per session, removed after."""
    if not os.path.exists("/usr/bin/python3"):
        pytest.skip("needs /usr/bin/python3 to make the test users' Python")
    interpreter = UsersPython()
    try:
        interpreter.create()
        yield interpreter
    finally:
        interpreter.remove()


@contextmanager
def unix_user(name: str) -> Iterator[OtherUser]:
    """A real Unix user created for the test session (useradd; needs root), removed after."""
    import shutil

    if os.geteuid() != 0:
        pytest.skip("needs root to create a second Unix user (CI runs as root)")
    if shutil.which("useradd") is None or not os.path.exists("/usr/bin/python3"):
        pytest.skip("needs useradd and /usr/bin/python3 to act as a second Unix user")
    subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", name], check=True)
    user = None
    try:
        user = OtherUser(name)
        yield user
    finally:
        subprocess.run(["pkill", "-KILL", "-u", name], check=False)
        if user is not None:  # the user's job data in shared memory goes with the user
            for folder in Path("/dev/shm").glob(f"dlsched-{user.uid}-*"):
                shutil.rmtree(folder, ignore_errors=True)
        subprocess.run(["userdel", name], check=False)


@pytest.fixture(scope="session")
def other_user() -> Iterator[OtherUser]:
    """A second Unix user for attacks across users (created with useradd; needs root)."""
    with unix_user(f"dlsb{os.getpid()}") as user:
        yield user


@pytest.fixture(scope="session")
def team_users(request: pytest.FixtureRequest) -> Iterator[tuple[OtherUser, OtherUser]]:
    """Two real Unix users whose Python (``users_python``) has the package."""
    with unix_user(f"dlsa{os.getpid()}") as a, unix_user(f"dlsc{os.getpid()}") as b:
        # made once the users exist: a run that cannot create them skips before this
        a.interpreter = b.interpreter = request.getfixturevalue("users_python")
        probe = a.python("import jupyter_dlsched, cloudpickle, psutil")
        assert probe.returncode == 0, f"the test users cannot import the package: {probe.stderr}"
        yield a, b


@contextmanager
def small_disk(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``path`` (for disk-full tests), unmounted after.

    Skips the test without root (CI runs as root) or where mounting is not allowed.
    """
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs (CI runs as root)")
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.fixture
def ip(home: Path) -> Iterator[Any]:
    """The IPython shell with the extension loaded, its scheduler on ``home`` made on first
    use as in a notebook (a usage error starts no pool agent); the names a test leaves in
    the namespace are removed after it."""
    from IPython.core.interactiveshell import InteractiveShell

    import jupyter_dlsched as dls
    from jupyter_dlsched.widgets.live import refresher

    shell = InteractiveShell.instance()
    # the shell is one per process: what another test file's use of it left (a ``_job``)
    # is not this test's
    for name in set(shell.user_ns) - set(shell.user_ns_hidden):
        if not name.startswith("__"):
            del shell.user_ns[name]
    shell.run_line_magic("load_ext", "jupyter_dlsched")
    dls.set_default_scheduler(None)  # the next is Scheduler() on $DLSCHED_HOME: ``home``
    before = set(shell.user_ns)
    yield shell
    refresher.stop_all()
    for name in set(shell.user_ns) - before:
        del shell.user_ns[name]
    dls.set_default_scheduler(None)
