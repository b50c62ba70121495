"""First in, first out: the head of the queue blocks everything behind it."""

from __future__ import annotations

from dataclasses import dataclass

from .base import submit_order
from .ranked import RankedPolicy


@dataclass
class FifoPolicy(RankedPolicy):
    """Strict submit order; with ``skip=True`` jobs that fit jump a blocked head (first fit).

    Parameters: ``skip=False`` (``fifo-ff`` is ``skip=True``). Never preempts.

    >>> FifoPolicy(skip=True, name="fifo-ff").name
    'fifo-ff'
    """

    skip: bool = False
    name: str = "fifo"
    preempt = False
    queue_key = staticmethod(submit_order)
