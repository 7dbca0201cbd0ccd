"""Does customer_ltv's skew mitigation help? Measured on generated demo data.

The demo generator gives ~20% of orders to one customer (`c-hot`) and ~8% to guests (NULL
customer_id). customer_ltv (transforms/revenue.py) shuffles on customer_id, so without care
one reduce task receives the hot customer's rows and another the whole NULL bucket. The
pipeline's mitigation: drop guests before any shuffle, and reduce paid orders to one row per
(customer, day) with a map-side partial aggregation before the running sum; AQE's skew join
is on for the joins after it.

This runs the same LTV computation twice on the same orders and reads Spark's own task
metrics (REST API of the session's UI) for every shuffle stage:
  mitigated: `transforms.revenue.customer_ltv`, as the asset runs it;
  naive:     the running sum straight over every order row, partitioned by customer_id,
             guests filtered out only at the end (what the textbook window would do).
It prints, per variant, the shuffle records read by the busiest reduce task, the median
task, their ratio, and the wall time.

    python -m benchmarks.ltv_skew --days 31 --orders-per-day 3000
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import urllib.request
from datetime import date, timedelta
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from backfill_platform.resources import SparkSessionResource
from backfill_platform.sources.generate import generate_landing
from backfill_platform.transforms.fx import parse_rates, with_usd
from backfill_platform.transforms.lines import read_lines
from backfill_platform.transforms.orders import latest_wins, parse_orders, with_unknown_currency
from backfill_platform.transforms.revenue import customer_ltv


def orders_in_usd(spark: SparkSession, landing: Path) -> DataFrame:
    """Staging's orders (latest wins) at point-in-time FX, straight from the landing files."""
    orders = read_lines(spark, sorted(landing.glob("orders/*/*.jsonl")), "ingest_date")
    parsed = parse_orders(orders.where(~F.col("is_blank")).drop("is_blank"))
    rates = parse_rates(read_lines(spark, sorted(landing.glob("fx_rates/*/*.csv")), "rate_date"))
    known = ["USD", *(r["currency"] for r in rates.select("currency").distinct().collect())]
    valid = with_unknown_currency(parsed.withColumnRenamed("day", "ingest_date"), known)
    return with_usd(latest_wins(valid.where("reject_reason IS NULL")), rates)


def naive_ltv(orders: DataFrame) -> DataFrame:
    """Same totals, no mitigation: every paid order row is shuffled by customer_id."""
    running = Window.partitionBy("customer_id").orderBy("event_date")
    return (
        orders.where(F.col("status") == "paid")
        .select(
            "customer_id",
            F.col("event_date").alias("snapshot_date"),
            F.count(F.lit(1)).over(running).alias("lifetime_paid_orders"),
            F.sum("amount_usd").over(running).alias("lifetime_revenue_usd"),
        )
        .where(F.col("customer_id").isNotNull())
        .dropDuplicates(["customer_id", "snapshot_date"])
    )


def _api(spark: SparkSession) -> str:
    context = spark.sparkContext
    return f"{context.uiWebUrl}/api/v1/applications/{context.applicationId}"


def shuffle_stages(spark: SparkSession, since: set[int]) -> list[dict]:
    """Per shuffle-reading stage completed after `since`: task records read, max and median."""
    base = _api(spark)
    stages = json.load(urllib.request.urlopen(f"{base}/stages?status=complete"))
    found = []
    for stage in stages:
        if stage["stageId"] in since or stage.get("shuffleReadRecords", 0) == 0:
            continue
        tasks = json.load(
            urllib.request.urlopen(
                f"{base}/stages/{stage['stageId']}/{stage['attemptId']}/taskList?length=10000"
            )
        )
        records = [t["taskMetrics"]["shuffleReadMetrics"]["recordsRead"] for t in tasks]
        found.append(
            {
                "stage": stage["stageId"],
                "tasks": len(records),
                "records": sum(records),
                "max_task": max(records),
                "median_task": statistics.median(records),
            }
        )
    return found


def measure(spark: SparkSession, name: str, df: DataFrame) -> dict:
    done = {s["stageId"] for s in json.load(urllib.request.urlopen(f"{_api(spark)}/stages"))}
    start = time.perf_counter()
    # Write every column to Spark's no-op sink: count() would let the optimizer prune the
    # running sums (and with them the skewed window) away.
    df.write.format("noop").mode("overwrite").save()
    seconds = time.perf_counter() - start
    stages = shuffle_stages(spark, done)
    busiest = max(stages, key=lambda s: s["max_task"])
    return {
        "variant": name,
        "seconds": round(seconds, 2),
        "shuffle_records": sum(s["records"] for s in stages),
        "busiest_task_records": busiest["max_task"],
        "median_task_records_in_that_stage": busiest["median_task"],
        "busiest_over_median": round(busiest["max_task"] / max(busiest["median_task"], 1), 1),
        "stages": [
            f"{s['stage']}: {s['records']} records in {s['tasks']} tasks, max {s['max_task']}"
            for s in stages
        ],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=31)
    parser.add_argument("--orders-per-day", type=int, default=3000)
    parser.add_argument("--shuffle-partitions", type=int, default=8)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)

    spark = SparkSessionResource(
        master="local[2]",
        shuffle_partitions=args.shuffle_partitions,
        ui_enabled=True,
        # Report the shuffle as hashed, not as AQE re-coalesced it after the fact.
        extra_conf={"spark.sql.adaptive.coalescePartitions.enabled": "false"},
    ).get_session()
    with tempfile.TemporaryDirectory() as tmp:
        first = date(2024, 1, 1)
        last = first + timedelta(days=args.days - 1)
        summary = generate_landing(
            Path(tmp), first, last, args.orders_per_day, args.seed, progress=False
        )
        orders = orders_in_usd(spark, Path(tmp)).cache()
        total = orders.count()
        hot = orders.where(F.col("customer_id") == "c-hot").count()
        guests = orders.where(F.col("customer_id").isNull()).count()
        print(
            f"orders: {total} ({hot / total:.1%} c-hot, {guests / total:.1%} guests) "
            f"over {args.days} days; generator: {summary.get('orders')}"
        )
        days = [first + timedelta(days=i) for i in range(args.days)]
        results = [
            measure(spark, "naive", naive_ltv(orders)),
            measure(spark, "mitigated", customer_ltv(orders, None, days)),
        ]
        for result in results:
            print(json.dumps(result))
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
