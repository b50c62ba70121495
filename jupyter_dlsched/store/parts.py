"""``Via``: a method of ``Store`` that is one of its parts' methods, named where ``Store``
lists them (``get = Via("reads", JobReads.get)``: ``store.get`` is ``store.reads.get``),
typed as the part's method is."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

P = ParamSpec("P")
R = TypeVar("R")


class Via(Generic[P, R]):
    """``store.<method>`` answered by ``store.<part>.<method>``: a descriptor, so the part's
    bound method is what callers get (its name, signature and docstring)."""

    def __init__(self, part: str, method: Callable[Concatenate[Any, P], R]) -> None:
        self.part = part
        self.method = method
        self.name = method.__name__
        self.__doc__ = method.__doc__

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Via[P, R]: ...

    @overload
    def __get__(self, obj: object, owner: type | None = None) -> Callable[P, R]: ...

    def __get__(self, obj: object | None, owner: type | None = None) -> Via[P, R] | Callable[P, R]:
        if obj is None:
            return self
        bound: Callable[P, R] = getattr(getattr(obj, self.part), self.name)
        return bound
