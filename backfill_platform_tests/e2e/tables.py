"""Reading the lakehouse the services wrote, from the test process's Spark session."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import functions as F

from backfill_platform.resources.lakehouse import LakehouseResource
from backfill_platform.tables import TABLE_NAMES
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
