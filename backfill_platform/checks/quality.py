"""Quality of staging/orders per event day: keys, required values, volume and NULL rates.

Four checks, one Spark aggregation (in the step of checks/staging.py): per event day of the
run and of the trailing window before it, rows, distinct order_ids and the NULL count of
every column. Unique keys and required values are ERROR and blocking (a duplicate order
doubles revenue downstream); the volume and NULL-rate comparisons with the trailing window
are WARN (real days do vary).
"""

from datetime import timedelta
from statistics import mean, median

from dagster import AssetCheckSeverity, AssetCheckSpec
from pyspark.sql import functions as F

from backfill_platform.checks.results import CheckOutcome, PartitionResult
from backfill_platform.partitions import daily_partitions
from backfill_platform.ranges import DayRange, keys_in_window
from backfill_platform.resources import LakehouseResource
from backfill_platform.settings import (
    CHECK_MIN_HISTORY,
    CHECK_NULL_SPIKE,
    CHECK_ROW_COUNT_FACTOR,
    CHECK_TRAILING_DAYS,
    setting,
)
from backfill_platform.tables import STAGING_ORDERS, table
from backfill_platform.transforms.orders import SOURCE_COORDINATES

DAY = table(STAGING_ORDERS).partition_column  # event_date: the day every verdict is for

# Contract 1.1: every field but customer_id is required; event_date is derived from one.
REQUIRED_COLUMNS = (
    "event_date",
    "order_id",
    "event_time",
    "updated_at",
    "status",
    "currency",
    "amount",
    "ingest_date",
)
UNIQUE = "order_id_unique"
NOT_NULL = "required_columns_not_null"
VOLUME = "row_count_within_trailing_bounds"
NULL_SPIKE = "null_rate_within_trailing_bounds"


QUALITY_SPECS = [
    AssetCheckSpec(name, asset=STAGING_ORDERS, blocking=blocks, partitions_def=daily_partitions)
    for name, blocks in ((UNIQUE, True), (NOT_NULL, True), (VOLUME, False), (NULL_SPIKE, False))
]


def quality_outcomes(lakehouse: LakehouseResource, run: DayRange) -> list[CheckOutcome]:
    """order_id unique and required columns set per event day (ERROR, blocking); row count
    and per-column NULL rate within bounds of the trailing window's (WARN)."""
    trailing_days = int(setting(CHECK_TRAILING_DAYS))
    window_start = run.start - timedelta(days=trailing_days)
    all_keys = keys_in_window(window_start, run.end)
    staged = lakehouse.read_partitions(STAGING_ORDERS, window_start, run.end)
    columns = [c for c in staged.columns if not c.startswith("_") and c != DAY]
    profiled = [c for c in columns if c not in SOURCE_COORDINATES]
    stats = {
        r[DAY].isoformat(): r.asDict()
        for r in staged.groupBy(DAY)
        .agg(
            F.count(F.lit(1)).alias("rows"),
            F.count_distinct("order_id").alias("order_ids"),
            *(F.count(F.when(F.col(c).isNull(), True)).alias(f"null:{c}") for c in columns),
        )
        .collect()
    }
    unique, not_null, volume, spikes = [], [], [], []
    factor = float(setting(CHECK_ROW_COUNT_FACTOR))
    spike = float(setting(CHECK_NULL_SPIKE))
    min_history = int(setting(CHECK_MIN_HISTORY))
    for key in run.partition_keys():
        day = stats.get(key, {"rows": 0, "order_ids": 0})
        rows = day["rows"]
        unique.append(
            PartitionResult(
                key, f"{rows} distinct", f"{day['order_ids']} distinct", day["order_ids"] == rows
            )
        )
        nulls = {c: day.get(f"null:{c}", 0) for c in columns}
        bad = {c: n for c, n in nulls.items() if c in REQUIRED_COLUMNS and n}
        not_null.append(
            PartitionResult(
                key, "0 NULLs", f"{sum(bad.values())} NULLs", not bad, _describe(bad, "NULLs")
            )
        )

        index = all_keys.index(key)
        history = [stats[k] for k in all_keys[max(0, index - trailing_days) : index] if k in stats]
        volume.append(_volume(key, rows, [h["rows"] for h in history], factor, min_history))
        spikes.append(_null_spike(key, rows, nulls, history, profiled, spike, min_history))

    return [
        CheckOutcome(UNIQUE, STAGING_ORDERS, unique, what="order_id unique per event day"),
        CheckOutcome(
            NOT_NULL, STAGING_ORDERS, not_null, what=f"no NULL in {', '.join(REQUIRED_COLUMNS)}"
        ),
        CheckOutcome(
            VOLUME,
            STAGING_ORDERS,
            volume,
            severity=AssetCheckSeverity.WARN,
            what=f"rows within x{factor:g} of the median of the {trailing_days} days before; "
            "empty days flagged",
        ),
        CheckOutcome(
            NULL_SPIKE,
            STAGING_ORDERS,
            spikes,
            severity=AssetCheckSeverity.WARN,
            what=f"NULL share per column at most {spike:g} above its trailing mean",
        ),
    ]


def _describe(counts: dict[str, int], unit: str) -> str:
    return ", ".join(f"{c}: {n} {unit}" for c, n in sorted(counts.items()))


def _volume(
    key: str, rows: int, history: list[int], factor: float, min_history: int
) -> PartitionResult:
    if rows == 0:
        return PartitionResult(key, "> 0 rows", 0, False, "empty partition")
    if len(history) < min_history:
        return PartitionResult(
            key, "no baseline", rows, True, f"{len(history)} earlier day(s) with rows"
        )
    base = median(history)
    low, high = base / factor, base * factor
    return PartitionResult(
        key,
        f"{low:.0f}..{high:.0f} rows",
        rows,
        low <= rows <= high,
        f"median of {len(history)} earlier days: {base:g}",
    )


def _null_spike(
    key: str,
    rows: int,
    nulls: dict[str, int],
    history: list[dict],
    columns: list[str],
    spike: float,
    min_history: int,
) -> PartitionResult:
    if rows == 0 or len(history) < min_history:
        return PartitionResult(key, "no baseline", "-", True)
    baseline = {c: mean(h.get(f"null:{c}", 0) / h["rows"] for h in history) for c in columns}
    rates = {c: nulls[c] / rows for c in columns}
    spiking = {c: rates[c] for c in columns if rates[c] > baseline[c] + spike}
    worst = max(columns, key=lambda c: rates[c] - baseline[c])
    return PartitionResult(
        key,
        f"{worst} <= {baseline[worst] + spike:.3f}",
        f"{worst} {rates[worst]:.3f}",
        not spiking,
        ", ".join(f"{c}: {r:.3f} vs trailing {baseline[c]:.3f}" for c, r in spiking.items()),
    )
