"""The per-user pool agent: one writer, clients over its socket, jobs that outlive it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import wait_for

from jupyter_dlsched.agent.client import AgentClient, user_address
from jupyter_dlsched.agent.protocol import AgentUnavailable
from jupyter_dlsched.client.scheduler import Scheduler
from jupyter_dlsched.vocab.errors import JobNotFound, SpecError


def sleeper(seconds, value=None):

    time.sleep(seconds)
    return value if value is not None else seconds


def agent_pids(home):
    """Agent processes serving ``home`` (there must never be two); a child the agent has
    just forked, which carries its name until it takes its own, is not one."""
    found = {}
    for p in psutil.process_iter(["cmdline", "name", "ppid"]):
        cmd = p.info["cmdline"] or []
        if p.info["name"] == "dlsched-agent" and str(home) in cmd:
            found[p.pid] = p.info["ppid"]
    return [pid for pid, parent in found.items() if parent not in found]


@pytest.fixture
def agent_sched(home):
    """A scheduler that works through this user's agent (started on first use)."""
    with Scheduler(home, agent=True, lease_ttl=3.0, grace=2.0) as s:
        yield s
    for pid in agent_pids(home):
        os.kill(pid, signal.SIGTERM)


def test_a_request_is_checked_against_its_shape_at_the_door(agent_sched, home):
    """A field the op does not take, one it needs, or a value of the wrong kind: refused with
    one line naming it, before the handler runs (an unknown field used to pass in silence)."""
    from jupyter_dlsched.agent.protocol import ProtocolError

    client = AgentClient(user_address(home))
    with pytest.raises(
        ProtocolError, match=r"^a malformed 'cancel' request: it needs the field 'id'$"
    ):
        client.call("cancel")  # type: ignore[call-overload]
    with pytest.raises(
        ProtocolError, match=r"a malformed 'jobs' request: no field 'colour' \(it takes"
    ):
        client.call("jobs", colour="red")  # type: ignore[call-overload]
    with pytest.raises(
        SpecError, match=r"^limit='ten' is invalid: expected a whole number or null$"
    ):
        client.call("jobs", limit="ten")  # type: ignore[arg-type]
    with pytest.raises(SpecError, match=r"^inline=1 is invalid: expected true or false$"):
        client.call(
            "submit", [], kind="command", jobs=[], default_name="x", origin="", options={},
            inline=1, backend="local",
        )  # type: ignore[arg-type]  # fmt: skip
    assert client.call("ping") == {"ok": True}  # the agent goes on


def test_events_are_answered_a_page_at_a_time(agent_sched, home):
    """A whole ledger's events in one reply held the agent's one thread for most of a second
    at 100,000 events: a page is at most 2,000 events, and the client reads every page."""
    from jupyter_dlsched.agent.reads import MAX_EVENT_ROWS

    s = agent_sched
    holder = s.submit(sleeper, 60, gpus=2)
    queued = s.map(sleeper, [0] * (MAX_EVENT_ROWS + 100), gpus=1, priority="low")
    client = AgentClient(user_address(home))
    first = client.call("events", limit=10**6)
    assert len(first["events"]) == MAX_EVENT_ROWS and first["more"] is True
    every = first["events"]
    while True:  # as a shared pool's client reads them (link.RemoteLedger.events)
        reply = client.call("events", since=int(every[-1]["seq"]), limit=10**6)
        every += reply["events"]
        if not reply["more"]:
            break
    assert len(every) > MAX_EVENT_ROWS + 100
    assert [e["seq"] for e in every] == sorted({e["seq"] for e in every})  # none twice
    # left queued, they would run after the test: the holder's end starts an agent again
    for job in queued:
        job.cancel()
    holder.cancel()


def test_a_client_submits_steers_and_reads_through_the_agent(agent_sched, home):
    s = agent_sched
    assert s.link is not None and s.link.hello["mode"] == "user"
    assert agent_pids(home) == [s.link.hello["pid"]]
    assert s.submit(pow, 2, 10).result(timeout=30) == 1024
    assert [h.result(timeout=30) for h in s.map(abs, [-1, -2, -3])] == [1, 2, 3]
    command = s.submit_command([sys.executable, "-c", "print('hi')"], name="greet")
    assert command.result(timeout=30) == 0 and "hi" in command.logs()
    # every change went through the agent: the jobs were written by the agent's process
    assert {j.owner for j in s.jobs()} == {os.environ.get("USER") or s.owner}
    waiting = s.submit(sleeper, 30, gpus=2)
    blocked = s.submit(sleeper, 0, gpus=1, priority="low")
    wait_for(lambda: waiting.state == "running")
    assert s.set_priority(blocked.id, "high").priority == 100
    assert wait_for(lambda: blocked.info().waiting) == "waiting for 1 GPU"
    assert s.cancel(waiting.id).cancel_requested or waiting.state == "cancelled"
    assert waiting.wait(timeout=30).state == "cancelled"
    assert blocked.result(timeout=30) == 0
    with pytest.raises(SpecError, match="gpus=9"):
        s.submit(pow, 2, 1, gpus=9)
    with pytest.raises(JobNotFound):
        s.cancel("nosuchjob")
    assert s.status()["pool"]["mode"] == "user"


def test_submit_to_running_is_decided_by_the_agent_without_a_client_tick(agent_sched):
    s = agent_sched
    s.close()  # no loop in this process: only the agent can start the job
    client = AgentClient(s.link.client.address, home=s.home)
    handle = Scheduler(s.home, agent=True, loop=False).submit(sleeper, 0.2, 7)
    wait_for(lambda: client.call("get", id=handle.id)["job"]["state"] == "succeeded")
    client.close()


def test_killing_the_agent_loses_no_job_and_a_new_agent_moves_the_queue_on(agent_sched, home):
    s = agent_sched
    first = [s.submit(sleeper, 3, i, gpus=1) for i in range(2)]
    third = s.submit(sleeper, 0.5, 2, gpus=1)
    wait_for(lambda: all(h.info().job_pid for h in first))
    supervisors = [h.info().supervisor_pid for h in first]
    [agent] = agent_pids(home)
    os.kill(agent, signal.SIGKILL)
    wait_for(lambda: not psutil.pid_exists(agent) or _zombie(agent))
    # the running jobs are not the agent's to lose: their supervisors carry on
    assert all(psutil.pid_exists(pid) for pid in supervisors)
    assert third.state == "queued"
    # the next client starts a fresh agent, which adopts the ledger as it is
    with Scheduler(home, agent=True) as again:
        assert again.link.hello["pid"] != agent
        assert [again.get(h.id).result(timeout=60) for h in first] == [0, 1]
        assert again.get(third.id).result(timeout=60) == 2
    # never more than two 1-GPU jobs at once on the two GPUs
    spans = []
    for h in [*first, third]:
        info = h.info()
        spans.append((info.started, info.finished))
    assert not any(
        a[0] < b[0] < a[1] and c[0] < b[0] < c[1]
        for a in spans
        for b in spans
        for c in spans
        if len({a, b, c}) == 3
    )
    assert len(agent_pids(home)) == 1


def _zombie(pid):
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_client_uses_an_agent_another_process_started(home):
    env = {**os.environ, "DLSCHED_HOME": str(home)}
    agent = subprocess.Popen(
        [sys.executable, "-m", "jupyter_dlsched.agent", "--home", str(home), "--idle-exit", "60"],
        env=env,
    )
    try:
        client = AgentClient(user_address(home))
        wait_for(lambda: _answers(client), timeout=30)
        with Scheduler(home, agent=True) as s:
            assert s.link.hello["pid"] == agent.pid
            assert s.submit(pow, 3, 3).result(timeout=30) == 27
        # a second agent for the same folder steps aside: one writer per ledger
        second = subprocess.run(
            [sys.executable, "-m", "jupyter_dlsched.agent", "--home", str(home)],
            env=env,
            timeout=60,
        )
        assert second.returncode == 0 and agent.poll() is None
        client.call("stop")
        assert agent.wait(timeout=30) == 0
        with pytest.raises(AgentUnavailable):
            AgentClient(user_address(home)).call("ping")
    finally:
        agent.kill()
        agent.wait()


def _answers(client):
    try:
        client.call("ping")
    except AgentUnavailable:
        return False
    return True


def test_the_agent_refuses_a_peer_of_another_uid(agent_sched, other_user, home):
    s = agent_sched
    address = s.link.client.address
    attack = other_user.run(
        """
import json, socket, struct, sys
address = bytes.fromhex(sys.argv[1])
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(address)
head = json.dumps({"op": "submit", "kind": "command", "options": {},
                   "jobs": [{"files": {"command.json": 0}}], "blobs": [22]}).encode()
try:
    s.sendall(struct.pack(">I", len(head)) + head + b'{"argv": ["/bin/id"]}  ')
except OSError:
    pass
data = b""
while True:
    chunk = s.recv(65536)
    if not chunk:
        break
    data += chunk
n = struct.unpack(">I", data[:4])[0]
print(json.loads(data[4:4 + n])["error"]["message"])
""",
        address.hex(),
    )
    assert attack.returncode == 0, attack.stderr
    assert f"serves uid {os.getuid()} only" in attack.stdout
    assert [j.kind for j in s.jobs()] == []  # nothing was queued


def test_the_cli_works_through_the_agent(home, tmp_path):
    env = {**os.environ, "DLSCHED_HOME": str(home), "DLSCHED_AGENT": "1"}
    dlsched = os.path.join(os.path.dirname(sys.executable), "dlsched")
    try:
        done = subprocess.run(
            [dlsched, "submit", "--wait", "--name", "echo", "--", "sh", "-c", "echo hi; exit 3"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 3, done.stderr
        assert "hi" in done.stdout
        status = subprocess.run(
            [dlsched, "status"], env=env, capture_output=True, text=True, timeout=60
        )
        assert status.returncode == 0, status.stderr
        assert "pool: yours alone, agent pid" in status.stdout
    finally:
        for pid in agent_pids(home):
            os.kill(pid, signal.SIGTERM)


def test_dlsched_agent_0_uses_the_ledger_without_an_agent(home):
    env = {**os.environ, "DLSCHED_HOME": str(home), "DLSCHED_AGENT": "0"}
    dlsched = os.path.join(os.path.dirname(sys.executable), "dlsched")
    done = subprocess.run(
        [dlsched, "submit", "--wait", "--", "sh", "-c", "echo direct"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "direct" in done.stdout
    status = subprocess.run(
        [dlsched, "status"], env=env, capture_output=True, text=True, timeout=60
    )
    assert f"pool: yours alone, state in {home}" in status.stdout, status.stdout
    assert agent_pids(home) == []
    assert not (home / "agent.log").exists()


def test_malformed_messages_end_only_their_own_connection(agent_sched):
    import json
    import socket
    import struct

    address = agent_sched.link.client.address
    attacks = [
        b"[" * 200_000 + b"]" * 200_000,  # nesting deeper than the JSON parser goes
        b"not json at all",
        json.dumps({"op": "submit", "blobs": [-1]}).encode(),
        json.dumps({"op": "no such request"}).encode(),
    ]
    for head in attacks:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(10)
            sock.connect(address)
            sock.sendall(struct.pack(">I", len(head)) + head)
            reply = sock.recv(65536)
            assert b'"ok":false' in reply, reply[:200]
    # a held `changes` request followed by bytes that are no message
    seq = AgentClient(address).call("seq")["seq"]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(address)
        held = json.dumps({"op": "changes", "since": seq + 10**6, "wait": 0.2}).encode()
        sock.sendall(struct.pack(">I", len(held)) + held + b"\xff\xff\xff\xff")
        assert b'"ok":true' in sock.recv(65536)
    assert AgentClient(address).call("ping")["ok"]
    assert agent_sched.submit(pow, 2, 5).result(timeout=30) == 32


def test_a_client_refuses_an_agent_of_another_user_in_its_place(other_user, home):
    # another user takes the name of this user's agent before it starts
    squatter = subprocess.Popen(
        other_user.command(
            "/usr/bin/python3",
            "-c",
            "import socket, sys, time\n"
            "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
            "s.bind(bytes.fromhex(sys.argv[1])); s.listen(8); print('ready', flush=True)\n"
            "time.sleep(60)",
            user_address(home).hex(),
        ),
        stdout=subprocess.PIPE,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    try:
        assert squatter.stdout.readline().strip() == "ready"
        with pytest.raises(AgentUnavailable, match=f"served by uid {other_user.uid}"):
            Scheduler(home, agent=True)
    finally:
        squatter.kill()
        squatter.wait()


def test_long_event_lists_come_a_page_at_a_time(agent_sched, monkeypatch):
    from jupyter_dlsched.agent.link import RemoteLedger

    jobs = [agent_sched.submit(pow, 2, i) for i in range(3)]
    for job in jobs:
        job.result(timeout=30)
    client = agent_sched.link.client
    first = client.call("events", since=0, limit=2)
    assert len(first["events"]) == 2 and first["more"] is True
    with pytest.raises(SpecError):
        client.call("events", since=0, limit=0)
    everything = agent_sched.store.events()
    assert len(everything) >= 9  # queued, running, succeeded for each job
    monkeypatch.setattr(RemoteLedger, "PAGE", 2)
    remote = RemoteLedger(agent_sched.link)
    assert [e["seq"] for e in remote.events()] == [e["seq"] for e in everything]
    assert [e["seq"] for e in remote.events(jobs[1].id)] == [
        e["seq"] for e in everything if e["job_id"] == jobs[1].id
    ]
    changes = remote.state_changes_since(0)
    assert [c[0] for c in changes] == [e["seq"] for e in everything]


def test_a_shared_socket_is_created_open_to_all_and_a_planted_link_is_not_followed(tmp_path):
    import shutil
    import tempfile

    from jupyter_dlsched.agent.service import Agent

    target = tmp_path / "precious"
    target.write_text("keep")
    target.chmod(0o600)
    # a folder of root's (a socket under /tmp would be refused: anyone may write there)
    run = Path(tempfile.mkdtemp(prefix="dlsched-test-", dir="/run"))
    sock = run / "dlsched.sock"
    sock.symlink_to(target)
    agent = Agent(tmp_path / "pool", socket_path=sock)
    try:
        assert agent.bind()
        assert sock.is_socket() and not sock.is_symlink()
        assert sock.stat().st_mode & 0o777 == 0o666
        assert target.stat().st_mode & 0o777 == 0o600 and target.read_text() == "keep"
    finally:
        agent.close()
        shutil.rmtree(run)


def test_an_idle_agent_exits_and_the_next_client_starts_another(home, monkeypatch):
    monkeypatch.setenv("DLSCHED_AGENT_IDLE", "1")
    with Scheduler(home, agent=True) as s:
        assert s.submit(pow, 2, 4).result(timeout=30) == 16
        first = int(s.link.hello["pid"])
    wait_for(lambda: _zombie(first), timeout=30)  # nobody connected, nothing waiting
    with Scheduler(home, agent=True) as s:
        assert int(s.link.hello["pid"]) != first
        assert s.submit(pow, 2, 5).result(timeout=30) == 32


def test_a_client_replaces_an_agent_that_runs_other_code(home):
    from pathlib import Path

    import jupyter_dlsched.agent.service as service

    with Scheduler(home, agent=True) as s:
        first = int(s.link.hello["pid"])
        job = s.submit(sleeper, 3, "survived")
        wait_for(lambda: job.state == "running", timeout=30)
    source = Path(service.__file__)
    before = source.stat()
    try:
        # an upgrade: the agent's code on disk is newer than the running agent
        os.utime(source, ns=(before.st_atime_ns, time.time_ns()))
        time.sleep(2.1)  # this process re-reads the stamp at most every 2 s
        with Scheduler(home, agent=True) as s:
            assert int(s.link.hello["pid"]) != first
            assert _zombie(first)  # one agent per ledger: the old one was stopped
            # its running job carried on under its supervisor
            assert s.get(job.id).result(timeout=30) == "survived"
    finally:
        os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns))


def _keys_fit(reply, shape):
    """The reply's fields (less its ``ok``) are its shape's: every required one, no other."""
    fields = set(reply) - {"ok"}
    required, optional = shape.__required_keys__, shape.__optional_keys__
    return required <= fields <= required | optional


def test_a_round_trip_of_each_kind_of_request_answers_with_its_reply_shape(agent_sched):
    from jupyter_dlsched.agent.shapes import OPS

    s = agent_sched
    done = s.submit(pow, 2, 3)
    assert done.result(timeout=30) == 8
    waiting = s.submit(sleeper, 30)  # steered (priority, cancel) before it ends
    client = s.link.client
    replies = {
        "hello": client.call("hello"),
        "ping": client.call("ping"),
        "get": client.call("get", id=done.id),
        "jobs": client.call("jobs", states=["succeeded"], limit=10),
        "finished": client.call("finished", since=0.0),
        "count": client.call("count"),
        "seq": client.call("seq"),
        "status": client.call("status"),
        "changes": client.call("changes", since=0),
        "events": client.call("events", id=done.id),
        "meta": client.call("meta", key="settings"),
        "progress": client.call("progress", id=done.id, progress={"done": 1}),
        "priority": client.call("priority", id=waiting.id, priority="high"),
        "cancel": client.call("cancel", id=waiting.id),
        "tick": client.call("tick"),
        "settings": client.call("settings", grace=2.0),
        "cache": client.call("cache"),
        "samples": client.call("samples", since=0.0),
        "schedules": client.call("schedules"),
    }
    misfits = {op: sorted(r) for op, r in replies.items() if not _keys_fit(r, OPS[op][1])}
    assert not misfits, f"replies whose fields are not their shape's: {misfits}"
    assert replies["get"]["job"]["state"] == "succeeded"
    assert replies["progress"]["recorded"] is False  # the job has ended
    assert replies["cancel"]["job"]["id"] == waiting.id


def test_an_interrupted_changes_wait_ends_at_once_not_on_a_second_connection(home):
    """A closing Scheduler interrupts its loop's ``changes`` long-poll: the call must fail
    then, not reconnect and wait its whole time again (each close took a second more)."""
    import threading

    with Scheduler(home) as s:
        since = s.store.last_event_seq()
        watcher = AgentClient(user_address(home), home)
        ended: list[BaseException] = []

        def wait() -> None:
            try:
                watcher.call("changes", since=since, wait=30)
            except AgentUnavailable as error:
                ended.append(error)

        thread = threading.Thread(target=wait, daemon=True)
        thread.start()
        wait_for(lambda: watcher._sock is not None, 10)
        time.sleep(0.2)  # the request is held by the agent now (nothing changes meanwhile)
        watcher.interrupt()
        thread.join(timeout=15)  # a retry would hold it for the wait's 30 s
        assert not thread.is_alive(), "the interrupted wait went on on a new connection"
        assert len(ended) == 1
        watcher.close()


def test_a_stopped_agent_takes_no_new_connection_and_the_next_client_starts_another(home):
    """Once ``stop`` is answered the socket no longer answers: a client right behind it
    starts a new agent instead of reaching the one shutting down ("lost the connection …
    while submitting" before), and its submission is served (it also lost its connection
    when the agent it reached was one a supervisor had started as its job ended:
    ``test_an_agent_a_supervisor_starts_is_the_pools_not_part_of_its_job``)."""
    import socket

    for n in range(3):
        with Scheduler(home, agent=True) as s:
            assert s.submit(pow, 2, n).result(timeout=60) == 2**n
            first = int(s.link.hello["pid"])
        AgentClient(user_address(home)).call("stop")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with pytest.raises(OSError):
            probe.connect(user_address(home))
        probe.close()
        with Scheduler(home, agent=True) as s:
            assert int(s.link.hello["pid"]) != first
            assert s.submit(pow, 3, n).result(timeout=60) == 3**n


def test_an_agent_whose_state_folder_was_removed_and_made_again_serves_no_more(home):
    """``rm -rf`` of the state folder while its agent runs, then a new client at once: the
    folder exists again (the client made it), but the old agent's ledger is gone. It must
    not take the new client's jobs into the removed ledger (they were "not found")."""
    import shutil

    with Scheduler(home, agent=True) as s:
        assert s.submit(pow, 2, 3).result(timeout=60) == 8
        first = int(s.link.hello["pid"])
    # the agent may write a file into it meanwhile (as under a user's rm -rf): again
    wait_for(lambda: shutil.rmtree(home, ignore_errors=True) or not home.exists(), timeout=30)
    with Scheduler(home, agent=True) as s:
        h = s.submit(pow, 2, 4)
        assert h.result(timeout=60) == 16
        assert s.get(h.id).info().state == "succeeded"
        assert int(s.link.hello["pid"]) != first
    wait_for(lambda: _zombie(first) or not psutil.pid_exists(first), timeout=30)


def test_an_agent_exits_once_its_state_folder_is_removed_even_if_made_again(home):
    """Nothing an agent holds is anyone's once its ledger is removed: it exits by itself,
    with no client to replace it, also when the folder has been made again since."""
    import shutil

    from jupyter_dlsched.store import Store

    with Scheduler(home, agent=True) as s:  # connected: no idle exit meanwhile
        assert s.submit(pow, 2, 5).result(timeout=60) == 32
        first = int(s.link.hello["pid"])
        wait_for(lambda: shutil.rmtree(home, ignore_errors=True) or not home.exists(), 30)
        Store(home)  # a new, empty ledger where it was
        wait_for(lambda: _zombie(first) or not psutil.pid_exists(first), timeout=30)


def _held_until(release: str) -> str:
    Path(release + ".started").touch()
    while not Path(release).exists():
        time.sleep(0.02)
    return "released"


def test_an_agent_a_supervisor_starts_is_the_pools_not_part_of_its_job(home, tmp_path):
    """A job whose result comes while no agent runs: its supervisor starts one to decide what
    starts next. That agent is the pool's, not one of the job's processes: the supervisor's
    end-of-job sweep of what the job left behind killed it (a client that had just reached
    it lost its connection while submitting)."""
    release = str(tmp_path / "go")
    with Scheduler(home, agent=True) as s:
        h = s.submit(_held_until, release)
        wait_for(Path(release + ".started").exists, timeout=60)
        first = int(s.link.hello["pid"])
        supervisor = s.get(h.id).info().supervisor_pid
    assert supervisor
    AgentClient(user_address(home)).call("stop")
    wait_for(lambda: _zombie(first) or not psutil.pid_exists(first), timeout=30)
    Path(release).touch()  # the result is written: the supervisor tells the agent, no agent runs
    agent = wait_for(lambda: agent_pids(home), timeout=60)[0]
    assert supervisor not in [p.pid for p in psutil.Process(agent).parents()]
    wait_for(lambda: not psutil.pid_exists(supervisor) or _zombie(supervisor), timeout=60)
    assert psutil.Process(agent).status() != psutil.STATUS_ZOMBIE
    with Scheduler(home, agent=True) as s:
        assert s.get(h.id).result(timeout=60) == "released"
        assert s.submit(pow, 2, 5).result(timeout=60) == 32
        assert int(s.link.hello["pid"]) == agent
