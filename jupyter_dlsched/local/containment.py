"""Every process a job starts, wherever it went: what its supervisor stops and waits for.

A process group is not a container: a job that calls ``setsid()`` (a daemon,
a double fork) leaves it, and its process would outlive a cancel, a time limit
or a memory limit while the job's GPUs go to the next job. So:

* the supervisor is a child subreaper (``PR_SET_CHILD_SUBREAPER``): a process
  of the job whose parent exits is re-parented to the supervisor, never to
  init, so the job's processes are exactly the supervisor's descendants;
* a shared pool's supervisor (root) also puts the job in a cgroup of its own,
  as slurmstepd's proctrack does: under the service's own cgroup-v2 subtree
  where it was delegated one (``Delegate=yes``), else in the cgroup-v1
  ``freezer`` (or ``pids``) hierarchy. A job process cannot leave it, and
  freezing it makes the kill race-free. The ``memory`` cgroup a process runs
  in is never changed.

Processes are signalled by pid only while they are still the supervisor's
descendants (or members of the job's cgroup), through a pidfd opened before
the check: a pid that was reused by another process is never signalled.

>>> box = Containment.create("a1b2c3d4", attempt=1, home=home, cgroup=True)  # doctest: +SKIP
>>> box.join()  # in the forked job process, before it runs the job's code
>>> box.pids(), box.kill_all(), box.close()
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36
CGROUP_ROOT = Path("/sys/fs/cgroup")
#: Names of job cgroups start with this, then a token of the state folder, the job and attempt.
PREFIX = "dlsched-"
#: Seconds ``kill_all`` keeps killing before it gives up on a process that will not die.
KILL_TIMEOUT = 10.0


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants; False where the kernel refuses."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


@dataclass(frozen=True)
class ProcessEntry:
    """One line of ``/proc/<pid>/stat``: what the process tree is made of."""

    pid: int
    ppid: int
    pgid: int
    zombie: bool


def _stat(pid: int) -> ProcessEntry | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read()
    except OSError:
        return None
    # the command name may hold spaces and parentheses: fields start after the last ')'
    fields = text[text.rfind(b")") + 2 :].split()
    try:
        return ProcessEntry(pid, int(fields[1]), int(fields[2]), fields[0] in (b"Z", b"X"))
    except (IndexError, ValueError):
        return None


def process_table() -> dict[int, ProcessEntry]:
    """Every process of this machine (one pass over ``/proc``)."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            entry = _stat(int(name))
            if entry is not None:
                table[entry.pid] = entry
    return table


def _children(pid: int) -> list[int] | None:
    """The children of ``pid`` from ``/proc/<pid>/task/<tid>/children`` (None where the kernel
    has no such file): a few reads instead of a pass over every process of the machine."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    found: list[int] = []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                found += [int(word) for word in f.read().split()]
        except FileNotFoundError:
            if tid == str(pid) and os.path.isdir(f"/proc/{pid}/task/{tid}"):
                return None  # a kernel without CONFIG_PROC_CHILDREN
        except OSError:
            continue
    return found


def descendants(root: int) -> dict[int, ProcessEntry]:
    """The processes below ``root`` (children, their children, ...), zombies included."""
    first = _children(root)
    if first is None:
        return _descendants_in(process_table(), root)
    found: dict[int, ProcessEntry] = {}
    todo = first
    while todo:
        pid = todo.pop()
        if pid in found or pid == root:
            continue
        entry = _stat(pid)
        if entry is None:
            continue
        found[pid] = entry
        todo += _children(pid) or []
    return found


def _descendants_in(table: dict[int, ProcessEntry], root: int) -> dict[int, ProcessEntry]:
    children: dict[int, list[int]] = {}
    for entry in table.values():
        children.setdefault(entry.ppid, []).append(entry.pid)
    found: dict[int, ProcessEntry] = {}
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if pid not in found and pid != root:
            found[pid] = table[pid]
            todo += children.get(pid, [])
    return found


def is_descendant(pid: int, root: int) -> bool:
    """Whether ``pid`` is below ``root`` now (its chain of parents reaches ``root``)."""
    seen = 0
    while pid > 1 and seen < 4096:
        entry = _stat(pid)
        if entry is None:
            return False
        if entry.ppid == root:
            return True
        pid, seen = entry.ppid, seen + 1
    return False


class Cgroup:
    """The cgroup of one job in one hierarchy: ``v2`` (a delegated subtree), or v1
    ``freezer`` or ``pids``. Only root creates them; a job process cannot leave one."""

    def __init__(self, path: Path, kind: str) -> None:
        self.path, self.kind = path, kind

    @classmethod
    def parents(cls) -> list[tuple[Path, str]]:
        """Where job cgroups may be made on this machine, best first (none without root)."""
        if os.geteuid() != 0:
            return []
        found = []
        v2 = _delegated_v2()
        if v2 is not None:
            found.append((v2, "v2"))
        for kind in ("freezer", "pids"):
            folder = CGROUP_ROOT / kind
            if (folder / "cgroup.procs").exists() and os.access(folder, os.W_OK):
                found.append((folder, kind))
        return found

    @classmethod
    def make(cls, name: str) -> Cgroup | None:
        """A new cgroup called ``name`` in the best hierarchy there is, or None."""
        for parent, kind in cls.parents():
            path = parent / name
            try:
                os.mkdir(path, 0o755)
            except FileExistsError:
                pass  # left by this job's earlier supervisor: emptied before it is used
            except OSError:
                continue
            return cls(path, kind)
        return None

    def join(self, pid: int = 0) -> None:
        """Move ``pid`` (0: this process) into the cgroup (``OSError`` if it cannot)."""
        with open(self.path / "cgroup.procs", "w") as f:
            f.write(f"{pid or os.getpid()}\n")

    def pids(self) -> set[int]:
        try:
            text = (self.path / "cgroup.procs").read_text()
        except OSError:
            return set()
        return {int(line) for line in text.split()}

    def _freezer(self, state: str) -> None:
        if self.kind == "v2":
            (self.path / "cgroup.freeze").write_text("1" if state == "FROZEN" else "0")
        elif self.kind == "freezer":
            (self.path / "freezer.state").write_text(state)

    def _frozen(self) -> bool:
        if self.kind == "v2":
            events = (self.path / "cgroup.events").read_text()
            return "frozen 1" in events
        return (self.path / "freezer.state").read_text().strip() == "FROZEN"

    def kill_all(self) -> set[int]:
        """Kill every process in the cgroup and wait until it is empty; returns who was in it.

        Frozen first (v2 and freezer), so no process forks between the listing and the
        kill; in a pids-only cgroup the listing and the kill repeat until it is empty.
        """
        killed: set[int] = set()
        deadline = time.monotonic() + KILL_TIMEOUT
        while time.monotonic() < deadline:
            members = self.pids()
            if not members:
                break
            killed |= members
            if self.kind == "v2" and (self.path / "cgroup.kill").exists():
                (self.path / "cgroup.kill").write_text("1")
            else:
                frozen = False
                if self.kind in ("v2", "freezer"):
                    try:
                        self._freezer("FROZEN")
                        frozen = _wait(self._frozen, 1.0)
                    except OSError:
                        pass
                members = self.pids()
                killed |= members
                for pid in members:
                    _kill(pid, signal.SIGKILL)
                if frozen:
                    self._freezer("THAWED")  # a frozen process dies only once thawed
            _wait(lambda: not self.pids(), 0.5)
        return killed

    def remove(self) -> bool:
        """Remove the cgroup once it is empty (killing what is left); True when it is gone."""
        if self.pids():
            self.kill_all()
        for _ in range(50):
            try:
                os.rmdir(self.path)
                return True
            except FileNotFoundError:
                return True
            except OSError as error:
                if error.errno != errno.EBUSY:
                    return False
                time.sleep(0.02)  # its last process is exiting
        return False


def _delegated_v2() -> Path | None:
    """This process's own cgroup-v2 folder when it may make groups below it, else None.

    The root of the hierarchy is never used: only a subtree delegated to the
    service (``Delegate=yes``) is ours to divide.
    """
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    own = next((line[3:] for line in lines if line.startswith("0::")), None)
    if not own or own == "/":
        return None
    for mount in (CGROUP_ROOT, CGROUP_ROOT / "unified"):
        if (mount / "cgroup.controllers").exists():
            folder = mount / own.lstrip("/")
            if (folder / "cgroup.kill").exists() and os.access(folder, os.W_OK):
                return folder
    return None


def _wait(predicate: object, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while True:
        try:
            if predicate():  # type: ignore[operator]
                return True
        except OSError:
            return False
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def home_token(home: str | os.PathLike[str]) -> str:
    """Eight hex digits naming a state folder in cgroup names (two pools never collide)."""
    return hashlib.sha1(os.path.realpath(home).encode()).hexdigest()[:8]


class Containment:
    """All processes of one job: the supervisor's descendants, and the job's cgroup if any.

    Made by the supervisor before it forks the job; ``join`` runs in each forked
    job process before anything of the job does.
    """

    def __init__(self, cgroup: Cgroup | None = None) -> None:
        self.root = os.getpid()
        self.subreaper = become_subreaper()
        self.cgroup = cgroup
        self.ranks: set[int] = set()

    @classmethod
    def create(
        cls, job_id: str, attempt: int, home: str | os.PathLike[str], cgroup: bool = False
    ) -> Containment:
        """``cgroup``: also a cgroup of the job's own (a shared pool's supervisor, root)."""
        group = None
        if cgroup:
            group = Cgroup.make(f"{PREFIX}{home_token(home)}-{job_id}-{attempt}")
            if group is not None:
                group.kill_all()  # an earlier supervisor's leftovers of this very attempt
        return cls(group)

    def join(self) -> None:
        """In a forked job process: enter the job's cgroup (``OSError`` if it cannot)."""
        if self.cgroup is not None:
            self.cgroup.join()

    def add(self, pid: int) -> None:
        """A job process the supervisor forked (and waits for itself: never reaped here);
        the supervisor's side of ``join`` (whichever runs first wins)."""
        self.ranks.add(pid)
        if self.cgroup is not None:
            try:
                self.cgroup.join(pid)
            except OSError:
                pass  # it has exited already, or it joined itself

    def table(self) -> dict[int, ProcessEntry]:
        """The job's live processes (zombies left out), with their parents and groups."""
        found = {pid: e for pid, e in descendants(self.root).items() if not e.zombie}
        if self.cgroup is not None:
            for pid in self.cgroup.pids() - found.keys():
                entry = _stat(pid)
                if entry is not None and not entry.zombie and pid != self.root:
                    found[pid] = entry
        return found

    def pids(self) -> set[int]:
        return set(self.table())

    def _ours(self, pid: int) -> bool:
        if is_descendant(pid, self.root):
            return True
        return self.cgroup is not None and pid in self.cgroup.pids()

    def signal(self, sig: int, pids: Iterable[int] | None = None) -> set[int]:
        """Send ``sig`` to each of the job's processes (or those of ``pids`` still the job's);
        returns the pids signalled."""
        sent = set()
        for pid in self.pids() if pids is None else pids:
            try:
                fd = os.pidfd_open(pid)
            except OSError:
                continue
            try:
                # checked after the pidfd holds the process: a reused pid fails the check
                if self._ours(pid):
                    signal.pidfd_send_signal(fd, sig)
                    sent.add(pid)
            except OSError:
                pass
            finally:
                os.close(fd)
        return sent

    def kill_all(self) -> set[int]:
        """SIGKILL every process of the job until none is left; returns the pids killed."""
        killed: set[int] = set()
        if self.cgroup is not None:
            killed |= self.cgroup.kill_all()
        deadline = time.monotonic() + KILL_TIMEOUT
        while time.monotonic() < deadline:
            hit = self.signal(signal.SIGKILL)
            if not hit:
                break
            killed |= hit
            self.reap()
            time.sleep(0.01)
        return killed

    def reap(self) -> None:
        """Collect exited processes re-parented to the supervisor (never the ranks given to
        ``add``: the supervisor reads their exit status itself)."""
        for pid, entry in descendants(self.root).items():
            if entry.ppid == self.root and entry.zombie and pid not in self.ranks:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass

    def close(self) -> None:
        """Remove the job's cgroup (after killing anything still in it)."""
        if self.cgroup is not None:
            self.cgroup.remove()
            self.cgroup = None


def sweep_cgroups(
    home: str | os.PathLike[str], running: Callable[[], Iterable[tuple[str, int]]]
) -> int:
    """Remove this pool's job cgroups that no running attempt owns (a crashed supervisor's),
    killing what is left in them; ``running()``: (job id, attempt) of the running jobs, read
    after the cgroups are listed: a supervisor creates its job's cgroup only once its claim
    is in the ledger, so each cgroup listed is either in that read or no longer running
    (read first, a claim and its cgroup could both come between the read and the listing,
    and the job's new cgroup was removed under it). Returns how many were removed."""
    mine = f"{PREFIX}{home_token(home)}-"
    found: list[tuple[Path, str, str]] = []
    for parent, kind in Cgroup.parents():
        try:
            found += [
                (parent, kind, e.name)
                for e in os.scandir(parent)
                if e.is_dir() and e.name.startswith(mine)
            ]
        except OSError:
            continue
    if not found:
        return 0
    keep = {f"{mine}{job}-{attempt}" for job, attempt in running()}
    removed = 0
    for parent, kind, name in found:
        if name not in keep and Cgroup(parent / name, kind).remove():
            removed += 1
    return removed
