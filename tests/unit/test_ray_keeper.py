"""When the pool agent starts its Ray driver again (``agent/ray_keeper.py``): a driver that
came up and died is replaced at once, one that never came up after the retry wait. The
driver program is the edge here: its start is recorded, its socket is a flag."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from jupyter_dlsched.agent import ray_keeper
from jupyter_dlsched.agent.ray_keeper import RAY_DRIVER_RETRY, RayKeeper
from jupyter_dlsched.backends import ray_driver
from jupyter_dlsched.store import Store
from jupyter_dlsched.vocab.resources import Capacity
from jupyter_dlsched.vocab.spec import build_spec

POOL = Capacity.empty(n_gpus=2, gpu_mem=16 * 2**30, cpus=4, mem=64 * 2**30)


class Driver:
    """The driver program: each start has a pid; ``serving`` and ``running`` say its state."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.serving = False
        self.running = False

    def popen(self, argv: list[str], **_: Any) -> SimpleNamespace:
        self.starts.append(len(self.starts) + 1000)
        self.running = True
        return SimpleNamespace(pid=self.starts[-1])


@pytest.fixture
def keeper(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[RayKeeper, Driver, list]:
    store = Store(tmp_path / "h")
    spec = build_spec(capacity=POOL, gpus=1)
    store.insert_job(spec, {"payload.pkl": b"x"}, owner="anna", uid=1000, backend="ray")
    driver = Driver()
    clock = [1000.0]
    monkeypatch.setattr(subprocess, "Popen", driver.popen)
    monkeypatch.setattr(ray_driver, "driver_alive", lambda home: driver.serving)
    monkeypatch.setattr(ray_keeper, "process_exists", lambda pid: driver.running)
    monkeypatch.setattr(ray_keeper, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    return RayKeeper(tmp_path / "h", lambda: store, shared=False), driver, clock


def die(driver: Driver) -> None:
    driver.serving = driver.running = False


def test_a_driver_that_served_and_died_is_started_again_at_once(keeper: Any) -> None:
    keep, driver, clock = keeper
    assert keep.keep() and len(driver.starts) == 1
    driver.serving = True
    clock[0] += 5
    assert keep.keep()  # it serves
    die(driver)
    clock[0] += 1  # killed 6 s after it was started
    assert keep.keep() and len(driver.starts) == 2, "waited for the retry after a serving driver"


def test_a_driver_that_never_came_up_is_started_again_after_the_retry_wait(keeper: Any) -> None:
    keep, driver, clock = keeper
    assert keep.keep()
    die(driver)  # exited while joining: its log says why
    clock[0] += RAY_DRIVER_RETRY - 1
    assert not keep.keep() and len(driver.starts) == 1
    clock[0] += 1
    assert keep.keep() and len(driver.starts) == 2


def test_a_driver_dying_again_and_again_is_not_started_in_a_loop(keeper: Any) -> None:
    keep, driver, clock = keeper
    keep.keep()
    for _ in range(2):  # serves, dies, is replaced at once; the replacement too
        driver.serving = True
        clock[0] += 2
        keep.keep()
        die(driver)
        clock[0] += 1
        keep.keep()
    assert len(driver.starts) == 2  # the second death waits for the retry
    clock[0] += RAY_DRIVER_RETRY
    assert keep.keep() and len(driver.starts) == 3
