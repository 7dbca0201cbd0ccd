"""The CRM rate limit shared by every process on the machine: a sliding window in SQLite.

(`RateLimiter` is what the CRM client needs of any holder; `crm_limiter_postgres.py` keeps the
same window in PostgreSQL for deployments on several machines. The window arithmetic,
`window_wait`, is shared by both.)

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
the limiter admitted. Several machines need a shared holder instead: the same table in the
Dagster instance's PostgreSQL (`crm_limiter_postgres.py`); docs/crm.md says which one a
deployment gets.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Sequence
from contextlib import closing
from pathlib import Path
from typing import Protocol

BACKFILL, LIVE = "backfill", "live"
WINDOW_SECONDS = 1.0
# A call in flight longer than this is taken for a crashed process and stops counting.
STALE_SECONDS = 120.0


class RateLimiter(Protocol):
    """What `CrmResource` needs of a limiter, whichever holds the window."""

    def acquire(self, kind: str) -> tuple[int, float]:
        """Wait for a slot; returns (call id, seconds waited)."""
        ...

    def finish(self, call: int) -> None:
        """Stamp the call's completion: from then on it leaves the window after a second."""
        ...

    def close(self) -> None: ...

    def __enter__(self) -> RateLimiter: ...

    def __exit__(self, *exc) -> None: ...


def check_kind(kind: str) -> None:
    if kind not in (BACKFILL, LIVE):
        raise ValueError(f"kind {kind!r}: must be {BACKFILL!r} or {LIVE!r}")


def check_limits(limit: int, backfill_limit: int) -> None:
    if limit < 1 or not 1 <= backfill_limit <= limit:
        raise ValueError(f"rate limit {limit} / backfill share {backfill_limit}: invalid")


def window_wait(
    rows: Sequence[tuple[str, float | None]], kind: str, now: float, limit: int, backfill_limit: int
) -> float:
    """Seconds until a `kind` call fits both budgets, given the window's (kind, finished)
    rows (finished None: in flight, counted as `now`); 0.0 when it fits now."""
    budgets = [(limit, rows)]
    if kind == BACKFILL:
        budgets.append((backfill_limit, [r for r in rows if r[0] == BACKFILL]))
    wait = 0.0
    for budget, counted in budgets:
        if len(counted) >= budget:
            # The (len - budget + 1)-th oldest stamp must leave the window first; an
            # in-flight call has no stamp yet: look again shortly.
            stamps = sorted(r[1] if r[1] is not None else now for r in counted)
            frees = stamps[len(counted) - budget] + WINDOW_SECONDS
            wait = max(wait, frees - now, 0.005)
    return min(wait, WINDOW_SECONDS)


class CrmRateLimiter:
    """acquire() blocks until a call may start; finish() stamps its completion."""

    def __init__(self, path: str | Path, limit: int, backfill_limit: int):
        check_limits(limit, backfill_limit)
        self.path = Path(path)
        self.limit = limit
        self.backfill_limit = backfill_limit
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # One connection per thread for the limiter's life: opening and closing one per
        # acquire and per finish made the last close of the file checkpoint the WAL every
        # time (2-20 ms a call on a busy machine, the bench's CRM calls ran at 17-60/s).
        self._local = threading.local()
        self._opened: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        with closing(self._connect()) as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(
                "CREATE TABLE IF NOT EXISTS calls (id INTEGER PRIMARY KEY, kind TEXT NOT NULL, "
                "started REAL NOT NULL, finished REAL)"
            )

    def _connect(self) -> sqlite3.Connection:
        # Used by the thread that opened it only; `close` runs after those threads ended.
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
        # A second of call stamps needs no fsync per commit (two commits a call): WAL with
        # synchronous=NORMAL keeps commits atomic and isolated between processes; a power
        # cut may lose the last stamps, which a one-second window does not miss.
        db.execute("PRAGMA synchronous=NORMAL")
        return db

    def _db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            db = self._local.db = self._connect()
            with self._lock:
                self._opened.append(db)
        return db

    def close(self) -> None:
        """Close every connection this limiter opened (each thread's)."""
        with self._lock:
            opened, self._opened = self._opened, []
        for db in opened:
            db.close()
        self._local = threading.local()

    def __enter__(self) -> CrmRateLimiter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def acquire(self, kind: str) -> tuple[int, float]:
        """Wait for a slot; returns (call id, seconds waited)."""
        check_kind(kind)
        waited = 0.0
        db = self._db()
        while True:
            wait = self._try(db, kind)
            if isinstance(wait, int):
                return wait, waited
            time.sleep(wait)
            waited += wait

    def _try(self, db: sqlite3.Connection, kind: str) -> int | float:
        now = time.time()
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute(
                "DELETE FROM calls WHERE finished <= ? OR (finished IS NULL AND started < ?)",
                (now - WINDOW_SECONDS, now - STALE_SECONDS),
            )
            # Counting is enough while both budgets have room; the stamps are read only to
            # compute a wait (at 600 calls/s, reading the window's rows on every call cost
            # more than the call).
            total, backfills = db.execute(
                "SELECT COUNT(*), COUNT(CASE WHEN kind = ? THEN 1 END) FROM calls", (BACKFILL,)
            ).fetchone()
            full = total >= self.limit or (kind == BACKFILL and backfills >= self.backfill_limit)
            if full:
                rows = db.execute("SELECT kind, finished FROM calls").fetchall()
                db.execute("COMMIT")
                return window_wait(rows, kind, now, self.limit, self.backfill_limit)
            call = db.execute(
                "INSERT INTO calls (kind, started) VALUES (?, ?)", (kind, now)
            ).lastrowid
            db.execute("COMMIT")
            return int(call)
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def finish(self, call: int) -> None:
        self._db().execute("UPDATE calls SET finished = ? WHERE id = ?", (time.time(), call))
