"""What every partitioned asset shares: chunked backfills and the run's date range.

Table facts (keys, partition columns, code versions) live in `backfill_platform.tables`.
"""

from __future__ import annotations

from datetime import date

from dagster import AssetExecutionContext, BackfillPolicy

from backfill_platform.settings import PARTITIONS_PER_RUN, int_setting

# The furthest an order arrives after its event day in lineage terms; staging itself reads
# every later ingest day (see staging.py), this only draws the dependency in the graph.
LATE_ARRIVAL_LINEAGE_DAYS = 10


def chunked_backfill_policy() -> BackfillPolicy:
    """Ranged runs of at most BACKFILL_PARTITIONS_PER_RUN days: resumable chunk by chunk."""
    return BackfillPolicy.multi_run(max_partitions_per_run=int_setting(PARTITIONS_PER_RUN))


def run_dates(context: AssetExecutionContext) -> tuple[date, date]:
    """The run's half-open date range [start, end) from Dagster's time window.

    The dates are what Delta predicates take; where the days themselves are needed,
    `DayRange.of_dates(*run_dates(context))` gives them (no counting by hand).
    """
    window = context.partition_time_window
    return window.start.date(), window.end.date()
