"""What the stream's reliability suites ask of raw/orders: the Kafka offsets it holds."""

from __future__ import annotations

import time
from pathlib import Path

from pyspark.sql import functions as F

from backfill_platform.resources import LakehouseResource


def offsets(lake: LakehouseResource, topic: str) -> list[tuple[int, int]]:
    """(partition, offset) of every row of `topic` in raw/orders, sorted, copies kept."""
    # Asked of the file system: this JVM's Delta would keep taking the path for no table
    # once it found none there; a read of a table with a first commit looks for new ones.
    first_commit = Path(lake.table_path("raw/orders")) / "_delta_log" / f"{0:020d}.json"
    if not first_commit.is_file():
        return []
    rows = lake.read("raw/orders").where(F.col("kafka_topic") == topic)
    return sorted((r[0], r[1]) for r in rows.select("kafka_partition", "kafka_offset").collect())


def wait_for_offsets(lake, topic: str, count: int, process, timeout: float = 600) -> None:
    """Until raw holds `count` rows of `topic`; fails with the stream's log if it died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(offsets(lake, topic)) >= count:
            return
        if process.pid() is None:
            raise AssertionError(f"the stream process died:\n{process.log.read_text()[-3000:]}")
        time.sleep(2)
    raise AssertionError(
        f"raw did not reach {count} rows of {topic}:\n{process.log.read_text()[-3000:]}"
    )
