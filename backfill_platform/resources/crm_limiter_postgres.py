"""The CRM rate limit shared by every machine of a deployment: the sliding window in PostgreSQL.

The same window as the SQLite limiter (`crm_limiter.py`: two budgets, a call in flight
counts as "now", a record in flight for over 120 s is taken for a killed process), kept in a
table of the Dagster instance's PostgreSQL (deploy/dagster-postgres.yaml, the DAGSTER_PG_*
settings), which every machine that runs a run already reaches.

- **One transaction per admission.** `pg_advisory_xact_lock` serialises the limiters of
  every machine for the few statements that drop expired records, count both budgets and
  insert the call; the lock ends with the transaction, also when the connection dies.
- **One clock.** Stamps are the database server's `clock_timestamp()`, never a caller's
  clock: machines whose clocks disagree still count one window.
- **A lost connection waits, it never admits.** No call starts without its record committed:
  when PostgreSQL is unreachable (a restart, a failover), `acquire` reconnects every half
  second and fails with `LimiterUnavailable` after `unavailable_seconds`; `finish` retries
  as long, then leaves the record in flight (it counts as "now" until it expires: the
  window over-counts, never under-counts). The table is a logged one: crash recovery keeps
  every committed record (an UNLOGGED table would be emptied and forget the last second).
- **The password** is read from DAGSTER_PG_PASSWORD where the connection opens; messages
  name `user@host:port/db` only.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import psycopg2

from backfill_platform.resources.crm_limiter import (
    BACKFILL,
    STALE_SECONDS,
    WINDOW_SECONDS,
    check_kind,
    check_limits,
    window_wait,
)
from backfill_platform.settings import PG_DB, PG_HOST, PG_PASSWORD, PG_PORT, PG_USERNAME, setting

TABLE = "backfill_crm_rate_limit"
# pg_advisory_xact_lock key: "crm_lim" in ASCII, so other users of advisory locks can tell.
LOCK_KEY = 0x63726D5F6C696D
_RETRY_SECONDS = 0.5
# Errors of the connection, not of the statement: wait and reconnect.
_LOST = (psycopg2.OperationalError, psycopg2.InterfaceError)


class LimiterUnavailable(RuntimeError):
    """The limiter's database did not answer for too long; no call was admitted meanwhile."""


@dataclass(frozen=True)
class PgConnection:
    """Where the window lives; `str()` and `repr()` never show the password."""

    host: str
    port: int
    user: str
    dbname: str
    password: str = field(default="", repr=False)

    @classmethod
    def from_settings(cls) -> PgConnection:
        """The Dagster instance's connection settings (deploy/dagster-postgres.yaml)."""
        port = setting(PG_PORT).strip() or "5432"
        if not port.isdigit():
            raise LimiterUnavailable(f"DAGSTER_PG_PORT={port!r}: not a port number")
        return cls(
            host=setting(PG_HOST).strip(),
            port=int(port),
            user=setting(PG_USERNAME).strip(),
            dbname=setting(PG_DB).strip(),
            password=PG_PASSWORD.get_value() or "",
        )

    def __str__(self) -> str:
        return f"postgresql://{self.user}@{self.host}:{self.port}/{self.dbname}"

    def scrub(self, text: str) -> str:
        """One line of a driver message, the password removed should it ever appear."""
        line = (text.strip().splitlines() or [""])[0]
        return line.replace(self.password, "***") if self.password else line


class PostgresRateLimiter:
    """acquire() blocks until a call may start; finish() stamps its completion."""

    def __init__(
        self,
        connection: PgConnection,
        limit: int,
        backfill_limit: int,
        unavailable_seconds: float = 60.0,
    ):
        check_limits(limit, backfill_limit)
        self.connection = connection
        self.limit = limit
        self.backfill_limit = backfill_limit
        self.unavailable_seconds = unavailable_seconds
        # One connection per thread (a transaction belongs to a connection), as in SQLite.
        self._local = threading.local()
        self._opened: list = []
        self._lock = threading.Lock()

    def _connect(self):
        c = self.connection
        db = psycopg2.connect(
            host=c.host,
            port=c.port,
            user=c.user,
            password=c.password,
            dbname=c.dbname,
            connect_timeout=5,
            application_name="backfill_platform crm limiter",
            # A machine that vanishes mid-transaction must not hold the lock for long: the
            # server ends its session (and the transaction, and the lock) within seconds.
            keepalives=1,
            keepalives_idle=5,
            keepalives_interval=2,
            keepalives_count=3,
            options="-c idle_in_transaction_session_timeout=10000 -c statement_timeout=30000",
        )
        try:
            with db.cursor() as cur:
                # Several machines may start at once: create the table under the same lock.
                cur.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))
                cur.execute(
                    f"CREATE TABLE IF NOT EXISTS {TABLE} (id bigserial PRIMARY KEY, "
                    "kind text NOT NULL, started double precision NOT NULL, "
                    "finished double precision)"
                )
            db.commit()
        except BaseException:
            db.close()
            raise
        return db

    def _db(self):
        db = getattr(self._local, "db", None)
        if db is None or db.closed:
            db = self._local.db = self._connect()
            with self._lock:
                self._opened.append(db)
        return db

    def _drop(self) -> None:
        """Forget this thread's connection after it failed (the server rolls back)."""
        db = getattr(self._local, "db", None)
        self._local.db = None
        if db is not None and not db.closed:
            db.close()

    def close(self) -> None:
        """Close every connection this limiter opened (each thread's)."""
        with self._lock:
            opened, self._opened = self._opened, []
        for db in opened:
            if not db.closed:
                db.close()
        self._local = threading.local()

    def __enter__(self) -> PostgresRateLimiter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def acquire(self, kind: str) -> tuple[int, float]:
        """Wait for a slot; returns (call id, seconds waited)."""
        check_kind(kind)
        waited, lost_since = 0.0, None
        while True:
            try:
                wait = self._try(self._db(), kind)
                lost_since = None
            except _LOST as error:
                self._drop()
                lost_since = lost_since or time.monotonic()
                if time.monotonic() - lost_since > self.unavailable_seconds:
                    raise LimiterUnavailable(
                        f"the CRM rate limiter's PostgreSQL ({self.connection}) did not answer "
                        f"for {self.unavailable_seconds:.0f} s, no CRM call was made meanwhile "
                        f"(check DAGSTER_PG_*): {self.connection.scrub(str(error))}"
                    ) from None
                wait = _RETRY_SECONDS
            if isinstance(wait, int):
                return wait, waited
            time.sleep(wait)
            waited += wait

    def _try(self, db, kind: str) -> int | float:
        try:
            with db.cursor() as cur:
                cur.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))
                # The server's clock, read once the lock is held.
                cur.execute("SELECT extract(epoch FROM clock_timestamp())::float8")
                (now,) = cur.fetchone()
                cur.execute(
                    f"DELETE FROM {TABLE} WHERE finished <= %s "
                    "OR (finished IS NULL AND started < %s)",
                    (now - WINDOW_SECONDS, now - STALE_SECONDS),
                )
                cur.execute(
                    f"SELECT count(*), count(*) FILTER (WHERE kind = %s) FROM {TABLE}",
                    (BACKFILL,),
                )
                total, backfills = cur.fetchone()
                if total >= self.limit or (kind == BACKFILL and backfills >= self.backfill_limit):
                    cur.execute(f"SELECT kind, finished FROM {TABLE}")
                    rows = cur.fetchall()
                    db.commit()
                    return window_wait(rows, kind, now, self.limit, self.backfill_limit)
                cur.execute(
                    f"INSERT INTO {TABLE} (kind, started) VALUES (%s, %s) RETURNING id",
                    (kind, now),
                )
                (call,) = cur.fetchone()
            # If the connection dies during COMMIT the record may exist without our knowing:
            # it then counts as in flight until it expires (over-counting, never under).
            db.commit()
            return int(call)
        except _LOST:
            raise
        except BaseException:
            if not db.closed:
                db.rollback()
            raise

    def finish(self, call: int) -> None:
        """Stamp the call's completion with the server's clock; while the database is
        unreachable, retry for `unavailable_seconds`, then leave the record in flight."""
        lost_since = None
        while True:
            try:
                db = self._db()
                with db.cursor() as cur:
                    cur.execute(
                        f"UPDATE {TABLE} SET finished = extract(epoch FROM clock_timestamp()) "
                        "WHERE id = %s",
                        (call,),
                    )
                db.commit()
                return
            except _LOST:
                self._drop()
                lost_since = lost_since or time.monotonic()
                if time.monotonic() - lost_since > self.unavailable_seconds:
                    return  # counted as "now" until it expires: a slot lost, never one extra
                time.sleep(_RETRY_SECONDS)
