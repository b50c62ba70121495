"""What the parts an engine or a scheduler owns need of it: ledger, folder, pool, wake-up.

A backend, its monitor threads and the inline runner hold a ``Port``, never the whole
``Engine`` or ``Scheduler``: they record jobs in the ledger, read the pool's shape and
wake the loop that decides, and nothing else. An ``Engine`` is its backend's port; a
``Scheduler`` is the port of its inline runner (and of the client side of a backend
an agent decides for).
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
