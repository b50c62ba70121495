"""What a job's failure shows: the user's frames, each with its source line.

A function defined in a notebook travels to its job by value (cloudpickle), and
cloudpickle names the code of such a function ``<dynamic-code>``: the job process then
knows neither the cell it came from nor its lines, and its traceback says
``File "<dynamic-code>", line 4, in boom`` and nothing more. ``dumps`` pickles like
cloudpickle but keeps each such code object's file name (the cell's:
``<ipython-input-3-…>``, or a kernel's ``/tmp/ipykernel_…/….py``) and carries the lines of
those files that exist only in this process's memory; loading the pickle puts them in the
job process's ``linecache``, so the job's traceback shows ``return 1/x`` as the notebook
would. ``user_traceback`` then keeps only the user's frames of such a traceback, and
``JobTraceback`` shows a job's exception in IPython as one traceback of them.

>>> import cloudpickle
>>> cloudpickle.loads(dumps({"args": (1, 2)}))
{'args': (1, 2)}
"""

from __future__ import annotations

import io
import linecache
import os
import re
import sys
import traceback
import types
from collections import ChainMap
from typing import Any

import cloudpickle

# what cloudpickle writes in place of a by-value function's file name
_DYNAMIC = "<dynamic-code>"
# a notebook's cells are small; a file this large is not a cell, and is left behind
MAX_SOURCE_CHARS = 1_000_000


def dumps(obj: Any) -> bytes:
    """``cloudpickle.dumps(obj)``, keeping the names and source lines of by-value code."""
    buffer = io.BytesIO()
    SourcePickler(buffer).dump(Carrier(obj))
    return buffer.getvalue()


def install_sources(sources: dict[str, list[str]]) -> None:
    """Make ``linecache`` (what tracebacks read) know these in-memory files' lines.

    A file this process already knows keeps its own lines (a kernel loading its own
    payload back).
    """
    for filename, lines in sources.items():
        if filename not in linecache.cache:
            # no mtime: linecache.checkcache keeps an entry that is not a file on disk
            linecache.cache[filename] = (sum(map(len, lines)), None, lines, filename)


def _carried(obj: Any, _installed: None) -> Any:
    """The object a ``dumps`` pickle holds (its sources were installed just before)."""
    return obj


class Carrier:
    """The object to pickle, followed by the sources its code was defined in."""

    def __init__(self, obj: Any) -> None:
        self.obj = obj


class _Sources:
    """Stands for the sources seen so far, pickled after everything else."""


class SourcePickler(cloudpickle.Pickler):
    """cloudpickle's pickler, keeping by-value code's file names and carrying the lines of
    in-memory files for a ``Carrier`` it pickles (``options``: the pickler's own)."""

    def __init__(self, file: io.BytesIO, **options: Any) -> None:
        self.filenames: dict[str, None] = {}  # in the order met
        # read by the C pickler when it starts: cloudpickle's reducers, code objects ours
        self.dispatch_table = ChainMap(
            {types.CodeType: self._reduce_code}, cloudpickle.Pickler.dispatch_table
        )
        super().__init__(file, **options)

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is Carrier:
            # the arguments load in order: the object first, then the sources it needs
            return _carried, (obj.obj, _Sources())
        if type(obj) is _Sources:
            return install_sources, (self._sources(),)
        return super().reducer_override(obj)

    def _reduce_code(self, code: types.CodeType) -> Any:
        rebuild, args = cloudpickle.Pickler.dispatch_table[types.CodeType](code)
        self.filenames[code.co_filename] = None
        kept = tuple(code.co_filename if type(a) is str and a == _DYNAMIC else a for a in args)
        return rebuild, kept

    def _sources(self) -> dict[str, list[str]]:
        """The lines of the files met that only this process has (notebook cells)."""
        sources: dict[str, list[str]] = {}
        size = 0
        for filename in self.filenames:
            if os.path.exists(filename):
                continue  # a module on disk: the job reads it as any traceback would
            lines = linecache.getlines(filename)
            size += sum(map(len, lines))
            if lines and size <= MAX_SOURCE_CHARS:
                sources[filename] = lines
        return sources


# the package (this file is in its room vocab/): frames there are ours, not the user's
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_FRAME = re.compile(r'^  File "(?P<file>[^"]*)", line \d+')


def user_traceback(tb: str) -> str:
    """A job's traceback with only the user's frames, the way a notebook cell shows it.

    Frames of this package (the job process, the runner, the magics) go, and so does
    everything above a scheduled cell's first frame. Headers, chained exceptions and the
    exception lines stay.
    """
    out: list[str] = []
    segment: list[tuple[str | None, list[str]]] = []  # (file of the frame or None, lines)

    def flush() -> None:
        files = [f for f, _ in segment if f is not None]
        first_cell = next((i for i, f in enumerate(files) if f.startswith("<scheduled cell")), 0)
        seen = 0
        for file, lines in segment:
            if file is not None:
                seen += 1
                if seen <= first_cell or file.startswith(_PACKAGE):
                    continue
            out.extend(lines)
        segment.clear()

    for line in tb.splitlines():
        match = _FRAME.match(line)
        if line.startswith("Traceback (most recent call last)"):
            flush()
            segment.append((None, [line]))
        elif match:
            segment.append((match.group("file"), [line]))
        elif line.startswith("    ") and segment and segment[-1][0] is not None:
            segment[-1][1].append(line)  # the frame's source line and its ^^^ markers
        else:
            segment.append((None, [line]))
    flush()
    return "\n".join(out)


class JobTraceback:
    """IPython's ``_render_traceback_`` for an exception a job raised.

    IPython asks an exception for this before formatting its own traceback (the protocol
    ipyparallel's remote errors use). Shown instead: one traceback of the user's frames,
    those that asked for the result in this process, then the job's, each with its line;
    none of the package's, here or in the job process.
    """

    def __init__(self, error: BaseException, tb: str, job_id: str) -> None:
        self.error = error
        self.tb = tb
        self.job_id = job_id

    def __call__(self) -> list[str]:
        remote = user_traceback(self.tb).splitlines()
        heads = [i for i, line in enumerate(remote) if line.startswith("Traceback (most recent")]
        # the frames here called into the job's last exception: they go above its frames
        at = heads[-1] + 1 if heads else 0
        if not heads:
            remote.insert(0, "Traceback (most recent call last):")
            at = 1
        remote[at:at] = self._frames_here()
        how = f"`dlsched logs {self.job_id}` shows everything it printed"
        return [*_as_cells(remote), f"(raised in job {self.job_id}; {how})"]

    def _frames_here(self) -> list[str]:
        frames = []
        tb = self.error.__traceback__
        while tb is not None:
            code = tb.tb_frame.f_code
            # IPython's own frames say __tracebackhide__, the package's are ours
            hidden = "__tracebackhide__" in tb.tb_frame.f_locals
            if not hidden and not code.co_filename.startswith(_PACKAGE):
                frames.append((code.co_filename, tb.tb_lineno, code.co_name))
            tb = tb.tb_next
        summary = traceback.StackSummary.from_list([(f, n, name, None) for f, n, name in frames])
        return [line for text in summary.format() for line in text.rstrip("\n").split("\n")]


def _as_cells(lines: list[str]) -> list[str]:
    """Frames of this kernel's cells named as IPython names them: ``Cell In[3], line 4``."""
    ipython = sys.modules.get("IPython")  # only ever called by a running IPython
    shell = ipython.get_ipython() if ipython is not None else None
    counts = getattr(getattr(shell, "compile", None), "_filename_map", None) or {}
    shown = []
    for line in lines:
        match = _FRAME.match(line)
        count = counts.get(match.group("file")) if match else None
        if match and count is not None:
            line = f"  Cell In[{count}]" + line[match.end("file") + 1 :]
        shown.append(line)
    return shown
