"""What the parts a scheduler owns need of it: its ledger, folder, pool and wake-up.

A backend, its monitor threads and the inline runner hold a ``Port``, never the whole
``Scheduler``: they record jobs in the ledger, read the pool's shape and wake the loop
that decides, and nothing else. The ``Scheduler`` is one port; anything with these
four members (and whether an agent decides for it) is another.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .settings import Settings
    from .store import Store


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
