"""Skew of staging/orders on its aggregation key, customer_id, per event day (WARN).

A hot customer or a big NULL (guest) bucket lands in one shuffle partition when Spark
hash-partitions on customer_id, and that one task then sets the job's wall time. The check
measures, per partition and for the run as a whole: the top key's share of rows, the NULL
bucket's share, max/median rows per key, and the imbalance (largest / mean bucket) that
Spark's own hash partitioning (Murmur3, `pmod(hash(key), N)`) gives across N workers. How
customer_ltv avoids paying for it is in docs/checks.md.
"""

from dagster import AssetCheckSeverity, AssetCheckSpec, MetadataValue
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from backfill_platform.checks.results import CheckOutcome, PartitionResult
from backfill_platform.partitions import daily_partitions
from backfill_platform.ranges import DayRange
from backfill_platform.resources import LakehouseResource
from backfill_platform.settings import (
    SKEW_IMBALANCE,
    SKEW_MAX_MEDIAN_RATIO,
    SKEW_NULL_SHARE,
    SKEW_TOP_KEY_SHARE,
    SKEW_WORKERS,
    setting,
)
from backfill_platform.tables import STAGING_ORDERS, table

KEY = "customer_id"
TOP_KEYS = 3
RUN = "run"  # the group holding the whole run's numbers (never a day's key)


def key_skew(rows: DataFrame, key: str, group: str, workers: int) -> dict[str, dict]:
    """Per `group` value, and for all rows together (under RUN): rows, keys, top key share,
    NULL share, max/median, hash imbalance.

    One rollup counts rows per (group, key) and per key over every group; two windows and one
    aggregation of that small table give the rest. A tiny day's check costs its Spark jobs,
    not its rows, so the whole run's figures ride on the per-day pass instead of a second one.
    """
    counted = rows.rollup(key, group).agg(
        F.count(F.lit(1)).alias("n"), F.grouping_id().alias("_level")
    )
    # grouping_id of rollup(key, group): 0 for (key, group), 1 for (key), 3 for the total.
    per_key = counted.where(F.col("_level") < 3).select(
        F.when(F.col("_level") == 0, F.col(group).cast("string")).otherwise(F.lit(RUN)).alias("g"),
        key,
        "n",
    )
    known = F.col(key).isNotNull()
    ranked = (
        per_key.withColumn("_bucket", F.pmod(F.hash(F.col(key)), F.lit(workers)))
        .withColumn("_bucket_n", F.sum("n").over(Window.partitionBy("g", "_bucket")))
        .withColumn(
            "_rank",
            F.row_number().over(Window.partitionBy("g", known).orderBy(F.desc("n"), key)),
        )
    )
    stats = ranked.groupBy("g").agg(
        F.sum("n").alias("rows"),
        F.count(key).alias("keys"),
        F.coalesce(F.sum(F.when(~known, F.col("n"))), F.lit(0)).alias("nulls"),
        F.max(F.when(known, F.col("n"))).alias("max_per_key"),
        F.median(F.when(known, F.col("n"))).alias("median_per_key"),
        F.max("_bucket_n").alias("max_bucket"),
        F.sort_array(
            F.collect_list(
                F.when(known & (F.col("_rank") <= TOP_KEYS), F.struct("_rank", key, "n"))
            )
        ).alias("top"),
    )
    result = {}
    for r in stats.collect():
        rows_n = r["rows"]
        top_keys = [(t[key], t["n"]) for t in r["top"]]
        result[r["g"]] = {
            "rows": rows_n,
            "keys": r["keys"],
            "top_keys": top_keys,
            "top_key_share": (top_keys[0][1] / rows_n) if top_keys else 0.0,
            "null_share": r["nulls"] / rows_n,
            "max_median_ratio": (r["max_per_key"] or 0) / float(r["median_per_key"] or 1),
            "hash_imbalance": r["max_bucket"] / (rows_n / workers),
        }
    return result


SKEW = "customer_id_skew"
SKEW_SPEC = AssetCheckSpec(SKEW, asset=STAGING_ORDERS, partitions_def=daily_partitions)


def skew_outcome(lakehouse: LakehouseResource, run: DayRange) -> CheckOutcome:
    """Top key share, NULL share, max/median rows per key and hash imbalance on customer_id
    per event day and for the whole run (WARN above BACKFILL_SKEW_* thresholds)."""
    workers = int(setting(SKEW_WORKERS))
    limits = {
        "top_key_share": float(setting(SKEW_TOP_KEY_SHARE)),
        "null_share": float(setting(SKEW_NULL_SHARE)),
        "max_median_ratio": float(setting(SKEW_MAX_MEDIAN_RATIO)),
        "hash_imbalance": float(setting(SKEW_IMBALANCE)),
    }
    staged = lakehouse.read_partitions(STAGING_ORDERS, run.start, run.end)
    per_day = key_skew(staged, KEY, table(STAGING_ORDERS).partition_column, workers)
    whole = per_day.get(RUN)
    results = [_verdict(key, per_day.get(key), limits) for key in run.partition_keys()]
    expected = ", ".join(f"{k} <= {v:g}" for k, v in limits.items())
    return CheckOutcome(
        SKEW,
        STAGING_ORDERS,
        results,
        severity=AssetCheckSeverity.WARN,
        what=f"customer_id skew ({expected}; {workers} hash buckets)",
        extra_metadata={
            f"run_{name}": float(round(whole[name], 4)) if whole else 0.0 for name in limits
        }
        | {
            "run_top_keys": MetadataValue.md(
                "\n".join(f"- `{k}`: {n} rows" for k, n in (whole or {}).get("top_keys", []))
                or "none"
            ),
            "hash_buckets": workers,
        },
    )


def _verdict(partition: str, stats: dict | None, limits: dict[str, float]) -> PartitionResult:
    if not stats:
        return PartitionResult(partition, "rows", "no rows", True)
    over = [name for name, limit in limits.items() if stats[name] > limit]
    actual = ", ".join(f"{name} {stats[name]:.2f}" for name in limits)
    top = ", ".join(f"{k} ({n}/{stats['rows']})" for k, n in stats["top_keys"])
    detail = (f"over: {', '.join(over)}; " if over else "") + f"top keys: {top or 'none'}"
    return PartitionResult(partition, "within limits", actual, not over, detail)
