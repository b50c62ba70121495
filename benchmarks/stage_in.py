"""What staging while queued wins: a job's first pass over its data, with and without stage-in.

    python benchmarks/stage_in.py [--size 512MiB] [--files 8] [--rate 100MB] [--blocker 30]

A dataset of ``--files`` files (``--size`` in all) is read from a throttled
source (``--rate`` bytes per second, standing in for a network file server).
A ``--blocker``-second job holds both (simulated) GPUs; a data job is queued
behind it and reads every file once (its "first pass"), through
``dls.data`` when it declared ``stage_in`` — the stager read the source
through the same throttle (``configure_cache(max_rate=...)``) while the
blocker ran — else straight from the source through a reader paced at the
same rate. The time from the data job's start to the end of its first pass is
what the overlap wins. Prints a Markdown table (quoted in docs/benchmarks.md)
and the numbers as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

CHUNK = 4 * 2**20


def make_dataset(path: Path, size: int, files: int) -> None:
    path.mkdir(parents=True)
    block = os.urandom(CHUNK)
    for i in range(files):
        with open(path / f"shard-{i:03d}.bin", "wb") as f:
            left = size // files
            while left > 0:
                f.write(block[: min(left, CHUNK)])
                left -= CHUNK


def blocker(seconds: float) -> None:
    time.sleep(seconds)


def first_pass(source: str, rate: float | None) -> dict[str, float]:
    """Runs in the job: read every file once; paced at ``rate`` when reading the source."""
    import jupyter_dlsched as dls

    began = time.time()
    folder = dls.data("ds") if rate is None else Path(source)
    total = 0
    for file in sorted(Path(folder).iterdir()):
        with open(file, "rb") as f:
            while chunk := f.read(CHUNK):
                total += len(chunk)
                if rate:
                    ahead = total / rate - (time.time() - began)
                    if ahead > 0:
                        time.sleep(ahead)
    return {"began": began, "ended": time.time(), "bytes": total}


def drop_page_cache(path: Path) -> None:
    """Forget the dataset's pages, so every run reads from the disk (best effort)."""
    for file in path.rglob("*"):
        if file.is_file():
            fd = os.open(file, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def run(mode: str, root: Path, source: Path, rate: float, blocker_s: float) -> dict[str, Any]:
    from jupyter_dlsched.scheduler import Scheduler

    home = root / f"home-{mode}"
    with Scheduler(home) as s:
        s.configure_cache(max_rate=int(rate))
        drop_page_cache(source)
        hold = s.submit(blocker, blocker_s, gpus=2, name="blocker")
        while hold.state != "running":
            time.sleep(0.05)
        submitted = time.time()
        if mode == "stage-in":
            job = s.submit(first_pass, str(source), None, gpus=1, stage_in={"ds": str(source)})
        else:
            job = s.submit(first_pass, str(source), rate, gpus=1)
        result = job.result(timeout=blocker_s + 600)
        hold.result(timeout=60)
        info = job.info()
        staged = [
            e["reason"] for e in s.store.events(job.id) if e["reason"].startswith("ds staged")
        ]
    from jupyter_dlsched.local import launcher

    launcher.stop(home)
    return {
        "mode": mode,
        "wait_s": (info.started or 0) - submitted,
        "first_pass_s": result["ended"] - result["began"],
        "start_to_pass_end_s": result["ended"] - (info.started or 0),
        "submit_to_pass_end_s": result["ended"] - submitted,
        "bytes": result["bytes"],
        "staged": staged[0] if staged else "",
    }


def main() -> None:
    from jupyter_dlsched.units import format_size, parse_size

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="512MiB")
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--rate", default="100MB", help="bytes per second of the source")
    parser.add_argument("--blocker", type=float, default=30.0, help="seconds")
    args = parser.parse_args()
    size, rate = parse_size(args.size), float(parse_size(args.rate))
    os.environ["DLSCHED_SIMULATE_GPUS"] = "2x16GiB"
    root = Path(tempfile.mkdtemp(prefix="dlsched-stage-in-"))
    try:
        source = root / "dataset"
        make_dataset(source, size, args.files)
        rows = [run(mode, root, source, rate, args.blocker) for mode in ("direct", "stage-in")]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(
        f"\n{format_size(size)} in {args.files} files, source read at {args.rate}/s, "
        f"{args.blocker:g} s blocker; {platform.node()} ({os.cpu_count()} cores)\n"
    )
    print("| mode | queued (s) | start → end of first pass (s) | submit → end of first pass (s) |")
    print("|---|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['mode']} | {r['wait_s']:.1f} | {r['start_to_pass_end_s']:.2f} "
            f"| {r['submit_to_pass_end_s']:.1f} |"
        )
    won = rows[0]["start_to_pass_end_s"] - rows[1]["start_to_pass_end_s"]
    print(f"\noverlap won: {won:.1f} s of the job's time on its GPU ({rows[1]['staged']})")
    print("\n" + json.dumps({"rows": rows, "overlap_won_s": won}))


if __name__ == "__main__":
    main()
