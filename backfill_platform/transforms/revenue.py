"""The marts (contract 2.1): daily revenue per currency and customer lifetime value."""

from __future__ import annotations

from datetime import date

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from backfill_platform.transforms.fx import USD_TYPE

LOCAL_TYPE = "decimal(38,2)"
# Spark adds two DECIMAL(38,10) by rounding to 9 places (the sum could need 39 digits);
# lifetime sums stay far below 10^20, so add in DECIMAL(30,10), which is exact.
_SUM_TYPE = "decimal(30,10)"


def daily_revenue(orders_usd: DataFrame) -> DataFrame:
    """One row per (event_date, currency) with at least one order; sums over paid orders."""
    paid = F.col("status") == "paid"
    return orders_usd.groupBy("event_date", "currency").agg(
        F.count(F.lit(1)).alias("orders"),
        F.count(F.when(paid, True)).alias("paid_orders"),
        F.coalesce(F.sum(F.when(paid, F.col("amount"))), F.lit(0))
        .cast(LOCAL_TYPE)
        .alias("revenue_local"),
        F.coalesce(F.sum(F.when(paid, F.col("amount_usd"))), F.lit(0))
        .cast(USD_TYPE)
        .alias("revenue_usd"),
    )


def customer_ltv(
    orders_usd: DataFrame,
    previous: DataFrame | None,
    snapshot_days: list[date],
) -> DataFrame:
    """LTV snapshots for consecutive `snapshot_days`, carrying `previous` (the day before).

    The whole range is one pass over the days a customer's totals change, not over every
    (customer, day) of the output: paid orders are first reduced to one row per (customer,
    day) — guests (NULL customer) are dropped before any shuffle and the hot customer's
    thousands of orders collapse map-side — the previous snapshot joins as each customer's
    opening change on the first day, a running sum per customer walks those changes, and
    each total is then repeated over the days until the customer's next change. Every
    customer seen so far appears on every later snapshot. (Building the full customer x day
    grid first and summing over it sorted 7x more rows: docs/performance.md.)
    """
    first_day, last_day = snapshot_days[0], snapshot_days[-1]
    changes = (
        orders_usd.where((F.col("status") == "paid") & F.col("customer_id").isNotNull())
        .groupBy("customer_id", F.col("event_date").alias("day"))
        .agg(
            F.count(F.lit(1)).alias("orders"),
            F.sum("amount_usd").cast(_SUM_TYPE).alias("revenue_usd"),
            F.min("event_date").alias("first_order_date"),
        )
    )
    if previous is not None:
        changes = changes.unionByName(
            previous.select(
                "customer_id",
                F.lit(first_day).alias("day"),
                F.col("lifetime_paid_orders").alias("orders"),
                F.col("lifetime_revenue_usd").cast(_SUM_TYPE).alias("revenue_usd"),
                "first_order_date",
            )
        )
    by_day = Window.partitionBy("customer_id").orderBy("day")
    so_far = by_day.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    totals = changes.select(
        "customer_id",
        "day",
        F.sum("orders").over(so_far).cast("bigint").alias("lifetime_paid_orders"),
        F.sum("revenue_usd").over(so_far).cast(USD_TYPE).alias("lifetime_revenue_usd"),
        F.min("first_order_date").over(so_far).alias("first_order_date"),
        F.lead("day").over(by_day).alias("next_day"),
    )
    # A carried customer with orders on the first day has two changes that day: the later
    # row holds both, the earlier one is not a snapshot.
    last_of_day = F.col("next_day").isNull() | (F.col("next_day") > F.col("day"))
    until = F.coalesce(F.date_sub("next_day", 1), F.lit(last_day))
    return totals.where(last_of_day).select(
        # explode_outer: a nullable column, as the table's; the sequence is never empty.
        F.explode_outer(F.sequence("day", until)).alias("snapshot_date"),
        "customer_id",
        "lifetime_paid_orders",
        "lifetime_revenue_usd",
        "first_order_date",
    )
