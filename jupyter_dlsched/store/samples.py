"""Utilisation samples: the pool's readings over time, thinned for charts, pruned by age."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from .ledger import Ledger


class UsageHistory:
    """The ``samples`` table, ``store.usage``: the pool's utilisation over time."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def add_samples(self, rows: Iterable[tuple[float, str, Any, Any, Any, Any]]) -> None:
        """Rows of ``(time, source, util, mem_used, mem_total, data-dict-or-None)``."""
        encoded = [
            (t, src, util, used, total, json.dumps(data) if data is not None else None)
            for t, src, util, used, total, data in rows
        ]
        with self.ledger.transaction() as db:
            db.executemany(
                "INSERT INTO samples(time, source, util, mem_used, mem_total, data) "
                "VALUES(?,?,?,?,?,?)",
                encoded,
            )

    def samples(self, since: float = 0.0, until: float | None = None) -> list[dict[str, Any]]:
        sql, args = "SELECT * FROM samples WHERE time >= ?", [since]
        if until is not None:
            sql += " AND time <= ?"
            args.append(until)
        rows = self.ledger.db.execute(sql + " ORDER BY time", args)
        return [{**dict(r), "data": json.loads(r["data"]) if r["data"] else None} for r in rows]

    def thinned_samples(
        self, since: float, until: float, source: str | None, max_rows: int
    ) -> list[dict[str, Any]]:
        """Rows in ``[since, until]`` of ``source`` (and its parts, ``gpu0:...``) or of all
        sources, each source thinned evenly to about ``max_rows``, in time order.

        Filtering and thinning happen in SQLite, so a day of 1 s history is never
        loaded to answer for a sparkline.
        """
        where = "time >= ? AND time <= ?"
        args: list[Any] = [since, until]
        if source:
            where += " AND (source = ? OR source LIKE ?)"
            args += [source, source.replace("%", "").replace("_", "") + ":%"]
        db = self.ledger.db
        count = int(db.execute(f"SELECT COUNT(*) FROM samples WHERE {where}", args).fetchone()[0])
        stride = max(1, -(-count // max_rows))
        rows = db.execute(
            f"""SELECT time, source, util, mem_used, mem_total, data FROM (
                    SELECT *, ROW_NUMBER() OVER (PARTITION BY source ORDER BY time) - 1 AS n
                    FROM samples WHERE {where}
                ) WHERE n % ? = 0 ORDER BY time""",
            [*args, stride],
        )
        return [
            {
                "time": r[0],
                "source": r[1],
                "util": r[2],
                "mem_used": r[3],
                "mem_total": r[4],
                "data": json.loads(r[5]) if r[5] else None,
            }
            for r in rows
        ]

    def prune_samples(self, older_than: float) -> int:
        with self.ledger.transaction() as db:
            return db.execute("DELETE FROM samples WHERE time < ?", (older_than,)).rowcount
