"""Shared fixtures: a private state folder per test, simulated GPUs, launchers stopped after."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from jupyter_dlsched import launcher
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
