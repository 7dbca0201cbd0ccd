"""Reading the lakehouse the services wrote, from the test process's Spark session."""

from __future__ import annotations

from datetime import date, timedelta
from itertools import pairwise
from pathlib import Path

from pyspark.sql import functions as F

from backfill_platform.resources.lakehouse import LakehouseResource
from backfill_platform.tables import CUSTOMER_LTV, TABLE_NAMES
from backfill_platform_tests.harness import spark_resource_for_tests


def lakehouse_for(root: Path, spark=None) -> LakehouseResource:
    """The lakehouse at `root`, read with the test session (`spark` only orders fixtures)."""
    return LakehouseResource(root_dir=str(root), spark=spark_resource_for_tests())


def partition_fingerprints(lake: LakehouseResource) -> dict[str, dict[str, tuple[int, str]]]:
    """Per table, per Delta partition value: (rows, order-independent hash of data columns).

    A partition is "torn" if it matches neither the state before a write nor after it; this
    is the unit the one write path (`replace_range`) promises to replace atomically.
    """
    result: dict[str, dict[str, tuple[int, str]]] = {}
    for name in TABLE_NAMES:
        if not lake.exists(name):
            result[name] = {}
            continue
        table = lake.delta_table(name)
        columns = table.detail().first()["partitionColumns"]  # none: one "*" partition
        df = lake.read(name)
        column = columns[0] if columns else "_whole_table"
        if not columns:
            df = df.withColumn(column, F.lit("*"))
        cols = sorted(c for c in df.columns if not c.startswith("_"))
        rows = (
            df.groupBy(column)
            .agg(
                F.count(F.lit(1)).alias("n"),
                F.sum(F.xxhash64(*cols).cast("decimal(38,0)")).alias("h"),
            )
            .collect()
        )
        result[name] = {str(r[column]): (r["n"], str(r["h"])) for r in rows}
    return result


def assert_ltv_committed_oldest_first(
    lake: LakehouseResource, after: int, reach: tuple[str, str]
) -> list[tuple[str, str]]:
    """customer_ltv D is D-1 plus day D: the LTV ranges committed after version `after`, in
    Delta commit order, run from the first day of `reach` to its last, each starting where
    the one before ended (docs/lineage.md, "Order of the LTV chunks"). Returns the ranges."""
    commits = sorted(
        (c for c in lake.history(CUSTOMER_LTV) if c["version"] > after), key=lambda c: c["version"]
    )
    ranges = [
        (c["metadata"]["partition_start"], c["metadata"]["partition_end"])
        for c in commits
        if c["metadata"].get("partition_start")
    ]
    first, last = reach
    assert ranges and ranges[0][0] == first, ranges
    assert ranges[-1][1] == (date.fromisoformat(last) + timedelta(1)).isoformat(), ranges
    for (_, end), (start, _) in pairwise(ranges):
        assert start == end, f"LTV range from {start} committed out of order: {ranges}"
    return ranges
