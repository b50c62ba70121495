"""A job process of a shared pool, in a fresh interpreter of the job's owner.

The supervisor (the pool's service, root) forks the job process, which becomes
the job's owner, writes the payload into the owner's spool folder, and
executes ``python -m jupyter_dlsched.local.jobrun FOLDER RANK`` with the owner's
interpreter (the one that submitted the job). So nothing of the service — its
memory, its open ledger — is reachable from the job's code.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..vocab import private
from .jobproc import run_python


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    folder, rank = Path(args[0]), int(args[1])
    meta_path, payload_path = folder / f"job-{rank}.json", folder / f"payload-{rank}.pkl"
    meta = json.loads(private.read_file(meta_path) or b"{}")
    payload = private.read_file(payload_path) or b""
    meta_path.unlink(missing_ok=True)
    payload_path.unlink(missing_ok=True)
    for entry in reversed(meta.get("sys_path") or []):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    return run_python(folder, payload, rank)


if __name__ == "__main__":
    sys.exit(main())
