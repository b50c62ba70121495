"""Command jobs on the pool's own Python start warm: ``python train.py …`` and
``python -m pkg …`` run in the job's forked process, with what was imported ahead of it
(``preload.py``: numpy, and torch once a job has imported it), instead of an exec of a fresh
interpreter that imports everything again.

Only where the result is the same as an exec's: the command's program is this interpreter
(the same file, found on the job's ``PATH``), its options are at most ``-u``, the job's
``PYTHON*`` and ``LD_*`` variables are this process's own (they shape an interpreter's start),
this interpreter was started without options, and no module imported ahead would be shadowed
by one of the script's folder (a fresh interpreter would import the folder's own). Anything
else execs as before, and so does every command where ``DLSCHED_PRELOAD=none`` (the pool
agent's) turns warm starts off.

What the script sees is what ``python`` gives it: ``sys.argv``, ``__name__ == "__main__"``,
``sys.path[0]`` (the script's folder, or the working folder for ``-m``), ``sys.executable``,
the working folder and the environment (set by the job process), the exit status of
``sys.exit`` or of an uncaught exception (with its traceback from the script's own frame),
death by SIGINT after an uncaught ``KeyboardInterrupt``, SIGTERM's default action, its
``atexit`` handlers, and non-daemon threads joined at the end.
"""

from __future__ import annotations

import atexit
import builtins
import importlib.machinery
import io
import os
import runpy
import shutil
import signal
import sys
import threading
import traceback
import types
from dataclasses import dataclass
from pathlib import Path

from . import preload

#: variables an interpreter reads as it starts: a job that changes one gets a fresh one
_STARTUP_PREFIXES = ("PYTHON", "LD_")


@dataclass(frozen=True)
class Script:
    """What to run: a file (``path``) or a module (``module``), its arguments, ``-u``."""

    path: str | None
    module: str | None
    args: list[str]
    unbuffered: bool

    @property
    def first_path_entry(self) -> str:
        """``sys.path[0]`` as ``python`` sets it: the script's folder (symlinks resolved), or
        the working folder for ``-m``."""
        if self.path is not None:
            return os.path.dirname(os.path.realpath(self.path))
        return os.getcwd()


def warm_script(argv: list[str], env: dict[str, str]) -> Script | None:
    """The script ``argv`` runs when it can run warm here (see the module's docstring), else
    None. Called in the job's process, in its working folder, before it takes ``env``."""
    if preload.pinned() == []:
        return None  # DLSCHED_PRELOAD=none: nothing is warm, every command execs
    if not argv or not _plain_interpreter() or not _same_startup(env):
        return None
    program = shutil.which(argv[0], path=env.get("PATH", os.defpath))
    if program is None or not _same_interpreter(program):
        return None
    rest = list(argv[1:])
    unbuffered = False
    while rest and rest[0] == "-u":
        unbuffered = True
        rest.pop(0)
    if len(rest) >= 2 and rest[0] == "-m" and rest[1] and not rest[1].startswith("-"):
        script = Script(None, rest[1], rest[2:], unbuffered)
    elif rest and not rest[0].startswith("-") and os.path.isfile(rest[0]):
        script = Script(rest[0], None, rest[1:], unbuffered)
    else:
        return None
    return None if _shadowed(script.first_path_entry) else script


def run_warm(script: Script) -> int:
    """Run ``script`` as ``python`` would; its exit status (SIGINT kills this process after
    an uncaught ``KeyboardInterrupt``, as it would kill a fresh interpreter)."""
    sys.path[0:1] = [script.first_path_entry]
    # stdout to a file is block-buffered in a fresh interpreter, unless -u or PYTHONUNBUFFERED
    unbuffered = script.unbuffered or bool(os.environ.get("PYTHONUNBUFFERED"))
    sys.stdout.reconfigure(line_buffering=False, write_through=unbuffered)  # type: ignore[union-attr]
    sys.stderr.reconfigure(write_through=unbuffered)  # type: ignore[union-attr]
    signal.signal(signal.SIGINT, signal.default_int_handler)
    atexit._clear()  # what this process registered before is not the script's
    code = 0
    try:
        _run(script)
    except SystemExit as stop:
        code = _exit_code(stop)
    except KeyboardInterrupt as interrupt:
        _print_from_script(interrupt, script)
        code = -signal.SIGINT
    except BaseException as error:
        _print_from_script(error, script)
        code = 1
    code = _finish(code)
    if code == -signal.SIGINT:
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return code


def _run(script: Script) -> None:
    """Run the script in a fresh ``__main__``, as the interpreter's own start does (the
    module: ``runpy._run_module_as_main``, what ``python -m`` calls)."""
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    if script.module is not None:
        sys.argv = [script.module, *script.args]  # the module's file takes argv[0]
        runpy._run_module_as_main(script.module, alter_argv=True)  # type: ignore[attr-defined]
        return
    assert script.path is not None
    path = os.path.abspath(script.path)  # __file__ is absolute; argv[0] stays as given
    with io.open_code(path) as source:
        code = compile(source.read(), path, "exec", dont_inherit=True)
    main.__dict__.update(
        __file__=path,
        __cached__=None,
        __loader__=importlib.machinery.SourceFileLoader("__main__", path),
        __builtins__=builtins,
    )
    sys.argv = [script.path, *script.args]
    exec(code, main.__dict__)


def _finish(code: int) -> int:
    """Join the script's non-daemon threads and run its ``atexit`` handlers, as an
    interpreter's end does; a ``SystemExit`` raised there decides the status as it would."""
    try:
        threading._shutdown()  # type: ignore[attr-defined]
    except BaseException:
        traceback.print_exc()
    try:
        atexit._run_exitfuncs()
    except SystemExit as stop:
        return _exit_code(stop)
    return code


def _exit_code(stop: SystemExit) -> int:
    """``sys.exit(x)``'s status: None is 0, a number is itself, anything else is printed and
    is 1."""
    if stop.code is None:
        return 0
    if isinstance(stop.code, int):
        return stop.code & 0xFF
    print(stop.code, file=sys.stderr)
    return 1


def _print_from_script(error: BaseException, script: Script) -> None:
    """The traceback ``python`` prints: from the script's own first frame (not runpy's)."""
    tb = error.__traceback__
    first = tb
    target = _script_file(script)
    while tb is not None:
        if os.path.realpath(tb.tb_frame.f_code.co_filename) == target:
            first = tb
            break
        tb = tb.tb_next
    traceback.print_exception(type(error), error, first)


def _script_file(script: Script) -> str:
    if script.path is not None:
        return os.path.realpath(script.path)
    module = sys.modules.get("__main__")
    return os.path.realpath(getattr(module, "__file__", "") or "")


def _plain_interpreter() -> bool:
    """This interpreter was started as ``python`` without options (as the pool starts it)."""
    flags = sys.flags
    return not (
        flags.isolated
        or flags.ignore_environment
        or flags.no_user_site
        or flags.no_site
        or flags.optimize
        or flags.verbose
        or flags.inspect
        or flags.interactive
        or flags.bytes_warning
        or flags.safe_path
        or sys.warnoptions
        or sys._xoptions
    )


def _same_startup(env: dict[str, str]) -> bool:
    def startup(variables: dict[str, str] | os._Environ[str]) -> dict[str, str]:
        return {k: v for k, v in variables.items() if k.startswith(_STARTUP_PREFIXES)}

    return startup(env) == startup(os.environ)


def _same_interpreter(program: str) -> bool:
    """``program`` is this interpreter: the same file, reached from the same folder (a
    virtual environment's ``python`` is a link to the base one; its folder decides)."""
    mine = Path(sys.executable)
    try:
        return (
            os.path.samefile(program, mine)
            and Path(program).absolute().parent == mine.absolute().parent
        )
    except OSError:
        return False


def _shadowed(folder: str) -> bool:
    """A module imported ahead has a namesake in ``folder`` (``sys.path[0]``), which a fresh
    interpreter would import instead."""
    try:
        names = os.listdir(folder)
    except OSError:
        return True
    local = {n[:-3] for n in names if n.endswith(".py")} | {
        n for n in names if os.path.isfile(os.path.join(folder, n, "__init__.py"))
    }
    loaded = {name.partition(".")[0] for name in sys.modules}
    return bool(local & loaded)
