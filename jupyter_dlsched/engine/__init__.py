"""The engine: the one place that validates, writes, decides and launches (``core.py``).

``launching.py`` is who starts what a decision allocated; ``link.py`` is how a
``Scheduler`` without an agent reaches an engine in its own process. The pool agent,
a job's supervisor and the Ray driver compose an ``Engine`` of their own.
"""

from .core import Engine
from .launching import Launching, OwnJobs
from .link import EngineLink

__all__ = ["Engine", "EngineLink", "Launching", "OwnJobs"]
