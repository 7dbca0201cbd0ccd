"""Validation's reconciliation: a shadow against the layers it was built from.

Each shadowed table answers to its asset's blocking equation (checks/reconciliation.py),
applied to the shadow lakehouse, so a shadow fct is held against the staging it read (the
shadow's when staging is shadowed too, production's otherwise). fct's revenue_usd, which no
blocking equation recomputes (fct's stops at local currency, LTV's covers customers' paid
orders only), is held against staging's paid orders at point-in-time FX. The contract oracle
(`reference.py`) stays with the tests and the demo: production code never runs it.
"""

from __future__ import annotations

from collections.abc import Sequence

from dagster import AssetKey
from pyspark.sql import functions as F

from backfill_platform.checks.reconciliation import layer_equation
from backfill_platform.checks.results import CheckOutcome, PartitionResult
from backfill_platform.ranges import DayRange
from backfill_platform.resources import LakehouseResource, LandingZoneResource
from backfill_platform.tables import FCT_DAILY_REVENUE, RAW_FX_RATES, STAGING_ORDERS, table
from backfill_platform.transforms.fx import USD_TYPE, FxRateError, with_usd


def reconcile_layers(
    lake: LakehouseResource,
    landing: LandingZoneResource,
    keys: Sequence[AssetKey],
    days: DayRange,
) -> dict | None:
    """{"ok", "details"} of `keys` over `days` (None when none has an equation); `lake` is
    the shadow lakehouse when validating."""
    run = days
    outcomes = [o for k in keys if (o := layer_equation(lake, landing, k, run)) is not None]
    if FCT_DAILY_REVENUE in keys:
        outcomes.append(fct_usd_vs_staging(lake, run))
    if not outcomes:
        return None
    return {"ok": not any(o.failed for o in outcomes), "details": [o.verdict() for o in outcomes]}


def fct_usd_vs_staging(lake: LakehouseResource, run: DayRange) -> CheckOutcome:
    """Per event day and currency: fct revenue_usd == staging's paid amounts at the rate of
    their day (the latest within FX's reach), summed exactly."""
    outcome = CheckOutcome(
        "revenue_usd_matches_staging_at_fx",
        FCT_DAILY_REVENUE,
        [],
        what="fct_daily_revenue revenue_usd vs staging's paid orders at point-in-time FX",
    )
    column = table(FCT_DAILY_REVENUE).partition_column
    paid = lake.read_range(
        STAGING_ORDERS, table(STAGING_ORDERS).partition_column, run.start, run.end
    ).where(F.col("status") == "paid")
    try:
        # Only rates up to each event day count, so the whole (small) rates table is the input.
        converted = with_usd(paid, lake.read(RAW_FX_RATES))
    except FxRateError as error:
        span = str(run)
        outcome.results.append(PartitionResult(span, "a rate per order", "none", False, str(error)))
        return outcome
    expected = converted.groupBy(F.col("event_date").alias(column), "currency").agg(
        F.sum("amount_usd").cast(USD_TYPE).alias("expected")
    )
    actual = lake.read_range(FCT_DAILY_REVENUE, column, run.start, run.end).select(
        column, "currency", F.col("revenue_usd").alias("actual")
    )
    same = F.coalesce("expected", F.lit(0).cast(USD_TYPE)).eqNullSafe(F.col("actual"))
    days = {
        r[column].isoformat(): r
        for r in expected.join(actual, [column, "currency"], "full_outer")
        .groupBy(column)
        .agg(
            F.sum("expected").alias("expected"),
            F.sum("actual").alias("actual"),
            F.sort_array(F.collect_list(F.when(~same, F.col("currency")))).alias("differing"),
        )
        .collect()
    }
    for day in run.partition_keys():
        row = days.get(day)
        if row is None:
            outcome.results.append(PartitionResult(day, "no paid orders", "no rows", True))
            continue
        detail = f"differs for {', '.join(row['differing'])}" if row["differing"] else ""
        outcome.results.append(
            PartitionResult(
                day, f"{row['expected'] or 0} USD", f"{row['actual']} USD", not detail, detail
            )
        )
    converted.unpersist()
    return outcome
