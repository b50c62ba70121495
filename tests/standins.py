"""Stand-ins for the NVIDIA programs a machine without a GPU lacks: each records what it
was asked, in a file, and answers as the real one does. The tests put them on PATH, and so
does ``benchmarks/gpu_check.py --cpu``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

#: ``cuda-checkpoint``: ``--get-state`` and ``--toggle --pid PID`` over a state kept per pid
#: in a file; each toggle recorded as ``{"pid": ..., "to": "checkpointed" | "running"}``
CUDA_CHECKPOINT = """#!{python}
import json, os, sys
from pathlib import Path

calls, states = Path({calls!r}), Path({calls!r} + ".states")
args = sys.argv[1:]
if "--help" in args:
    print("usage: cuda-checkpoint --toggle --pid PID | --get-state --pid PID")
    sys.exit(0)
pid = args[args.index("--pid") + 1]
if not os.path.exists(f"/proc/{{pid}}"):
    print(f"Could not find process {{pid}}", file=sys.stderr)
    sys.exit(1)
known = json.loads(states.read_text()) if states.exists() else {{}}
state = known.get(pid, "running")
if "--get-state" in args:
    print(state)
elif "--toggle" in args:
    known[pid] = "checkpointed" if state == "running" else "running"
    states.write_text(json.dumps(known))
    with calls.open("a") as log:
        log.write(json.dumps({{"pid": int(pid), "to": known[pid]}}) + "\\n")
"""

#: ``nvidia-cuda-mps-control`` (a shell script, so that any user can run it): ``-d`` starts a
#: stand-in daemon, a command on stdin (``quit`` stops it); each call recorded with its user
MPS_CONTROL = """#!/bin/sh
# a stand-in nvidia-cuda-mps-control: -d starts a "daemon" (a sleep) and records who asked;
# otherwise it reads a command from stdin, and "quit" stops the daemon
pipe="$CUDA_MPS_PIPE_DIRECTORY"
if [ "$1" = "-d" ]; then
    sleep 600 </dev/null >/dev/null 2>&1 &
    echo $! > "$pipe/nvidia-cuda-mps-control.pid"
    printf '{{"args": ["-d"], "uid": %s, "pipe": "%s", "device": "%s", "pid": %s}}\\n' \\
        "$(id -u)" "$pipe" "$CUDA_VISIBLE_DEVICES" "$!" >> {log}
else
    read -r command
    if [ "$command" = quit ]; then kill "$(cat "$pipe/nvidia-cuda-mps-control.pid")"; fi
    printf '{{"args": [], "stdin": "%s", "uid": %s, "pipe": "%s"}}\\n' \\
        "$command" "$(id -u)" "$pipe" >> {log}
fi
"""


def install(folder: Path, name: str, calls: Path) -> Path:
    """Write the stand-in for ``name`` into ``folder`` (to put on PATH), recording its calls
    in ``calls``; returns the program."""
    folder.mkdir(parents=True, exist_ok=True)
    program = folder / name
    if name == "cuda-checkpoint":
        program.write_text(CUDA_CHECKPOINT.format(python=sys.executable, calls=str(calls)))
    elif name == "nvidia-cuda-mps-control":
        program.write_text(MPS_CONTROL.format(log=str(calls)))
    else:
        raise ValueError(f"no stand-in for {name}")
    program.chmod(0o755)
    return program


def recorded(calls: Path) -> list[dict]:
    """What a stand-in was asked, in order."""
    return [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []
