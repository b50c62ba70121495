"""The Jupyter server extension: REST API, the scheduler loop and the utilisation sampler.

Enabled by ``jupyter-config/server-config/jupyter_dlsched.json``, which pip installs
into ``etc/jupyter/jupyter_server_config.d``; ``jupyter server extension list``
shows it as ``jupyter_dlsched``.
"""

from __future__ import annotations

from typing import Any


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    from .app import DlschedApp

    return [{"module": "jupyter_dlsched.server.app", "app": DlschedApp}]
