"""The pool agent's requests: one method per request of the protocol (``Agent._ops``).

Each takes the peer (who asks: uid, name, admin), the message and its binary
attachments, and returns the reply (``None``: answered later, as ``changes`` with
``wait`` is); the message and the reply are typed with the op's shapes
(``shapes.OPS``), which the clients' calls are typed with too. A shape says what a
well-formed request holds: each handler still checks every field it reads. Every
reply then passes the one visibility rule (``visibility.py``). The checks of a shared
pool's limits (priority cap, queued jobs, payload bytes) are here too, since only
requests apply them.
"""

from __future__ import annotations

import json
import os
from typing import Any, cast

from .._version import __version__
from ..backends.base import refuse_stage_in
from ..store.buffers import buffer_files
from ..vocab.errors import JobNotFound, PermissionDenied, SpecError
from ..vocab.schema import JobInfo, info_to_json
from ..vocab.spec import check_text
from ..vocab.words import PRIORITY_WORDS, over_payload_limit
from .connections import Peer
from .protocol import ProtocolError
from .reads import Reads
from .shapes import (
    Done,
    EndedRequest,
    HelloReply,
    JobIdRequest,
    JobReply,
    NoFields,
    PriorityRequest,
    ProgressReply,
    ProgressRequest,
    RayReply,
    RayRequest,
    RoomReply,
    SchedulesReply,
    SchedulesRequest,
    SettingsReply,
    SettingsRequest,
    SubmitReply,
    SubmitRequest,
)

#: Largest progress report a job may send (JSON bytes).
MAX_PROGRESS = 64 * 1024


#: What a submission may store with a job (``Store.read_file`` names).
JOB_FILES = ("payload.pkl", "command.json", "context.json")


def _job_files(item: object, blobs: list[bytes]) -> dict[str, bytes]:
    """One job of a ``submit``: ``{"files": {name: index of an attachment}}``, checked."""
    files = item.get("files") if isinstance(item, dict) else None
    if not isinstance(files, dict):
        raise ProtocolError("each job of a submit request needs files: {name: attachment}")
    out = {}
    for name, index in files.items():
        if name not in JOB_FILES:
            raise ProtocolError(f"a job file {name!r}: expected one of {', '.join(JOB_FILES)}")
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(blobs):
            raise ProtocolError(
                f"job file {name!r} names attachment {index!r}; the request has {len(blobs)}"
            )
        out[name] = blobs[index]
    return out


def _priority_value(priority: int) -> str:
    """``"urgent (1000)"`` for a named level, ``"101"`` for any other."""
    name = PRIORITY_WORDS.get(priority)
    return f"{name} ({priority})" if name else str(priority)


class Requests(Reads):
    """The request handlers of ``Agent`` (``service.py``), which this is a part of (the
    attributes of the agent they use are declared in ``Reads``)."""

    def _hello(self, peer: Peer, msg: NoFields, blobs: list[bytes]) -> HelloReply:
        return {
            "version": __version__,
            "mode": "shared" if self.shared else "user",
            "home": str(self.home),
            "socket": str(self.socket_path) if self.socket_path is not None else None,
            "pid": os.getpid(),
            "code": self.code,
            "ledger": self._store.ledger.identity(),
            "uid": peer.uid,
            "user": peer.user,
            "admin": peer.admin,
        }

    def _submit(self, peer: Peer, msg: SubmitRequest, blobs: list[bytes]) -> SubmitReply:
        assert self.sched is not None
        options = msg.get("options") or {}
        if not isinstance(options, dict):
            raise SpecError("options", options, "a mapping of resource options")
        inline = bool(msg.get("inline"))
        if self.shared and inline:
            raise SpecError(
                "inline",
                True,
                "a job that runs in the pool's own processes (a shared pool "
                "cannot run a thread of your kernel): leave out --inline",
            )
        backend = msg.get("backend") or "local"
        if backend != "local" and self.shared:
            raise SpecError("backend", backend, "the local backend in a shared pool")
        if backend not in ("local", "ray"):
            raise SpecError("backend", backend, '"local" or "ray" through a pool agent')
        jobs = msg.get("jobs")
        if not isinstance(jobs, list) or not jobs:
            raise ProtocolError("a submit request without jobs")
        ray = backend == "ray"
        if ray:
            self.ray.check_options(msg)
            if inline:
                raise SpecError("inline", True, "no --inline with the ray backend")
        batch = self.sched.prepare(
            str(msg.get("kind", "function")),
            [_job_files(item, blobs) for item in jobs],
            default_name=str(msg.get("default_name", "job")),
            origin=str(msg.get("origin", "")),
            options=options,
            suffixes=[
                check_text(str(item["suffix"]), "name") if item.get("suffix") else None
                for item in jobs
            ],
            inventory=self.ray.inventory() if ray else None,
            check=(lambda spec: refuse_stage_in("ray", spec)) if ray else None,
            inline=inline,
        )
        self._check_priority(peer, batch[0][1].priority)
        self._check_queued(peer, len(batch))
        self._check_payload(peer, batch)
        self._check_schedules(peer, batch)
        ids = self.sched.insert(
            batch, owner=peer.user, uid=peer.uid, inline=inline, backend=backend
        )
        if ray:
            self.ray.keep()
        return {"ids": ids}

    def _check_priority(self, peer: Peer, priority: int) -> None:
        if peer.admin or self.config is None:
            return
        cap = self.config.limits_for(peer.user).max_priority
        if cap is not None and priority > cap:
            raise PermissionDenied(
                f"priority {_priority_value(priority)} is above the highest a user may ask "
                f"for in this pool, {_priority_value(cap)}; an admin can raise it"
            )

    def _check_queued(self, peer: Peer, adding: int) -> None:
        if self.config is None:
            return
        cap = self.config.limits_for(peer.user).max_queued
        if cap is None:
            return
        waiting = self._store.count_waiting(peer.uid)
        if waiting + adding > cap:
            raise PermissionDenied(
                f"{peer.user} has {waiting} job{'s' if waiting != 1 else ''} waiting; the "
                f"limit per user is {cap} (this request adds {adding})"
            )

    def _check_payload(self, peer: Peer, batch: list[tuple[str, Any, dict[str, bytes]]]) -> None:
        """Refuse a submission that would put a user's unfinished jobs' payloads over
        ``max_payload_bytes``: what one user queues cannot fill the pool's disk."""
        if self.config is None:
            return
        cap = self.config.limits_for(peer.user).max_payload_bytes
        if cap is None:
            return
        distinct = {id(data): len(data) for _, _, files in batch for data in files.values()}
        # and the big buffers the payloads name (each file once): they count as much
        named = {
            path: size
            for _, _, files in batch
            for path, size in buffer_files(files.get("payload.pkl", b"")).items()
        }
        adding = sum(distinct.values()) + sum(named.values())
        held = self._store.payload_bytes(peer.uid)
        if held + adding > cap and self._store.release_kept_payloads(peer.uid):
            held = self._store.payload_bytes(peer.uid)  # ended jobs' kept payloads went first
        if held + adding > cap:
            raise PermissionDenied(over_payload_limit(peer.user, held, cap, adding))

    def _room(self, peer: Peer, msg: NoFields, blobs: list[bytes]) -> RoomReply:
        """What the peer's payloads may still take, asked before its client writes a big
        submission's files (so one over the limit is refused before anything is written)."""
        cap = self.config.limits_for(peer.user).max_payload_bytes if self.config else None
        held = self._store.payload_bytes(peer.uid) - self._store.kept_payload_bytes(peer.uid)
        return {"held": held, "limit": cap}

    def _check_schedules(self, peer: Peer, batch: list[tuple[str, Any, dict[str, bytes]]]) -> None:
        """Refuse a schedule past ``max_schedules`` of its user (each tick of each makes a
        job, however soon it ends)."""
        adding = sum(1 for _, spec, _ in batch if spec.every is not None)
        if not adding or self.config is None:
            return
        cap = self.config.limits_for(peer.user).max_schedules
        if cap is None:
            return
        held = self._store.timetable.schedule_count(peer.uid)
        if held + adding > cap:
            raise PermissionDenied(
                f"{peer.user} has {held} schedule{'s' if held != 1 else ''}; the limit per "
                f"user is {cap} (max_schedules; this request adds {adding}): remove one "
                "with `dlsched schedules remove ID`"
            )

    def _owned(self, peer: Peer, job_id: object, doing: str) -> JobInfo:
        """The job, if ``peer`` may ``doing`` it: its owner, or an admin."""
        if not isinstance(job_id, str):
            raise JobNotFound(job_id)
        info = self._store.get(job_id)
        if info.uid != peer.uid and not peer.admin:
            raise PermissionDenied(
                f"job {info.id} belongs to {info.owner}: only its owner or a pool admin may "
                f"{doing} it"
            )
        return info

    def _cancel(self, peer: Peer, msg: JobIdRequest, blobs: list[bytes]) -> JobReply:
        assert self.sched is not None
        info = self._owned(peer, msg.get("id"), "cancel")
        self._dirty = True
        return {"job": info_to_json(self.sched.cancel(info.id))}

    def _priority(self, peer: Peer, msg: PriorityRequest, blobs: list[bytes]) -> JobReply:
        assert self.sched is not None
        from ..vocab.spec import parse_priority

        info = self._owned(peer, msg.get("id"), "change the priority of")
        priority = parse_priority(msg.get("priority"))
        self._check_priority(peer, priority)
        self._dirty = True
        return {"job": info_to_json(self.sched.set_priority(info.id, priority))}

    def _requeue(self, peer: Peer, msg: JobIdRequest, blobs: list[bytes]) -> JobReply:
        assert self.sched is not None
        info = self._owned(peer, msg.get("id"), "requeue")
        self._check_queued(peer, 1)
        self._dirty = True
        return {"job": info_to_json(self.sched.requeue(info.id))}

    def _ray(self, peer: Peer, msg: RayRequest, blobs: list[bytes]) -> RayReply:
        return self.ray.request(msg)

    def _schedules(self, peer: Peer, msg: SchedulesRequest, blobs: list[bytes]) -> SchedulesReply:
        from ..schedules.requests import answer

        # the same answer a Scheduler without an agent gives itself, as a plain dict
        return cast(SchedulesReply, answer(self._store, dict(msg), uid=peer.uid, admin=peer.admin))

    def _progress(self, peer: Peer, msg: ProgressRequest, blobs: list[bytes]) -> ProgressReply:
        info = self._owned(peer, msg.get("id"), "report progress for")
        progress = msg.get("progress")
        if info.state != "running" or not isinstance(progress, dict):
            return {"recorded": False}
        if len(json.dumps(progress)) > MAX_PROGRESS:
            raise SpecError("progress", "...", f"at most {MAX_PROGRESS} bytes of JSON")
        self._store.update(info.id, progress=progress)
        return {"recorded": True}

    def _ended(self, peer: Peer, msg: EndedRequest, blobs: list[bytes]) -> Done:
        self._dirty = True  # a job's resources are free: decide now
        if "again" in msg:
            self.take_back(peer, msg["again"] is True)  # its supervisor's last word
        return {}

    def _tick_request(self, peer: Peer, msg: NoFields, blobs: list[bytes]) -> Done:
        self._dirty = True
        return {}

    def _settings(self, peer: Peer, msg: SettingsRequest, blobs: list[bytes]) -> SettingsReply:
        assert self.sched is not None
        if self.shared and not peer.admin:
            raise PermissionDenied("only a pool admin may change the pool's policy or leases")
        self.sched.write_settings(
            msg.get("policy"),
            msg.get("lease_ttl"),
            msg.get("grace"),
            msg.get("policy_params"),
            resize_every=msg.get("resize_every"),
            resize_cost=msg.get("resize_cost"),
            min_schedule_interval=msg.get("min_schedule_interval"),
        )
        self._dirty = True
        return {"settings": self._store.get_meta("settings")}

    def _stop(self, peer: Peer, msg: NoFields, blobs: list[bytes]) -> Done:
        if not peer.admin:
            raise PermissionDenied("only a pool admin may stop the pool's service")
        self._stopping = True
        self.stop_listening()  # before the reply: a client behind it starts the next agent
        return {}
