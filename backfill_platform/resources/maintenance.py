"""Keeping the lakehouse's tables healthy: VACUUM, dropping a shadow, compacting the
stream's small files.

Reading and writing tables is `lakehouse.py`'s job; this module's is what keeps them cheap
to read and within their disk over months, under the same per-table lock as every writer.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import date

from dagster import AssetKey
from py4j.protocol import Py4JJavaError
from pyspark.errors import AnalysisException, SparkRuntimeException
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from backfill_platform.resources.delta_log import open_log
from backfill_platform.resources.lakehouse import CONCURRENT_WRITE_CONFLICTS, LakehouseResource
from backfill_platform.resources.storage import hadoop_fs
from backfill_platform.tables import TABLES, shadow_name, table

_RETENTION_CHECK = "spark.databricks.delta.retentionDurationCheck.enabled"
_LISTING_PARALLELISM = "spark.sql.sources.parallelPartitionDiscovery.parallelism"


class TableDropRefused(Exception):
    """A drop was refused before anything was deleted."""


def vacuum(lake: LakehouseResource, key: AssetKey | str, retention_hours: float) -> int | None:
    """VACUUM under the table lock, with the caller's retention window in place of
    Delta's fixed 7-day check (callers enforce their own floor: the shadow retention).

    The lock matters for a short window: VACUUM must not delete a writer's new files.
    Returns the files it deleted, from the VACUUM END commit Delta logs (None if Delta's
    VACUUM logging is off).

    Delta lists the table's files with Spark's partition-discovery parallelism, 10,000
    tasks by default whatever the table's size: 30 to 60 s for a table of 8 folders in a
    2-core session, 4 to 6 s with one task per core (docs/performance.md). The cores are
    what can run at once, so more tasks than that only queue.
    """
    settings = {
        _RETENTION_CHECK: "false",
        _LISTING_PARALLELISM: str(lake.session.sparkContext.defaultParallelism),
    }
    with lake.spark.temporary_conf(settings), lake.table_lock(key):
        table_ = lake.delta_table(key)
        table_.vacuum(retention_hours)
        latest = table_.history(1).first()
    if latest["operation"] != "VACUUM END":
        return None
    return int((latest["operationMetrics"] or {}).get("numDeletedFiles", 0))


def drop_shadows(lake: LakehouseResource, suffix: str) -> list[str]:
    """Delete every shadow table of `suffix`; returns their names.

    Only ever removes Delta table directories directly under their table's layer in this
    lakehouse: names come from the registry and a validated suffix, then each resolved
    path (symlinks followed) is compared with its resolved layer directory. Every shadow
    is checked before the first is deleted, so a refusal deletes nothing.
    """
    root = lake.local_root()
    doomed = []
    for registered in TABLES:
        name = shadow_name(registered.name, suffix)
        if root is None:
            # Object stores have no symlinks: the validated name is the whole guard.
            path = shown = lake.table_path(name)
            filesystem, hadoop_path = hadoop_fs(lake.session, path)
            if not filesystem.exists(hadoop_path):
                continue
        else:
            layer_dir = (root / registered.layer).resolve()
            resolved = (root / name).resolve()
            if not (root / name).exists() and not (root / name).is_symlink():
                continue
            if (
                layer_dir.parent != root
                or resolved.parent != layer_dir
                or resolved.name != name.split("/")[1]
            ):
                raise TableDropRefused(
                    f"{name}: resolves to {resolved}, not a table directly under "
                    f"{root / registered.layer}; nothing was deleted."
                )
            path, shown = resolved.as_uri(), resolved
        if not lake.exists(name):
            raise TableDropRefused(f"{name}: {shown} is not a Delta table; nothing was deleted.")
        doomed.append((name, path))
    for name, path in doomed:
        with lake.table_lock(name):
            filesystem, hadoop_path = hadoop_fs(lake.session, path)
            filesystem.delete(hadoop_path, True)
    return [name for name, _ in doomed]


# -- compaction: the stream's small files merged with Delta's OPTIMIZE ---------------------
# A day is compacted once it holds this many small files (BACKFILL_STREAM_COMPACT_FILES).
COMPACT_FILES = 32
# Files under this size are small: OPTIMIZE merges them, and leaves every larger file alone
# (Delta's `optimize.minFileSize`), so one compaction rewrites less than this plus the day's
# new small files, however large the day has grown.
SMALL_FILE_BYTES = 8 * 1024 * 1024
_OPTIMIZE_MIN_FILE_SIZE = "spark.databricks.delta.optimize.minFileSize"
LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class Compaction:
    """One compaction round of a table's days: what it found, did, or why it gave way."""

    table: str
    small_files: dict[str, int]  # day -> files under SMALL_FILE_BYTES before the round
    files_removed: int = 0
    files_added: int = 0
    seconds: float = 0.0
    gave_way: str | None = None  # why nothing was committed: another writer, a conflict

    @property
    def days(self) -> list[str]:
        return sorted(self.small_files)

    def describe(self) -> str:
        days = ", ".join(f"{d} ({n} small files)" for d, n in sorted(self.small_files.items()))
        if self.gave_way:
            return f"compaction of {self.table} {days} left for later: {self.gave_way}"
        return (
            f"compacted {self.table} {days}: {self.files_removed} files -> "
            f"{self.files_added} in {self.seconds:.1f} s"
        )


def small_files(
    lake: LakehouseResource,
    key: AssetKey | str,
    days: Iterable[str] | None = None,
    below: int = SMALL_FILE_BYTES,
) -> dict[str, int]:
    """Day -> live files under `below` bytes of a table partitioned by day (every day when
    `days` is None), from the newest snapshot's file list: the Delta log, no data file."""
    if not lake.exists(key):
        return {}
    snapshot = open_log(lake.session, lake.table_path(key)).startTransaction().snapshot()
    files = DataFrame(snapshot.allFiles().toDF(), lake.session)
    day = files["partitionValues"][table(key).partition_column]
    if days is not None:
        files = files.where(day.isin(sorted(set(days))))
    small = files.where(F.col("size") < below).groupBy(day.alias("day")).count().collect()
    return {r["day"]: int(r["count"]) for r in small}


def compact_days(
    lake: LakehouseResource,
    key: AssetKey | str,
    days: Iterable[str] | None = None,
    min_files: int = COMPACT_FILES,
    small_bytes: int = SMALL_FILE_BYTES,
    counted: dict[str, int] | None = None,
) -> Compaction | None:
    """OPTIMIZE (bin-packing) the `days` that hold `min_files` small files or more (every
    such day when `days` is None); None when no day does. `counted`: the days' small files
    as `small_files` just counted them, not counted again.

    Delta's compaction commits with dataChange=false: readers, time travel and the
    idempotent appends' transaction ids (`txnAppId`) see the same rows. It takes the table
    lock like every writer, but never waits for it: while a landing run or the stream holds
    the table, it gives way (`gave_way`) and the caller tries again later. On an object
    store, where no lock orders writers, a lost race is Delta's conflict and gives way the
    same; the writer that commits after it retries as it retries any conflict.
    """
    if counted is None:
        counted = small_files(lake, key, days, small_bytes)
    found = {d: n for d, n in counted.items() if n >= min_files}
    if not found:
        return None
    name = key if isinstance(key, str) else key.to_user_string()
    column = table(key).partition_column
    listed = ", ".join(f"DATE'{date.fromisoformat(d).isoformat()}'" for d in sorted(found))
    started = time.monotonic()
    with lake.table_lock(key, wait=False) as held:
        if not held:
            return Compaction(name, found, gave_way="another writer holds the table")
        try:
            with lake.spark.temporary_conf({_OPTIMIZE_MIN_FILE_SIZE: str(small_bytes)}):
                metrics = (
                    lake.delta_table(key)
                    .optimize()
                    .where(f"`{column}` IN ({listed})")
                    .executeCompaction()
                    .first()["metrics"]
                )
        except CONCURRENT_WRITE_CONFLICTS as error:
            return Compaction(name, found, gave_way=f"a concurrent commit ({type(error).__name__})")
    return Compaction(
        name,
        found,
        files_removed=int(metrics["numFilesRemoved"]),
        files_added=int(metrics["numFilesAdded"]),
        seconds=time.monotonic() - started,
    )


class DayCompactor:
    """Compacts the days a long-lived writer appends to (the stream), on a thread of its own
    so the writer never waits for it beyond one compaction's hold of the table lock.

    `note(days, version)` after each commit: a commit that follows the last one it knows
    (`version` = that one + 1) added one file to each of its days, so it adds one to their
    counts without reading the Delta log; a day that reaches `min_files` that way, or any
    day after a commit it did not see (another writer, its own compaction, an unknown
    version), wakes it to count the day's small files from the log and compact it at
    `min_files` (`compact_days`). So the log's file list is read once per `min_files`
    batches of a day, not once per batch. A round that gave way is tried again after
    `retry_seconds` or at the next note. It starts with a round over every day of the table,
    so days a previous process left at the threshold are compacted too, and `close()` runs
    the last round. A failed round is logged and its days tried again: upkeep never stops
    the writer it keeps.
    """

    def __init__(
        self,
        lake: LakehouseResource,
        key: AssetKey | str,
        min_files: int = COMPACT_FILES,
        retry_seconds: float = 30.0,
        on_round: Callable[[Compaction], None] | None = None,
    ):
        self.lake, self.key, self.min_files = lake, key, min_files
        self.retry_seconds, self.on_round = retry_seconds, on_round
        self.rounds: list[Compaction] = []
        self._pending: set[str] = set()
        self._counts: dict[str, int] = {}  # day -> small files, as last counted plus appends
        self._version: int | None = None  # the last commit the counts include
        self._every_day = True
        self._closing = False
        self._guard = threading.Lock()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="day-compactor", daemon=True)
        self._thread.start()
        self._wake.set()

    def note(self, days: Iterable[str], version: int | None = None) -> None:
        """`days` got one file each in commit `version` (None: not known)."""
        with self._guard:
            follows = version is not None and self._version is not None
            follows = follows and version == self._version + 1 and not self._every_day
            self._version = version if follows else None
            if not follows:  # a commit not seen between: count the days from the log
                self._pending.update(days)
                self._wake.set()
                return
            for day in days:
                self._counts[day] = self._counts.get(day, 0) + 1
                if self._counts[day] >= self.min_files:
                    self._pending.add(day)
            if self._pending:
                self._wake.set()

    def close(self) -> list[Compaction]:
        """The last round over the noted days, then stop; the rounds that did something."""
        with self._guard:
            self._closing = True
        self._wake.set()
        self._thread.join()
        return self.rounds

    def __enter__(self) -> DayCompactor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _run(self) -> None:
        retry = False
        while True:
            self._wake.wait(self.retry_seconds if retry else None)
            self._wake.clear()
            with self._guard:
                days = None if self._every_day else sorted(self._pending)
                self._pending.clear()
                self._every_day, closing = False, self._closing
            retry = bool(days is None or days) and self._round(days)
            if closing:
                return

    def _round(self, days: list[str] | None) -> bool:
        """One round; whether its days are left to try again."""
        try:
            version = self.lake.current_version(self.key) if self.lake.exists(self.key) else None
            counted = small_files(self.lake, self.key, days)
            with self._guard:
                if days is None:
                    self._counts.clear()
                self._counts.update(dict.fromkeys(days or [], 0) | counted)
                # the counts hold this version's files; a later note follows it or recounts
                self._version = version if version is not None and not self._pending else None
            done = compact_days(self.lake, self.key, days, self.min_files, counted=counted)
        except (Py4JJavaError, AnalysisException, SparkRuntimeException) as error:
            reason = str(error).splitlines()[0][:300]
            LOG.error("compaction of %s %s failed, tried again later: %s", self.key, days, reason)
            done = Compaction(str(self.key), dict.fromkeys(days or [], 0), gave_way=reason)
        if done is None:
            return False
        if done.gave_way is None:
            self.rounds.append(done)
            with self._guard:  # its own commit: the next note counts from the log again
                self._version = None
                self._counts.update(dict.fromkeys(done.days, 1))
        if self.on_round is not None:
            self.on_round(done)
        if done.gave_way is not None:
            with self._guard:
                self._pending.update(done.days)
            return True
        return False
