"""The members of a sweep (``map``): each named by its index and argument.

>>> member_suffixes(lambda lr: lr, [0.01, 0.001])
['[0] lr=0.01', '[1] lr=0.001']

The queue, the sidebar and ``dlsched queue --name 'sweep*'`` then tell them apart:
``sweep[2] lr=0.01``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any

#: the longest argument shown in a member's name; longer ones are cut with "…"
MAX_SHOWN = 40


def member_suffixes(fn: Callable[..., Any], items: Iterable[Any]) -> list[str]:
    """``"[i] param=repr(item)"`` for each item (``"[i] repr(item)"`` when the function's
    first parameter takes no keyword, as for most builtins)."""
    param = _first_parameter(fn)
    suffixes = []
    for i, item in enumerate(items):
        shown = _short(item)
        suffixes.append(f"[{i}] {param}={shown}" if param else f"[{i}] {shown}")
    return suffixes


def member_name(base: str, suffix: str, max_len: int) -> str:
    """The base name (the job's ``name``, else the function's) with a member's suffix, cut
    to ``max_len`` characters from the argument's end, never from the index."""
    name = f"{base}{suffix}"
    return name if len(name) <= max_len else name[: max_len - 1] + "…"


def _first_parameter(fn: Callable[..., Any]) -> str | None:
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # builtins and callables without a signature
        return None
    if not parameters:
        return None
    first = parameters[0]
    if first.kind in (first.VAR_POSITIONAL, first.VAR_KEYWORD, first.POSITIONAL_ONLY):
        return None  # "x=-1" would read as a keyword the function does not take
    return first.name


def _short(item: Any) -> str:
    try:
        text = repr(item)
    except Exception:
        text = f"<{type(item).__name__}>"
    text = " ".join(text.split())  # one line: a name has no newlines
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 1] + "…"
