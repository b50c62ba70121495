"""What staging while queued wins: a job's first pass over its data, with and without stage-in.

    python benchmarks/stage_in.py [--size 512MiB] [--files 8] [--rate 100MB] [--blocker 30]
    python benchmarks/stage_in.py --http [--size 256MiB] [--files 4] [--rate 100MB]

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

``--http``: compressed transfer. The files are served over HTTP on loopback
through one link paced at ``--rate`` (``benchmarks/http_source.py``), once
compressible (numbers as CSV text) and once not (random bytes); a job staging
all of them is submitted to an idle pool and the time from submit to its start
is the staging time. Each kind is staged twice in the same run: from a server
that answers ``Accept-Encoding: zstd`` (the stager asks when its sample
compresses) and from one that does not (an uncompressed copy).
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
    from jupyter_dlsched.client.scheduler import Scheduler

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


def csv_like(path: Path, size: int, seed: int) -> None:
    """Numbers as CSV text (8 columns, 6 decimals): what compresses, like most tabular data."""
    import numpy as np

    rng = np.random.default_rng(seed)
    with open(path, "wb") as f:
        while f.tell() < size:
            rows = rng.standard_normal((65536, 8))
            f.write(("\n".join(",".join(f"{x:.6f}" for x in row) for row in rows) + "\n").encode())


def touch() -> str:
    return "started"


def http_run(folder: Path, root: Path, compress: bool, rate: float) -> dict[str, Any]:
    from http_source import serving

    from jupyter_dlsched.client.scheduler import Scheduler
    from jupyter_dlsched.local import launcher

    home = root / f"home-http-{folder.name}-{compress}"
    names = sorted(p.name for p in folder.iterdir())
    with serving(folder, compress=compress, rate=rate) as server, Scheduler(home) as s:
        submitted = time.time()
        inputs = {f"f{i}": server.url(name) for i, name in enumerate(names)}
        job = s.submit(touch, gpus=1, stage_in=inputs)
        job.result(timeout=3600)
        staged = [e["reason"] for e in s.store.events(job.id) if " staged: " in e["reason"]]
        row = {
            "data": folder.name,
            "server": "zstd when asked" if compress else "plain only",
            "staging_s": (job.info().started or 0) - submitted,
            "wire_bytes": sum(server.sent),
            "zstd_files": sum(1 for _, enc in server.seen if enc == "zstd"),
            "staged": staged,
        }
    launcher.stop(home)
    return row


def http_main(size: int, files: int, rate: float, rate_text: str) -> None:
    from jupyter_dlsched.vocab.units import format_size

    root = Path(tempfile.mkdtemp(prefix="dlsched-stage-http-"))
    rows = []
    try:
        for kind in ("compressible", "incompressible"):
            folder = root / kind
            folder.mkdir()
            for i in range(files):
                name = folder / f"part-{i:03d}.{'csv' if kind == 'compressible' else 'bin'}"
                if kind == "compressible":
                    csv_like(name, size // files, seed=i)
                else:
                    make_dataset(root / "noise", size // files, 1)
                    (root / "noise" / "shard-000.bin").rename(name)
                    (root / "noise").rmdir()
            rows += [http_run(folder, root, compress, rate) for compress in (False, True)]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(
        f"\n~{format_size(size)} in {files} files per kind over one link paced at {rate_text}/s; "
        f"{platform.node()} ({os.cpu_count()} cores)\n"
    )
    print("| data | server | files sent zstd | bytes on the link | staging (s) | speed-up |")
    print("|---|---|---:|---:|---:|---:|")
    for plain, squeezed in (rows[0:2], rows[2:4]):
        for r in (plain, squeezed):
            gain = plain["staging_s"] / r["staging_s"]
            print(
                f"| {r['data']} | {r['server']} | {r['zstd_files']} | "
                f"{format_size(r['wire_bytes'])} | {r['staging_s']:.2f} | {gain:.2f}× |"
            )
    print("\n" + json.dumps({"rows": rows}))


def main() -> None:
    from jupyter_dlsched.vocab.units import format_size, parse_size

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="512MiB")
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--rate", default="100MB", help="bytes per second of the source")
    parser.add_argument("--blocker", type=float, default=30.0, help="seconds")
    parser.add_argument("--http", action="store_true", help="compressed transfer over HTTP")
    args = parser.parse_args()
    os.environ["DLSCHED_SIMULATE_GPUS"] = "2x16GiB"
    if args.http:
        size = parse_size(args.size) if args.size != "512MiB" else parse_size("256MiB")
        files = args.files if args.files != 8 else 4
        http_main(size, files, float(parse_size(args.rate)), args.rate)
        return
    size, rate = parse_size(args.size), float(parse_size(args.rate))
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
