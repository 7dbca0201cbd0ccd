"""The CRM rate limit shared by every process on the machine: a sliding window in SQLite.

Why this holder: concurrent Dagster runs are separate processes, so the limiter's state
must live outside them. A SQLite file (WAL, `BEGIN IMMEDIATE`) gives an atomic
read-count-insert across processes with nothing to deploy, and one transaction can admit a
call against two budgets at once: the total limit and the backfills' share (a token bucket
library such as pyrate-limiter holds one budget per bucket, so a backfill call would have
to take two buckets non-atomically). The window is exact, not a bucket approximation:
a call is admitted when fewer than `limit` calls (fewer than `backfill_limit` backfill
calls) are stamped within the last second. A call's stamp is its completion time, and a
call still in flight counts as "now": the server receives a request somewhere between
admission and completion, so no one-second window on the server can hold more calls than
the limiter admitted. Several machines would need a shared holder instead (the same table
in the Dagster instance's PostgreSQL); docs/crm.md says so.
"""

from __future__ import annotations

import sqlite3
import time
from contextlib import closing
from pathlib import Path

BACKFILL, LIVE = "backfill", "live"
WINDOW_SECONDS = 1.0
# A call in flight longer than this is taken for a crashed process and stops counting.
_STALE_SECONDS = 120.0


class CrmRateLimiter:
    """acquire() blocks until a call may start; finish() stamps its completion."""

    def __init__(self, path: str | Path, limit: int, backfill_limit: int):
        if limit < 1 or not 1 <= backfill_limit <= limit:
            raise ValueError(f"rate limit {limit} / backfill share {backfill_limit}: invalid")
        self.path = Path(path)
        self.limit = limit
        self.backfill_limit = backfill_limit
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with closing(self._connect()) as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(
                "CREATE TABLE IF NOT EXISTS calls (id INTEGER PRIMARY KEY, kind TEXT NOT NULL, "
                "started REAL NOT NULL, finished REAL)"
            )

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=30, isolation_level=None)

    def acquire(self, kind: str) -> tuple[int, float]:
        """Wait for a slot; returns (call id, seconds waited)."""
        if kind not in (BACKFILL, LIVE):
            raise ValueError(f"kind {kind!r}: must be {BACKFILL!r} or {LIVE!r}")
        waited = 0.0
        db = self._connect()
        try:
            while True:
                wait = self._try(db, kind)
                if isinstance(wait, int):
                    return wait, waited
                time.sleep(wait)
                waited += wait
        finally:
            db.close()

    def _try(self, db: sqlite3.Connection, kind: str) -> int | float:
        now = time.time()
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute(
                "DELETE FROM calls WHERE finished <= ? OR (finished IS NULL AND started < ?)",
                (now - WINDOW_SECONDS, now - _STALE_SECONDS),
            )
            rows = db.execute("SELECT kind, finished FROM calls").fetchall()
            budgets = [(self.limit, rows)]
            if kind == BACKFILL:
                budgets.append((self.backfill_limit, [r for r in rows if r[0] == BACKFILL]))
            wait = 0.0
            for limit, counted in budgets:
                if len(counted) >= limit:
                    # The (len - limit + 1)-th oldest stamp must leave the window first;
                    # an in-flight call has no stamp yet: look again shortly.
                    stamps = sorted(r[1] if r[1] is not None else now for r in counted)
                    frees = stamps[len(counted) - limit] + WINDOW_SECONDS
                    wait = max(wait, frees - now, 0.005)
            if wait:
                db.execute("COMMIT")
                return min(wait, WINDOW_SECONDS)
            call = db.execute(
                "INSERT INTO calls (kind, started) VALUES (?, ?)", (kind, now)
            ).lastrowid
            db.execute("COMMIT")
            return int(call)
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def finish(self, call: int) -> None:
        with closing(self._connect()) as db:
            db.execute("UPDATE calls SET finished = ? WHERE id = ?", (time.time(), call))
