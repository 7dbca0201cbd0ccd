"""Anchor: the two marts computed by DuckDB straight from the landing files, on one machine.

Independent of the platform on purpose (no `backfill_platform.transforms`, no Spark): it is
what this hardware does with a columnar engine and the contract (docs/contract.md 1.1, 1.2,
2.1) written as SQL, so the benchmark can tell how far the platform is from the machine,
not from itself. Exact decimals throughout (DECIMAL(18,2) amounts x DECIMAL(18,8) rates).
Rejects are filtered with the contract's rules but not kept: the anchor produces the marts
only, the part of the platform's output it is compared on.
"""

from __future__ import annotations

from datetime import date
from decimal import Decimal
from pathlib import Path

# One row per landing line: day, file name, 1-based line number, text without '\r'.
_LINES = """
CREATE TEMP TABLE lines AS
WITH files AS (
    SELECT regexp_extract(filename, 'ingest_date=([0-9-]{10})', 1)::DATE AS ingest_date,
           regexp_extract(filename, '[^/]+$') AS file_name,
           string_split(content, chr(10)) AS pieces
    FROM read_text($orders)
)
SELECT ingest_date, file_name, unnest(pieces) AS piece,
       generate_subscripts(pieces, 1) AS line_number
FROM files WHERE ingest_date BETWEEN $first AND $last
"""

_RATES = """
CREATE TEMP TABLE rates AS
SELECT regexp_extract(filename, 'rate_date=([0-9-]{10})', 1)::DATE AS rate_date,
       currency, usd_per_unit::DECIMAL(18, 8) AS usd_per_unit
FROM read_csv($fx, header = true, filename = true,
              columns = {'currency': 'VARCHAR', 'usd_per_unit': 'VARCHAR'})
WHERE regexp_full_match(currency, '[A-Z]{3}')
  AND regexp_full_match(usd_per_unit, '[0-9]+([.][0-9]{1,8})?')
  AND usd_per_unit::DECIMAL(18, 8) > 0
"""

# Contract 1.1: a line is valid when it is a JSON object with the required fields, of the
# right types, RFC 3339 timestamps with an offset that exist in the calendar, a known status
# and currency, and an amount >= 0 with at most 2 significant fractional digits.
_VALID = """
CREATE TEMP TABLE valid AS
WITH docs AS (
    SELECT ingest_date, file_name, line_number, rtrim(piece, chr(13)) AS doc
    FROM lines WHERE trim(rtrim(piece, chr(13))) <> ''
), objects AS (
    SELECT * FROM docs WHERE json_valid(doc) AND json_type(doc) = 'OBJECT'
), fields AS (
    SELECT ingest_date, file_name, line_number,
           json_type(doc, '$.order_id') AS t_order, doc ->> '$.order_id' AS order_id,
           json_type(doc, '$.customer_id') AS t_customer, doc ->> '$.customer_id' AS customer_id,
           json_type(doc, '$.event_time') AS t_event, doc ->> '$.event_time' AS event_text,
           json_type(doc, '$.updated_at') AS t_updated, doc ->> '$.updated_at' AS updated_text,
           json_type(doc, '$.status') AS t_status, doc ->> '$.status' AS status,
           json_type(doc, '$.currency') AS t_currency, doc ->> '$.currency' AS currency,
           json_type(doc, '$.amount') AS t_amount, doc ->> '$.amount' AS amount_text
    FROM objects
), typed AS (
    SELECT *,
           try_cast(replace(event_text, 'Z', '+00:00') AS TIMESTAMPTZ) AS event_time,
           try_cast(replace(updated_text, 'Z', '+00:00') AS TIMESTAMPTZ) AS updated_at
    FROM fields
    WHERE t_order = 'VARCHAR' AND order_id <> ''
      AND coalesce(t_customer, 'NULL') IN ('VARCHAR', 'NULL')
      AND t_event = 'VARCHAR' AND t_updated = 'VARCHAR'
      AND t_status = 'VARCHAR' AND t_currency = 'VARCHAR'
      AND t_amount IN ('VARCHAR', 'UBIGINT', 'BIGINT', 'DOUBLE')
      AND regexp_full_match(amount_text, '[0-9]+([.][0-9]*)?')
      AND length(rtrim(regexp_extract(amount_text, '[.]([0-9]*)$', 1), '0')) <= 2
      AND amount_text::DECIMAL(38, 10) < 1e16
      AND status IN ('placed', 'paid', 'refunded', 'cancelled')
      AND (currency = 'USD' OR currency IN (SELECT currency FROM rates))
      AND regexp_full_match(event_text, $timestamp)
      AND regexp_full_match(updated_text, $timestamp)
)
SELECT order_id, CASE WHEN t_customer = 'VARCHAR' THEN customer_id END AS customer_id,
       event_time, updated_at, status, currency,
       amount_text::DECIMAL(38, 10)::DECIMAL(18, 2) AS amount,
       ingest_date, file_name, line_number
FROM typed WHERE event_time IS NOT NULL AND updated_at IS NOT NULL
"""

_TIMESTAMP = (
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}([.][0-9]{1,9})?"
    r"(Z|[+-]((0[0-9]|1[0-7]):[0-5][0-9]|18:00))"
)

# Latest wins (greatest updated_at, then the last to arrive), then point-in-time FX: the
# rate of the event day or the most recent one within the 7 days before it.
_STAGED = """
CREATE TEMP TABLE staged AS
WITH current_state AS (
    SELECT * EXCLUDE (rank) FROM (
        SELECT *, row_number() OVER (
            PARTITION BY order_id
            ORDER BY updated_at DESC, ingest_date DESC, file_name DESC, line_number DESC
        ) AS rank
        FROM valid
    ) WHERE rank = 1
), dated AS (
    SELECT *, timezone('UTC', event_time)::DATE AS event_date FROM current_state
)
SELECT d.*,
       CASE WHEN d.currency = 'USD' THEN 1::DECIMAL(18, 8) ELSE (
           SELECT r.usd_per_unit FROM rates r
           WHERE r.currency = d.currency
             AND r.rate_date BETWEEN d.event_date - 7 AND d.event_date
           ORDER BY r.rate_date DESC LIMIT 1
       ) END AS usd_per_unit
FROM dated d
WHERE d.event_date BETWEEN $first AND $last
"""

_FCT = """
SELECT event_date, currency, count(*) AS orders,
       count(*) FILTER (WHERE status = 'paid') AS paid_orders,
       coalesce(sum(amount) FILTER (WHERE status = 'paid'), 0) AS revenue_local,
       coalesce(sum(amount * usd_per_unit) FILTER (WHERE status = 'paid'), 0) AS revenue_usd
FROM staged GROUP BY ALL ORDER BY ALL
"""

# Cumulative per customer: one row per (snapshot day, customer) from the customer's first
# paid order on, each day carrying the running totals of the days up to it.
_LTV = """
WITH daily AS (
    SELECT customer_id, event_date, count(*) AS paid, sum(amount * usd_per_unit) AS usd
    FROM staged WHERE status = 'paid' AND customer_id IS NOT NULL GROUP BY ALL
), running AS (
    SELECT customer_id, event_date,
           sum(paid) OVER w AS lifetime_paid_orders,
           sum(usd) OVER w AS lifetime_revenue_usd,
           min(event_date) OVER w AS first_order_date,
           coalesce(lead(event_date) OVER (PARTITION BY customer_id ORDER BY event_date),
                    $last + 1) AS next_change
    FROM daily
    WINDOW w AS (PARTITION BY customer_id ORDER BY event_date)
)
SELECT day::DATE AS snapshot_date, customer_id, lifetime_paid_orders, lifetime_revenue_usd,
       first_order_date
FROM running,
     range(event_date::TIMESTAMP, next_change::TIMESTAMP, INTERVAL 1 DAY) AS t(day)
ORDER BY ALL
"""


def _connect(landing_dir: Path, first: date, last: date, threads: int | None):
    """A connection holding the staged orders of first..last (tables rates, valid, staged)."""
    import duckdb

    con = duckdb.connect()
    if threads:
        con.execute(f"SET threads = {int(threads)}")
    con.execute("SET TimeZone = 'UTC'")
    landing = Path(landing_dir)
    con.execute(_RATES, {"fx": str(landing / "fx_rates" / "rate_date=*" / "*.csv")})
    orders = str(landing / "orders" / "ingest_date=*" / "*.jsonl")
    con.execute(_LINES, {"orders": orders, "first": first, "last": last})
    con.execute(_VALID, {"timestamp": _TIMESTAMP})
    con.execute(_STAGED, {"first": first, "last": last})
    missing = con.execute(
        "SELECT DISTINCT event_date, currency FROM staged WHERE usd_per_unit IS NULL"
    ).fetchall()
    if missing:
        con.close()
        raise ValueError(f"no FX rate within 7 days for {sorted(missing)[:5]}")
    return con


def run_duckdb(
    landing_dir: Path, first: date, last: date, threads: int | None = None
) -> tuple[list[tuple], list[tuple]]:
    """Rows of marts/fct_daily_revenue and marts/customer_ltv for first..last, from the
    landing days first..last (as a backfill of that range reads them)."""
    con = _connect(landing_dir, first, last, threads)
    try:
        return con.execute(_FCT).fetchall(), con.execute(_LTV, {"last": last}).fetchall()
    finally:
        con.close()


def write_duckdb_marts(
    landing_dir: Path, first: date, last: date, out_dir: Path, threads: int | None = None
) -> None:
    """Both marts as Parquet under out_dir (fct_daily_revenue/, customer_ltv/), as the
    floor writes them, so the benchmark compares all contenders the same way."""
    con = _connect(landing_dir, first, last, threads)
    try:
        for name, query, params in (
            ("fct_daily_revenue", _FCT, {}),
            ("customer_ltv", _LTV, {"last": last}),
        ):
            target = Path(out_dir) / name
            target.mkdir(parents=True, exist_ok=True)
            path = str(target / "part-0.parquet").replace("'", "''")
            con.execute(f"COPY ({query}) TO '{path}' (FORMAT parquet)", params)
    finally:
        con.close()


def normalized(rows: list[tuple]) -> list[tuple]:
    """Decimals by value (scales differ between engines), dates as ISO text."""
    return sorted(
        tuple(
            v.normalize() if isinstance(v, Decimal) else v.isoformat() if isinstance(v, date) else v
            for v in row
        )
        for row in rows
    )
