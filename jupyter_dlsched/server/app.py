"""The server extension app: configuration, start-up and shutdown.

Options (``jupyter_server_config.py`` or the command line)::

    c.DlschedApp.home = "/scratch/dlsched"     # the ledger and spool folder
    c.DlschedApp.policy = "fair"               # written to the ledger for everyone
    c.DlschedApp.sample_interval = 5.0         # seconds between utilisation samples (0: off)
    c.DlschedApp.history_retention = 86400.0   # seconds of utilisation history kept
    c.DlschedApp.open_metrics = False          # True: /dlsched/metrics needs no token
"""

from __future__ import annotations

import os

from jupyter_server.extension.application import ExtensionApp
from traitlets import Bool, Float, Unicode

from .handlers import HANDLERS
from .state import ServerState


class DlschedApp(ExtensionApp):
    """Runs the scheduler loop and the sampler inside the Jupyter server and serves REST."""

    name = "jupyter_dlsched"
    load_other_extensions = True

    home = Unicode(
        None,
        allow_none=True,
        config=True,
        help="The state folder (ledger and spool). Default: $DLSCHED_HOME, else <jupyter data dir>/dlsched.",
    )
    policy = Unicode(
        None,
        allow_none=True,
        config=True,
        help=(
            "Scheduling policy (priority, fifo, sjf, fair, las). It is stored in the ledger and "
            "used by every participant; unset keeps the ledger's (or $DLSCHED_POLICY)."
        ),
    )
    sample_interval = Float(
        5.0,
        config=True,
        help="Seconds between utilisation samples written to the ledger; 0 turns sampling off.",
    )
    history_retention = Float(
        24 * 3600.0, config=True, help="Seconds of utilisation history kept in the ledger."
    )

    open_metrics = Bool(
        False,
        config=True,
        help=(
            "Answer /dlsched/metrics (Prometheus) without authentication, for a scraper on "
            "this machine that holds no token. Anyone who reaches the server's port can then "
            "read the pool's job counts and per-user GPU use."
        ),
    )

    state: ServerState | None = None

    def initialize_settings(self) -> None:
        from ..client.scheduler import Scheduler
        from ..vocab.errors import PermissionDenied

        home = self.home or os.environ.get("DLSCHED_HOME") or None
        try:
            scheduler = Scheduler(home=home, policy=self.policy or None, loop=False)
        except PermissionDenied as error:
            # a shared pool's policy is its service's: say so, and use the pool as it is
            self.log.warning("jupyter-dlsched: DlschedApp.policy ignored: %s", error)
            scheduler = Scheduler(home=home, loop=False)
        self.state = ServerState(
            scheduler,
            sample_interval=self.sample_interval,
            history_retention=self.history_retention,
        )
        if self.serverapp is not None:
            self.state.root_dir = self.serverapp.root_dir
        self.state.start()
        self.settings["dlsched"] = self.state
        self.settings["dlsched_open_metrics"] = self.open_metrics
        self.log.info(
            "jupyter-dlsched: ledger %s, policy %s, sampling every %ss",
            scheduler.home,
            scheduler.settings.policy,
            self.sample_interval,
        )

    def initialize_handlers(self) -> None:
        from .notebooks import HANDLERS as NOTEBOOK_HANDLERS

        self.handlers.extend(HANDLERS)
        self.handlers.extend(NOTEBOOK_HANDLERS)

    async def stop_extension(self) -> None:
        if self.state is not None:
            self.state.close()
            self.state = None
