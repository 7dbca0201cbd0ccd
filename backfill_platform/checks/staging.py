"""The checks of a run's staging/orders and its rejects, in one step.

Four checks read staging or raw over the run's days once staging is written: the accounting
of every raw row (`staging_vs_raw`), the rejects' (`rejects_vs_raw`), quality and skew. They
run as one Dagster step whose queries run at the same time (`at_once`): each is small next
to the write, mostly the driver's snapshot, planning and stage waits, so on one JVM they
overlap instead of queueing, and the step reads the run's materializations once for the
evaluations' targets. Each check keeps its own name, severity, blocking flag and one
evaluation per day; a blocking failure fails the step after every evaluation is logged, as
a check step of its own would (results.record).
"""

from dagster import AssetCheckExecutionContext, multi_asset_check

from backfill_platform.checks.quality import QUALITY_SPECS, quality_outcomes
from backfill_platform.checks.reconciliation import (
    ACCOUNTS_SPEC,
    REJECTS_SPEC,
    rejects_vs_raw,
    staging_vs_raw,
    versions_written,
)
from backfill_platform.checks.results import (
    CheckEvents,
    at_once,
    log_partition_metrics,
    record,
    run_partitions,
)
from backfill_platform.checks.skew import SKEW_SPEC, skew_outcome
from backfill_platform.resources import LakehouseResource
from backfill_platform.tables import RAW_ORDERS, STAGING_ORDERS, STAGING_REJECTS


@multi_asset_check(
    specs=[ACCOUNTS_SPEC, REJECTS_SPEC, *QUALITY_SPECS, SKEW_SPEC],
    name="staging_orders_checks",
)
def staging_orders_checks(
    context: AssetCheckExecutionContext, lakehouse: LakehouseResource
) -> CheckEvents:
    """staging/orders and its rejects account for every raw row; order_id unique, required
    values set, volume and NULL rates within trailing bounds; customer_id skew."""
    run = run_partitions(context)
    # In the run that built staging: the versions it committed and the raw version it read.
    staging_version, raw_for_staging = versions_written(
        context, lakehouse, STAGING_ORDERS, RAW_ORDERS, run
    )
    rejects_version, raw_for_rejects = versions_written(
        context, lakehouse, STAGING_REJECTS, RAW_ORDERS, run
    )
    (accounts, accounts_metrics), (rejects, rejects_metrics), quality, skew = at_once(
        lambda: staging_vs_raw(lakehouse, run, raw_for_staging, staging_version),
        lambda: rejects_vs_raw(lakehouse, run, raw_for_rejects, rejects_version),
        lambda: quality_outcomes(lakehouse, run),
        lambda: skew_outcome(lakehouse, run),
    )
    log_partition_metrics(context, STAGING_ORDERS, accounts_metrics)
    log_partition_metrics(context, STAGING_REJECTS, rejects_metrics)
    accounts.metrics, rejects.metrics = accounts_metrics, rejects_metrics
    yield from record(context, accounts, rejects, *quality, skew)


staging_checks = [staging_orders_checks]
