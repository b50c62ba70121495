"""Stage-in in a shared pool: a user's inputs are read with that user's rights, into a cache
entry that is theirs alone. Two real Unix users, a real service, real files."""

from __future__ import annotations

import json

from team_pool import STAGE_EACH, shared_pool

OWNER = r"""
import hashlib, json, os, tempfile
import jupyter_dlsched as dls
folder = tempfile.mkdtemp(prefix="dlsched-a-data-")   # 0700, the owner's: no one else reads it
path = os.path.join(folder, "data.bin")
with open(path, "wb") as f:
    f.write(os.urandom(1 << 20))

def use():
    import hashlib, os
    import jupyter_dlsched as dls
    staged = str(dls.data("train"))
    with open(staged, "rb") as f:
        return [hashlib.sha256(f.read()).hexdigest(), os.getuid(), staged]

h = dls.Scheduler(loop=False).submit(use, stage_in={"train": path}, name="a-stage")
with open(path, "rb") as f:
    print(json.dumps([h.result(timeout=120), hashlib.sha256(f.read()).hexdigest(), path, h.id]))
"""

INTRUDER = r"""
import json, os, sys
import jupyter_dlsched as dls
from jupyter_dlsched.agent.client import AgentClient
source, entry = sys.argv[1], sys.argv[2]

def steal():
    import jupyter_dlsched as dls
    with open(dls.data("train"), "rb") as f:
        return f.read().hex()

h = dls.Scheduler(loop=False).submit(steal, stage_in={"train": source}, name="b-stage")
h.wait(timeout=120)
out = {"state": h.state, "reason": h.info().reason, "id": h.id}
for what, call in (("list entry", lambda: os.listdir(os.path.dirname(entry))),
                   ("read entry", lambda: open(entry, "rb").read())):
    try:
        call()
        out[what] = "allowed"
    except PermissionError as error:
        out[what] = "denied"
cache = AgentClient(os.environ["DLSCHED_SOCKET"]).call("cache")["cache"]
out["cache items"] = [item["source"] for item in cache["items"]]
print(json.dumps(out))
"""


def test_a_users_input_is_staged_with_their_rights_and_no_one_else_reaches_it(team_users):
    import os

    a, b = team_users
    with shared_pool() as service:
        done = service.as_user(a, OWNER)
        assert done.returncode == 0, done.stderr + service.log.read_text()[-3000:]
        (digest, uid, entry), expected, source, a_job = json.loads(done.stdout)
        # A's job read the staged copy of A's file, as A
        assert (digest, uid) == (expected, a.uid)
        assert entry.startswith(str(service.home)) and entry != source
        st = os.stat(entry)
        assert (st.st_uid, st.st_mode & 0o777) == (a.uid, 0o400)
        assert (
            os.stat(os.path.dirname(entry)).st_uid,
            os.stat(os.path.dirname(entry)).st_mode & 0o777,
        ) == (a.uid, 0o700)
        try:
            intrusion = service.as_user(b, INTRUDER, source, entry)
            assert intrusion.returncode == 0, intrusion.stderr
            out = json.loads(intrusion.stdout)
            # B's job asking for the same file fails before it runs: B cannot read it
            assert out["state"] == "failed", out
            assert out["reason"].startswith("stage-in 'train': cannot read"), out["reason"]
            assert "Permission denied" in out["reason"], out["reason"]
            log = service.home / "spool" / out["id"] / "log"
            assert not log.exists() or expected not in log.read_text()
            # and B cannot reach A's cache entry, nor see it listed
            assert (out["list entry"], out["read entry"]) == ("denied", "denied")
            assert source not in out["cache items"]
            # the admin sees it
            from jupyter_dlsched.agent.client import AgentClient

            items = AgentClient(str(service.socket)).call("cache")["cache"]["items"]
            assert [i["source"] for i in items] == [source]
        finally:
            import subprocess

            subprocess.run(["rm", "-rf", os.path.dirname(source)], check=False)


def test_a_users_cache_quota_evicts_their_own_entries_and_never_anothers(team_users):
    """``max_cache_bytes``: a user's stage-ins make room among that user's own entries
    (least recently used first); another user's older entry stays; an input larger than
    the share is refused with the figures."""
    import os
    import subprocess

    from jupyter_dlsched.agent.client import AgentClient

    a, b = team_users
    KiB = 1024
    config = '[limits]\nmax_cache_bytes = "1536KiB"\n'
    folders = []
    with shared_pool(config) as service:
        try:
            first = service.as_user(b, STAGE_EACH, "b1", str(1024 * KiB))
            assert first.returncode == 0, first.stderr + service.log.read_text()[-3000:]
            b_runs = json.loads(first.stdout)
            folders.append(b_runs["folder"])
            assert b_runs["runs"][0]["state"] == "succeeded", b_runs

            done = service.as_user(
                a, STAGE_EACH, "a1", str(1024 * KiB), "a2", str(1024 * KiB), "a3", str(2048 * KiB)
            )
            assert done.returncode == 0, done.stderr + service.log.read_text()[-3000:]
            a_runs = json.loads(done.stdout)
            folders.append(a_runs["folder"])
            a1, a2, a3 = a_runs["runs"]
            assert (a1["state"], a2["state"]) == ("succeeded", "succeeded"), a_runs
            # larger than A's whole share: refused before anything is copied, with the figures
            assert a3["state"] == "failed"
            assert "more than your share of the data cache (1.5 MiB" in a3["reason"], a3

            items = AgentClient(str(service.socket)).call("cache")["cache"]["items"]
            cached = {item["source"] for item in items}
            # A's second input pushed out A's first, not B's older entry
            assert cached == {b_runs["runs"][0]["path"], a2["path"]}, cached
            view = service.as_user(
                a,
                "import json, os\nfrom jupyter_dlsched.agent.client import AgentClient\n"
                "c = AgentClient(os.environ['DLSCHED_SOCKET']).call('cache')['cache']\n"
                "print(json.dumps([c['user_bytes'], c['user_max_bytes'], len(c['items'])]))",
            )
            assert view.returncode == 0, view.stderr
            assert json.loads(view.stdout) == [1024 * KiB, 1536 * KiB, 1]
        finally:
            subprocess.run(["rm", "-rf", *folders], check=False)
            assert all(not os.path.exists(f) for f in folders)


HTTP_OWNER = r"""
import json, sys
import jupyter_dlsched as dls

def size():
    import jupyter_dlsched as dls
    return dls.data("train").stat().st_size

h = dls.Scheduler(loop=False).submit(size, stage_in={"train": sys.argv[1]}, name="a-http")
print(json.dumps([h.result(timeout=120), h.id]))
"""


def test_a_users_http_input_crosses_compressed_through_their_reader(team_users, tmp_path):
    import random

    from benchmarks.http_source import serving

    a, _ = team_users
    www = tmp_path / "www"
    www.mkdir()
    rng = random.Random(3)
    text = "".join(f"{rng.random():.6f},{rng.random():.6f}\n" for _ in range(200_000))
    (www / "train.csv").write_text(text)
    with serving(www) as server, shared_pool() as service:
        done = service.as_user(a, HTTP_OWNER, server.url("train.csv"))
        assert done.returncode == 0, done.stderr + service.log.read_text()[-3000:]
        got, job_id = json.loads(done.stdout)
        assert got == len(text)
        assert [enc for _, enc in server.seen] == ["plain", "zstd"]
        from jupyter_dlsched.agent.client import AgentClient

        events = AgentClient(str(service.socket)).call("events", id=job_id)
        assert "zstd in transfer" in json.dumps(events["events"]), events
