"""Files only their owner can touch: the state folder, the ledger, and what jobs leave behind.

A job's result is a pickle, and unpickling runs code. So whatever the
scheduler reads back must be something no other user could have written or
swapped: the state folder and every folder above it belong to the user (or
root) and are not writable by others (the rule OpenSSH applies to ``~/.ssh``
and slurmctld to its state); folders are 0700, files 0600, and spool files are
opened without following symbolic links. A folder that breaks the rule is
refused with ``UnsafeStateFolder``, never silently repaired: changing the mode
of another user's folder would hide the problem, not solve it.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from .errors import UnsafeStateFolder

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def _why_unsafe(st: os.stat_result, *, ancestor: bool, owner: int | None = None) -> str | None:
    """What is wrong with a folder's owner or mode, or None when it is safe to trust.

    ``owner``: whose it must be (default: ours); a shared pool's service checks a
    job's spool folder and files against the job's owner.
    """
    me = os.geteuid() if owner is None else owner
    if ancestor:
        if st.st_uid not in (0, me):
            return f"it belongs to uid {st.st_uid}, who could replace what is inside"
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            return "other users can write to it (and it has no sticky bit)"
        return None
    if st.st_uid != me:
        whose = "you" if owner is None else "the job's owner"
        return f"it belongs to uid {st.st_uid}, not to {whose} (uid {me})"
    if st.st_mode & 0o022:
        return f"other users can write to it (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def secure_folder(path: Path) -> Path:
    """Create ``path`` (0700) if missing, then check it and every folder above it.

    Returns the resolved path. Raises ``UnsafeStateFolder`` when the folder or one
    above it belongs to another user or is writable by others; a folder of the
    user's own that others can merely read is tightened to 0700.
    """
    path = Path(path).expanduser()
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except PermissionError as error:
        raise UnsafeStateFolder(path, f"it cannot be created ({error.strerror})") from None
    real = Path(os.path.realpath(path))
    st = os.stat(real)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeStateFolder(path, "it is not a folder")
    why = _why_unsafe(st, ancestor=False)
    if why:
        raise UnsafeStateFolder(path, why)
    if stat.S_IMODE(st.st_mode) & 0o066:
        os.chmod(real, 0o700)  # a shared pool's folders stay 0711: users reach their own spool
    for parent in real.parents:
        why = _why_unsafe(os.stat(parent), ancestor=True)
        if why:
            raise UnsafeStateFolder(path, f"the folder above it, {parent}, is unsafe: {why}")
    return real


def private_subfolder(path: Path, owner: int | None = None) -> Path:
    """A folder inside a checked one (``spool``, ``spool/<id>``): 0700, ours, not a link.

    With ``owner`` (a shared pool's service, as root), a new folder is given to
    that user and an existing one must already be theirs.
    """
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    else:
        if owner is not None and owner != os.geteuid():
            os.chown(path, owner, -1, follow_symlinks=False)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeStateFolder(path, "it is not a folder (a symbolic link or a file)")
    why = _why_unsafe(st, ancestor=False, owner=owner)
    if why:
        raise UnsafeStateFolder(path, why)
    return path


def check_file(path: Path, st: os.stat_result, owner: int | None = None) -> None:
    """A file we are about to trust: a regular file of ours (or ``owner``'s) others cannot write."""
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeStateFolder(path, "it is not a regular file")
    why = _why_unsafe(st, ancestor=False, owner=owner)
    if why:
        raise UnsafeStateFolder(path, why)


def read_file(path: Path, owner: int | None = None, max_bytes: int | None = None) -> bytes | None:
    """The bytes of a spool file written by the user's own job, or None when it is missing.

    Opened without following a symbolic link, and checked after opening (no gap
    between the check and the read).
    """
    try:
        # O_NONBLOCK: a FIFO planted under the name is refused below, never waited on
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise UnsafeStateFolder(path, "it is a symbolic link") from None
        raise
    with os.fdopen(fd, "rb") as f:
        check_file(path, os.fstat(f.fileno()), owner)
        return f.read() if max_bytes is None else f.read(max_bytes)


def write_file(path: Path, data: bytes) -> None:
    """Write ``path`` atomically as a 0600 file (a fresh temporary file, then a rename)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class PlantedFile(UnsafeStateFolder):
    """A spool file that is not what the pool writes there (a link, a FIFO, a folder, a
    second name of another file): the job's owner put it there; the job fails with this."""

    def __init__(self, path: Path, what: str) -> None:
        super().__init__(path, what)
        self.args = (f"its spool folder holds a planted {Path(path).name} ({what}): {path}",)


def planted_kind(st: os.stat_result) -> str | None:
    """What a spool file is when it is not a plain file of one name, or None."""
    if stat.S_ISLNK(st.st_mode):
        return "a symbolic link"
    if stat.S_ISFIFO(st.st_mode):
        return "a FIFO"
    if stat.S_ISDIR(st.st_mode):
        return "a folder"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_nlink > 1:
        return "a hard link"
    return None


def clear_files(folder: Path, names: tuple[str, ...]) -> None:
    """Remove what an earlier run left under ``names`` (a link is removed, never followed);
    ``PlantedFile`` for one that cannot be removed (a folder)."""
    for name in names:
        path = folder / name
        try:
            os.unlink(path)
        except FileNotFoundError:
            continue
        except OSError:
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            raise PlantedFile(path, planted_kind(st) or "it cannot be removed") from None


def open_append(path: Path, owner: int | None = None) -> int:
    """A file descriptor appending to ``path`` (created 0600), refusing a link or a stranger's.

    With ``owner``, a file this call creates is given to that user (a shared pool's logs).
    ``PlantedFile`` when a symbolic link, FIFO, folder or hard link stands under the name.
    """
    # O_NONBLOCK: a FIFO planted under the name fails to open instead of blocking us
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | _NOFOLLOW | _CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
            try:
                st = os.lstat(path)
            except OSError:
                raise error from None
            raise PlantedFile(path, planted_kind(st) or "it cannot be opened") from None
        raise
    try:
        st = os.fstat(fd)
        what = planted_kind(st)
        if what is not None:
            raise PlantedFile(path, what)
        if owner is not None and st.st_uid != owner and os.geteuid() == 0:
            if st.st_uid == 0 and st.st_size == 0 and st.st_nlink == 1:
                os.fchown(fd, owner, -1)  # just created by us (the service)
        check_file(path, os.fstat(fd), owner)
    except BaseException:
        os.close(fd)
        raise
    return fd


def touch(path: Path, owner: int | None = None) -> bool:
    """Create ``path`` if missing, never through a link (a flag file in a user's spool).

    False when something else stands under the name (a FIFO, a link, a folder): the
    flag is not written, and nothing waits on it.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | _NOFOLLOW | _CLOEXEC | os.O_NONBLOCK, 0o600)
    except OSError as error:
        if error.errno in (errno.ENXIO, errno.ELOOP, errno.EISDIR):
            return False
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return False
        if owner is not None and os.geteuid() == 0 and st.st_uid == 0 and st.st_nlink == 1:
            os.fchown(fd, owner, -1)
    finally:
        os.close(fd)
    return True


def create_private(path: Path) -> None:
    """Make sure ``path`` is our own 0600 regular file (the ledger, before SQLite opens it).

    An existing file is only looked at (``lstat``), never opened: closing any descriptor
    of a database file drops every SQLite lock this process holds on it, which lets
    another process change the file under a connection here (corruption).
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o600)
    except FileExistsError:
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            raise UnsafeStateFolder(path, "it is a symbolic link") from None
        check_file(path, st)
        if stat.S_IMODE(st.st_mode) & 0o077:
            os.chmod(path, 0o600)
    else:
        os.close(fd)  # a file that did not exist a moment ago: no connection holds locks on it


def default_home() -> Path:
    """``$DLSCHED_HOME``, else ``<jupyter data dir>/dlsched``."""
    env = os.environ.get("DLSCHED_HOME")
    if env:
        return Path(env).expanduser()
    from jupyter_core.paths import jupyter_data_dir

    return Path(jupyter_data_dir()) / "dlsched"
