"""Stage-in from an ``http://`` file: the stager asks the server for zstd when the first MiB
compresses, reads plainly when it does not, and copies the same bytes either way."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from conftest import wait_for

from benchmarks.http_source import serving
from jupyter_dlsched.client.scheduler import Scheduler
from jupyter_dlsched.staging import sources
from jupyter_dlsched.staging.sources import HttpSource, StagingFailed, compresses

pytest.importorskip("zstandard")

MiB = 2**20


def text_like(path: Path, size: int) -> Path:
    """Numbers as a CSV holds them: compresses about 2-3× with zstd."""
    rng = __import__("random").Random(7)
    with open(path, "w") as f:
        while f.tell() < size:
            f.write(",".join(f"{rng.gauss(0, 1):.6f}" for _ in range(8)) + "\n")
    return path


def noise(path: Path, size: int) -> Path:
    path.write_bytes(os.urandom(size))
    return path


def read_input(name: str) -> str:
    """Runs in the job: the digest of what ``dls.data`` gives it."""
    import jupyter_dlsched as dls

    return hashlib.sha256(dls.data(name).read_bytes()).hexdigest()


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_sample_decides_whether_to_ask_for_zstd(tmp_path: Path) -> None:
    assert compresses(text_like(tmp_path / "t.csv", MiB).read_bytes()[: sources.SAMPLE])
    assert not compresses(noise(tmp_path / "n.bin", MiB).read_bytes())


def test_compressible_data_crosses_compressed_and_arrives_whole(
    sched: Scheduler, tmp_path: Path
) -> None:
    (tmp_path / "www").mkdir()
    data = text_like(tmp_path / "www" / "train.csv", 6 * MiB)
    with serving(tmp_path / "www") as server:
        job = sched.submit(read_input, "ds", stage_in={"ds": server.url("train.csv")})
        result = job.result(timeout=120)
        assert result == sha(data)
        [(plain, _), (zstd, squeezed)] = zip(server.seen, server.sent, strict=True)
        assert plain == ("/train.csv", "plain") and zstd == ("/train.csv", "zstd")
        assert squeezed < 0.8 * data.stat().st_size  # it crossed smaller
    [staged] = [e["reason"] for e in sched.store.events(job.id) if " staged: " in e["reason"]]
    assert staged.endswith("zstd in transfer)"), staged


def test_incompressible_data_is_read_plainly_in_one_request(tmp_path: Path) -> None:
    (tmp_path / "www").mkdir()
    data = noise(tmp_path / "www" / "shard.bin", 3 * MiB)
    with serving(tmp_path / "www") as server:
        source = HttpSource(server.url("shard.bin"))
        [listed] = source.listing()
        assert listed.size == data.stat().st_size and listed.stamp.startswith("ETag=")
        with source.open("") as reader:
            got = b"".join(iter(lambda: reader.read(MiB), b""))
        assert got == data.read_bytes()
        assert server.seen == [("/shard.bin", "plain")]
        assert source.encodings == {"": "plain"}


def test_a_server_that_ignores_the_ask_is_read_plainly(tmp_path: Path) -> None:
    (tmp_path / "www").mkdir()
    data = text_like(tmp_path / "www" / "train.csv", 3 * MiB)
    with serving(tmp_path / "www", compress=False) as server:
        source = HttpSource(server.url("train.csv"))
        with source.open("") as reader:
            got = b"".join(iter(lambda: reader.read(MiB), b""))
        assert got == data.read_bytes()
        assert source.encodings == {"": "plain"}
        assert [enc for _, enc in server.seen] == ["plain", "plain"]  # asked twice, plain both


def test_a_missing_url_fails_the_job_with_the_http_status(sched: Scheduler, tmp_path: Path) -> None:
    (tmp_path / "www").mkdir()
    with serving(tmp_path / "www") as server:
        with pytest.raises(StagingFailed, match="HTTP 404"):
            HttpSource(server.url("nope.csv")).listing()
        job = sched.submit(read_input, "ds", stage_in={"ds": server.url("nope.csv")})
        wait_for(lambda: job.state == "failed", timeout=60)
        assert "HTTP 404" in (job.info().reason or "")
