"""One Delta commit that swaps a range's data files for files another table wrote.

The zero-copy cutover's commit (operations/cutover.py). Delta has no public API that commits
files written by another table: SHALLOW CLONE does it for a whole table only, and every
DataFrame or SQL write rewrites the rows. So this module drives Delta's own transaction
(`DeltaLog` / `OptimisticTransaction`, the JVM API Delta's commands are built on) through
py4j: the range's files are the transaction's read set, so a concurrent writer to the range
conflicts as it would with a replaceWhere, and the commit goes through the table's log store
and protocol checks like any write. The add actions are the source table's own (statistics
included), their files hard-linked beside production's (lakehouse.py says why).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from backfill_platform.resources.delta_log import open_log
from backfill_platform.resources.spark import session_conf

# Delta reads commitInfo.userMetadata from this session setting when the operation carries
# none (the Manual Update operation carries none); the rollback's RESTORE uses it too.
USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"


class ZeroCopyUnavailable(Exception):
    """The range's files cannot be adopted as they are; nothing was committed."""


@dataclass(frozen=True)
class RangeFiles:
    """A table's live data files of a range at one snapshot, as Delta's log records them."""

    version: int
    adds: list[dict[str, Any]]  # the `add` actions: path, partitionValues, size, stats, ...


def _rows(files: list[dict[str, Any]]) -> int | None:
    """Rows by the files' statistics; None when a file has none."""
    counts = [json.loads(f["stats"]).get("numRecords") if f.get("stats") else None for f in files]
    return None if None in counts else sum(counts)


def _bytes(files: list[dict[str, Any]]) -> int:
    return sum(int(f["size"]) for f in files)


def _seq(session: SparkSession, items: list):
    jvm = session.sparkContext._jvm
    converters = jvm.scala.jdk.javaapi.CollectionConverters
    return converters.asScala(jvm.java.util.ArrayList(items)).toSeq()


def range_files(session: SparkSession, path: str, partition_predicate: str) -> RangeFiles:
    """The newest snapshot's files whose partition values satisfy `partition_predicate` (an
    SQL predicate on partition columns), with their full statistics."""
    jvm = session.sparkContext._jvm
    snapshot = open_log(session, path).startTransaction().snapshot()
    schema = StructType.fromJson(json.loads(snapshot.metadata().schemaString()))
    files = DataFrame(snapshot.allFiles().toDF(), session)
    fields = [c for c in files.columns if c in _ADD_FIELDS]
    for column in jvm.scala.jdk.javaapi.CollectionConverters.asJava(
        snapshot.metadata().partitionColumns()
    ):
        files = files.withColumn(
            column, files["partitionValues"][column].cast(schema[column].dataType)
        )
    rows = files.where(partition_predicate).select(F.to_json(F.struct(*fields))).collect()
    return RangeFiles(version=int(snapshot.version()), adds=[json.loads(r[0]) for r in rows])


# AddFile's fields (Delta protocol): the columns of Snapshot.allFiles kept in the action.
_ADD_FIELDS = (
    "path",
    "partitionValues",
    "size",
    "modificationTime",
    "dataChange",
    "stats",
    "tags",
    "deletionVector",
    "baseRowId",
    "defaultRowCommitVersion",
    "clusteringProvider",
)


@dataclass(frozen=True)
class SwapCommit:
    version: int
    files_added: int
    files_removed: int
    rows_added: int | None
    rows_removed: int | None
    bytes_added: int
    bytes_removed: int


def swap_range(
    session: SparkSession,
    path: str,
    partition_predicate: str,
    adds: list[dict[str, Any]],
    user_metadata: dict[str, Any],
    before_commit=lambda: None,
) -> SwapCommit:
    """Commit: remove the table's files in `partition_predicate`, add `adds` (paths relative
    to this table, already in place when `before_commit` returns), as one Delta version."""
    jvm = session.sparkContext._jvm
    txn = open_log(session, path).startTransaction()
    expression = (
        session._jsparkSession.sessionState().sqlParser().parseExpression(partition_predicate)
    )
    # keepNumRecords: the removed files' row counts, for the commit's record.
    current = txn.filterFiles(_seq(session, [expression]), True)
    now = jvm.java.lang.System.currentTimeMillis()
    removes, removed = [], []
    for i in range(current.size()):
        live = current.apply(i)
        removes.append(live.removeWithTimestamp(now, True))
        removed.append(json.loads(live.json())["add"])
    action = jvm.org.apache.spark.sql.delta.actions.Action
    added = [
        action.fromJson(json.dumps({"add": {**a, "dataChange": True}}, sort_keys=True))
        for a in adds
    ]
    before_commit()
    operation = getattr(
        getattr(jvm.org.apache.spark.sql.delta, "DeltaOperations$ManualUpdate$"), "MODULE$"
    )
    text = json.dumps(user_metadata, sort_keys=True, default=str)
    with session_conf(session, {USER_METADATA_CONF: text}):
        version = txn.commit(_seq(session, added + removes), operation)
    return SwapCommit(
        version=int(version),
        files_added=len(adds),
        files_removed=len(removed),
        rows_added=_rows(adds),
        rows_removed=_rows(removed),
        bytes_added=_bytes(adds),
        bytes_removed=_bytes(removed),
    )
