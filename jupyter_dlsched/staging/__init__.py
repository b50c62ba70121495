"""Data staged while a job waits: inputs copied into a node-local cache before the job starts.

A job declares its inputs (``stage_in={"train": "/mnt/share/imagenet/train"}``);
while it is queued, a stager (``stager.py``) copies each into the cache
(``cache.py``), and the tick (``gate.py``) starts the job only once all its
inputs are there. Inside the job, ``dls.data("train")`` is the local path.
See ``docs/staging.md``.
"""

from __future__ import annotations

from .cache import CacheConfig, cache_info, configure
from .gate import StagingGate, staging_words
from .sources import StagingFailed, fingerprint, open_source

__all__ = [
    "CacheConfig",
    "StagingFailed",
    "StagingGate",
    "cache_info",
    "configure",
    "fingerprint",
    "open_source",
    "staging_words",
]
