"""The submit-time checks of a shared pool's limits (``requests.py``), each refusal counted
and logged as a limit that bit (``bites.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..vocab.errors import PermissionDenied
from .bites import Bites
from .connections import Peer

if TYPE_CHECKING:
    from .requests import Requests

    _Checks = Requests
else:
    _Checks = object


class CountedRefusals(_Checks):
    """The checks of ``Requests``, each refusal counted: put before it among the agent's
    bases."""

    bites: Bites

    def _check_priority(self, peer: Peer, priority: int) -> None:
        self._counted("max_priority", peer, super()._check_priority, peer, priority)

    def _check_queued(self, peer: Peer, adding: int) -> None:
        self._counted("max_queued", peer, super()._check_queued, peer, adding)

    def _check_payload(self, peer: Peer, batch: list[tuple[str, Any, dict[str, bytes]]]) -> None:
        self._counted("max_payload_bytes", peer, super()._check_payload, peer, batch)

    def _counted(self, limit: str, peer: Peer, check: Callable[..., None], *args: Any) -> None:
        try:
            check(*args)
        except PermissionDenied as refusal:
            self.bites.hit(limit, peer.user, "refused a submission: %s", refusal)
            raise
