"""Big buffers travel beside a pickle, never inside it.

A notebook's arguments and results are GiB arrays, tensors and models. Pickled whole they
cross the agent's socket, sit in the ledger as a blob and are copied four to six times.
Instead, ``dumps`` pickles with protocol 5 and takes every buffer of 1 MiB or more out of
band: numpy arrays (and so pandas blocks), the storages of CPU torch tensors and models'
parameters, and ``pickle.PickleBuffer``s (``bytes`` and ``bytearray`` stay in band: pickle
never asks about them). Each is written once into a file named by its
content's SHA-256 (over its 16 MiB pieces' digests, hashed in parallel) in a folder of
the owner's (``buffer_folder``: in ``/dev/shm`` unless ``DLSCHED_BUFFERS`` names
another, 0700); the pickle keeps only their names and sizes, in
a header before it. ``loads`` maps each file copy-on-write: an array arrives without a
copy, and a job that writes into its argument changes its own pages only.

The ledger counts, per file, the unfinished jobs (and the ``requeue`` window) that need
it, as it does for its blobs (``store/payloads.py``), and deletes it after; an agent that
starts removes files nobody names (a submission killed half way). A job's result is
written by name, not by content, and has a life of its own (``results.py``).

>>> data = dumps({"x": numpy.zeros(2**20)}, folder)  # doctest: +SKIP
>>> loads(data)["x"].base  # doctest: +SKIP
<mmap.mmap ...>
"""

from __future__ import annotations

import hashlib
import io
import json
import mmap
import os
import pickle
import shutil
import stat
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import cloudpickle

from ..vocab.errors import DlschedError, SpecError, UnsafeStateFolder
from ..vocab.private import check_file, secure_folder
from ..vocab.tracebacks import Carrier, SourcePickler
from ..vocab.units import format_size
from .results import folder_owner, parse_name, settled_name

#: where buffer folders go when ``/dev/shm`` is small or missing
BUFFERS_ENV = "DLSCHED_BUFFERS"
#: a buffer this size or larger travels out of band
MIN_OUT_OF_BAND = 1 << 20
MAGIC = b"DLSB\x01"
#: the ledger names a buffer file so (``blob_refs.hash``, a job's ``files``)
FILE_PREFIX = "file:"
#: a buffer is hashed and written in pieces this size, by up to ``_THREADS`` threads
_CHUNK = 16 << 20
_THREADS = min(8, len(os.sched_getaffinity(0)))


class DataTooLarge(DlschedError):
    """A submission's buffers do not fit where buffers go."""


def buffer_root() -> Path:
    """The folder buffer folders are made in: ``DLSCHED_BUFFERS``, else ``/dev/shm``."""
    named = os.environ.get(BUFFERS_ENV, "").strip()
    if named:
        return Path(named).expanduser()
    return Path("/dev/shm")


def buffer_folder(home: Path, uid: int | None = None, *, in_home: bool = False) -> Path:
    """This user's buffer folder for the pool whose state folder is ``home``: under the
    buffer root (shared memory), or with ``in_home`` in ``home`` itself (a SLURM pool's
    nodes see its state folder, not this machine's shared memory)."""
    uid = os.getuid() if uid is None else uid
    pool = hashlib.sha256(os.path.realpath(home).encode()).hexdigest()[:12]
    root = buffer_root()
    if in_home or (not root.is_dir() and not os.environ.get(BUFFERS_ENV)):
        root = Path(home) / "buffers"
    return root / f"dlsched-{uid}-{pool}"


def folder_space(folder: Path) -> tuple[int, int]:
    """(free bytes, total bytes) of the file system ``folder`` is on (or would be on)."""
    probe = folder
    while not probe.exists():
        probe = probe.parent
    usage = shutil.disk_usage(probe)
    return usage.free, usage.total


# -- pickling ----------------------------------------------------------------------------


def _rebuild_storage(buffer: Any) -> Any:
    import torch

    if memoryview(buffer).readonly:
        # memory nobody may write into (Ray's object store): torch cannot mark a tensor
        # read-only, and a model trained in place writes into its weights, so a copy
        buffer = bytearray(memoryview(buffer))
    return torch.frombuffer(buffer, dtype=torch.uint8).untyped_storage()


def _rebuild_tensor(
    storage: Any,
    dtype: Any,
    size: tuple[int, ...],
    stride: tuple[int, ...],
    offset: int,
    requires_grad: bool,
    parameter: bool,
) -> Any:
    import torch

    tensor = torch.empty(0, dtype=dtype).set_(storage, offset, size, stride)
    if parameter:
        return torch.nn.Parameter(tensor, requires_grad=requires_grad)
    return tensor.requires_grad_(requires_grad)


class _Storage:
    """One torch storage, pickled once however many tensors view it (tied weights stay
    tied): the pickler's memo sees this same object each time."""

    def __init__(self, array: Any) -> None:
        self.array = array

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        return _rebuild_storage, (pickle.PickleBuffer(self.array),)


class _Pickler(SourcePickler):
    """cloudpickle (keeping a notebook function's cell name and lines: ``SourcePickler``),
    with the storages of torch CPU tensors taken out of band too."""

    def __init__(self, file: io.BytesIO, buffer_callback: Callable[[Any], Any]) -> None:
        super().__init__(file, protocol=5, buffer_callback=buffer_callback)
        self._storages: dict[int, _Storage] = {}

    def reducer_override(self, obj: Any) -> Any:
        kind = type(obj)
        if kind.__module__.startswith("torch") and kind.__name__ in ("Tensor", "Parameter"):
            reduced = self._tensor(obj)
            if reduced is not NotImplemented:
                return reduced
        return super().reducer_override(obj)

    def _tensor(self, t: Any) -> Any:
        import torch

        if t.device.type != "cpu":
            raise TypeError(
                f"a {t.device.type.upper()} tensor cannot travel to a job: pass it as "
                "`.cpu()` (the job moves it to its own GPU with `dlt.device()`)"
            )
        if t.layout != torch.strided or t.is_quantized or t.grad_fn is not None:
            return NotImplemented
        if t.is_conj() or t.is_neg() or t.untyped_storage().nbytes() < MIN_OUT_OF_BAND:
            return NotImplemented
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key not in self._storages:
            whole = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (storage.nbytes(),), (1,))
            self._storages[key] = _Storage(whole.numpy())
        return _rebuild_tensor, (
            self._storages[key],
            t.dtype,
            tuple(t.size()),
            tuple(t.stride()),
            t.storage_offset(),
            t.requires_grad,
            isinstance(t, torch.nn.Parameter),
        )


def _pickle(obj: Any) -> tuple[bytes, list[memoryview]]:
    """``obj`` pickled, and the buffers taken out of band (in order)."""
    taken: list[memoryview] = []

    def out_of_band(buffer: pickle.PickleBuffer) -> bool:
        try:
            raw = buffer.raw()
        except BufferError:  # not contiguous: in band
            return True
        if raw.nbytes < MIN_OUT_OF_BAND:
            return True
        taken.append(raw)
        return False

    out = io.BytesIO()
    _Pickler(out, out_of_band).dump(Carrier(obj))
    return out.getvalue(), taken


def check_picklable(obj: Any) -> None:
    """Raise what pickling ``obj`` would raise, without writing or copying its buffers."""
    _Pickler(io.BytesIO(), lambda buffer: False).dump(obj)


def dumps(
    obj: Any,
    folder: Path | None,
    *,
    written: dict[int, tuple[Any, str]] | None = None,
    nested: bytes | None = None,
    named: str | None = None,
    room: Callable[[int], None] | None = None,
) -> bytes:
    """``obj`` pickled, its big buffers written into ``folder`` (none: all in band).

    ``room(need)`` is told the bytes about to be written, before any is, and may refuse
    them (a shared pool's payload limit, asked of the service).

    ``written`` remembers, across calls of one submission (a ``map``), the buffers already
    written (by the object that holds them), so one array shared by every member is
    written and hashed once. Nothing is written unless all of it fits. ``nested``: a
    pickle made by ``dumps`` that ``obj`` carries (a ``map``'s function, pickled once):
    its buffers are named in this header too, so the ledger keeps them as long. ``named``:
    the files are ``<named>.<n>``, not named by their content (a job's result, in its own
    folder: nothing to share, so nothing to hash).
    """
    if folder is None:
        out = io.BytesIO()
        _Pickler(out, lambda buffer: True).dump(Carrier(obj))  # every buffer in band
        return out.getvalue()
    body, buffers = _pickle(obj)
    inner = manifest(nested) if nested is not None else None
    if not buffers and inner is None:
        return body
    secure_folder(folder)  # ours, 0700, no link on the way: nobody plants a file there
    memo = {} if written is None else written
    new = [b for b in buffers if id(b.obj) not in memo]
    need = sum(b.nbytes for b in new)
    if room is not None and need:
        room(need)
    free, _ = folder_space(folder)
    if need > free:
        raise DataTooLarge(
            f"the job's data ({format_size(need)}) does not fit in {folder} "
            f"({format_size(free)} free); set {BUFFERS_ENV} to a folder with room"
        )
    names = []
    for n, raw in enumerate(buffers):
        if named is not None:
            names.append([write_buffer(folder, raw, f"{named}.{n}"), raw.nbytes])
            continue
        key = id(raw.obj)
        if key not in memo:
            # the holder is kept with its digest: its id names no other object meanwhile
            memo[key] = (raw.obj, write_buffer(folder, raw))
        names.append([memo[key][1], raw.nbytes])
    described: dict[str, Any] = {"folder": str(folder), "buffers": names}
    if inner is not None:
        described["nested"] = [[str(inner[0]), inner[1]]]
    header = json.dumps(described).encode()
    return MAGIC + len(header).to_bytes(4, "big") + header + body


def write_buffer(folder: Path, raw: memoryview, name: str | None = None) -> str:
    """Write ``raw`` into ``folder`` under ``name``, else its digest (``_tree_digest``); the name.

    A file already there under that digest holds the same bytes (each is written under a
    temporary name and renamed whole, in a folder only its user can write): it is kept,
    not written again, so data submitted again costs its hash only. The pieces are hashed
    and written by several threads where the machine has the cores (hashlib and ``pwrite``
    release the GIL)."""
    view = raw.cast("B") if raw.format != "B" or raw.ndim != 1 else raw
    pieces = [(i, view[i : i + _CHUNK]) for i in range(0, view.nbytes, _CHUNK)]
    with ThreadPoolExecutor(min(_THREADS, len(pieces)) or 1) as pool:
        if name is None:
            name = _tree_digest(pool, [piece for _, piece in pieces], view.nbytes)
            if _have(folder / name, view.nbytes):
                return name
        tmp = folder / f".{os.getpid()}.{threading.get_ident()}.{time.monotonic_ns()}.part"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            try:
                for _ in pool.map(lambda p: _write_at(fd, p[1], p[0]), pieces):
                    pass
            finally:
                os.close(fd)
            os.replace(tmp, folder / name)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    return name


def _tree_digest(pool: ThreadPoolExecutor, pieces: list[memoryview], size: int) -> str:
    """SHA-256 over the size and the SHA-256 of each ``_CHUNK`` piece: as strong as one
    SHA-256 of the whole, and its pieces hash on as many cores as there are."""
    top = hashlib.sha256(b"dlsched-tree-1 %d " % size)
    for piece_digest in pool.map(lambda p: hashlib.sha256(p).digest(), pieces):
        top.update(piece_digest)
    return top.hexdigest()


def _write_at(fd: int, piece: memoryview, offset: int) -> None:
    while piece.nbytes:
        done = os.pwrite(fd, piece, offset)
        piece, offset = piece[done:], offset + done


def _have(path: Path, size: int) -> bool:
    """Whether ``path`` is a whole buffer file of ours, then marked as in use now (a starting
    agent's sweep keeps files written, or used again, since it started)."""
    try:
        st = os.lstat(path)
        check_file(path, st)
    except (OSError, UnsafeStateFolder):
        return False
    if st.st_size != size or stat.S_IMODE(st.st_mode) & 0o077:
        return False
    try:
        os.utime(path, follow_symlinks=False)
    except OSError:
        return False
    return True


# -- reading ----------------------------------------------------------------------------


def manifest(data: bytes) -> tuple[Path, list[tuple[str, int]]] | None:
    """The folder and ``(digest, size)`` of each buffer a pickle names, or None (in band)."""
    if not data.startswith(MAGIC):
        return None
    header = _header(data)
    return Path(header["folder"]), [(str(d), int(n)) for d, n in header["buffers"]]


def _header(data: bytes) -> dict[str, Any]:
    """The header before a pickle ``dumps`` made; a ``SpecError`` for one it did not make."""
    try:
        size = int.from_bytes(data[len(MAGIC) : len(MAGIC) + 4], "big")
        header = json.loads(data[len(MAGIC) + 4 : len(MAGIC) + 4 + size])
        str(header["folder"])
        [(str(d), int(n)) for d, n in header["buffers"]]
        for folder, inner in header.get("nested", ()):
            [(str(folder), str(d), int(n)) for d, n in inner]
    except (ValueError, TypeError, KeyError) as error:
        raise SpecError("payload.pkl", "…", f"a payload this package pickled ({error})") from None
    return dict(header)


def buffer_files(data: bytes) -> dict[str, int]:
    """Each buffer file a pickle names (its path) and its size."""
    found = manifest(data)
    if found is None:
        return {}
    folder, buffers = found
    files = {str(folder / digest): size for digest, size in buffers}
    for inner_folder, inner in _header(data).get("nested", ()):
        files.update({str(Path(inner_folder) / d): int(n) for d, n in inner})
    return files


def loads(
    data: bytes, buffers: Mapping[str, Any] | None = None, *, moved: Path | None = None
) -> Any:
    """What ``dumps`` pickled, each out-of-band buffer mapped from its file (no copy).

    ``buffers``: each buffer by its file's path, brought another way (a Ray job's, through
    Ray's object store: its node need not see this machine's files). ``moved``: the job's
    spool folder, where a result's buffers go from the buffer folder (``results.settle``).
    """
    found = manifest(data)
    if found is None:
        return cloudpickle.loads(data)
    folder, names = found
    size = int.from_bytes(data[len(MAGIC) : len(MAGIC) + 4], "big")
    body = memoryview(data)[len(MAGIC) + 4 + size :]
    if buffers is None:
        maps = [map_buffer(folder / digest, n, moved) for digest, n in names]
    else:
        missing = [d for d, _ in names if str(folder / d) not in buffers]
        if missing:
            raise DlschedError(f"the job's data {folder / missing[0]} did not reach it")
        maps = [buffers[str(folder / digest)] for digest, _ in names]
    return pickle.loads(body, buffers=maps)


def map_buffer(path: Path, size: int, moved: Path | None = None) -> mmap.mmap:
    """``path`` mapped copy-on-write, checked first: a regular file of ours that nobody
    else can write, of the size the pickle says (a file planted or cut is refused); a
    result's buffer gone from there is looked for where it moved to (``loads``)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        settled = settled_name(path.name) if moved is not None else None
        if moved is not None and settled is not None:
            return map_buffer(moved / settled, size)
        raise DlschedError(
            f"the job's data file {path} is gone (removed, or the machine restarted); "
            "submit the job again"
        ) from None
    try:
        st = os.fstat(fd)
        check_file(path, st)
        if st.st_size != size or stat.S_IMODE(st.st_mode) & 0o077:
            raise UnsafeStateFolder(path, f"it is not the {size}-byte file of ours written")
        return mmap.mmap(fd, size, access=mmap.ACCESS_COPY)
    finally:
        os.close(fd)


def remove_files(paths: Iterable[str]) -> None:
    """Delete buffer files the ledger no longer needs (``file:`` names or paths).

    A shared pool's service deletes as root in its users' folders: each file is unlinked
    through its folder opened without following a link, and only when that folder belongs
    to the user its name says, so no link planted on the way sends the deletion elsewhere.
    """
    for name in paths:
        path = Path(name[len(FILE_PREFIX) :] if name.startswith(FILE_PREFIX) else name)
        try:
            fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            owner = os.fstat(fd).st_uid
            if owner in (os.geteuid(), folder_owner(path.parent)):
                os.unlink(path.name, dir_fd=fd)
        except OSError:
            pass
        finally:
            os.close(fd)


def file_size(path: str, uid: int) -> int:
    """The size of a buffer file a submission names, checked to be a regular file of
    ``uid``'s (the ledger counts it against that user's quota)."""
    st = os.lstat(path)
    check_file(Path(path), st, owner=uid)
    return st.st_size


def sweep(
    home: Path,
    kept: set[str],
    before: float,
    results: Callable[[Path, str, bool], bool] | None = None,
) -> tuple[int, int]:
    """Delete the files of this pool's buffer folders (every user's under the default
    root, and this process's own) that no job names and that were last written before
    ``before`` (a submission killed half way left them; one writing now is newer);
    ``(files, bytes)`` deleted. A result's buffers (``results.py``) are asked of
    ``results(folder, name, ours)``: True leaves the file alone (a job still writes it, or
    it was settled just now; ``ours``: the folder is this process's user's)."""
    own = buffer_folder(home)
    pool = own.name.rsplit("-", 1)[1]
    folders = {own, buffer_folder(home, in_home=True)}
    for root in (buffer_root(), Path(home) / "buffers"):
        try:
            folders.update(p for p in root.glob(f"dlsched-*-{pool}"))
        except OSError:
            pass
    count = size = 0
    for folder in folders:
        try:
            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            owner = os.fstat(fd).st_uid
            if owner not in (os.geteuid(), folder_owner(folder)):
                continue
            for name in os.listdir(fd):
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    continue  # gone meanwhile (a result's other buffers, settled with it)
                if str(folder / name) in kept or st.st_mtime >= before:
                    continue
                if parse_name(name) is not None and results is not None:
                    if results(folder, name, owner == os.geteuid()):
                        continue
                os.unlink(name, dir_fd=fd)
                count, size = count + 1, size + st.st_size
        except OSError:
            pass
        finally:
            os.close(fd)
    return count, size
