"""The stream's upkeep over time (`make bench-stream-upkeep`, docs/live-stream.md).

A real one-node broker, the demo shop at `--rate` messages/s for `--seconds`, the platform's
stream (`stream run`'s path: a batch every `--trigger-seconds`, each reported to a Dagster
instance through `StreamReporter`) into a fresh lakehouse, once per way of compacting:

- **none**: no compaction, every batch reported at once (the stream before its upkeep);
- **optimize**: the stream's own (`resources/maintenance.py`): OPTIMIZE of a day at
  `--compact-files` small files, on a thread beside the stream; reports coalesced;
- **auto**: Delta's auto compaction (`spark.databricks.delta.autoCompact.enabled`, its
  `minNumFiles` = `--compact-files`), run by Delta inside the append that reaches it.

Per way: batches, data files and small files per ingest day at the end, compactions and
their seconds, the longest batch (the stream waits for an auto compaction inside its batch),
and the materializations written. Prints a table, writes
`benchmarks/results/stream-upkeep-<timestamp>.json`.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

from benchmarks.measure import load_average, write_result

LAUNCH = datetime(2024, 1, 10, tzinfo=UTC)
WAYS = ("none", "optimize", "auto")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=5.0, help="messages/s")
    parser.add_argument("--seconds", type=float, default=170.0)
    parser.add_argument("--trigger-seconds", type=float, default=1.0)
    parser.add_argument("--compact-files", type=int, default=32)
    parser.add_argument("--orders-per-day", type=int, default=200, help="the shop's clock")
    parser.add_argument("--ways", default=",".join(WAYS))
    args = parser.parse_args(argv)

    from backfill_platform.sources.kafka_broker import kafka_broker

    work = Path(tempfile.mkdtemp(prefix="bench-stream-upkeep-"))
    result: dict = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "args": vars(args),
        "load_before": load_average(),
    }
    with kafka_broker(work / "kafka", "warm", partitions=4) as broker:
        for way in args.ways.split(","):
            result[way] = _run(work / way, broker, f"orders_{way}", way, args)
            print(f"{way}: {result[way]}", flush=True)
    result["load_after"] = load_average()
    out = write_result("stream-upkeep", result)
    print()
    print(
        "| way | batches | files per day at the end | small files | compactions | "
        "compaction s (median, max) | longest batch s | materializations |"
    )
    print("|---|---:|---|---:|---:|---|---:|---:|")
    for way in args.ways.split(","):
        r = result[way]
        print(
            f"| {way} | {r['batches']} | {r['files_per_day']} | {r['small_files']} | "
            f"{r['compactions']} | {r['compaction_seconds']} | {r['longest_batch_seconds']} | "
            f"{r['materializations']} |"
        )
    print(f"\nwritten {out} (load {result['load_before']} -> {result['load_after']})")
    return 0


def _run(work: Path, broker, topic: str, way: str, args) -> dict:
    from backfill_platform.operations.stream import run_stream
    from backfill_platform.operations.stream_events import StreamReporter
    from backfill_platform.resources.kafka import OrdersTopicResource
    from backfill_platform.resources.maintenance import small_files
    from backfill_platform.sources.producer import produce, shop_events
    from backfill_platform.tables import RAW_ORDERS
    from backfill_platform_tests.harness import Platform

    broker.create_topic(topic, 4)
    platform = Platform.create(work)
    lake = platform.resources["lakehouse"]
    orders = OrdersTopicResource(bootstrap_servers=broker.bootstrap, topic=topic)
    total = int(args.rate * args.seconds)
    messages = shop_events(LAUNCH, total, orders_per_day=args.orders_per_day)[:total]
    batches: list[float] = []
    rows: list[int] = []
    stop = threading.Event()
    auto = {"spark.databricks.delta.autoCompact.enabled": "true"} | {
        "spark.databricks.delta.autoCompact.minNumFiles": str(args.compact_files)
    }
    with (
        lake.spark.temporary_conf(auto if way == "auto" else {}),
        StreamReporter(
            platform.instance, lake, topic, interval_seconds=0.0 if way == "none" else None
        ) as reporter,
    ):

        def on_batch(batch) -> None:
            batches.append(batch.seconds)
            rows.append(batch.rows if batch.delta_version is not None else 0)
            reporter(batch)

        done: dict = {}
        stream = threading.Thread(
            target=lambda: done.update(
                report=run_stream(
                    lake,
                    orders,
                    stop,
                    args.trigger_seconds,
                    on_batch,
                    compact_files=args.compact_files if way == "optimize" else None,
                )
            )
        )
        stream.start()
        produce(broker.bootstrap, topic, messages, rate=args.rate)
        deadline = time.monotonic() + 300
        while sum(rows) < total and time.monotonic() < deadline:
            time.sleep(1)
        stop.set()
        stream.join()
    report = done["report"]
    files = lake.partition_files(RAW_ORDERS)
    history = lake.history(RAW_ORDERS)
    optimized = [c for c in history if c["operation"] == "OPTIMIZE"]
    seconds = [c.seconds for c in report.compactions]
    return {
        "messages": total,
        "batches": len(report.batches),
        "rows": report.rows,
        "files_per_day": {day: f.files for day, f in sorted(files.items())},
        "small_files": sum(small_files(lake, RAW_ORDERS).values()),
        "compactions": len(optimized),
        "compaction_seconds": [
            round(statistics.median(seconds), 2) if seconds else None,
            round(max(seconds), 2) if seconds else None,
        ],
        "longest_batch_seconds": round(max(batches, default=0.0), 2),
        "median_batch_seconds": round(statistics.median(batches), 2) if batches else None,
        "materializations": reporter.reported,
    }


if __name__ == "__main__":
    raise SystemExit(main())
