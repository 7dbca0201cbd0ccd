"""The raw parse alone: the platform's line reader and contract parser against the plain
Spark anchor's text reader and `json_tuple`, on one generated landing zone.

The full `make bench` showed the raw parse taking longer than the whole plain Spark job;
this isolates it so a change to `transforms/lines.py` or `transforms/orders.py` can be
measured in a minute rather than a 40-minute bench. Each line is timed to Spark's `noop`
sink (everything computed, nothing written), best of `--repeat` after one warm-up.

    python -m benchmarks.raw_parse --days 31 --orders-per-day 6000
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

from pyspark.sql import DataFrame

from backfill_platform.resources import SparkSessionResource
from backfill_platform.sources.generate import generate_landing
from backfill_platform.transforms.lines import counted, read_lines
from backfill_platform.transforms.orders import parse_orders
from benchmarks.anchor_spark import order_fields, order_lines

REPO = Path(__file__).resolve().parent.parent


def time_it(make: Callable[[], DataFrame], repeat: int) -> list[float]:
    seconds = []
    for _ in range(repeat + 1):  # the first is a warm-up
        started = time.monotonic()
        make().write.format("noop").mode("overwrite").save()
        seconds.append(round(time.monotonic() - started, 2))
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--start", type=date.fromisoformat, default=date(2024, 1, 1))
    parser.add_argument("--days", type=int, default=31)
    parser.add_argument("--orders-per-day", type=int, default=6000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="bench-parse-") as work:
        landing = Path(work) / "landing"
        last = args.start + timedelta(days=args.days - 1)
        generate_landing(landing, args.start, last, args.orders_per_day, 7, progress=False)
        resource = SparkSessionResource(extra_conf={"spark.ui.showConsoleProgress": "false"})
        spark = resource.get_session()
        files = sorted(landing.glob("orders/*/*.jsonl"))
        lines = read_lines(spark, files, "ingest_date").count()
        cases = {
            "anchor: text reader + split": lambda: order_lines(spark, landing),
            "anchor: + json_tuple (untyped, no rules)": lambda: order_fields(
                order_lines(spark, landing)
            ),
            "platform: read_lines": lambda: read_lines(spark, files, "ingest_date"),
            "platform: read_lines + parse_orders (contract rules)": lambda: parse_orders(
                read_lines(spark, files, "ingest_date")
            ),
            # raw/orders' own pipeline: the lines counted before the parse, which then
            # compiles to a method of its own (transforms/lines.py `counted`).
            "platform: read_lines, counted, + parse_orders (raw/orders)": lambda: parse_orders(
                counted(read_lines(spark, files, "ingest_date"), "lines")[0]
            ),
        }
        runs = {name: time_it(make, args.repeat) for name, make in cases.items()}

    best = {name: min(seconds[1:]) for name, seconds in runs.items()}
    result = {
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "scale": {"days": args.days, "orders_per_day": args.orders_per_day, "lines": lines},
        "load_average": os.getloadavg()[0],
        "cpus": os.cpu_count(),
        "seconds": runs,
        "best_seconds": best,
        "seconds_per_million_lines": {n: round(s / lines * 1e6, 2) for n, s in best.items()},
    }
    print(f"\n{lines:,} landing lines, {args.days} days; best of {args.repeat} after a warm-up")
    print("| line | best s | s per million lines |\n|---|---:|---:|")
    for name, seconds in best.items():
        print(f"| {name} | {seconds:.2f} | {result['seconds_per_million_lines'][name]:.2f} |")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"raw-parse-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    path.write_text(json.dumps(result, indent=2))
    print(f"\nwritten: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
