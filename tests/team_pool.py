"""A shared pool for tests: ``dlsched service run`` in a folder every user can reach.

Used by ``test_team.py`` and the browser test of the shared sidebar; the two
Unix users come from the ``team_users`` fixture (``conftest.py``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from conftest import OtherUser, wait_for

from jupyter_dlsched.agent.client import AgentClient
from jupyter_dlsched.agent.protocol import AgentUnavailable

DLSCHED = os.path.join(os.path.dirname(sys.executable), "dlsched")
#: Where test services put their sockets: a folder of root's that only root can write.
RUN_ROOT = "/run"

SUBMIT = """
import sys
import jupyter_dlsched as dls

def work(seconds, tag):
    import os, time
    time.sleep(seconds)
    return [tag, os.getuid()]

s = dls.Scheduler(loop=False)
seconds, tag, gpus = float(sys.argv[1]), sys.argv[2], float(sys.argv[3])
n, cpus = int(sys.argv[4]), float(sys.argv[5])
for i in range(n):
    h = s.submit(work, seconds, tag, gpus=gpus, cpus=cpus, name=tag)
    print(h.id, flush=True)
"""

RESULT = """
import json, sys
import jupyter_dlsched as dls
s = dls.Scheduler(loop=False)
print(json.dumps(s.get(sys.argv[1]).result(timeout=float(sys.argv[2]))))
"""


class Service:
    """``dlsched service run`` in a folder every user can reach, two simulated GPUs."""

    def __init__(
        self,
        root: Path,
        config: str = "",
        *,
        env: dict[str, str] | None = None,
        prefix: tuple[str, ...] = (),
        args: tuple[str, ...] = (),
    ) -> None:
        self.root = root
        #: extra environment of the service, and a command it runs under (``prlimit ...``)
        self.extra_env = dict(env or {})
        self.prefix = prefix
        self.args = args
        self.home = root / "home"
        # clients trust a socket only in folders no other user can write: not under /tmp
        self.run = Path(tempfile.mkdtemp(prefix="dlsched-test-", dir=RUN_ROOT))
        os.chmod(self.run, 0o755)
        self.socket = self.run / "dlsched.sock"
        self.config = root / "service.toml"
        self.config.write_text(config)
        self.log = root / "service.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, "DLSCHED_SIMULATE_GPUS": "2x16GiB", **self.extra_env}
        env.pop("DLSCHED_SOCKET", None)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    *self.prefix,
                    DLSCHED,
                    "service",
                    "run",
                    "--home",
                    str(self.home),
                    "--socket",
                    str(self.socket),
                    "--config",
                    str(self.config),
                    *self.args,
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_for(self._answers, timeout=60, what=lambda: self.log.read_text())

    def _answers(self) -> bool:
        try:
            AgentClient(str(self.socket)).call("ping")
        except AgentUnavailable:
            return False
        return True

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)

    def job(self, job_id: str) -> dict:
        """The job's row as an admin (root) sees it."""
        return AgentClient(str(self.socket)).call("get", id=job_id)["job"]

    def events(self, job_id: str) -> list[dict]:
        return AgentClient(str(self.socket)).call("events", id=job_id)["events"]

    def as_user(self, user: OtherUser, script: str, *args: str, timeout: float = 120):
        return user.python(script, *args, env={"DLSCHED_SOCKET": str(self.socket)}, timeout=timeout)

    def submit(
        self,
        user: OtherUser,
        seconds: float,
        tag: str,
        gpus: float = 0,
        n: int = 1,
        cpus: float = 0.25,
    ) -> list[str]:
        """Queue ``n`` jobs of ``user`` that sleep ``seconds`` and return ``[tag, uid]``."""
        done = self.as_user(user, SUBMIT, str(seconds), tag, str(gpus), str(n), str(cpus))
        assert done.returncode == 0, done.stderr
        return done.stdout.split()


@contextmanager
def shared_pool(config: str = "", **options: Any) -> Iterator[Service]:
    """A started service with two simulated GPUs; its jobs cancelled and folder removed after
    (``options``: the service's extra ``env``, a ``prefix`` command, more ``args``)."""
    root = Path(tempfile.mkdtemp(prefix="dlsched-team-"))
    os.chmod(root, 0o755)
    service = Service(root, config, **options)
    try:
        service.start()
        yield service
    finally:
        if service.proc is not None and service.proc.poll() is None:
            client = AgentClient(str(service.socket))
            # the running first: a page of the queue is reads.MAX_JOB_ROWS jobs at most
            running = client.call("jobs", states=["running", "preempted"])["jobs"]
            for job in running + client.call("jobs", states=["queued"])["jobs"]:
                client.call("cancel", id=job["id"])
            # their supervisors remove their cgroups as they end: not cut short by the stop
            ids = [job["id"] for job in running]
            wait_for(
                lambda: not client.call("jobs", ids=ids, states=["running", "preempted"])["jobs"],
                timeout=60,
            )
        service.stop()
        subprocess.run(["rm", "-rf", str(root), str(service.run)], check=False)


#: A user's script: one job per (label, size) pair in argv, each staging a fresh file of that
#: size and reading it back; prints the folder of the files and each job's end.
STAGE_EACH = r"""
import json, os, sys, tempfile
import jupyter_dlsched as dls
folder = tempfile.mkdtemp(prefix="dlsched-quota-")
out = []
for label, size in zip(sys.argv[1::2], sys.argv[2::2]):
    path = os.path.join(folder, label + ".bin")
    with open(path, "wb") as f:
        f.write(os.urandom(int(size)))

    def use():
        import os
        import jupyter_dlsched as dls
        return os.path.getsize(dls.data("train"))

    h = dls.Scheduler(loop=False).submit(use, stage_in={"train": path}, name=label)
    h.wait(timeout=120)
    out.append({"label": label, "path": path, "state": h.state, "reason": h.info().reason})
print(json.dumps({"folder": folder, "runs": out}))
"""


def script_line(proc: subprocess.Popen[str], timeout: float = 120.0) -> dict:
    """The next JSON line a user's script (``proc``, text pipes) prints; its stderr if it
    exits instead. A thread reads the lines: ``select`` on the pipe would wait on a line
    already read into the pipe's buffer with the one before (two lines printed at once)."""
    import json
    import queue
    import threading

    lines: queue.Queue[str] | None = getattr(proc, "_dlsched_lines", None)
    if lines is None:
        lines = queue.Queue()
        proc._dlsched_lines = lines
        stdout = proc.stdout
        assert stdout is not None

        def read(into: queue.Queue[str] = lines) -> None:
            for line in stdout:
                into.put(line)
            into.put("")  # the end

        threading.Thread(target=read, daemon=True).start()
    try:
        line = lines.get(timeout=timeout)
    except queue.Empty:
        line = ""
    if not line:
        proc.kill()
        raise AssertionError(f"no line from the user's script: {proc.stderr.read()}")  # type: ignore[union-attr]
    return json.loads(line)
