"""What one user of a shared pool may see of another user's jobs: the one rule every reply passes.

Everyone sees the queue: ids, names, owners, states, resources, devices,
places in line and why a job waits. What is private to a job stays with its
owner and the pool's admins: its environment, the notebook it came from, its
data sources, its progress metrics, and the words of how a run ended (an
exception's message can hold anything its code put there).

``redact(reply, viewer, owners)`` applies this to every job row (``job``,
``jobs``) and every event (``events``) of a reply, whatever request made it:
the agent passes every reply through it, so a new request cannot skip it.

>>> viewer = Viewer(uid=1001, admin=False)
>>> row = {"uid": 1000, "state": "failed", "reason": "ValueError: s3cret", "env": {"K": "v"}}
>>> redact({"job": row}, viewer, lambda ids: {})["job"]["reason"]
'failed'
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

#: Reasons the pool itself writes with nothing of a job's own in them.
PUBLIC_REASONS = frozenset(
    {
        "",
        "submitted",
        "cancelled by user",
        "requeued after preemption",
        "preempted by a higher-priority job",
    }
)
_PRIORITY_CHANGE = re.compile(r"^priority -?\d+ -> -?\d+$")
_RETRY = re.compile(r"^(retry \d+/\d+) after: ")


@dataclass(frozen=True)
class Viewer:
    """Who asks: a uid, and whether it is one of the pool's admins."""

    uid: int
    admin: bool

    def sees_all_of(self, uid: object) -> bool:
        return self.admin or uid == self.uid


def public_reason(state: str | None, reason: str | None) -> str:
    """The words of a state change that anyone may read: the pool's own, or the state."""
    text = reason or ""
    if text in PUBLIC_REASONS or _PRIORITY_CHANGE.match(text):
        return text
    retry = _RETRY.match(text)
    if retry:
        return retry.group(1)  # that it is retried is the queue's; why is its owner's
    return state or ""


def job_row(data: dict[str, Any], viewer: Viewer) -> dict[str, Any]:
    """A job (``info_to_json``) as ``viewer`` may see it."""
    if viewer.sees_all_of(data.get("uid")):
        return data
    data = dict(data)
    data["env"] = {}
    data["origin"] = ""
    data["reason"] = public_reason(data.get("state"), data.get("reason"))
    data["stage_in"] = {name: "" for name in data.get("stage_in") or {}}
    if data.get("progress"):
        data["progress"] = {**data["progress"], "metrics": {}}
    return data


def event_row(event: dict[str, Any], owner_uid: int | None, viewer: Viewer) -> dict[str, Any]:
    """One event of the audit trail as ``viewer`` may see it (its job's owner: ``owner_uid``)."""
    if viewer.sees_all_of(owner_uid):
        return event
    return {**event, "reason": public_reason(event.get("to_state"), event.get("reason"))}


def redact(
    reply: dict[str, Any],
    viewer: Viewer,
    owners: Callable[[Iterable[str]], dict[str, int]],
) -> dict[str, Any]:
    """``reply`` with every job row and event in it as ``viewer`` may see it.

    ``owners(job_ids)``: the owner uid of each of those jobs (events name only their job).
    """
    if viewer.admin:
        return reply
    out = dict(reply)
    if isinstance(out.get("job"), dict):
        out["job"] = job_row(out["job"], viewer)
    if isinstance(out.get("jobs"), list):
        out["jobs"] = [job_row(j, viewer) if isinstance(j, dict) else j for j in out["jobs"]]
    events = out.get("events")
    if isinstance(events, list) and events:
        uids = owners({str(e.get("job_id")) for e in events if isinstance(e, dict)})
        out["events"] = [
            event_row(e, uids.get(str(e.get("job_id"))), viewer) if isinstance(e, dict) else e
            for e in events
        ]
    return out
