"""What the parts an engine or a scheduler owns need of it: ledger, folder, pool, wake-up.

A backend, its monitor threads and the inline runner hold a ``Port``, never the whole
``Engine`` or ``Scheduler``: they record jobs in the ledger, read the pool's shape and
wake the loop that decides, and nothing else. An ``Engine`` is its backend's port; a
``Scheduler`` is the port of its inline runner (and of the client side of a backend
an agent decides for).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..policy import Decisions
    from ..store import Store
    from ..store.settings import Settings
    from ..vocab.schema import JobInfo


class Port(Protocol):
    """The four things a backend uses of the scheduler it runs jobs for."""

    @property
    def store(self) -> Store:
        """The ledger (a shared pool's client reads it through the agent)."""

    @property
    def home(self) -> Path:
        """The state folder: spool, logs, the launcher's socket."""

    @property
    def inventory(self) -> dict[str, Any]:
        """The pool's shape as the ledger holds it."""

    @property
    def through_agent(self) -> bool:
        """Whether a pool agent decides and launches for this scheduler."""

    def wake(self) -> None:
        """Ask the deciding loop for a decision now."""


class InlinePort(Port, Protocol):
    """The inline runner's port: also the ledger's settings (the lease's length)."""

    @property
    def settings(self) -> Settings:
        """The ledger's settings."""


class Link(Protocol):
    """A ``Scheduler``'s one way to whatever decides: ``agent.link.AgentLink`` (a pool
    agent over its socket) and ``engine.link.EngineLink`` (an engine in this process)."""

    #: whether the pool is every user's of the machine (a service)
    shared: bool
    #: whether an agent decides (the ``Port.through_agent`` of the scheduler's backend)
    through_agent: bool

    def ledger(self) -> Any:
        """The ledger as this client reads it (a shared pool's through its service)."""

    def submit(
        self,
        kind: str,
        jobs: Sequence[dict[str, bytes]],
        *,
        default_name: str,
        origin: str,
        options: dict[str, Any],
        inline: bool = False,
        backend: str = "local",
        suffixes: Sequence[str] | None = None,
    ) -> list[str]:
        """Queue ``jobs`` (each its files) with the same options; their ids."""

    def cancel(self, job_id: str) -> JobInfo: ...

    def set_priority(self, job_id: str, priority: int | str) -> JobInfo: ...

    def requeue(self, job_id: str) -> JobInfo: ...

    def status(self) -> dict[str, Any]: ...

    def tick(self, now: float | None = None) -> Decisions | None:
        """Ask for a decision now (``now`` only for an engine in this process)."""

    def settings(self, **values: Any) -> None:
        """Write the ledger's settings given (unset ones keep theirs)."""

    def wake(self) -> None:
        """Ask for a decision soon."""

    def schedules(self, msg: dict[str, Any]) -> dict[str, Any]:
        """List the schedules, or remove one (``{"remove": id}``)."""

    def changes(self, since: int, wait: float) -> list[tuple[int, str, str]]:
        """State changes after event ``since``, waiting up to ``wait`` seconds for one."""

    def interrupt(self) -> None:
        """End a ``changes`` wait now."""

    def close(self) -> None: ...
