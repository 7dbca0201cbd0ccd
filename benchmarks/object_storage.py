"""The full backfill on a local lakehouse vs on S3 (`make bench-s3`, docs/object-storage.md).

One generated landing zone, copied into a bucket of a real S3-compatible server on
127.0.0.1 (versitygw, `make s3-deps`); the same in-process backfill of every asset, once
with local roots and once with `s3a://` roots, in one warm Spark session (a short warm-up
first, so neither pays for class loading). Prints a table and writes
`benchmarks/results/object-storage-<timestamp>.json`. The tables must be equal.

What it measures is the cost of the object store's protocol (HTTP per file operation,
conditional commits, listing instead of readdir), not network bandwidth: the server is
local.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from datetime import date, timedelta
from pathlib import Path

from benchmarks.measure import write_result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--start", default="2024-01-01")
    parser.add_argument("--days", type=int, default=31)
    parser.add_argument("--orders-per-day", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    first = date.fromisoformat(args.start)
    last = first + timedelta(days=args.days - 1)
    os.environ["BACKFILL_START_DATE"] = first.isoformat()
    os.environ["BACKFILL_END_DATE"] = last.isoformat()
    # The daily partitions are defined when the package is imported, from these settings.
    from dagster import DagsterInstance

    from backfill_platform.definitions import all_assets, build_resources
    from backfill_platform.reconcile import fingerprints
    from backfill_platform.runner import backfill
    from backfill_platform.sources.crm_data import generate_crm
    from backfill_platform.sources.crm_process import start_crm_server
    from backfill_platform.sources.generate import generate_landing
    from backfill_platform_tests.e2e.object_store import S3Server
    from backfill_platform_tests.harness import spark_resource_for_tests

    work = Path(tempfile.mkdtemp(prefix="bench-s3-"))
    landing = work / "landing"
    summary = generate_landing(landing, first, last, args.orders_per_day, args.seed)
    generate_crm(landing, work / "crm", args.seed)
    crm = start_crm_server(work / "crm", token="bench-s3", rate=5000)
    os.environ.update(
        BACKFILL_CRM_URL=crm.url,
        BACKFILL_CRM_TOKEN="bench-s3",
        BACKFILL_CRM_RATE_LIMIT="5000",
        # One machine: an s3a:// root needs an explicit limiter file (docs/crm.md).
        BACKFILL_CRM_LIMITER=str(work / "crm_rate_limit.sqlite"),
    )
    s3 = S3Server(work / "s3")
    s3.start()
    try:
        spark_resource = spark_resource_for_tests()
        spark = spark_resource.get_session()
        s3.configure(spark)
        bucket = s3.bucket("bench")
        s3.upload(spark, landing, f"{bucket}/landing")
        roots = {
            "warm-up (local, 3 days)": (str(landing), str(work / "warmup")),
            "local": (str(landing), str(work / "lakehouse")),
            "s3a": (f"{bucket}/landing", f"{bucket}/lakehouse"),
        }
        seconds, prints = {}, {}
        for name, (landing_dir, lakehouse_dir) in roots.items():
            resources = build_resources(landing_dir, lakehouse_dir, spark=spark_resource)
            end = first + timedelta(days=2) if name.startswith("warm-up") else last
            started = time.monotonic()
            runs = backfill(
                all_assets,
                first.isoformat(),
                end.isoformat(),
                resources,
                DagsterInstance.ephemeral(),
            )
            seconds[name] = round(time.monotonic() - started, 1)
            print(f"{name:<24} {seconds[name]:>8.1f} s  ({len(runs)} runs)", flush=True)
            if not name.startswith("warm-up"):
                prints[name] = comparable(resources["lakehouse"], fingerprints)
        equal = prints["local"] == prints["s3a"]
        result = {
            "days": args.days,
            "orders_per_day": args.orders_per_day,
            "landing_lines": summary.get("lines"),
            "warm_up_days": 3,
            "seconds": seconds,
            "s3a_over_local": round(seconds["s3a"] / seconds["local"], 2),
            "tables_equal": equal,
            "objects_in_bucket": len(s3.objects("bench")),
        }
    finally:
        s3.stop()
        crm.stop()
    out = write_result("object-storage", result)
    print()
    print("| lakehouse + landing | seconds |")
    print("|---|---:|")
    print(f"| local disk | {seconds['local']} |")
    print(f"| s3a (versitygw on 127.0.0.1) | {seconds['s3a']} |")
    print(f"\ns3a / local = {result['s3a_over_local']}; tables equal: {equal}; wrote {out}")
    return 0 if equal else 1


def comparable(lake, fingerprints) -> dict:
    """What two independent builds must share: every table's fingerprint, except that the
    CRM answers carry the time they were fetched (the history's rows, the customers' column
    `fetched_at`), which no second build repeats."""
    prints = fingerprints(lake)
    prints.pop("raw/crm_customer_history", None)
    customers = lake.read("staging/customers").drop("fetched_at")
    columns = sorted(c for c in customers.columns if not c.startswith("_"))
    prints["staging/customers"] = sorted(map(str, customers.select(*columns).collect()))
    return prints


if __name__ == "__main__":
    sys.exit(main())
