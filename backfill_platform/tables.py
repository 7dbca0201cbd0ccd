"""The table registry: every Delta table's facts, declared once.

Assets, the IO manager, checks, validation, drift, the plan, maintenance and the CLI read
their table facts from here (asset key = storage path, partition column, row keys, layer,
code version, measured columns). Adding a table is one entry here plus its asset.
Shadow table names are built here too, so the suffix rule cannot be bypassed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from dagster import AssetKey


@dataclass(frozen=True)
class Table:
    key: AssetKey
    partition_column: str
    # What identifies a row within a partition (validation counts distinct keys on these).
    key_columns: tuple[str, ...]
    # Bump whenever the asset's logic changes what it writes: the version is stamped on
    # every Delta commit so a range written by mixed code can be found.
    code_version: str
    # Numeric columns whose sums drift and validation compare; empty: not drift-checked.
    measures: tuple[str, ...] = ()
    # False: the Delta partition column is not the Dagster partition day (the CRM tables:
    # fetch day, or unpartitioned); sizes per partition do not apply, commits still stamp
    # the event days a run covered (partition_start/partition_end).
    day_partitioned: bool = True
    # When a second writer shares the table's partitions: (column, SQL predicate) of the
    # rows the partitioned write path owns, and so replaces; the others are never touched
    # by it. Applied where the column exists (a table written before it holds only owned rows).
    owned_rows: tuple[str, str] | None = None

    @property
    def name(self) -> str:
        """`raw/orders`: the asset key is the table's path under the lakehouse root."""
        return self.key.to_user_string()

    @property
    def layer(self) -> str:
        return self.key.path[0]

    def owned_predicate(self, columns: Iterable[str]) -> str | None:
        """`owned_rows`' predicate when the table's `columns` hold its column, else None."""
        if self.owned_rows is None or self.owned_rows[0] not in set(columns):
            return None
        return self.owned_rows[1]

    @property
    def metadata(self) -> dict[str, str]:
        """Definition metadata of the asset: `partition_expr` names the column the IO manager
        replaces a run's range on (the dagster-deltalake convention)."""
        return {"partition_expr": self.partition_column}


RAW_ORDERS = AssetKey(["raw", "orders"])
RAW_FX_RATES = AssetKey(["raw", "fx_rates"])
STAGING_ORDERS = AssetKey(["staging", "orders"])
STAGING_REJECTS = AssetKey(["staging", "orders_rejects"])
FCT_DAILY_REVENUE = AssetKey(["marts", "fct_daily_revenue"])
CUSTOMER_LTV = AssetKey(["marts", "customer_ltv"])
# The CRM (contract 1.3): every answer kept, SCD2 versions, point-in-time revenue.
RAW_CRM_HISTORY = AssetKey(["raw", "crm_customer_history"])
STAGING_CUSTOMERS = AssetKey(["staging", "customers"])
FCT_REVENUE_BY_SEGMENT = AssetKey(["marts", "fct_revenue_by_segment"])
# Set on raw/orders rows from the stream, NULL on landing lines (transforms/messages.py).
RAW_ORDERS_STREAM_COLUMN = "kafka_topic"

TABLES: tuple[Table, ...] = (
    # Landing lines (no Kafka topic) are replaced per ingest day by the landing path; the
    # stream's messages (contract 1.4) are appended beside them, exactly once per offset.
    Table(
        RAW_ORDERS,
        "ingest_date",
        ("file_name", "line_number"),
        "raw-orders-2",
        owned_rows=(RAW_ORDERS_STREAM_COLUMN, f"`{RAW_ORDERS_STREAM_COLUMN}` IS NULL"),
    ),
    Table(RAW_FX_RATES, "rate_date", ("file_name", "line_number"), "raw-fx-1"),
    Table(STAGING_ORDERS, "event_date", ("order_id",), "staging-orders-2", ("amount",)),
    Table(STAGING_REJECTS, "ingest_date", ("file_name", "line_number"), "staging-orders-2"),
    Table(
        FCT_DAILY_REVENUE,
        "event_date",
        ("currency",),
        "fct-daily-revenue-1",
        ("orders", "paid_orders", "revenue_local", "revenue_usd"),
    ),
    Table(
        CUSTOMER_LTV,
        "snapshot_date",
        ("customer_id",),
        "customer-ltv-1",
        ("lifetime_paid_orders", "lifetime_revenue_usd"),
    ),
    # Appended, never replaced: partitioned by the UTC day of the fetch.
    Table(
        RAW_CRM_HISTORY,
        "fetched_date",
        ("customer_id", "fetched_at"),
        "raw-crm-history-1",
        day_partitioned=False,
    ),
    # Rebuilt whole from the newest kept answers: an unpartitioned Delta table.
    Table(
        STAGING_CUSTOMERS,
        "",
        ("customer_id", "valid_from"),
        "staging-customers-1",
        day_partitioned=False,
    ),
    Table(
        FCT_REVENUE_BY_SEGMENT,
        "event_date",
        ("segment", "country"),
        "fct-revenue-by-segment-1",
        ("orders", "paid_orders", "revenue_usd"),
    ),
)
# What a run keeps in memory of the ranges it writes (lakehouse.py `KeptRange`): the tables
# its later steps read over exactly that range. Not customer_ltv (its rows are many and its
# one reader, the roll-forward check, also reads the day before) nor the FX rates (read with
# the days before the range): keeping them cost their writes more than it saved.
KEPT_IN_RUN = frozenset({STAGING_ORDERS, STAGING_REJECTS, FCT_DAILY_REVENUE})
# Raw tables fed by the CRM rather than the landing zone: they run after staging/orders.
CRM_FED_RAW = (RAW_CRM_HISTORY,)
TABLE_NAMES: tuple[str, ...] = tuple(t.name for t in TABLES)
# The tables whose partition is an event/ingest day replaced whole by the one write path (the
# CRM history is appended by fetch day, staging/customers rebuilt whole): what "old or new,
# never torn" is checked on.
DAY_TABLE_NAMES: tuple[str, ...] = tuple(t.name for t in TABLES if t.day_partitioned)
LAYERS = ("raw", "staging", "marts")
_BY_NAME = {t.name: t for t in TABLES}


class UnknownTable(ValueError):
    """A name or key that is not a registered table."""


def table(key: AssetKey | str) -> Table:
    """The registered table for an asset key or a `layer/name` string; refuses others."""
    name = key if isinstance(key, str) else key.to_user_string()
    found = _BY_NAME.get(name.strip())
    if found is None:
        known = ", ".join(sorted(_BY_NAME))
        raise UnknownTable(f"unknown table {name!r}; known tables: {known}")
    return found


def tables_in(layers: Iterable[str]) -> list[Table]:
    wanted = set(layers)
    return [t for t in TABLES if t.layer in wanted]


# -- shadow tables ---------------------------------------------------------------------------
SHADOW_MARKER = "__shadow_"
SHADOW_SUFFIX_MAX = 40
_SUFFIX = re.compile(rf"[A-Za-z0-9_]{{1,{SHADOW_SUFFIX_MAX}}}")


class InvalidShadowSuffix(ValueError):
    """A shadow suffix outside the rule; nothing was touched."""


def check_shadow_suffix(suffix: object) -> str:
    """The one suffix rule: letters, digits and `_`, 1..40 characters.

    Enforced where shadow names are built (`shadow_name`), so a suffix can never carry a
    path separator, `..`, or anything else that would point a path outside its layer.
    """
    if not isinstance(suffix, str) or not _SUFFIX.fullmatch(suffix):
        raise InvalidShadowSuffix(
            f"--suffix {suffix!r}: a shadow suffix is 1 to {SHADOW_SUFFIX_MAX} letters, digits "
            "or '_' (no '/', '.', spaces or other characters); nothing was touched."
        )
    return suffix


def shadow_name(name: str, suffix: str) -> str:
    """`marts/fct_daily_revenue__shadow_fx` for a registered table and a valid suffix."""
    return f"{table(name).name}{SHADOW_MARKER}{check_shadow_suffix(suffix)}"


# -- shadow assets ---------------------------------------------------------------------------
# A shadow backfill materializes twins of the correctable assets under their own keys, so
# Dagster never records a shadow write as a production materialization.
SHADOW_KEY_PREFIX = "shadow"
SHADOW_GROUP = "shadow"
CORRECTABLE_LAYERS = ("staging", "marts")  # raw is re-ingested, never replaced by a shadow
# The run tag a shadow run carries: the suffix its twins write `<table>__shadow_<suffix>` to.
SHADOW_SUFFIX_TAG = "backfill_platform/shadow_suffix"


def shadow_key(key: AssetKey | str) -> AssetKey:
    """`shadow/marts/fct_daily_revenue` for `marts/fct_daily_revenue` (a registered table)."""
    return AssetKey([SHADOW_KEY_PREFIX, *table(key).key.path])


def production_key(key: AssetKey) -> AssetKey | None:
    """The registered table a shadow key twins; None for any other key."""
    if len(key.path) < 2 or key.path[0] != SHADOW_KEY_PREFIX:
        return None
    return table(AssetKey(key.path[1:])).key


def run_shadow_suffix(tags: Mapping[str, str]) -> str | None:
    """The run's shadow suffix from its `SHADOW_SUFFIX_TAG`, checked; None without the tag."""
    if SHADOW_SUFFIX_TAG not in tags:
        return None
    try:
        return check_shadow_suffix(tags[SHADOW_SUFFIX_TAG])
    except InvalidShadowSuffix as error:
        raise InvalidShadowSuffix(f"run tag {SHADOW_SUFFIX_TAG}: {error}") from None
