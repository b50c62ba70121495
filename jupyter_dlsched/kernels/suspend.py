"""Suspending an idle GPU kernel with the CUDA driver's checkpoint instead of shutting it down.

``cuda-checkpoint --toggle --pid PID`` (NVIDIA driver 550 and newer) moves a process's
device memory to host memory and releases its GPU; the same call brings it back, and
``--get-state`` says which it is in (``running``, ``locked``, ``checkpointed``,
``failed``). ``Checkpointer`` is the one way to it; ``reclaim_decision`` and
``restore_refusal`` are the rules a reclaim and a restore follow, pure so they can be
tested without a GPU.

The known failure modes, guarded here:

* a restore into a GPU without room for what the process held leaves it stuck
  (NVIDIA/cuda-checkpoint#44): free memory is checked first (``restore_refusal``);
* killing a process that was restored can hang in the driver (#53): a restored process is
  suspended again before it is killed (``Checkpointer.stop_safely``);
* processes with NCCL peers cannot be checkpointed one by one (#30): a kernel in a
  ``torch.distributed`` process group is shut down instead (``reclaim_decision``).

>>> Checkpointer().supported()  # doctest: +SKIP
'no cuda-checkpoint program on PATH (it comes with NVIDIA driver 550 and newer)'
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from dataclasses import dataclass

PROGRAM = "cuda-checkpoint"
TIMEOUT = 120.0


class CheckpointError(RuntimeError):
    """``cuda-checkpoint`` refused or failed; the message is its own."""


@dataclass(frozen=True)
class Decision:
    """What a reclaim does to an idle kernel: ``suspend`` it, or ``shutdown`` and say why."""

    action: str
    reason: str = ""


class Checkpointer:
    """A process's CUDA state moved to host memory and back, by ``cuda-checkpoint``.

    >>> c = Checkpointer()  # doctest: +SKIP
    >>> c.supported() is None and c.suspend(pid) and c.state(pid)  # doctest: +SKIP
    'checkpointed'
    """

    def __init__(self, program: str | None = None) -> None:
        self.program = program or shutil.which(PROGRAM)
        self._supported: tuple[str | None] | None = None

    def supported(self) -> str | None:
        """None where this machine can suspend; else why not, in one line."""
        if self._supported is None:
            self._supported = (self._why_not(),)
        return self._supported[0]

    def _why_not(self) -> str | None:
        if self.program is None:
            return f"no {PROGRAM} program on PATH (it comes with NVIDIA driver 550 and newer)"
        try:
            out = subprocess.run(
                [self.program, "--help"], capture_output=True, text=True, timeout=10, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            return f"{PROGRAM} does not run: {error}"
        if "--toggle" not in out.stdout + out.stderr:
            return f"{PROGRAM} lacks --toggle (needs NVIDIA driver 550 or newer)"
        return None

    def _run(self, *args: str) -> str:
        if self.program is None:
            raise CheckpointError(self.supported() or f"no {PROGRAM}")
        try:
            out = subprocess.run(
                [self.program, *args], capture_output=True, text=True, timeout=TIMEOUT
            )
        except subprocess.TimeoutExpired:
            raise CheckpointError(f"{PROGRAM} {' '.join(args)} did not answer") from None
        if out.returncode != 0:
            said = (out.stderr or out.stdout).strip() or f"exit status {out.returncode}"
            raise CheckpointError(f"{PROGRAM} {' '.join(args)}: {said}")
        return out.stdout.strip()

    def state(self, pid: int) -> str:
        """``running``, ``locked``, ``checkpointed`` or ``failed``."""
        return self._run("--get-state", "--pid", str(pid)).split()[-1].lower()

    def suspend(self, pid: int) -> None:
        """Move ``pid``'s CUDA state to host memory: its GPU memory is freed."""
        if self.state(pid) == "checkpointed":
            return
        self._run("--toggle", "--pid", str(pid))
        if (now := self.state(pid)) != "checkpointed":
            raise CheckpointError(f"process {pid} is {now} after the suspend, not checkpointed")

    def restore(self, pid: int) -> None:
        """Bring ``pid``'s CUDA state back to its GPU; it runs on from where it stopped."""
        if self.state(pid) == "running":
            return
        self._run("--toggle", "--pid", str(pid))
        if (now := self.state(pid)) != "running":
            raise CheckpointError(f"process {pid} is {now} after the restore, not running")

    def stop_safely(self, pid: int, sig: int = signal.SIGTERM) -> None:
        """Signal a process that was restored, suspending it first: a restored process
        killed while its CUDA state is live can hang in the driver (cuda-checkpoint#53)."""
        try:
            self.suspend(pid)
        except CheckpointError:
            pass  # nothing to suspend (it never touched CUDA, or it is gone): just stop it
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def reclaim_decision(checkpointer: Checkpointer, activity: dict[str, object]) -> Decision:
    """Suspend an idle kernel where the driver can and the kernel has no NCCL peers;
    otherwise shut it down, with the reason.

    ``activity`` is what the kernel itself reported (``activity.json``):
    ``process_group`` is true once it joined a ``torch.distributed`` process group, whose
    peers (NCCL's, cuda-checkpoint#30) would be left talking to a suspended rank.

    >>> reclaim_decision(Checkpointer(program="/nonexistent"), {}).action  # doctest: +SKIP
    'shutdown'
    """
    why_not = checkpointer.supported()
    if why_not is not None:
        return Decision("shutdown", why_not)
    if activity.get("process_group"):
        return Decision(
            "shutdown",
            "the kernel is in a torch.distributed process group: its peers (NCCL's) cannot "
            "be suspended one process at a time",
        )
    return Decision("suspend")


def restore_refusal(needed: int, free: dict[int, int]) -> str | None:
    """Why a suspended kernel cannot be restored onto GPUs with ``free`` bytes each, when it
    held ``needed`` bytes on each: a restore without room leaves it stuck
    (cuda-checkpoint#44). None when every GPU has room.

    >>> restore_refusal(4 * 2**30, {0: 2 * 2**30})
    'GPU 0 has 2.0 GiB free, the kernel needs 4.0 GiB to be restored'
    """
    for index, room in sorted(free.items()):
        if room < needed:
            return (
                f"GPU {index} has {room / 2**30:.1f} GiB free, the kernel needs "
                f"{needed / 2**30:.1f} GiB to be restored"
            )
    return None


def available() -> tuple[bool, str]:
    """Whether ``cuda-checkpoint`` is installed and answers, with the reason if not."""
    checkpointer = Checkpointer()
    why_not = checkpointer.supported()
    return (False, why_not) if why_not else (True, str(checkpointer.program))
