"""The floor: the fastest hand-written Spark job from the landing zone to the two marts.

No Dagster, no Delta, no intermediate tables, no per-partition anything: one pass over the
landing files of the range, written as plain Parquet. It reuses the platform's contract
logic so both compute the same answer (the benchmark checks they do):
`transforms.lines.read_lines` (files to numbered lines), `transforms.orders.parse_orders`,
`with_unknown_currency` and `latest_wins` (validation and latest-wins),
`transforms.fx.parse_rates` and `with_usd` (point-in-time FX in exact decimals) and
`transforms.revenue.daily_revenue` / `customer_ltv` (the marts).
It skips what produces no rows: raw's metadata counts, the rejects table and the checks
that only fail a run (FX headers, conflicting rates).
"""

from __future__ import annotations

from datetime import date
from pathlib import Path

from pyspark import StorageLevel
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from backfill_platform.resources.landing import FX_RATES, ORDERS, LandingZoneResource
from backfill_platform.resources.spark import SparkSessionResource
from backfill_platform.transforms.fx import parse_rates, with_usd
from backfill_platform.transforms.lines import counted, read_lines
from backfill_platform.transforms.orders import latest_wins, parse_orders, with_unknown_currency
from backfill_platform.transforms.revenue import customer_ltv, daily_revenue


def run_floor(spark: SparkSession, landing_dir: Path, days: list[date], out_dir: Path) -> None:
    """Both marts for `days` (consecutive, oldest first) as Parquet under out_dir."""
    landing = LandingZoneResource(landing_dir=str(landing_dir), spark=SparkSessionResource())
    keys = [d.isoformat() for d in days]
    rates = parse_rates(read_lines(spark, landing.files(FX_RATES, keys), "rate_date"))
    rates = rates.where(F.col("reject_reason").isNull()).persist()
    known = sorted({"USD", *(r["currency"] for r in rates.select("currency").distinct().collect())})

    # Counted as raw/orders counts them: the parse then compiles apart (`counted`).
    lines, _ = counted(read_lines(spark, landing.files(ORDERS, keys), "ingest_date"), "lines")
    parsed = parse_orders(lines.where(~F.col("is_blank")).drop("is_blank")).withColumnRenamed(
        "day", "ingest_date"
    )
    valid = with_unknown_currency(parsed, known).where(
        F.col("reject_reason").isNull() & F.col("event_date").between(days[0], days[-1])
    )
    orders_usd = with_usd(latest_wins(valid), rates).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        daily_revenue(orders_usd).write.mode("overwrite").parquet(
            str(out_dir / "fct_daily_revenue")
        )
        customer_ltv(orders_usd, None, days).write.mode("overwrite").parquet(
            str(out_dir / "customer_ltv")
        )
    finally:
        orders_usd.unpersist()
        rates.unpersist()
