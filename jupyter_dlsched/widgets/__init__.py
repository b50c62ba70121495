"""ipywidgets views of the scheduler: ``dashboard(scheduler)`` and ``JobView(handle)``.

>>> import jupyter_dlsched as dls
>>> dls.dashboard()  # doctest: +SKIP
>>> dls.JobView(dls.submit(train, 1e-3, gpus=1))  # doctest: +SKIP

Only the front ends (these widgets and the magics) import ipywidgets.
"""

from __future__ import annotations

from .dashboard import Dashboard, dashboard
from .jobview import JobView

__all__ = ["Dashboard", "JobView", "dashboard"]
