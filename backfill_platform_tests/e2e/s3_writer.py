"""One writer process of the object-store concurrency tests, as if on its own machine.

    python -m backfill_platform_tests.e2e.s3_writer --root s3a://b/lake --table t/x \
        --writer 2 --days 2024-01-01,2024-01-02 --go GO_FILE --out result.json

Its own JVM, no lock directory shared with the others (the table's root is on object
storage, so `LakehouseResource` takes no lock): each day is one `replace_range` of 10 rows
tagged with the writer, the platform's one write path. The S3 settings come from the
environment (BACKFILL_S3_*), as in a deployment. `--log-store delta-default` swaps in
Delta's own S3 log store, to show what the project's conditional-write store prevents.
Waits for `--go` to exist, so every writer's first commit races the others'.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from datetime import date, timedelta
from pathlib import Path

from backfill_platform.resources import LakehouseResource, SparkSessionResource
from backfill_platform.resources.lakehouse import CommitLost, TableWriteError

DELTA_DEFAULT_S3_LOG_STORE = "io.delta.storage.S3SingleDriverLogStore"
ROWS_PER_DAY = 10


class _RetryCounter(logging.Handler):
    """Counts the platform's own retries of a conflicting write (`_retrying_conflicts`)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += "retrying" in record.getMessage()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--table", required=True)
    parser.add_argument("--writer", type=int, required=True)
    parser.add_argument("--days", required=True, help="comma-separated, one commit each")
    parser.add_argument("--rounds", type=int, default=1, help="write the days this many times")
    parser.add_argument("--go", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--log-store", choices=["project", "delta-default"], default="project")
    args = parser.parse_args(argv)

    extra = {"spark.ui.showConsoleProgress": "false"}
    if args.log_store == "delta-default":
        extra["spark.delta.logStore.s3a.impl"] = DELTA_DEFAULT_S3_LOG_STORE
    spark = SparkSessionResource(
        master="local[1]",
        shuffle_partitions=1,
        driver_memory="512m",
        s3_endpoint=os.environ["BACKFILL_S3_ENDPOINT"],
        s3_path_style=True,
        s3_access_key_id=os.environ["BACKFILL_S3_ACCESS_KEY_ID"],
        s3_secret_access_key=os.environ["BACKFILL_S3_SECRET_ACCESS_KEY"],
        extra_conf=extra,
    )
    lake = LakehouseResource(root_dir=args.root, spark=spark)
    session = spark.get_session()
    lake.exists(args.table)  # opens the bucket before the race starts
    ready = Path(args.out + ".ready")
    ready.write_text("ready")
    while not Path(args.go).exists():
        time.sleep(0.05)

    retries = _RetryCounter()
    logging.getLogger("backfill_platform.resources.lakehouse").addHandler(retries)
    commits, failures, lost = [], [], []
    days = [date.fromisoformat(d) for d in args.days.split(",")]
    for round_ in range(args.rounds):
        for day in days:
            rows = [(day, args.writer, round_, i) for i in range(ROWS_PER_DAY)]
            df = session.createDataFrame(rows, "day date, writer int, round int, n int")
            try:
                commit = lake.replace_range(
                    args.table, df, "day", day, day + timedelta(days=1), {"writer": args.writer}
                )
            except TableWriteError as error:
                failures.append({"day": day.isoformat(), "error": str(error)})
                continue
            except CommitLost as error:  # Delta said committed; the history disagrees
                lost.append({"day": day.isoformat(), "error": str(error)})
                continue
            commits.append(
                {
                    "day": day.isoformat(),
                    "round": round_,
                    "version": commit.version,
                    "token": commit.user_metadata["commit_token"],
                }
            )
    Path(args.out).write_text(
        json.dumps(
            {"commits": commits, "failures": failures, "lost": lost, "retries": retries.count}
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
