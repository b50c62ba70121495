"""When a waiting job will start: the live policy replayed forward from the ledger's queue
(``replay``), and the engine's cached estimates of it (``start_times``).

``forecast`` and ``RunTimes`` are named here as they were before the package had rooms.
"""

from .replay import RunTimes as RunTimes
from .replay import forecast as forecast
