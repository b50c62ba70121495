"""Having the pool decide once a job's grant is free: the supervisor tells the pool
agent (with, from a spare's supervisor, whether it waits for another job), or in a
pool without an agent ticks the ledger itself."""

from __future__ import annotations

import os
import traceback
from dataclasses import dataclass
from pathlib import Path

from ..agent.client import AgentClient, agent_wanted, notify, user_address
from ..agent.shapes import EndedRequest
from ..engine import Engine
from ..store import Store
from ..vocab.errors import DlschedError, LedgerUnavailable


@dataclass
class LastWord:
    """A spare supervisor's last word for its job: whether it waits for another one."""

    again: bool | None
    said: bool = False


def decide_after(
    home: str | os.PathLike[str],
    job_id: str,
    agent: str | bytes | None,
    word: LastWord | None = None,
) -> None:
    """Have the pool decide what starts now that this job's grant is free (``word``: with
    this supervisor's last word for the job; without: its grant is still held)."""
    if agent is None:
        tick_after(home)
    else:
        tell_agent(agent, job_id, home, word)


def tell_agent(
    address: str | bytes, job_id: str, home: str | os.PathLike[str], word: LastWord | None
) -> None:
    """Tell the pool agent a job ended, so it decides what starts next, and with
    ``word`` whether this supervisor waits for another job.

    This user's agent is started again if it has gone (it is the only one that
    decides); a shared pool's service that is down decides when it is back.
    """
    message: EndedRequest = {"id": job_id}
    if word is not None and word.again is not None:
        message["again"] = word.again
        word.said = True
    if isinstance(address, str):
        notify(address, {"op": "ended", **message})
        return
    try:
        AgentClient(address, home=home).call("ended", **message)
    except DlschedError:
        traceback.print_exc()


def wake_pool(home: str | os.PathLike[str]) -> None:
    """Have the pool decide now: this user's agent when the pool has one (started again if
    it has gone), else a tick on the ledger directly."""
    if not agent_wanted():
        tick_after(home)
        return
    try:
        AgentClient(user_address(home), home=home).call("tick")
    except DlschedError:
        traceback.print_exc()


def tick_after(home: str | os.PathLike[str]) -> None:
    """Start whatever can start now that a job's resources (or its data) are ready."""
    if not (Path(home) / "ledger.sqlite").exists():
        return  # the state folder was removed while the job ran: nothing to schedule
    try:
        # the ledger directly: this supervisor belongs to a pool run without an agent
        with Engine(Store(home), "local", probe_pool=False) as engine:
            engine.tick()
    except LedgerUnavailable:
        pass  # disk full: the next participant with room ticks
    except Exception:
        traceback.print_exc()
