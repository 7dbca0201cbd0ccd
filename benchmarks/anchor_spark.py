"""Anchor: a plain PySpark job from the landing files to the two marts, written without the
platform's `transforms/`.

The floor (benchmarks/floor.py) reuses the platform's transforms, so a slow transform makes
it slow too and the ratio hides it. This job is what a data engineer would write by hand
against the contract (docs/contract.md 1.1, 1.2, 2.1): the text reader in whole-file mode
(line numbers for the latest-wins tie-break), `json_tuple`, `try_to_timestamp`, a window for
latest-wins, a broadcast FX join with a window for the 7-day reach, and exact decimals.
Rejects are filtered, not kept: the anchor produces the marts only.
"""

from __future__ import annotations

from datetime import date
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

_FIELDS = ("order_id", "customer_id", "event_time", "updated_at", "status", "currency", "amount")
_TIMESTAMP = (
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}([.][0-9]{1,6})?"
    r"(Z|[+-]((0[0-9]|1[0-7]):[0-5][0-9]|18:00))$"
)
_STATUSES = ("placed", "paid", "refunded", "cancelled")


def _rates(spark: SparkSession, landing: Path) -> DataFrame:
    raw = (
        spark.read.option("header", True)
        .schema("currency string, usd_per_unit string")
        .csv(str(landing / "fx_rates" / "rate_date=*" / "*.csv"))
        .withColumn("file", F.input_file_name())
    )
    return raw.where(
        F.col("currency").rlike("^[A-Z]{3}$")
        & F.col("usd_per_unit").rlike(r"^[0-9]+([.][0-9]{1,8})?$")
    ).select(
        F.to_date(F.regexp_extract("file", r"rate_date=([0-9-]{10})", 1)).alias("rate_date"),
        "currency",
        F.col("usd_per_unit").cast("decimal(18,8)").alias("usd_per_unit"),
    )


def order_lines(spark: SparkSession, landing: Path) -> DataFrame:
    """Every delivered order line: whole files split on newlines, numbered for the tie-break."""
    files = spark.read.text(
        str(landing / "orders" / "ingest_date=*" / "*.jsonl"), wholetext=True
    ).withColumn("file", F.input_file_name())
    return files.select(
        F.to_date(F.regexp_extract("file", r"ingest_date=([0-9-]{10})", 1)).alias("ingest_date"),
        F.regexp_extract("file", r"([^/]+)$", 1).alias("file_name"),
        F.posexplode(F.split("value", "\n")).alias("line_index", "line"),
    ).withColumn("line", F.regexp_replace("line", "\r$", ""))


def order_fields(lines: DataFrame) -> DataFrame:
    """The contract's fields of each non-blank line as text (`json_tuple`), untyped."""
    return lines.where(F.trim("line") != "").select(
        "ingest_date",
        "file_name",
        "line_index",
        F.json_tuple("line", *_FIELDS).alias(*_FIELDS),
    )


def _orders(
    spark: SparkSession, landing: Path, known: list[str], first: date, last: date
) -> DataFrame:
    lines = order_lines(spark, landing)
    parsed = order_fields(lines.where(F.col("ingest_date").between(first, last)))
    amount_ok = F.col("amount").rlike(r"^[0-9]+([.][0-9]*)?$") & (
        F.length(F.rtrim(F.regexp_extract("amount", r"[.]([0-9]*)$", 1), F.lit("0"))) <= 2
    )
    valid = parsed.where(
        F.col("order_id").isNotNull()
        & (F.col("order_id") != "")
        & F.col("event_time").rlike(_TIMESTAMP)
        & F.col("updated_at").rlike(_TIMESTAMP)
        & F.col("status").isin(*_STATUSES)
        & F.col("currency").isin(*known)
        & amount_ok
    ).select(
        "order_id",
        "customer_id",
        "status",
        "currency",
        F.col("amount").cast("decimal(38,10)").cast("decimal(18,2)").alias("amount"),
        F.try_to_timestamp("event_time").alias("event_time"),
        F.try_to_timestamp("updated_at").alias("updated_at"),
        "ingest_date",
        "file_name",
        "line_index",
    )
    valid = valid.where(F.col("event_time").isNotNull() & F.col("updated_at").isNotNull())
    latest = Window.partitionBy("order_id").orderBy(
        F.col("updated_at").desc(),
        F.col("ingest_date").desc(),
        F.col("file_name").desc(),
        F.col("line_index").desc(),
    )
    return (
        valid.withColumn("rank", F.row_number().over(latest))
        .where("rank = 1")
        .drop("rank")
        .withColumn("event_date", F.to_date("event_time"))  # the session's time zone is UTC
    )


def in_usd(orders: DataFrame, rates: DataFrame) -> DataFrame:
    """Each order's point-in-time rate: its event day's, else the latest of the 7 before."""
    usd = orders.where(F.col("currency") == "USD").withColumn(
        "usd_per_unit", F.lit(1).cast("decimal(18,8)")
    )
    other = orders.where(F.col("currency") != "USD").alias("o")
    joined = other.join(
        F.broadcast(rates.alias("r")),
        (F.col("o.currency") == F.col("r.currency"))
        & F.col("r.rate_date").between(F.date_sub("o.event_date", 7), F.col("o.event_date")),
        "left",
    )
    nearest = Window.partitionBy("o.order_id").orderBy(F.col("r.rate_date").desc_nulls_last())
    priced = (
        joined.withColumn("pick", F.row_number().over(nearest))
        .where("pick = 1")
        .select("o.*", "r.usd_per_unit")
    )
    return usd.unionByName(priced)


def require_rates(priced: DataFrame) -> None:
    """Contract 1.2: no rate within the reach is an error, never a guess."""
    missing = priced.where(F.col("usd_per_unit").isNull()).select("event_date", "currency")
    if missing.limit(1).count():
        raise ValueError(f"no FX rate within 7 days for {missing.distinct().take(5)}")


def daily_revenue(priced: DataFrame) -> DataFrame:
    """`marts/fct_daily_revenue` from priced orders (each with its `usd_per_unit`)."""
    paid = F.col("status") == "paid"
    usd = F.col("amount") * F.col("usd_per_unit")
    return priced.groupBy("event_date", "currency").agg(
        F.count(F.lit(1)).alias("orders"),
        F.count(F.when(paid, 1)).alias("paid_orders"),
        F.coalesce(F.sum(F.when(paid, F.col("amount"))), F.lit(0)).alias("revenue_local"),
        F.coalesce(F.sum(F.when(paid, usd)), F.lit(0)).alias("revenue_usd"),
    )


def customer_ltv(priced: DataFrame, last: date) -> DataFrame:
    """`marts/customer_ltv` up to `last`: running totals repeated over the days between a
    customer's paid days."""
    paid = F.col("status") == "paid"
    usd = F.col("amount") * F.col("usd_per_unit")
    by_customer = Window.partitionBy("customer_id").orderBy("event_date")
    daily = (
        priced.where(paid & F.col("customer_id").isNotNull())
        .groupBy("customer_id", "event_date")
        .agg(F.count(F.lit(1)).alias("paid"), F.sum(usd).alias("usd"))
    )
    running = daily.select(
        "customer_id",
        "event_date",
        F.sum("paid").over(by_customer).alias("lifetime_paid_orders"),
        F.sum("usd").over(by_customer).alias("lifetime_revenue_usd"),
        F.min("event_date").over(by_customer).alias("first_order_date"),
        F.coalesce(F.date_sub(F.lead("event_date").over(by_customer), 1), F.lit(last)).alias(
            "until"
        ),
    )
    return running.select(
        F.explode(F.sequence("event_date", "until")).alias("snapshot_date"),
        "customer_id",
        "lifetime_paid_orders",
        "lifetime_revenue_usd",
        "first_order_date",
    )


def run_anchor_spark(
    spark: SparkSession, landing_dir: Path, first: date, last: date, out_dir: Path
) -> None:
    """Both marts for first..last as Parquet under out_dir, as the floor writes them, from
    the landing days first..last (as a backfill of that range reads them)."""
    landing = Path(landing_dir)
    rates = _rates(spark, landing).cache()
    known = ["USD", *(r["currency"] for r in rates.select("currency").distinct().collect())]
    orders = _orders(spark, landing, known, first, last)
    orders = orders.where(F.col("event_date").between(first, last))
    priced = in_usd(orders, rates).cache()
    try:
        require_rates(priced)
        daily_revenue(priced).write.mode("overwrite").parquet(
            str(Path(out_dir) / "fct_daily_revenue")
        )
        customer_ltv(priced, last).write.mode("overwrite").parquet(
            str(Path(out_dir) / "customer_ltv")
        )
    finally:
        priced.unpersist()
        rates.unpersist()
