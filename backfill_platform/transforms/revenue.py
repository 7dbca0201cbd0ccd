"""The marts (contract 2.1): daily revenue per currency and customer lifetime value."""

from __future__ import annotations

from datetime import date

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from backfill_platform.transforms.fx import USD_TYPE

LOCAL_TYPE = "decimal(38,2)"
# Spark adds two DECIMAL(38,10) by rounding to 9 places (the sum could need 39 digits);
# lifetime sums stay far below 10^20, so add in DECIMAL(30,10), which is exact.
_SUM_TYPE = "decimal(30,10)"

LTV_SCHEMA = T.StructType(
    [
        T.StructField("snapshot_date", T.DateType()),
        T.StructField("customer_id", T.StringType()),
        T.StructField("lifetime_paid_orders", T.LongType()),
        T.StructField("lifetime_revenue_usd", T.DecimalType(38, 10)),
        T.StructField("first_order_date", T.DateType()),
    ]
)


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
    spark: SparkSession,
    orders_usd: DataFrame,
    previous: DataFrame | None,
    snapshot_days: list[date],
) -> DataFrame:
    """LTV snapshots for consecutive `snapshot_days`, carrying `previous` (the day before).

    The whole range is one pass: paid orders are first reduced to one row per (customer,
    day) — guests (NULL customer) are dropped before any shuffle and the hot customer's
    thousands of orders collapse map-side — and a running sum per customer then walks the
    days. Every customer seen so far appears on every later snapshot.
    """
    first_day = snapshot_days[0]
    daily = (
        orders_usd.where((F.col("status") == "paid") & F.col("customer_id").isNotNull())
        .groupBy("customer_id", F.col("event_date").alias("snapshot_date"))
        .agg(
            F.count(F.lit(1)).alias("day_orders"),
            F.sum("amount_usd").cast(_SUM_TYPE).alias("day_revenue_usd"),
        )
    )
    base = (
        previous.select(
            "customer_id",
            F.col("lifetime_paid_orders").alias("base_orders"),
            F.col("lifetime_revenue_usd").cast(_SUM_TYPE).alias("base_revenue_usd"),
            F.col("first_order_date").alias("base_first_order_date"),
        )
        if previous is not None
        else spark.createDataFrame(
            [],
            "customer_id string, base_orders bigint, base_revenue_usd decimal(30,10), "
            "base_first_order_date date",
        )
    )
    starts = (
        base.select("customer_id", F.lit(first_day).alias("start_day"))
        .unionByName(daily.select("customer_id", F.col("snapshot_date").alias("start_day")))
        .groupBy("customer_id")
        .agg(F.min("start_day").alias("start_day"))
    )
    days = spark.createDataFrame([(d,) for d in snapshot_days], "snapshot_date date")
    grid = starts.join(F.broadcast(days), F.col("snapshot_date") >= F.col("start_day"))
    running = (
        Window.partitionBy("customer_id")
        .orderBy("snapshot_date")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    first_paid_day = F.when(F.col("day_orders") > 0, F.col("snapshot_date"))
    return (
        grid.join(daily, ["customer_id", "snapshot_date"], "left")
        .join(base, "customer_id", "left")
        .select(
            "snapshot_date",
            "customer_id",
            (
                F.coalesce(F.col("base_orders"), F.lit(0))
                + F.sum(F.coalesce(F.col("day_orders"), F.lit(0))).over(running)
            )
            .cast("bigint")
            .alias("lifetime_paid_orders"),
            (
                F.coalesce(F.col("base_revenue_usd"), F.lit(0).cast(_SUM_TYPE))
                + F.sum(F.coalesce(F.col("day_revenue_usd"), F.lit(0)))
                .over(running)
                .cast(_SUM_TYPE)
            )
            .cast(USD_TYPE)
            .alias("lifetime_revenue_usd"),
            F.coalesce(F.col("base_first_order_date"), F.min(first_paid_day).over(running)).alias(
                "first_order_date"
            ),
        )
    )
