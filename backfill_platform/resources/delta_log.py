"""A table's newest version and single commits, read off the Delta log on the driver.

Every write looks up the commit it just made (its version, metrics and metadata), and
`DeltaTable.history(n)` answers that with a Spark job whatever `n` is (Delta's
`DeltaHistoryManager.getHistory` maps the version range over a Spark job): 170-235 ms each
on a warm session, about ten per run (docs/performance.md). Delta's own driver-side reader
(`DeltaHistoryManager.getCommitInfoOpt`, through the table's log store, so object stores
work as for any read) takes one file read: 12-20 ms with the commit taken as its JSON
(`_logged`). Whole histories stay with `DeltaTable.history`, which reads many commits in
parallel.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from py4j.protocol import Py4JJavaError
from pyspark.sql import SparkSession

CHANGE_FEED = "delta.enableChangeDataFeed"


@dataclass(frozen=True)
class LoggedCommit:
    version: int
    operation: str
    metrics: dict[str, str]
    user_metadata: dict[str, Any]

    @property
    def changes_no_row(self) -> bool:
        """An append of no rows, or a DELETE of none: a run that recorded the days it
        covered and wrote nothing (raw/crm_customer_history's run that called no one,
        `LakehouseResource.record_unchanged`)."""
        m, appended = self.metrics, self.user_metadata.get("write_mode") == "append"
        if self.operation == "WRITE":
            return appended and m.get("numOutputRows") == "0"
        if self.operation == "DELETE":
            return m.get("numDeletedRows") == "0" and m.get("numAddedFiles") == "0"
        return False


def open_log(session: SparkSession, path: str):
    """The table's `DeltaLog` (Delta caches one per path and session)."""
    jvm = session.sparkContext._jvm
    return jvm.org.apache.spark.sql.delta.DeltaLog.forTable(session._jsparkSession, path)


def _snapshot(session: SparkSession, log):
    """The table's newest snapshot (`DeltaLog.update()`: lists the log, no Spark job)."""
    empty = session.sparkContext._jvm.scala.Option.empty()
    return log.update(False, empty, empty)


def latest_version(session: SparkSession, path: str) -> int:
    return int(_snapshot(session, open_log(session, path)).version())


def identity(session: SparkSession, path: str) -> tuple[str, int]:
    """The table's id (Delta makes a new one whenever a table is created at a path) and its
    newest version: together they name the table's content for good."""
    snapshot = _snapshot(session, open_log(session, path))
    return str(snapshot.metadata().id()), int(snapshot.version())


def feed_covers(session: SparkSession, path: str, version: int) -> bool:
    """Whether Delta's change data feed holds commit `version` as whole rows of one schema:
    the table records its changes (`delta.enableChangeDataFeed`) and that commit did not
    change the table's metadata (a new column would read as NULL in the removed rows). One
    file read; a feed switched on after `version` still fails at the read
    (DELTA_MISSING_CHANGE_DATA)."""
    jvm = session.sparkContext._jvm
    converters = jvm.scala.jdk.javaapi.CollectionConverters
    log = open_log(session, path)
    snapshot = _snapshot(session, log)
    settings = converters.asJava(snapshot.metadata().configuration())
    if str(settings.get(CHANGE_FEED)).lower() != "true" or version > int(snapshot.version()):
        return False
    files = jvm.org.apache.spark.sql.delta.util.DeltaCommitFileProvider.apply(snapshot)
    try:
        actions = log.store().read(files.deltaFile(version), log.newDeltaHadoopConf())
    except Py4JJavaError as error:
        if _not_found(error):
            return False  # cleaned up by Delta's log retention
        raise
    return not any(line.startswith('{"metaData"') for line in converters.asJava(actions))


def newest_commits(session: SparkSession, path: str, limit: int):
    """The table's newest `limit` commits, newest first, read one file at a time (a
    caller that finds what it looks for early reads no further)."""
    jvm = session.sparkContext._jvm
    log = open_log(session, path)
    snapshot = _snapshot(session, log)
    files = jvm.org.apache.spark.sql.delta.util.DeltaCommitFileProvider.apply(snapshot)
    manager = jvm.org.apache.spark.sql.delta.DeltaHistoryManager
    conf = log.newDeltaHadoopConf()
    newest = int(snapshot.version())
    for version in range(newest, max(newest - limit, -1), -1):
        try:
            info = manager.getCommitInfoOpt(log.store(), files.deltaFile(version), conf)
        except Py4JJavaError as error:
            if _not_found(error):
                return  # cleaned up by Delta's log retention: nothing older either
            raise
        if info.isDefined():
            yield _logged(version, info.get())


def _not_found(error: Py4JJavaError) -> bool:
    return "FileNotFoundException" in error.java_exception.getClass().getName()


def _logged(version: int, info) -> LoggedCommit:
    """The commit as Delta serializes it to its log, in one Py4J call: walking its metrics
    map entry by entry through Py4J took 14-19 ms a commit, the JSON 0.3-0.5 ms."""
    commit = json.loads(info.json())["commitInfo"]
    user = commit.get("userMetadata")
    return LoggedCommit(
        version=version,
        operation=str(commit["operation"]),
        metrics={key: str(value) for key, value in (commit.get("operationMetrics") or {}).items()},
        user_metadata=json.loads(user) if user else {},
    )
