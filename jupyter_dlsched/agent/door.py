"""Each request checked at the door against its shape (``shapes.OPS``) before its handler runs.

The shapes are what mypy checks a client's fields against; a peer can still send any JSON
object, so the agent checks the same table at run time, with the errors the handlers'
own checks give: a field the op does not take, or one it needs and did not get, is a
``ProtocolError`` ("a malformed 'cancel' request: ..."); a value of the wrong kind (a
string where a number goes) is a ``SpecError`` naming the field. What a value means (a
job id that exists, a priority in range, what is inside a list) is still the handler's
to check; the door checks only the shape.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from functools import cache
from typing import Any, Literal, NotRequired, Required, Union

from ..vocab.errors import SpecError
from .protocol import ProtocolError
from .shapes import OPS

#: the message's own fields, not the request's (``protocol.py``): its op, its attachments
_ENVELOPE = ("op", "blobs")


def check_request(op: str, message: Mapping[str, Any]) -> None:
    """Refuse ``message`` (a request of ``op``, a known op) unless it has its shape."""
    fields, required = _fields(OPS[op][0])
    missing = sorted(required - message.keys())
    if missing:
        raise ProtocolError(f"a malformed {op!r} request: it needs the field {missing[0]!r}")
    for name, value in message.items():
        if name in _ENVELOPE:
            continue
        kind = fields.get(name)
        if kind is None:
            known = ", ".join(sorted(fields)) or "no fields"
            raise ProtocolError(f"a malformed {op!r} request: no field {name!r} (it takes {known})")
        if not _is(value, kind):
            raise SpecError(name, value, _words(kind))  # as a handler's own check says it


@cache
def _fields(shape: type) -> tuple[dict[str, Any], frozenset[str]]:
    """A shape's fields with their kinds, and those it needs. (``__required_keys__`` alone
    is not enough: with postponed annotations a class sees ``NotRequired[...]`` as a string
    and counts the field as needed.)"""
    hints = typing.get_type_hints(shape, include_extras=True)
    required = set(shape.__required_keys__)  # type: ignore[attr-defined]
    for name, kind in hints.items():
        if typing.get_origin(kind) is NotRequired:
            required.discard(name)
        elif typing.get_origin(kind) is Required:
            required.add(name)
    return hints, frozenset(required)


def _is(value: Any, kind: Any) -> bool:
    """Whether a JSON value is of ``kind`` (its outer type: what is inside a list or an
    object is the handler's to check)."""
    origin = typing.get_origin(kind)
    if kind is Any:
        return True
    if origin in (Union, types.UnionType):
        return any(_is(value, k) for k in typing.get_args(kind))
    if origin in (Required, NotRequired):
        return _is(value, typing.get_args(kind)[0])
    if origin is Literal:
        return value in typing.get_args(kind)
    if kind is type(None):
        return value is None
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is str:
        return isinstance(value, str)
    if origin is list or kind is list:
        return isinstance(value, list)
    if origin is dict or kind is dict or typing.is_typeddict(kind):
        return isinstance(value, dict)
    return True  # a kind this table does not name: the handler checks it


def _words(kind: Any) -> str:
    origin = typing.get_origin(kind)
    if origin in (Union, types.UnionType):
        return " or ".join(_words(k) for k in typing.get_args(kind))
    if origin in (Required, NotRequired):
        return _words(typing.get_args(kind)[0])
    if origin is Literal:
        return " or ".join(repr(v) for v in typing.get_args(kind))
    if kind is type(None):
        return "null"
    if origin is list or kind is list:
        return "a list"
    if origin is dict or kind is dict or typing.is_typeddict(kind):
        return "an object"
    return {bool: "true or false", int: "a whole number", float: "a number", str: "a string"}.get(
        kind, str(kind)
    )
