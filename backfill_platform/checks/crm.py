"""Checks of the CRM tables: SCD2 validity, and segment revenue reconciled with daily revenue.

`staging_customers_scd2` (ERROR): every version has a parseable valid_from, no two versions
of a customer share one, each version ends where the next begins (no gap, no overlap) and
each customer has exactly one open version. `segments_match_daily_revenue` (blocking):
per event day, the sums of orders, paid orders and USD revenue over segments equal those of
`marts/fct_daily_revenue` over currencies: attribution moves revenue between segments,
never creates or loses it.
"""

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetKey,
    asset_check,
)
from pyspark.sql import Window
from pyspark.sql import functions as F

from backfill_platform.checks.results import (
    CheckEvents,
    CheckOutcome,
    PartitionResult,
    record,
    run_partitions,
    written_by_run,
)
from backfill_platform.partitions import daily_partitions
from backfill_platform.ranges import DayRange
from backfill_platform.resources import LakehouseResource
from backfill_platform.tables import FCT_DAILY_REVENUE, FCT_REVENUE_BY_SEGMENT, STAGING_CUSTOMERS

_SHOWN = 10


def scd2_problems(versions) -> tuple[int, dict[str, list[str]]]:
    """The table's version count, and problem kind -> the first customers (at most 10 each,
    by id) whose versions break SCD2: one Spark aggregation over the table."""
    following = Window.partitionBy("customer_id").orderBy("valid_from")
    checked = versions.withColumn("_next_from", F.lead("valid_from").over(following))
    per_customer = checked.groupBy("customer_id").agg(
        F.count(F.lit(1)).alias("versions"),
        F.count(F.when(F.col("valid_from").isNull(), True)).alias("unparseable"),
        (F.count(F.lit(1)) - F.countDistinct("valid_from")).alias("duplicate"),
        F.count(
            F.when(
                F.col("_next_from").isNotNull()
                & (F.col("valid_to").isNull() | (F.col("valid_to") != F.col("_next_from"))),
                True,
            )
        ).alias("gap_or_overlap"),
        F.count(F.when(F.col("valid_to").isNull(), True)).alias("open_versions"),
    )
    problems = {
        "unparseable valid_from": F.col("unparseable") > 0,
        "duplicate valid_from": F.col("duplicate") > 0,
        "gap or overlap": F.col("gap_or_overlap") > 0,
        "not exactly one open version": F.col("open_versions") != 1,
    }
    summary = per_customer.agg(
        F.coalesce(F.sum("versions"), F.lit(0)).alias("versions"),
        *(
            F.slice(
                F.sort_array(F.collect_list(F.when(condition, F.col("customer_id")))), 1, _SHOWN
            ).alias(name)
            for name, condition in problems.items()
        ),
    ).first()
    return summary["versions"], {name: summary[name] for name in problems if summary[name]}


@asset_check(asset=STAGING_CUSTOMERS, name="scd2_valid", blocking=True)
def staging_customers_scd2(
    context: AssetCheckExecutionContext, lakehouse: LakehouseResource
) -> AssetCheckResult:
    """No overlapping or gapped versions, one open version per customer."""
    if not lakehouse.exists(STAGING_CUSTOMERS):
        return AssetCheckResult(passed=False, description="staging/customers does not exist")
    versions, problems = scd2_problems(lakehouse.read(STAGING_CUSTOMERS))
    return AssetCheckResult(
        passed=not problems,
        severity=AssetCheckSeverity.ERROR,
        description="; ".join(f"{k}: {', '.join(map(repr, v))}" for k, v in problems.items())
        or "every customer's versions chain without gaps and end in one open version",
        metadata={"versions": versions, "problem_kinds": len(problems)},
    )


def segment_totals(
    lakehouse: LakehouseResource, run: DayRange, versions: dict[AssetKey, int | None] | None = None
) -> list[PartitionResult]:
    """Per event day of the run: (orders, paid orders, USD revenue) over segments vs over
    currencies in daily revenue, each mart at its version in `versions` (absent: the
    current one)."""
    versions = versions or {}

    def totals(key):
        if not lakehouse.exists(key):
            return {}
        rows = (
            lakehouse.read_range(key, "event_date", run.start, run.end, versions.get(key))
            .groupBy("event_date")
            .agg(
                F.sum("orders").alias("orders"),
                F.sum("paid_orders").alias("paid_orders"),
                F.sum("revenue_usd").alias("revenue_usd"),
            )
            .collect()
        )
        return {
            r["event_date"].isoformat(): (r["orders"], r["paid_orders"], r["revenue_usd"])
            for r in rows
        }

    segments, daily = totals(FCT_REVENUE_BY_SEGMENT), totals(FCT_DAILY_REVENUE)
    return [
        PartitionResult(
            day,
            f"daily {daily.get(day)}",
            f"segments {segments.get(day)}",
            segments.get(day) == daily.get(day),
        )
        for day in run.partition_keys()
    ]


@asset_check(
    asset=FCT_REVENUE_BY_SEGMENT,
    name="segments_match_daily_revenue",
    blocking=True,
    partitions_def=daily_partitions,
    additional_deps=[FCT_DAILY_REVENUE],
)
def segments_match_daily_revenue(
    context: AssetCheckExecutionContext, lakehouse: LakehouseResource
) -> CheckEvents:
    """Per event day: orders, paid orders and USD revenue over segments == over currencies."""
    run = run_partitions(context)
    # The marts as the run wrote them: the stream may fold newer staging into either later.
    versions = {}
    for key in (FCT_REVENUE_BY_SEGMENT, FCT_DAILY_REVENUE):
        written = written_by_run(context, key, run.partition_keys()[0])
        versions[key] = written["delta_version"] if written else None
    outcome = CheckOutcome(
        "segments_match_daily_revenue",
        FCT_REVENUE_BY_SEGMENT,
        segment_totals(lakehouse, run, versions),
        what="(orders, paid orders, USD revenue) over segments == over currencies",
    )
    yield from record(context, outcome)


crm_checks = [staging_customers_scd2, segments_match_daily_revenue]
