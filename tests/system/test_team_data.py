"""Big buffers in a shared pool: each user's in a folder of their own that only their
jobs read; the service counts and deletes them, and nobody can reach another's."""

from __future__ import annotations

import json
import os

import pytest
from team_pool import shared_pool

MIB = 2**20

#: A's job: a 4 MiB array argument, of which the job returns its size and first bytes and
#: which data files it maps; the client prints the job, its buffer folder and the result
SUBMIT_BIG = """
import json, sys
import jupyter_dlsched as dls

def look(data):
    with open("/proc/self/maps") as maps:
        mapped = sorted({line.split()[-1] for line in maps if "/dlsched-" in line})
    return [data.nbytes, data[:3].tobytes().hex(), mapped]

s = dls.Scheduler(loop=False)
import numpy as np
payload = np.frombuffer(b"\\x01\\x02\\x03" + bytes(4 * 2**20), np.uint8).copy()
h = s.submit(look, payload, cpus=0.25)
from jupyter_dlsched.store import buffers
print(json.dumps({"id": h.id, "folder": str(buffers.buffer_folder(s.home)),
                  "result": h.result(timeout=120)}))
"""

#: B's attempts on A's folder: read a file, plant one, list it
ATTACK = """
import json, os, sys
folder, name = sys.argv[1], sys.argv[2]
tried = {}
for what, act in (
    ("read", lambda: open(os.path.join(folder, name), "rb").read(1)),
    ("plant", lambda: open(os.path.join(folder, "0" * 64), "wb").write(b"x")),
    ("list", lambda: os.listdir(folder)),
):
    try:
        act()
        tried[what] = "done"
    except OSError as error:
        tried[what] = type(error).__name__
print(json.dumps(tried))
"""

#: B submits a payload naming A's data file: refused at submit
STEAL = """
import json, sys
import jupyter_dlsched as dls
from jupyter_dlsched.store import buffers
s = dls.Scheduler(loop=False)
header = json.dumps({"folder": sys.argv[1], "buffers": [[sys.argv[2], 4 * 2**20 + 3]]}).encode()
data = buffers.MAGIC + len(header).to_bytes(4, "big") + header + buffers.dumps(
    {"fn": len, "args": (b"",), "kwargs": {}}, None)
try:
    s._insert("function", {"payload.pkl": data}, default_name="steal", cpus=0.25)
    print("accepted")
except Exception as error:
    print(type(error).__name__, error)
"""


@pytest.fixture
def users(team_users):
    return team_users


def test_a_users_data_travels_in_their_own_folder_that_no_other_user_can_reach(users):
    a, b = users
    with shared_pool() as service:
        done = service.as_user(a, SUBMIT_BIG, timeout=180)
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout)
        size, head, mapped = out["result"]
        assert size == 4 * MIB + 3 and head == "010203"
        # it travelled as a file of A's that the job mapped, not through the service
        folder = out["folder"]
        [name] = os.listdir(folder)
        assert os.path.join(folder, name) in mapped
        st = os.stat(os.path.join(folder, name))
        assert st.st_uid == a.uid and st.st_mode & 0o777 == 0o600
        assert os.stat(folder).st_uid == a.uid and os.stat(folder).st_mode & 0o777 == 0o700
        assert service.job(out["id"])["state"] == "succeeded"

        attack = service.as_user(b, ATTACK, folder, name)
        assert attack.returncode == 0, attack.stderr
        assert json.loads(attack.stdout) == {
            "read": "PermissionError",
            "plant": "PermissionError",
            "list": "PermissionError",
        }
        steal = service.as_user(b, STEAL, folder, name)
        assert steal.returncode == 0, steal.stderr
        assert steal.stdout.startswith("SpecError") and "payload.pkl" in steal.stdout


#: A submits an array larger than the pool's payload limit; prints the refusal and what its
#: buffer folder holds after it
OVER_QUOTA = """
import json, os
import numpy as np
import jupyter_dlsched as dls
from jupyter_dlsched.store import buffers
from jupyter_dlsched.vocab.errors import DlschedError
s = dls.Scheduler(loop=False)
folder = buffers.buffer_folder(s.home)
try:
    s.submit(len, np.ones(8 * 2**20 // 8), cpus=0.25)
    refusal = None
except DlschedError as error:
    refusal = [type(error).__name__, str(error)]
left = sorted(os.listdir(folder)) if folder.exists() else []
print(json.dumps({"refusal": refusal, "left": left}))
"""


def test_data_over_the_users_payload_limit_is_refused_before_anything_is_written(users):
    """The service counts a submission's files against the user's max_payload_bytes; the
    client asks it for the room first, so an 8 MiB array over a 4 MiB limit is refused
    with the figures and nothing lands in the user's buffer folder (it used to be written,
    then refused, and left for the next sweep)."""
    a, _ = users
    with shared_pool('[limits]\nmax_payload_bytes = "4MiB"\n') as service:
        done = service.as_user(a, OVER_QUOTA, timeout=120)
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout)
    assert out["refusal"] is not None, out
    kind, words = out["refusal"]
    assert kind == "PermissionDenied", out
    assert "the limit per user is 4.0 MiB" in words and "adds 8.0 MiB" in words, words
    assert out["left"] == [], out
