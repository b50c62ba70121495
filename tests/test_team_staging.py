"""Stage-in in a shared pool: a user's inputs are read with that user's rights, into a cache
entry that is theirs alone. Two real Unix users, a real service, real files."""

from __future__ import annotations

import json

from team_pool import shared_pool

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
