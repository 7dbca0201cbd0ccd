"""Cutover time and bytes written, zero-copy vs copying, at two sizes 10x apart
(`make bench-cutover`, docs/playbook.md).

A production table and its shadow (`marts/fct_daily_revenue`'s path, generated rows: a day's
orders by currency with decimal amounts), each written one file per day as the platform's
runs write them. Then the platform's own `cutover` of the whole range, forced (no Dagster
instance, so no validation record), each mode repeated after a Delta RESTORE of production.
Data bytes written are read off the storage, not assumed: the bytes of files that appeared
in production's directory and are not the shadow's own (a hard link shares its inode). The
log bytes are the commit's JSON entry. Prints a table, writes
`benchmarks/results/cutover-<timestamp>.json`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from datetime import date, timedelta
from pathlib import Path

from dagster import AssetKey

from benchmarks.measure import write_result

TABLE = "marts/fct_daily_revenue"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--start", default="2024-01-01")
    parser.add_argument("--days", type=int, default=31)
    parser.add_argument("--rows-per-day", type=int, default=20_000, help="at the 1x size")
    parser.add_argument("--factor", type=int, default=10, help="the larger size, times 1x")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    first = date.fromisoformat(args.start)
    last = first + timedelta(days=args.days - 1)
    os.environ["BACKFILL_START_DATE"] = first.isoformat()
    os.environ["BACKFILL_END_DATE"] = last.isoformat()
    # The daily partitions are defined when the package is imported, from these settings.
    from backfill_platform.definitions import all_assets
    from backfill_platform.lineage import Lineage
    from backfill_platform.operations.cutover import cutover
    from backfill_platform.resources import LakehouseResource
    from backfill_platform_tests.harness import spark_resource_for_tests

    spark_resource = spark_resource_for_tests()
    spark = spark_resource.get_session()
    lineage = Lineage(all_assets)
    key = AssetKey.from_user_string(TABLE)
    work = Path(tempfile.mkdtemp(prefix="bench-cutover-"))
    sizes = {"warm-up": max(args.rows_per_day // 10, 1), "1x": args.rows_per_day}
    sizes[f"{args.factor}x"] = args.rows_per_day * args.factor
    rows = []
    for size, per_day in sizes.items():
        lake = LakehouseResource(root_dir=str(work / size), spark=spark_resource)
        shadow = lake.shadowing("bench", [TABLE])
        for target, fix in ((lake, 0), (shadow, 1)):
            target.replace_range(
                TABLE, _orders(spark, first, args.days, per_day, fix), "event_date",
                first, last + timedelta(days=1), {"code_version": f"bench-{fix}"},
            )  # fmt: skip
        base = lake.current_version(TABLE)
        table_bytes = lake.detail(TABLE).size_in_bytes
        for mode in ("zero-copy", "copy"):
            seconds, data_bytes, log_bytes = [], [], []
            for _ in range(1 if size == "warm-up" else args.repeats):
                if lake.current_version(TABLE) != base:
                    lake.delta_table(TABLE).restoreToVersion(base)
                before = _files(Path(lake.table_path(TABLE)))
                started = time.monotonic()
                done = cutover(
                    lake, None, [key], first.isoformat(), last.isoformat(), "bench",
                    f"bench {mode}", force=True, lineage=lineage, copy=mode == "copy",
                )  # fmt: skip
                seconds.append(time.monotonic() - started)
                (table,) = done.tables
                assert table.mode == mode, table
                data_bytes.append(_written(lake, shadow, before))
                log_bytes.append(_log_bytes(lake, table.version_after))
            if size == "warm-up":
                continue
            rows.append(
                {
                    "size": size,
                    "rows": per_day * args.days,
                    "table_bytes": table_bytes,
                    "mode": mode,
                    "seconds_median": round(statistics.median(seconds), 2),
                    "seconds": [round(s, 2) for s in seconds],
                    "data_bytes_written": max(data_bytes),
                    "log_bytes": max(log_bytes),
                    "files_per_table": args.days,
                }
            )
            print(
                f"{size:>4} {mode:<9} {rows[-1]['seconds_median']:>7.2f} s  "
                f"data {rows[-1]['data_bytes_written']:>12,} B  log {rows[-1]['log_bytes']:>7,} B",
                flush=True,
            )
    spark_resource.get_session().stop()
    big = f"{args.factor}x"
    growth = {
        mode: round(
            _pick(rows, big, mode)["seconds_median"] / _pick(rows, "1x", mode)["seconds_median"], 2
        )
        for mode in ("zero-copy", "copy")
    }
    result = {
        "days": args.days,
        "rows_per_day_1x": args.rows_per_day,
        "factor": args.factor,
        "repeats": args.repeats,
        "results": rows,
        "time_growth_1x_to_big": growth,
        "target_zero_copy_growth_at_most": 1.2,
        "target_met": growth["zero-copy"] <= 1.2
        and all(r["data_bytes_written"] == 0 for r in rows if r["mode"] == "zero-copy"),
    }
    out = write_result("cutover", result)
    print()
    print("| size | rows | table bytes | cutover | median s | data bytes written | log bytes |")
    print("|---|---:|---:|---|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['size']} | {r['rows']:,} | {r['table_bytes']:,} | {r['mode']} | "
            f"{r['seconds_median']} | {r['data_bytes_written']:,} | {r['log_bytes']:,} |"
        )
    print(
        f"\ntime {big} / 1x: zero-copy {growth['zero-copy']} (target <= 1.2), copy "
        f"{growth['copy']}; target met: {result['target_met']}; wrote {out}"
    )
    return 0 if result["target_met"] else 1


def _orders(spark, first: date, days: int, per_day: int, fix: int):
    from pyspark.sql import functions as F

    return (
        spark.range(days * per_day)
        .select(
            F.date_add(F.lit(first), (F.col("id") % days).cast("int")).alias("event_date"),
            F.format_string("o-%09d", F.col("id")).alias("order_id"),
            F.element_at(F.array(*map(F.lit, ("EUR", "USD", "GBP"))),
                         (F.col("id") % 3 + 1).cast("int")).alias("currency"),
            ((F.col("id") * 7919 % 100_000) / 100 + fix).cast("decimal(18,2)").alias("revenue_usd"),
        )
    )  # fmt: skip


def _files(table_dir: Path) -> dict[str, int]:
    return {
        str(p): p.stat().st_ino for p in table_dir.rglob("*.parquet") if "_delta_log" not in p.parts
    }


def _written(lake, shadow, before: dict[str, int]) -> int:
    """Bytes of data files the cutover created: new in production, not the shadow's inode."""
    shadow_inodes = set(_files(Path(shadow.table_path(TABLE))).values())
    return sum(
        Path(path).stat().st_size
        for path, inode in _files(Path(lake.table_path(TABLE))).items()
        if path not in before and inode not in shadow_inodes
    )


def _log_bytes(lake, version: int) -> int:
    return (Path(lake.table_path(TABLE)) / "_delta_log" / f"{version:020d}.json").stat().st_size


def _pick(rows: list[dict], size: str, mode: str) -> dict:
    return next(r for r in rows if r["size"] == size and r["mode"] == mode)


if __name__ == "__main__":
    sys.exit(main())
