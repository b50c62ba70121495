"""The pool agent: one process owns a ledger, decides, launches, and answers clients.

* ``service.py`` — the agent (``Agent``): socket, ``SO_PEERCRED``, requests, ticks, forks;
* ``protocol.py`` — the wire format (a JSON header and binary attachments);
* ``client.py`` — ``AgentClient``, finding a shared pool, starting a user's agent;
* ``link.py`` — how a ``Scheduler`` submits, steers and reads through an agent;
* ``config.py``, ``limits.py`` — a shared pool's configuration and per-user limits.
"""
