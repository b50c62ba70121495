"""Listing and removing schedules: the pool agent's ``schedules`` request, and what a
``Scheduler`` without an agent does itself. In a shared pool a user sees and removes
their own schedules; an admin every one."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..vocab.errors import PermissionDenied, SpecError

if TYPE_CHECKING:
    from ..store import Store

UNKNOWN = "the id of a schedule (`dlsched schedules` lists them)"


def answer(store: Store, msg: dict[str, Any], *, uid: int, admin: bool) -> dict[str, Any]:
    """``{"schedules": [...]}``, or with ``remove``: ``{"schedule": ...}`` (the removed one)."""
    remove = msg.get("remove")
    if remove is None:
        rows = store.timetable.schedules(None if admin else uid)
        return {"schedules": [s.to_json() for s in rows]}
    if not isinstance(remove, str):
        raise SpecError("schedule", remove, UNKNOWN)
    found = store.timetable.remove_schedule(remove, uid=None if admin else uid)
    if found is None:
        raise SpecError("schedule", remove, UNKNOWN)
    if found.uid != uid and not admin:
        raise PermissionDenied(
            f"schedule {remove} belongs to {found.owner}: only its owner or a pool "
            "admin may remove it"
        )
    return {"schedule": found.to_json()}
