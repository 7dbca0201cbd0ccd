"""Marts: daily revenue per currency and customer lifetime value, in exact decimals."""

from datetime import timedelta

from dagster import (
    AssetExecutionContext,
    AssetIn,
    Failure,
    TimeWindowPartitionMapping,
    asset,
)
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from backfill_platform.assets.common import chunked_backfill_policy, run_dates
from backfill_platform.partitions import daily_partitions
from backfill_platform.ranges import DayRange
from backfill_platform.resources import LakehouseResource, SparkSessionResource
from backfill_platform.resources.delta_io_manager import OWN_DAYS_ONLY
from backfill_platform.tables import (
    CUSTOMER_LTV,
    FCT_DAILY_REVENUE,
    RAW_FX_RATES,
    STAGING_ORDERS,
    table,
)
from backfill_platform.transforms.fx import REACH_DAYS, FxRateError, with_usd
from backfill_platform.transforms.revenue import customer_ltv as compute_customer_ltv
from backfill_platform.transforms.revenue import daily_revenue

# Point-in-time FX needs the rates of the event day and of the 7 days before it.
_FX_REACH = TimeWindowPartitionMapping(
    start_offset=-REACH_DAYS, end_offset=0, allow_nonexistent_upstream_partitions=True
)
_PREVIOUS_DAY = TimeWindowPartitionMapping(
    start_offset=-1, end_offset=-1, allow_nonexistent_upstream_partitions=True
)
# LTV reads only the run's staging days (`OWN_DAYS_ONLY`: the run's own write of them, kept in
# memory), but waits on the REACH_DAYS before them too, so every LTV day a backfill targets
# waits for the staging days the backfill rebuilds before it (Dagster's daemon otherwise
# requested the days past staging's range first: docs/lineage.md, "Order of the LTV
# chunks"). The window is FX's reach, so a backfill targets no more LTV days than before.
_STAGED_UNTIL_DAY = _FX_REACH


def _orders_in_usd(staged: DataFrame | None, fx: DataFrame | None, spark) -> DataFrame:
    if staged is None:  # retried: a backfill's run building it may not have ended yet
        raise Failure("staging/orders has not been built; materialize it for this range first.")
    if fx is None:
        fx = spark.createDataFrame(
            [], "rate_date date, currency string, usd_per_unit decimal(18,8), reject_reason string"
        )
    try:
        return with_usd(staged, fx)
    except FxRateError as error:
        raise Failure(str(error)) from error


@asset(
    key=FCT_DAILY_REVENUE,
    pool="lakehouse_downstream",  # serializes staging/marts writers (deploy/dagster.yaml)
    group_name="marts",
    partitions_def=daily_partitions,
    backfill_policy=chunked_backfill_policy(),
    code_version=table(FCT_DAILY_REVENUE).code_version,
    metadata=table(FCT_DAILY_REVENUE).metadata,
    ins={
        "staged": AssetIn(STAGING_ORDERS),
        "fx": AssetIn(RAW_FX_RATES, partition_mapping=_FX_REACH),
    },
    kinds={"spark", "delta"},
)
def fct_daily_revenue(
    context: AssetExecutionContext,
    spark: SparkSessionResource,
    staged: DataFrame | None,
    fx: DataFrame | None,
) -> DataFrame:
    """Orders, paid orders and revenue per (event_date, currency); USD at point-in-time FX.

    A day whose orders have no rate within 7 days fails the run, naming the days and
    currencies, and nothing is written.
    """
    return daily_revenue(_orders_in_usd(staged, fx, spark.get_session())).withColumn(
        "_loaded_at", F.current_timestamp()
    )


@asset(
    key=CUSTOMER_LTV,
    pool="lakehouse_downstream",
    group_name="marts",
    partitions_def=daily_partitions,
    backfill_policy=chunked_backfill_policy(),
    code_version=table(CUSTOMER_LTV).code_version,
    metadata=table(CUSTOMER_LTV).metadata,
    ins={
        "staged": AssetIn(
            STAGING_ORDERS, partition_mapping=_STAGED_UNTIL_DAY, metadata={OWN_DAYS_ONLY: True}
        ),
        "fx": AssetIn(RAW_FX_RATES, partition_mapping=_FX_REACH),
        "previous": AssetIn(CUSTOMER_LTV, partition_mapping=_PREVIOUS_DAY),
    },
    kinds={"spark", "delta"},
)
def customer_ltv(
    context: AssetExecutionContext,
    spark: SparkSessionResource,
    lakehouse: LakehouseResource,
    staged: DataFrame | None,
    fx: DataFrame | None,
    previous: DataFrame | None,
) -> DataFrame:
    """Lifetime paid orders and USD revenue per customer, one snapshot per day.

    Self-dependent: snapshot D is snapshot D-1 plus day D, so ranges must be built oldest
    first. The snapshot before the range must exist (unless the range starts at the first
    partition); otherwise the run fails instead of restarting everyone's LTV at zero.
    """
    run = DayRange.of_dates(*run_dates(context))
    start = run.start
    day_before = start - timedelta(days=1)
    first_partition = daily_partitions.start.date()
    base = None
    if start > first_partition:
        if not lakehouse.covers(CUSTOMER_LTV, day_before):
            # Retried, not a refusal (refusals.py): an asset backfill may launch these days
            # while the run rebuilding the day before is still going; a retry comes after.
            raise Failure(
                f"marts/customer_ltv has no snapshot for {day_before}; build the earlier "
                "partitions first (LTV is cumulative and runs oldest to newest)."
            )
        base = previous.where(F.col(table(CUSTOMER_LTV).partition_column) == F.lit(day_before))
    orders = _orders_in_usd(staged, fx, spark.get_session())
    return compute_customer_ltv(orders, base, run.days()).withColumn(
        "_loaded_at", F.current_timestamp()
    )
