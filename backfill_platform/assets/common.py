"""What every partitioned asset shares: partitions, chunked backfills, keys and versions."""

from __future__ import annotations

from datetime import date

from dagster import AssetExecutionContext, AssetKey, BackfillPolicy

from backfill_platform.settings import PARTITIONS_PER_RUN, setting

RAW_ORDERS = AssetKey(["raw", "orders"])
RAW_FX_RATES = AssetKey(["raw", "fx_rates"])
STAGING_ORDERS = AssetKey(["staging", "orders"])
STAGING_REJECTS = AssetKey(["staging", "orders_rejects"])
FCT_DAILY_REVENUE = AssetKey(["marts", "fct_daily_revenue"])
CUSTOMER_LTV = AssetKey(["marts", "customer_ltv"])

# Bump an asset's code version whenever its logic changes what it writes: the version is
# stamped on every Delta commit so a range written by mixed code can be found.
CODE_VERSIONS = {
    RAW_ORDERS: "raw-orders-1",
    RAW_FX_RATES: "raw-fx-1",
    STAGING_ORDERS: "staging-orders-1",
    STAGING_REJECTS: "staging-orders-1",
    FCT_DAILY_REVENUE: "fct-daily-revenue-1",
    CUSTOMER_LTV: "customer-ltv-1",
}

# The furthest an order arrives after its event day in lineage terms; staging itself reads
# every later ingest day (see staging.py), this only draws the dependency in the graph.
LATE_ARRIVAL_LINEAGE_DAYS = 10


def chunked_backfill_policy() -> BackfillPolicy:
    """Ranged runs of at most BACKFILL_PARTITIONS_PER_RUN days: resumable chunk by chunk."""
    return BackfillPolicy.multi_run(max_partitions_per_run=int(setting(PARTITIONS_PER_RUN)))


def run_dates(context: AssetExecutionContext) -> tuple[date, date]:
    """The run's half-open date range [start, end) from Dagster's time window."""
    window = context.partition_time_window
    return window.start.date(), window.end.date()
