"""Exceptions a user can meet, each saying what was wrong and what to do."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

_F = TypeVar("_F", bound=Callable[..., Any])


class DlschedError(Exception):
    """Base class of every error raised by jupyter-dlsched."""


class SpecError(DlschedError, ValueError):
    """A job request is invalid; the message names the field, the value and what is allowed.

    >>> raise SpecError("gpus", -1, "a whole number >= 0 or a fraction in (0, 1)")
    Traceback (most recent call last):
    ...
    jupyter_dlsched.vocab.errors.SpecError: gpus=-1 is invalid: expected a whole number >= 0 or a fraction in (0, 1)
    """

    def __init__(self, field: str, value: object, allowed: str) -> None:
        self.field = field
        self.value = value
        self.allowed = allowed
        shown = _short_repr(value)
        super().__init__(f"{field}={shown} is invalid: expected {allowed}")


def _short_repr(value: object, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters, so a huge bad input makes a short message."""
    try:
        text = repr(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


class JobNotFound(DlschedError, KeyError):
    """No job with this id exists in the ledger."""

    def __init__(self, job_id: object) -> None:
        self.job_id = job_id
        super().__init__(job_id)

    def __str__(self) -> str:
        return f"no job with id {self.job_id!r}; `dls.jobs()` or `dlsched queue` lists the jobs"


class UnsafeSocket(DlschedError, PermissionError):
    """A shared pool's socket in a folder another user could write: an impostor could serve it."""


class UnsafeStateFolder(DlschedError, PermissionError):
    """A state folder, ledger or spool file that another user could write or swap.

    Raised instead of using it: a result is a pickle, and unpickling runs code.
    """

    def __init__(self, path: object, why: str) -> None:
        self.path = path
        self.why = why
        super().__init__(
            f"refusing to use {path}: {why}. The state folder and everything in it must "
            "belong to you and be writable only by you (chmod 700 for folders, 600 for "
            "files); set DLSCHED_HOME to a folder of your own"
        )

    def __str__(self) -> str:
        return str(self.args[0])


class PermissionDenied(DlschedError, PermissionError):
    """Another user's job: only its owner (or a pool admin) may cancel, steer or read it.

    >>> raise PermissionDenied("only ana (the owner) or an admin may cancel job 3f2a")
    Traceback (most recent call last):
    ...
    jupyter_dlsched.vocab.errors.PermissionDenied: only ana (the owner) or an admin may cancel job 3f2a
    """


class LedgerUnavailable(DlschedError):
    """The ledger could not be read or written (disk full, read-only file system, ...)."""


class IllegalTransition(DlschedError):
    """A state change the job state machine does not allow (for example succeeded -> running)."""


class JobError(DlschedError):
    """A job did not succeed: it failed, timed out or was lost.

    ``state`` is the final state, ``reason`` the short reason shown in the queue,
    ``remote_traceback`` the formatted traceback from the job process when there is one.
    """

    def __init__(
        self,
        job_id: str,
        state: str,
        reason: str,
        remote_traceback: str | None = None,
        exc_type: str | None = None,
    ) -> None:
        self.job_id = job_id
        self.state = state
        self.reason = reason
        self.remote_traceback = remote_traceback
        self.exc_type = exc_type
        super().__init__(f"job {job_id} {state}: {reason}")


class JobFailed(JobError):
    """The job raised an exception or exited with a non-zero status."""


class JobTimeout(JobError):
    """The job ran past its ``time_limit``."""


class JobLost(JobError):
    """The job's supervisor stopped renewing its lease (crash, kill -9, reboot)."""


class RemoteTraceback(Exception):
    """Carries the job process's traceback text as the ``__cause__`` of a re-raised exception.

    Shown, it is the user's frames only (``tracebacks.user_traceback``): the job process's
    own frames say nothing about what went wrong. ``tb`` keeps the whole text.
    """

    def __init__(self, tb: str) -> None:
        self.tb = tb

    def __str__(self) -> str:
        from .tracebacks import user_traceback

        return "\n" + user_traceback(self.tb)


def raised_here(fn: _F) -> _F:
    """A public entry point: an error a user caused is raised from the user's own call.

    ``dls.submit(f, gpus=9)`` is refused by the pool agent, many calls deep in the
    client; shown in full, that is a 70-line traceback through the package before the
    one line that matters. The package's frames are dropped (the error, its message and
    its ``__cause__`` stay), and the entry point hides itself from IPython
    (``__tracebackhide__``): a notebook shows the user's line and the error.

    >>> @raised_here
    ... def submit(gpus): raise SpecError("gpus", gpus, "at most 2")
    """

    @functools.wraps(fn)
    def entry(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # noqa: F841  (read by IPython and pytest)
        try:
            return fn(*args, **kwargs)
        except DlschedError as error:
            # ipython_errors.py shows an error marked so as the user's line and the message
            error._dlsched_raised_here = True  # type: ignore[attr-defined]
            raise error.with_traceback(None) from error.__cause__

    return entry  # type: ignore[return-value]
