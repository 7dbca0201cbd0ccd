"""CRM answers to SCD2 customer versions, and point-in-time attribution of orders (contract
1.3, 2.1). No Dagster and no HTTP here: the assets fetch, this shapes."""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from backfill_platform.transforms.fx import USD_TYPE
from backfill_platform.transforms.orders import TIMESTAMP_PATTERN

GUEST, UNKNOWN = "guest", "unknown"

RAW_HISTORY_SCHEMA = T.StructType(
    [
        T.StructField("customer_id", T.StringType(), False),
        T.StructField("fetched_at", T.TimestampType(), False),
        T.StructField("fetched_date", T.DateType(), False),
        T.StructField("http_status", T.IntegerType(), False),
        T.StructField("body", T.StringType(), False),
        T.StructField("_run_id", T.StringType(), True),
    ]
)
_BODY = T.StructType(
    [
        T.StructField("customer_id", T.StringType()),
        T.StructField(
            "versions",
            T.ArrayType(
                T.StructType(
                    [
                        T.StructField("valid_from", T.StringType()),
                        T.StructField("segment", T.StringType()),
                        T.StructField("country", T.StringType()),
                    ]
                )
            ),
        ),
    ]
)


def newest_answers(raw: DataFrame) -> DataFrame:
    """Each customer's newest kept answer (greatest fetched_at): the one in force."""
    newest = Window.partitionBy("customer_id").orderBy(F.col("fetched_at").desc())
    return raw.withColumn("_n", F.row_number().over(newest)).where(F.col("_n") == 1).drop("_n")


def customers_to_fetch(orders: DataFrame, raw: DataFrame | None) -> DataFrame:
    """Customers of `orders` whose newest kept answer does not cover their latest order.

    A history fetched at F is final up to F (contract 1.3): a customer needs a call only
    when none is kept or an order's event_time is after the kept fetch.
    """
    needed = (
        orders.where(F.col("customer_id").isNotNull())
        .groupBy("customer_id")
        .agg(F.max("event_time").alias("latest_event_time"))
    )
    if raw is None:
        return needed
    kept = newest_answers(raw).select("customer_id", "fetched_at")
    return needed.join(kept, "customer_id", "left").where(
        F.col("fetched_at").isNull() | (F.col("fetched_at") < F.col("latest_event_time"))
    )


def scd2_versions(raw: DataFrame) -> DataFrame:
    """One row per (customer_id, valid_from) from each customer's newest 200 answer, with
    valid_to = the next version's valid_from (exclusive), NULL for the version in force.

    `valid_from_text` keeps the CRM's own text; a version whose valid_from is not RFC 3339
    with an offset gets a NULL valid_from, which the SCD2 check reports."""
    answers = newest_answers(raw).where(F.col("http_status") == 200)
    parsed = answers.select(
        "customer_id",
        "fetched_at",
        F.explode(F.from_json("body", _BODY)["versions"]).alias("v"),
    )
    text = F.col("v.valid_from")
    versions = parsed.select(
        "customer_id",
        F.when(F.regexp_like(text, F.lit(TIMESTAMP_PATTERN)), text.try_cast("timestamp")).alias(
            "valid_from"
        ),
        text.alias("valid_from_text"),
        F.col("v.segment").alias("segment"),
        F.col("v.country").alias("country"),
        "fetched_at",
    )
    following = Window.partitionBy("customer_id").orderBy("valid_from")
    return versions.withColumn("valid_to", F.lead("valid_from").over(following)).select(
        "customer_id",
        "valid_from",
        "valid_to",
        "segment",
        "country",
        "valid_from_text",
        "fetched_at",
    )


def uncovered_customers(orders: DataFrame, raw: DataFrame | None) -> list[str]:
    """Customers whose orders are not covered by a kept answer (the CRM step did not run)."""
    return sorted(r["customer_id"] for r in customers_to_fetch(orders, raw).collect())


def revenue_by_segment(orders_usd: DataFrame, versions: DataFrame) -> DataFrame:
    """One row per (event_date, segment, country): the version in force at event_time.

    Instants are compared (Spark timestamps are UTC instants), `valid_from <= event_time <
    valid_to`; a guest is `guest`, no version in force (404, or the first version starts
    later) is `unknown`, both with a NULL country.
    """
    v = versions.select(
        F.col("customer_id").alias("v_customer"),
        F.col("valid_from").alias("v_from"),
        F.col("valid_to").alias("v_to"),
        F.col("segment").alias("v_segment"),
        F.col("country").alias("v_country"),
    )
    in_force = (
        (F.col("customer_id") == F.col("v_customer"))
        & (F.col("v_from") <= F.col("event_time"))
        & (F.col("v_to").isNull() | (F.col("event_time") < F.col("v_to")))
    )
    attributed = orders_usd.join(v, in_force, "left").select(
        "event_date",
        F.when(F.col("customer_id").isNull(), F.lit(GUEST))
        .when(F.col("v_segment").isNull(), F.lit(UNKNOWN))
        .otherwise(F.col("v_segment"))
        .alias("segment"),
        F.when(
            F.col("customer_id").isNotNull() & F.col("v_segment").isNotNull(), F.col("v_country")
        ).alias("country"),
        "status",
        "amount_usd",
    )
    paid = F.col("status") == "paid"
    return attributed.groupBy("event_date", "segment", "country").agg(
        F.count(F.lit(1)).alias("orders"),
        F.count(F.when(paid, True)).alias("paid_orders"),
        F.coalesce(F.sum(F.when(paid, F.col("amount_usd"))), F.lit(0))
        .cast(USD_TYPE)
        .alias("revenue_usd"),
    )
