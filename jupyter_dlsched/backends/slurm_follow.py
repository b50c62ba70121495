"""Following submitted jobs with ``squeue`` and ``scontrol``: why each one waits, when it
starts (its node and GPUs), and when it has ended."""

from __future__ import annotations

import re
import time

from ..vocab.resources import Placement
from .slurm_record import SlurmRecorder, _parse_time
from .slurm_tools import SlurmError, run_tool
from .slurm_track import Track

RUNNING_STATES = {
    "RUNNING",
    "CONFIGURING",
    "COMPLETING",
    "SUSPENDED",
    "STOPPED",
    "SIGNALING",
    "STAGE_OUT",
    "RESIZING",
}
ENDED_STATES = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
    "OUT_OF_MEMORY",
    "SPECIAL_EXIT",
    "REVOKED",
}
# SLURM's words for why a job waits, with a gloss for people who do not know them
REASONS = {
    "None": "SLURM's scheduler has not considered it yet",
    "Resources": "the resources it asks for are in use",
    "Priority": "jobs with a higher priority are ahead of it",
    "Dependency": "a job it depends on has not finished",
    "BeginTime": "its start time has not come",
    "JobHeldUser": "held by its user (scontrol release)",
    "JobHeldAdmin": "held by an administrator",
    "QOSMaxJobsPerUserLimit": "the QOS allows no more running jobs for you",
    "AssocGrpGRES": "your account's GPU limit is reached",
    "ReqNodeNotAvail": "a node it needs is unavailable",
    "PartitionTimeLimit": "its time limit exceeds the partition's",
}


class SlurmFollower(SlurmRecorder):
    """The monitor's part that follows jobs in SLURM; an ended job goes to ``_record``."""

    def _poll(self) -> None:
        with self._lock:
            tracks = {t.slurm_id: t for t in self._tracks.values() if t.slurm_id}
        if not tracks:
            return
        try:
            out = run_tool(
                [
                    "squeue",
                    "--noheader",
                    "--states=all",
                    f"--jobs={','.join(tracks)}",
                    "--format=%i|%T|%r",
                ]
            )
        except SlurmError as error:
            if "Invalid job id" not in str(error):
                raise
            out = ""
        seen: dict[str, tuple[str, str]] = {}
        for line in out.splitlines():
            parts = line.strip().split("|")
            if len(parts) == 3:
                seen[parts[0]] = (parts[1], parts[2])
        for slurm_id, track in tracks.items():
            state, reason = seen.get(slurm_id, ("", ""))
            if state == "PENDING" or state.startswith("REQUEUE"):
                self._pending(track, reason)
            elif state in RUNNING_STATES:
                self._running(track)
            else:  # ended, or gone from squeue: scontrol knows more (exit code, times)
                self._running(track)  # a short job may start and end between two polls
                details = _scontrol(slurm_id)
                if details is None or details.get("JobState", "") in ENDED_STATES:
                    self._record(track, details)
                    continue
            self._tail(track)

    def _pending(self, track: Track, reason: str) -> None:
        gloss = REASONS.get(reason)
        words = f"SLURM: {reason}" + (f" ({gloss})" if gloss else "")
        policy = self.backend.slurm_policy
        if policy.reasons.get(track.job_id) == words:
            return
        policy.reasons[track.job_id] = words
        if reason == "Dependency":
            return  # the tick's own words ("waiting for job X to finish") say more
        self.store.queue.set_waiting_reason(track.job_id, words)

    def _running(self, track: Track) -> None:
        """SLURM started the job: move it to ``running`` with its node, GPUs and start time."""
        if track.started is not None:
            return
        details = _scontrol(track.slurm_id or "") or {}
        started = _parse_time(details.get("StartTime")) or time.time()
        node = details.get("NodeList") or None
        placement = self._placement(details)
        began = track.lease.started(started, placement=placement, host=node)
        if began is None:
            return  # taken over meanwhile
        started = began
        track.started = started
        self.backend.slurm_policy.reasons.pop(track.job_id, None)
        gpus = f", GPUs {','.join(map(str, placement.gpus))}" if placement.gpus else ""
        self._note(track, f"started on {node} (SLURM job {track.slurm_id}{gpus})")
        self._last_change = time.monotonic()
        assert self.backend.port is not None
        self.backend.port.wake()

    def _placement(self, details: dict[str, str]) -> Placement:
        """The inventory's indices of the GPUs SLURM gave (``GRES=gpu:2(IDX:0-1)``)."""
        assert self.backend.port is not None
        cards = {(g.get("node"), g.get("local")): g for g in self.backend.port.inventory["gpus"]}
        indices: list[int] = []
        for node, idx in re.findall(
            r"Nodes=(\S+) [^\n]*?GRES=\S*?\(IDX:([\d,-]+)\)", details.get("_text", "")
        ):
            for local in _expand(idx):
                card = cards.get((node, local))
                if card is not None:
                    indices.append(card["index"])
        mem = [cards_mem for cards_mem in (self.backend.gpu_mem,) * len(indices)]
        return Placement(gpus=tuple(indices), gpu_mem=tuple(mem))


def _scontrol(slurm_id: str) -> dict[str, str] | None:
    """``scontrol show job -d`` as ``{key: value}`` (``_text``: all of it); ``None`` if unknown."""
    try:
        text = run_tool(["scontrol", "show", "job", "-d", slurm_id])
    except SlurmError as error:
        if "Invalid job id" in str(error):
            return None
        raise
    values = dict(re.findall(r"(?:^|\s)([A-Za-z_/:]+)=(\S*)", text))
    values["_text"] = text
    return values


def _expand(indices: str) -> list[int]:
    """``"0-1,3"`` -> ``[0, 1, 3]``."""
    out: list[int] = []
    for part in indices.split(","):
        low, _, high = part.partition("-")
        if low.isdigit():
            out += list(range(int(low), int(high or low) + 1))
    return out
