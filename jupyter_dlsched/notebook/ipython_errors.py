"""In IPython, an error a user caused through the API shows as their line and the message.

``raised_here`` (errors.py) already drops the package's frames; IPython still shows
the frame that raised, with its source. This handler, installed on the shell when the
package is imported there (or by ``%load_ext jupyter_dlsched``), shows what a
``UsageError`` would: the cell line that called the API and the one-line error. Every
other exception, and errors from inside a job (their remote traceback is the point),
keep IPython's own traceback.
"""

from __future__ import annotations

import linecache
import os
from typing import Any

from ..vocab.errors import DlschedError

# the package (this file is in its room notebook/): frames there are ours, not the user's
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def install(shell: Any) -> None:
    """Show ``raised_here`` errors on ``shell`` as two lines; idempotent."""
    if getattr(shell, "_dlsched_short_errors", False):
        return
    if getattr(shell, "CustomTB", None) is not None and shell.custom_exceptions:
        return  # someone else's handler: leave it alone (IPython keeps only one)
    shell.set_custom_exc((DlschedError,), _show)
    shell._dlsched_short_errors = True


def _show(shell: Any, etype: type, value: BaseException, tb: Any, tb_offset: Any = None) -> Any:
    if not getattr(value, "_dlsched_raised_here", False):
        # called inside IPython's own except clause: its usual traceback, debugger and all
        shell.showtraceback(running_compiled_code=True)
        return None
    stb = [*_user_line(shell, tb), f"{etype.__name__}: {value}"]
    shell._showtraceback(etype, value, stb)
    return stb


def _user_line(shell: Any, tb: Any) -> list[str]:
    """Where the user's code called the API: the last frame outside this package."""
    where = None
    while tb is not None:
        code = tb.tb_frame.f_code
        if not code.co_filename.startswith(_PACKAGE):
            where = (code.co_filename, tb.tb_lineno)
        tb = tb.tb_next
    if where is None:
        return []
    filename, line = where
    source = linecache.getline(filename, line).strip()
    count = getattr(getattr(shell, "compile", None), "_filename_map", {}).get(filename)
    shown = f"Cell In[{count}]" if count is not None else filename  # as IPython says it
    return [f"{shown}, line {line}: {source}" if source else f"{shown}, line {line}"]
