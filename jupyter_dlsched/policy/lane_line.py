"""A policy's whole line told as stretches of the lanes it was given.

A policy that orders a deep queue by lanes (``lane_layout``, ``lane``) returns its line
(``line``) as one of these: the line is a few long stretches of the lanes, so a caller
that keeps something per lane position (``QueueIndex``: each job's rank in line) reads
the line from its lanes without touching every job. Readers that want jobs get them
as from any sequence; the jobs are read from the lanes lazily, so the line is only
valid while the lanes it names are unchanged.

>>> lanes = {"a": ["a1", "a2", "a3"], "b": ["b1"]}
>>> line = LaneLine(lanes, [Stretch("a", 1, 3), ["b1"], Stretch("a", 0, 1)])
>>> list(line), len(line), line[:2], line[3]
(['a2', 'a3', 'b1', 'a1'], 4, ['a2', 'a3'], 'a1')
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Mapping, Sequence
from itertools import chain, islice
from typing import Any, NamedTuple, overload


class Stretch(NamedTuple):
    """The jobs ``start:stop`` of the lane ``lane``, in the lane's order."""

    lane: Hashable
    start: int
    stop: int


class LaneLine(Sequence[Any]):
    """The jobs of ``pieces`` one after another: a ``Stretch`` of ``lanes`` or a loose
    list of jobs (one merged from several lanes, say)."""

    def __init__(
        self, lanes: Mapping[Hashable, Sequence[Any]], pieces: list[Stretch | list[Any]]
    ) -> None:
        self.lanes = lanes
        self.pieces = [p for p in pieces if _size(p)]
        self._len = sum(map(_size, self.pieces))
        self._flat: list[Any] | None = None

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Any]:
        return chain.from_iterable(
            islice(self.lanes[p.lane], p.start, p.stop) if isinstance(p, Stretch) else p
            for p in self.pieces
        )

    @overload
    def __getitem__(self, at: int) -> Any: ...

    @overload
    def __getitem__(self, at: slice) -> list[Any]: ...

    def __getitem__(self, at: int | slice) -> Any:
        if isinstance(at, slice) and at.step is None and (at.start or 0) >= 0:
            if at.stop is not None and at.stop >= 0:  # the front of the line: read no further
                return list(islice(self, at.start or 0, at.stop))
        if self._flat is None:
            self._flat = list(self)
        return self._flat[at]


def _size(piece: Stretch | list[Any]) -> int:
    return max(0, piece.stop - piece.start) if isinstance(piece, Stretch) else len(piece)
