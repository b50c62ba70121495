"""Several processes submitting at once never double-allocate a GPU."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from jupyter_dlsched.client.scheduler import Scheduler
from jupyter_dlsched.store import TERMINAL

SUBMITTER = textwrap.dedent(
    """
    import sys
    from jupyter_dlsched.client.scheduler import Scheduler

    def tiny(i):
        return i

    with Scheduler(sys.argv[1]) as s:
        handles = [s.submit(tiny, i, gpus=1, cpus=0.1) for i in range(int(sys.argv[2]))]
        handles += [s.submit(tiny, i, gpu_mem="6GiB", cpus=0.1) for i in range(int(sys.argv[2]))]
        print(sum(h.result(timeout=240) for h in handles))
    """
)


def gpu_timeline_is_never_overbooked(events, mem_total):
    """Replay running intervals from the events table; check every GPU at every moment."""
    held: dict[str, tuple[list[int], list[int], bool]] = {}
    for event in events:
        if event["to_state"] == "running":
            placement = event["data"]["placement"]
            held[event["job_id"]] = (placement["gpus"], placement["gpu_mem"], placement["shared"])
        elif event["from_state"] == "running":
            held.pop(event["job_id"], None)
        per_gpu: dict[int, list[tuple[int, bool]]] = {}
        for gpus, mems, shared in held.values():
            for gpu, mem in zip(gpus, mems, strict=True):
                per_gpu.setdefault(gpu, []).append((mem, shared))
        for holders in per_gpu.values():
            if any(not shared for _, shared in holders):
                assert len(holders) == 1, holders
            assert sum(mem for mem, _ in holders) <= mem_total


def test_parallel_submitters_never_exceed_capacity(home, tmp_path):
    script = tmp_path / "submit.py"
    script.write_text(SUBMITTER)
    n_procs, per_proc = 3, 8
    with Scheduler(home, loop=False):
        pass  # create the ledger once, so the submitters race on jobs, not on set-up
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(home), str(per_proc)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(n_procs)
    ]
    outputs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err
        assert int(out) == 2 * sum(range(per_proc))
    with Scheduler(home, loop=False) as s:
        jobs = s.jobs()
        assert len(jobs) == 2 * n_procs * per_proc
        assert all(j.state == "succeeded" for j in jobs)
        assert all(j.state in TERMINAL for j in jobs)
        gpu_timeline_is_never_overbooked(s.store.events(), 16 * 2**30)
        assert s.store.integrity_check() == "ok"
