"""Shared fixtures: a private state folder per test, simulated GPUs, launchers stopped after."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from jupyter_dlsched.local import launcher
from jupyter_dlsched.scheduler import Scheduler


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


class OtherUser:
    """A real second Unix user; ``run`` executes Python as that user (system interpreter)."""

    def __init__(self, name: str) -> None:
        import pwd

        entry = pwd.getpwnam(name)
        self.name, self.uid, self.gid = name, entry.pw_uid, entry.pw_gid

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
        (and its dependencies) the way a user's own Python on a shared machine would."""
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
        """Run ``script`` as this user with the package importable (``client_env``)."""
        return subprocess.run(
            self.command("/usr/bin/python3", "-c", script, *args),
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd="/",
            env=self.client_env(**(env or {})),
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


@contextmanager
def unix_user(name: str) -> Iterator[OtherUser]:
    """A real Unix user created for the test session (useradd; needs root), removed after."""
    import shutil

    if os.geteuid() != 0:
        pytest.skip("needs root to create a second Unix user (CI runs as root)")
    if shutil.which("useradd") is None or not os.path.exists("/usr/bin/python3"):
        pytest.skip("needs useradd and /usr/bin/python3 to act as a second Unix user")
    subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", name], check=True)
    try:
        yield OtherUser(name)
    finally:
        subprocess.run(["pkill", "-KILL", "-u", name], check=False)
        subprocess.run(["userdel", name], check=False)


@pytest.fixture(scope="session")
def other_user() -> Iterator[OtherUser]:
    """A second Unix user for attacks across users (created with useradd; needs root)."""
    with unix_user(f"dlsb{os.getpid()}") as user:
        yield user


@pytest.fixture(scope="session")
def team_users() -> Iterator[tuple[OtherUser, OtherUser]]:
    with unix_user(f"dlsa{os.getpid()}") as a, unix_user(f"dlsc{os.getpid()}") as b:
        probe = a.python("import jupyter_dlsched, cloudpickle, psutil")
        if probe.returncode != 0:
            pytest.skip(
                "another user cannot import this checkout of the package (its folder or "
                f"virtual environment is private): {probe.stderr.strip()[-200:]}"
            )
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
    """The IPython shell with the extension loaded and a scheduler on ``home``; the names a
    test leaves in the namespace are removed after it."""
    from IPython.core.interactiveshell import InteractiveShell

    import jupyter_dlsched as dls
    from jupyter_dlsched.widgets.live import refresher

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "jupyter_dlsched")
    dls.set_default_scheduler(Scheduler(home))
    before = set(shell.user_ns)
    yield shell
    refresher.stop_all()
    for name in set(shell.user_ns) - before:
        del shell.user_ns[name]
    dls.set_default_scheduler(None)
