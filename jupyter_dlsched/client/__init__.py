"""The client people hold: ``Scheduler`` (one per process, ``default``), the ``JobHandle``
it returns, what it follows (``following``), the jobs it runs in the kernel's own thread
(``inline``) and what a submission takes from its process (``context``).

Front ends (the notebook's magics, widgets, the server, the CLI) reach the pool through
here; nothing below the client imports it.
"""
