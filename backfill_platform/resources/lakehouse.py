"""The Delta lakehouse: table paths, range reads and the one way tables are written.

Every write goes through `replace_range`: the rows of a half-open date range are replaced
in one Delta commit (`replaceWhere`), so a daily run, a retry and a three-year backfill
are the same operation and running it twice leaves the table as running it once.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import random
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote, urlparse

from dagster import AssetKey, ConfigurableResource, InitResourceContext
from delta.exceptions import (
    ConcurrentAppendException,
    ConcurrentDeleteDeleteException,
    ConcurrentDeleteReadException,
    ConcurrentTransactionException,
    ConcurrentWriteException,
    DeltaConcurrentModificationException,
    MetadataChangedException,
    ProtocolChangedException,
)
from delta.tables import DeltaTable
from py4j.protocol import Py4JJavaError
from pydantic import Field, PrivateAttr
from pyspark.errors import AnalysisException, SparkRuntimeException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from backfill_platform.partitions import commit_partition_keys
from backfill_platform.refusals import refusal
from backfill_platform.resources.delta_files import (
    USER_METADATA_CONF,
    ZeroCopyUnavailable,
    range_files,
    swap_range,
)
from backfill_platform.resources.delta_log import (
    LoggedCommit,
    feed_covers,
    identity,
    latest_version,
    newest_commits,
)
from backfill_platform.resources.spark import SparkSessionResource
from backfill_platform.resources.storage import hadoop_fs, is_uri
from backfill_platform.runner import record_run_events
from backfill_platform.tables import (
    CORRECTABLE_LAYERS,
    SHADOW_SUFFIX_TAG,
    TABLE_NAMES,
    TABLES,
    production_key,
    run_shadow_suffix,
    shadow_name,
    table,
)


class TableWriteError(Exception):
    """A write was refused before committing; the table is unchanged."""


class CommitLost(RuntimeError):
    """Delta reported the write committed, yet its commit is not in the table's history:
    another writer replaced that version's log entry (a log store without mutual exclusion
    across writers). The platform's own after-write check; docs/object-storage.md."""


@dataclass(frozen=True)
class CommitInfo:
    version: int
    rows_written: int
    files_written: int
    files_removed: int
    rows_removed: int
    user_metadata: dict[str, Any]
    bytes_written: int = 0  # data bytes (numOutputBytes); a zero-copy commit writes none


@dataclass(frozen=True)
class KeptRange:
    """The rows one commit wrote over [start, end) of `column`, persisted in memory.

    A commit that replaces the whole range makes the table at `version`, restricted to that
    range, exactly these rows; so a later step of the same run reads them from memory
    instead of building the table's snapshot again and decoding its files.
    """

    version: int
    column: str
    start: date
    end: date
    frame: DataFrame  # the persisted frame, its columns in the table's order
    persisted: DataFrame  # what `unpersist` releases


# Run id -> what the run kept. Dagster sets up the IO manager's lakehouse and the one the
# assets and checks are given as two instances; the run's kept ranges are one for both.
_KEPT_BY_RUN: dict[str, dict[str, KeptRange]] = {}
# Run id -> storage path -> the version of that table the run's steps read (`run_version`).
_VERSIONS_BY_RUN: dict[str, dict[str, int]] = {}


@dataclass(frozen=True)
class TableDetail:
    """DESCRIBE DETAIL of a table: its live files as the Delta log counts them."""

    location: str
    num_files: int
    size_in_bytes: int
    partition_columns: tuple[str, ...]
    properties: dict[str, str] = field(default_factory=dict)  # the table's Delta properties


@dataclass(frozen=True)
class PartitionFiles:
    """A partition's live data files in a Delta version: how many, their bytes, their rows."""

    files: int
    bytes: int
    rows: int


@dataclass(frozen=True)
class StoredFile:
    """A data file in the table's storage, live or not (replaced files stay until VACUUM)."""

    path: str  # as the storage lists it: `file:/...`, `s3a://...`
    name: str  # relative to the table: `event_date=2024-01-01/part-....parquet`
    partition: str | None  # its folder's partition value(s), `/`-joined; None at the root
    size: int


def _name(key: AssetKey | str) -> str:
    """`raw/orders` for AssetKey(["raw", "orders"]): the asset key names the storage path.

    The lakehouse API takes either, so operators' `layer/name` strings need no conversion.
    """
    return key if isinstance(key, str) else key.to_user_string()


class LakehouseResource(ConfigurableResource):
    """Delta tables under one root, one table per asset key."""

    root_dir: str = Field(description="Root of the Delta tables (BACKFILL_LAKEHOUSE_DIR).")
    spark: SparkSessionResource
    shadow_suffix: str | None = Field(
        default=None,
        description="Route `shadow_tables` to `<table>__shadow_<suffix>` for reads and writes, "
        "so a shadow backfill runs the same code beside production without touching it.",
    )
    shadow_tables: list[str] = Field(
        default_factory=list, description="Tables (e.g. `marts/fct_daily_revenue`) to shadow."
    )
    # Set from the run's `SHADOW_SUFFIX_TAG` (tables.py): in a shadow run, the asset code
    # reads a correctable table's shadow where that shadow exists (upstream twins' output,
    # LTV's seeded previous snapshot), so the production code runs unchanged beside production.
    _run_shadow_suffix: str | None = PrivateAttr(default=None)
    _run_shadows: dict[str, bool] = PrivateAttr(default_factory=dict)
    # Storage path -> the range the run last wrote there (`replace_range(keep=True)`).
    _kept: dict[str, KeptRange] = PrivateAttr(default_factory=dict)
    # Storage path -> the version this run wrote last there, or first read there.
    _run_versions: dict[str, int] = PrivateAttr(default_factory=dict)

    def setup_for_execution(self, context: InitResourceContext) -> None:
        self._run_shadow_suffix = run_shadow_suffix(context.run.tags if context.run else {})
        self._run_shadows = {}
        self._kept = _KEPT_BY_RUN.setdefault(context.run_id, {}) if context.run_id else {}
        self._run_versions = (
            _VERSIONS_BY_RUN.setdefault(context.run_id, {}) if context.run_id else {}
        )
        if context.run is not None:
            # Every run of the code location sets this resource up, the daemon's included:
            # the one place to give the run's instance pooled, batched event writes.
            record_run_events(context.instance)

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        for kept in _KEPT_BY_RUN.pop(context.run_id, {}).values():
            kept.persisted.unpersist()
        _VERSIONS_BY_RUN.pop(context.run_id, None)

    def run_version(self, key: AssetKey | str) -> int | None:
        """The version of `key` the run's steps read: the one the run wrote last, else the
        one a step of the run read first (pinned then), so every step sees one version.

        The live stream may replace staging's days between two steps of a run; two marts
        built from two versions of staging would not agree, nor would their checks. The pin
        is the process's: the code location runs a run's steps in one process.
        """
        path = self.table_path(key)
        if path not in self._run_versions:
            version = self.current_version(key)
            if version is None:
                return None
            self._run_versions[path] = version
        return self._run_versions[path]

    @property
    def session(self) -> SparkSession:
        return self.spark.get_session()

    def storage_name(self, key: AssetKey | str) -> str:
        """Where `key` is stored: its own path, or its shadow's when it is shadowed (by
        configuration, or in a shadow run where that shadow exists)."""
        name = _name(key)
        if self.shadow_suffix and name in self.shadow_tables:
            return shadow_name(name, self.shadow_suffix)
        if self._run_shadow_suffix and self._run_shadow_exists(name):
            return shadow_name(name, self._run_shadow_suffix)
        return name

    def shadowing(self, suffix: str, keys: Iterable[AssetKey | str]) -> LakehouseResource:
        """This lakehouse with `keys` routed to their `suffix` shadows for reads and writes."""
        return LakehouseResource(
            root_dir=self.root_dir,
            spark=self.spark,
            shadow_suffix=suffix,
            shadow_tables=[_name(k) for k in keys],
        )

    def for_asset(
        self, key: AssetKey, shadow_suffix: str | None, writing: bool, context=None
    ) -> tuple[LakehouseResource, AssetKey]:
        """The lakehouse and table an asset reads or writes: a twin's shadow, or production.

        The one routing rule for every writer (the IO manager and the assets that write
        themselves, such as staging/customers), so a twin can never reach production: a
        twin (`shadow/...` key) needs the run's shadow suffix, and a production asset in a
        run that carries one is refused before it writes. Refusals are final (retrying
        cannot add a tag), so the run ends at once (refusals.py; `context`: an IO manager's).
        """
        production = production_key(key)
        if production is None:
            if shadow_suffix and writing:
                raise refusal(
                    f"{key.to_user_string()}: this run carries {SHADOW_SUFFIX_TAG}="
                    f"{shadow_suffix}, so it writes shadow assets only; production "
                    "is unchanged. Select the shadow/... assets or drop the tag.",
                    context=context,
                )
            return self, key
        if not shadow_suffix:
            raise refusal(
                f"{key.to_user_string()}: a shadow asset needs the run tag "
                f"{SHADOW_SUFFIX_TAG}=<suffix> naming the shadow it writes; nothing was written.",
                context=context,
            )
        return self.shadowing(shadow_suffix, [production]), production

    def run_target(self, key: AssetKey) -> tuple[LakehouseResource, AssetKey]:
        """`for_asset` for an asset that writes itself, with this run's shadow suffix."""
        return self.for_asset(key, self._run_shadow_suffix, writing=True)

    def _run_shadow_exists(self, name: str) -> bool:
        """A correctable table whose shadow of the run's suffix exists (cached once seen)."""
        if name not in TABLE_NAMES or table(name).layer not in CORRECTABLE_LAYERS:
            return False
        if not self._run_shadows.get(name):
            self._run_shadows[name] = self.exists(shadow_name(name, self._run_shadow_suffix))
        return self._run_shadows[name]

    def table_path(self, key: AssetKey | str) -> str:
        """A resolved local path, or `<root>/<name>` for a URI root such as `s3a://bucket/lake`."""
        local = self.local_root()
        if local is None:
            return f"{self.root_dir.rstrip('/')}/{self.storage_name(key)}"
        return str(local / self.storage_name(key))

    def exists(self, key: AssetKey | str) -> bool:
        """A Delta table is stored at exactly `key`'s path (not merely inside one).

        Asked of the storage through Hadoop's FileSystem and of Delta, so a remote root works.
        """
        path = self.table_path(key)
        return self._storage_exists(f"{path}/_delta_log") and DeltaTable.isDeltaTable(
            self.session, path
        )

    def delta_table(self, key: AssetKey | str) -> DeltaTable:
        return DeltaTable.forPath(self.session, self.table_path(key))

    def read(self, key: AssetKey | str, version: int | None = None) -> DataFrame:
        reader = self.session.read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        return reader.load(self.table_path(key))

    def read_range(
        self, key: AssetKey | str, column: str, start: date, end: date, version: int | None = None
    ) -> DataFrame:
        """Rows with start <= column < end (partition pruning does the rest).

        A range inside one this run wrote and kept (`replace_range(keep=True)`) comes from
        memory when the version asked for (None: the current one) is the version that write
        made. A wider range is read from the table alone: the kept rows joined to the rest
        from the table measured no faster in a run (the LTV roll-forward reads the day
        before its range too).
        """
        kept = self._kept.get(self.table_path(key))
        if (
            kept is not None
            and kept.column == column
            and kept.start <= start
            and end <= kept.end
            and kept.version == (self.current_version(key) if version is None else version)
        ):
            return kept.frame.where(_range_predicate(column, start, end))
        return self.read(key, version).where(_range_predicate(column, start, end))

    def read_partitions(
        self,
        key: AssetKey | str,
        start: date,
        end: date,
        version: int | None = None,
        owned_only: bool = False,
    ) -> DataFrame:
        """A registered table's partitions in [start, end), on its registered column;
        `owned_only` keeps the rows the partitioned write path owns (`Table.owned_rows`:
        raw/orders without the stream's rows)."""
        rows = self.read_range(key, table(key).partition_column, start, end, version)
        owned = owned_only and table(key).owned_predicate(rows.columns)
        return rows.where(owned) if owned else rows

    def commit_changes(
        self, key: AssetKey | str, version: int, start: date, end: date
    ) -> DataFrame | None:
        """What commit `version` did to [start, end) on the registered partition column, as
        Delta's change data feed reads it: the rows it removed (`_change_type` 'delete')
        and the rows it wrote ('insert'), from that commit's own files, with no snapshot of
        the version before rebuilt. None when the feed does not hold that commit
        (`delta_log.feed_covers`: no table, a table created before the feed was on, a
        schema change)."""
        path = self.table_path(key)
        if not feed_covers(self.session, path, version):
            return None
        changes = (
            self.session.read.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", version)
            .option("endingVersion", version)
            .load(path)
        )
        return changes.where(_range_predicate(table(key).partition_column, start, end))

    def current_version(self, key: AssetKey | str) -> int | None:
        if not self.exists(key):
            return None
        return latest_version(self.session, self.table_path(key))

    def content_id(self, key: AssetKey | str) -> tuple[str, int] | None:
        """(Delta's table id, newest version): it changes whenever the table's content can,
        so what is derived from a table can be kept under it (None: no table yet)."""
        if not self.exists(key):
            return None
        return identity(self.session, self.table_path(key))

    def newest_commit(self, key: AssetKey | str) -> LoggedCommit | None:
        """The table's newest commit, off the log on the driver (None: no table yet)."""
        if not self.exists(key):
            return None
        return next(newest_commits(self.session, self.table_path(key), 1), None)

    def added_nothing(self, key: AssetKey | str, since: int, until: int) -> bool:
        """Whether every commit of `key` after version `since` up to `until` appended no row
        (`LoggedCommit.changes_no_row`), so the table holds at `until` exactly its rows at
        `since`. One log file read per commit, no Spark job; False when a commit in between
        is gone from the log or is more than fifty back."""
        if until < since:
            return False
        expected = None
        for commit in newest_commits(self.session, self.table_path(key), _NEWEST_COMMITS):
            if expected is not None and commit.version != expected:
                return False  # a version without its commit record: cannot tell
            if commit.version <= since:
                return True
            if commit.version <= until and not commit.changes_no_row:
                return False
            expected = commit.version - 1
        return False

    def recorded_days(self, key: AssetKey | str, days: Iterable[str], code_version: str) -> bool:
        """Whether the newest commits, all stamped with `code_version` and none a whole
        rewrite but the last one read, already record every partition key in `days`: a run
        of those days that changes no row has nothing to add to the log, and a commit of no
        change would only make a new version for every reader to build its state for. Off
        the log on the driver, fifty commits at most; any other commit (a RESTORE, an
        OPTIMIZE, another writer's, another code version) ends the walk."""
        wanted = set(days)
        if not self.exists(key):
            return False
        for commit in newest_commits(self.session, self.table_path(key), _NEWEST_COMMITS):
            meta = commit.user_metadata
            if meta.get("code_version") != code_version or commit.operation not in (
                "WRITE",
                "DELETE",
            ):
                return False
            wanted -= set(commit_partition_keys(meta))
            if not wanted:
                return True
            if meta.get("write_mode") == "overwrite":  # older commits describe rows now gone
                return False
        return False

    @contextmanager
    def table_lock(self, key: AssetKey | str, wait: bool = True) -> Iterator[bool]:
        """Serialize this machine's writers to a table on a local root; yields whether this
        writer holds the table (without `wait`, False at once while another writer does:
        upkeep such as compaction gives way to writers instead of queueing before them).

        Delta's log store on a local filesystem gives mutual exclusion only inside one JVM,
        and each Dagster run is its own JVM: two runs committing version N at once could
        lose one commit. An OS file lock around the commit serializes writers to a table
        across processes (writers to different tables never wait for each other).

        An object-store root takes no lock: writers there may be on other machines, so
        the store itself refuses a second commit of version N (the conditional-write log
        store, `resources/spark.py`) and Delta's optimistic concurrency retries or fails
        the loser; `replace_range` retries a conflicting replace (docs/object-storage.md).
        """
        root = self.local_root()
        if root is None:
            yield True
            return
        lock_dir = root / "_locks"
        lock_dir.mkdir(parents=True, exist_ok=True)
        with open(lock_dir / (self.storage_name(key).replace("/", "__") + ".lock"), "w") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def replace_range(
        self,
        key: AssetKey | str,
        df: DataFrame,
        partition_column: str,
        start: date,
        end: date,
        user_metadata: Mapping[str, Any],
        keep: bool = False,
    ) -> CommitInfo:
        """Replace exactly the rows with start <= partition_column < end by `df`, atomically.

        With `keep`, `df` is persisted by the write itself and kept for the rest of the run
        (`read_range`): the run's later steps and checks read the range from memory. A table
        another writer shares (`Table.owned_rows`) is never kept: its range holds more rows
        than this write's.

        Delta checks every written row against the replaceWhere predicate and aborts the
        commit if one falls outside it, so out-of-range rows leave the table untouched.
        A table shared with a second writer (`Table.owned_rows`: raw/orders' stream rows)
        has only this path's own rows of the range replaced, and refuses any other row.
        New columns are added; a dropped or retyped column is refused before writing.
        """
        name = _name(key)
        path = self.table_path(key)
        token = uuid.uuid4().hex
        metadata = _range_metadata(user_metadata, name, partition_column, start, end, token)
        if self.storage_name(key) != name:
            metadata["shadow_table"] = self.storage_name(key)
        in_range = _range_predicate(column=partition_column, start=start, end=end)
        refused = TableWriteError(
            f"{name}: refused rows outside the run's partition range [{start}, {end}) on "
            f"column {partition_column} (or with a NULL {partition_column}"
            + (", or rows this write path does not own" if name in _OWNED else "")
            + "); the table is unchanged."
        )

        def attempt() -> CommitInfo:
            with self.table_lock(key):
                current = self.read(key).schema if self.exists(key) else None
                columns_before[:] = current.fieldNames() if current else []
                owned = _OWNED.get(name) and table(name).owned_predicate(
                    (df.schema if current is None else current).fieldNames()
                )
                accepted = f"{in_range} AND {owned}" if owned else in_range
                # On the partition column alone, Delta checks only the range: the full rule
                # is then checked inside the write, as on the write that creates the table.
                alone = (
                    bool(owned)
                    and current is not None
                    and self._range_owned_alone(key, in_range, owned)
                )
                predicate = in_range if alone else accepted
                data = (
                    _refuse_rows_outside(df, partition_column, accepted)
                    if current is None or alone
                    else df
                )
                adds_columns = current is not None and self._check_schema(name, current, data)
                # One file per date partition per write keeps the file count bounded over
                # re-runs.
                writer = (
                    data.repartition(F.col(partition_column))
                    .write.format("delta")
                    .mode("overwrite")
                    .option("replaceWhere", predicate)
                    .option("userMetadata", json.dumps(metadata, sort_keys=True, default=str))
                )
                if adds_columns:
                    writer = writer.option("mergeSchema", "true")
                if current is None:
                    writer = writer.partitionBy(partition_column)
                try:
                    writer.save(path)
                except (AnalysisException, SparkRuntimeException) as error:
                    condition = error.getCondition()
                    if condition == "DELTA_REPLACE_WHERE_MISMATCH" or (
                        condition == "USER_RAISED_EXCEPTION" and _OUT_OF_RANGE in str(error)
                    ):
                        raise refused from error
                    raise
                except Py4JJavaError as error:  # the JVM's own failures: I/O, a full disk, ...
                    version = self.current_version(key)
                    raise TableWriteError(
                        f"{name}: the write failed ({_root_cause(error)}); nothing was "
                        "committed, "
                        + (
                            "the table does not exist yet."
                            if version is None
                            else f"the table is unchanged at version {version}."
                        )
                    ) from error
                return self._find_commit(key, token)

        keep = keep and name not in _OWNED
        columns_before: list[str] = []  # the table's columns before the write, in order
        if keep:
            df = df.persist()
        try:
            commit = self._retrying_conflicts(name, f"[{start}, {end})", attempt, metadata)
        except BaseException:
            if keep:
                df.unpersist()
            raise
        self._run_versions[self.table_path(key)] = commit.version
        if keep:
            # The table's columns now: the ones it had (a write never drops or retypes one),
            # then those the write added, in the frame's order.
            columns = columns_before + [c for c in df.columns if c not in columns_before]
            previous = self._kept.pop(self.table_path(key), None)
            if previous is not None:
                previous.persisted.unpersist()
            self._kept[self.table_path(key)] = KeptRange(
                commit.version, partition_column, start, end, df.select(*columns), df
            )
        return commit

    def adopt_range(
        self,
        key: AssetKey | str,
        source: LakehouseResource,
        partition_column: str,
        start: date,
        end: date,
        user_metadata: Mapping[str, Any],
        source_version: int | None = None,
    ) -> CommitInfo:
        """Replace the range's files by `source`'s files of the range, copying no data.

        `source` is this lakehouse routed to a shadow (`shadowing`). Its files are hard-linked
        into this table's directory under their own names, then one Delta commit removes the
        range's old files and adds the links (delta_files.py). Links rather than absolute
        paths into the shadow (what Delta's SHALLOW CLONE writes): production owns every file
        it reads, so dropping or VACUUMing the shadow can never delete one of them, and
        VACUUM of production leaves the shadow whole. Raises ZeroCopyUnavailable, nothing
        committed or linked, where that cannot apply (`zero_copy_blocker`, deletion vectors,
        or a shadow that moved past `source_version`).
        """
        name = _name(key)
        blocker = self.zero_copy_blocker(key, source, partition_column)
        if blocker:
            raise ZeroCopyUnavailable(blocker)
        target = Path(self.table_path(key))
        origin = Path(source.table_path(key))
        in_range = _range_predicate(partition_column, start, end)
        metadata = _range_metadata(
            user_metadata, name, partition_column, start, end, uuid.uuid4().hex
        )
        with self.table_lock(key):
            files = range_files(self.session, str(origin), in_range)
            if source_version is not None and files.version != source_version:
                raise ZeroCopyUnavailable(
                    f"{source.storage_name(key)} is at v{files.version}, not v{source_version}"
                )
            unusable = [
                a["path"]
                for a in files.adds
                if a.get("deletionVector") or is_uri(a["path"]) or a["path"].startswith("/")
            ]
            if unusable:
                raise ZeroCopyUnavailable(
                    f"{len(unusable)} shadow file(s) carry deletion vectors or absolute paths"
                )
            linked: list[Path] = []

            def link_files() -> None:
                for add in files.adds:
                    relative = unquote(add["path"])
                    made = target / relative
                    made.parent.mkdir(parents=True, exist_ok=True)
                    if made.exists():  # a cutover interrupted after linking: the same file
                        if not made.samefile(origin / relative):
                            raise ZeroCopyUnavailable(f"{name}: {relative} exists in production")
                        continue
                    os.link(origin / relative, made)
                    linked.append(made)

            try:
                swap = swap_range(
                    self.session, str(target), in_range, files.adds, metadata, link_files
                )
            except BaseException:
                for made in linked:  # no commit references them
                    made.unlink(missing_ok=True)
                raise
        rows_written = swap.rows_added
        if rows_written is None:
            rows_written = source.read_range(
                key, partition_column, start, end, files.version
            ).count()
        rows_removed = swap.rows_removed
        if rows_removed is None:
            rows_removed = self.read_range(
                key, partition_column, start, end, swap.version - 1
            ).count()
        return CommitInfo(
            version=swap.version,
            rows_written=rows_written,
            files_written=swap.files_added,
            files_removed=swap.files_removed,
            rows_removed=rows_removed,
            user_metadata=metadata,
        )

    def zero_copy_blocker(
        self, key: AssetKey | str, source: LakehouseResource, partition_column: str
    ) -> str | None:
        """Why `adopt_range` cannot move `source`'s files into this table; None when it can."""
        name = _name(key)
        if self.local_root() is None:
            return "the lakehouse is on an object store, which has no hard links"
        if name in _OWNED:
            return f"{name} shares its partitions with a second writer"
        mine, theirs = self.detail(key), source.detail(key)
        if mine is None:
            return f"{name} does not exist yet"
        if theirs is None:
            return f"{source.storage_name(key)} does not exist"
        if mine.partition_columns != (partition_column,) or theirs.partition_columns != (
            partition_column,
        ):
            return f"the tables are not both partitioned by {partition_column} alone"
        if self.read(key).schema != source.read(key).schema:
            return "the shadow's schema differs from production's"
        for lake, detail in ((self, mine), (source, theirs)):
            if detail.properties.get("delta.columnMapping.mode", "none") != "none":
                return f"{lake.storage_name(key)} maps column names (delta.columnMapping)"
        if Path(self.table_path(key)).stat().st_dev != Path(source.table_path(key)).stat().st_dev:
            return "production and the shadow are on different filesystems"
        return None

    def append(
        self,
        key: AssetKey | str,
        df: DataFrame,
        partition_column: str | None,
        user_metadata: Mapping[str, Any],
    ) -> int | None:
        """Add rows in one commit, replacing nothing (raw/crm_customer_history keeps every
        answer: concurrent runs never lose each other's). Returns the new version."""
        return self._write(key, df, "append", partition_column, user_metadata)

    def append_once(
        self,
        key: AssetKey | str,
        df: DataFrame,
        partition_column: str,
        app_id: str,
        app_version: int,
        user_metadata: Mapping[str, Any],
    ) -> CommitInfo | None:
        """Append `df` in one commit unless `app_id` already committed `app_version` or a
        later one (Delta's idempotent writes, `txnAppId`/`txnVersion`): a replayed stream
        batch is skipped, however the writer died. Returns the commit; None when skipped.
        """
        name = _name(key)
        token = uuid.uuid4().hex
        metadata = {**user_metadata, "table": name, "write_mode": "append", "commit_token": token}

        def attempt() -> CommitInfo | None:
            with self.table_lock(key):
                exists = self.exists(key)
                writer = (
                    df.write.format("delta")
                    .mode("append")
                    .option("txnAppId", app_id)
                    .option("txnVersion", str(app_version))
                    .option("userMetadata", json.dumps(metadata, sort_keys=True, default=str))
                )
                if exists and self._check_schema(name, self.read(key).schema, df):
                    writer = writer.option("mergeSchema", "true")
                if not exists:
                    writer = writer.partitionBy(partition_column)
                writer.save(self.table_path(key))
                return self._find_commit(key, token, missing_ok=True)

        return self._retrying_conflicts(name, f"append {app_id}@{app_version}", attempt, metadata)

    def replace_messages(
        self,
        key: AssetKey | str,
        df: DataFrame,
        topic: str,
        partition: int,
        first: int,
        end: int,
        user_metadata: Mapping[str, Any],
    ) -> CommitInfo:
        """Replace exactly the rows of `topic`'s messages `partition`:[first, end) by `df`,
        in one commit (a replay of that part of the log): Delta's replaceWhere on data
        columns, which refuses any written row outside the span, so the landing path's rows
        and every other message are untouched whatever `df` holds."""
        name = _name(key)
        token = uuid.uuid4().hex
        metadata = {**user_metadata, "table": name, "write_mode": "replace", "commit_token": token}
        quoted = topic.replace("'", "''")
        predicate = (
            f"kafka_topic = '{quoted}' AND kafka_partition = {int(partition)} "
            f"AND kafka_offset >= {int(first)} AND kafka_offset < {int(end)}"
        )

        def attempt() -> CommitInfo:
            with self.table_lock(key):
                writer = (
                    df.write.format("delta")
                    .mode("overwrite")
                    .option("replaceWhere", predicate)
                    .option("userMetadata", json.dumps(metadata, sort_keys=True, default=str))
                )
                if self._check_schema(name, self.read(key).schema, df):
                    writer = writer.option("mergeSchema", "true")
                writer.save(self.table_path(key))
                return self._find_commit(key, token)

        return self._retrying_conflicts(
            name, f"replay p{partition} [{first}, {end})", attempt, metadata
        )

    def record_unchanged(self, key: AssetKey | str, user_metadata: Mapping[str, Any]) -> int:
        """Commit `user_metadata` and no change to the rows: a run that found nothing to
        rewrite still records the days it covered (`covers`, `built_partitions`). Delta
        commits a DELETE of no row (`skipRecordingEmptyCommits` is off); an append of no
        rows would add an empty file to an unpartitioned table on each such run. Returns the
        new version."""
        name = _name(key)
        token = uuid.uuid4().hex
        metadata = {**user_metadata, "table": name, "write_mode": "none", "commit_token": token}

        def attempt() -> int:
            text = json.dumps(metadata, sort_keys=True, default=str)
            with self.table_lock(key), self.spark.temporary_conf({USER_METADATA_CONF: text}):
                self.delta_table(key).delete(F.lit(False))
                return self._find_commit(key, token).version

        return self._retrying_conflicts(name, "record", attempt, metadata)

    def overwrite(
        self, key: AssetKey | str, df: DataFrame, user_metadata: Mapping[str, Any]
    ) -> int | None:
        """Replace a whole unpartitioned table in one commit (staging/customers, rebuilt
        from every kept CRM answer). Returns the new version."""
        return self._write(key, df, "overwrite", None, user_metadata)

    def _write(self, key, df, mode, partition_column, user_metadata) -> int | None:
        name = _name(key)
        metadata = {**user_metadata, "table": name, "write_mode": mode}
        return self._retrying_conflicts(
            name,
            mode,
            lambda: self._write_once(key, df, mode, partition_column, metadata),
            metadata,
        )

    def _write_once(self, key, df, mode, partition_column, metadata) -> int | None:
        name = _name(key)
        with self.table_lock(key):
            exists = self.exists(key)
            writer = (
                df.write.format("delta")
                .mode(mode)
                .option("userMetadata", json.dumps(metadata, sort_keys=True, default=str))
            )
            if exists and self._check_schema(name, self.read(key).schema, df):
                writer = writer.option("mergeSchema", "true")
            if not exists and partition_column:
                writer = writer.partitionBy(partition_column)
            writer.save(self.table_path(key))
            return self.current_version(key)

    def _range_owned_alone(self, key: AssetKey | str, in_range: str, owned: str) -> bool:
        """Whether the write path may replace the range of an existing table on its
        partition column alone: the table holds no other writer's rows there, and no other
        writer can commit before this one (the table lock, held by the caller, on a local
        root).

        Why it pays: a replaceWhere on a data column (`kafka_topic IS NULL`) makes Delta
        read every file of the range to find the rows to drop and rewrite the rest, so a
        re-ingest of raw read its whole range twice; on the partition column alone Delta
        drops the range's files from the log without reading them. The check reads no data
        file where the stream never wrote: Delta skips each file by its null count.
        An object-store root has no lock: a stream batch committed between this check and
        the replace would be dropped with the range, so there the data predicate stays.
        """
        if self.local_root() is None:
            return False
        return self.read(key).where(f"{in_range} AND NOT ({owned})").isEmpty()

    def _retrying_conflicts(
        self, name: str, what: str, write: Callable[[], _T], metadata: dict[str, Any]
    ) -> _T:
        """Run `write` again when a concurrent writer committed first and Delta found the two
        in conflict (overlapping partitions on an object-store root, where no lock orders
        writers). A replace is idempotent, so the retry leaves the table as if it ran last;
        after `CONFLICT_ATTEMPTS` the write fails, naming the table, having committed nothing.

        The commit that wins records the conflicts it lost first (`conflicts_retried` in its
        commit metadata, which `write` serializes on each attempt), so the table's history
        counts every conflict seen and retried, whichever process saw it.
        """
        for attempt in range(1, CONFLICT_ATTEMPTS + 1):
            if attempt > 1:
                metadata[CONFLICTS_RETRIED] = attempt - 1
            try:
                return write()
            except CONCURRENT_WRITE_CONFLICTS as error:
                if attempt == CONFLICT_ATTEMPTS:
                    reason = str(error).splitlines()[0][:300]
                    raise TableWriteError(
                        f"{name}: {what} conflicted with concurrent writers {attempt} times "
                        f"({reason}); this write committed nothing, the table holds theirs."
                    ) from error
                LOG.warning(
                    "%s: %s conflicted with a concurrent writer, retrying (%d of %d): %s",
                    name,
                    what,
                    attempt,
                    CONFLICT_ATTEMPTS,
                    type(error).__name__,
                )
                time.sleep(random.uniform(0.5, 2.0) * attempt)
        raise AssertionError("unreachable")

    # -- table state, read through Delta and the storage's FileSystem (no local paths) ------
    def detail(self, key: AssetKey | str) -> TableDetail | None:
        """DESCRIBE DETAIL: the live files' count and bytes and the partition columns."""
        if not self.exists(key):
            return None
        row = self.delta_table(key).detail().first()
        return TableDetail(
            location=row["location"],
            num_files=int(row["numFiles"]),
            size_in_bytes=int(row["sizeInBytes"]),
            partition_columns=tuple(row["partitionColumns"]),
            properties=dict(row["properties"] or {}),
        )

    def partition_files(
        self,
        key: AssetKey | str,
        partitions: Iterable[str] | None = None,
        version: int | None = None,
    ) -> dict[str, PartitionFiles]:
        """Partition value (`2024-01-01`) -> live data files, bytes and rows of `version`.

        One Spark job over the files Delta's snapshot lists (pruned to `partitions`), with
        each file's size as the Delta log recorded it (`_metadata.file_size`); only file
        footers are read. Partitions without rows are absent.
        """
        detail = self.detail(key)
        if detail is None:
            return {}
        columns = detail.partition_columns
        value = (
            F.concat_ws("/", *(F.col(c).cast("string") for c in columns)) if columns else F.lit("")
        )
        df = self.read(key, version)
        if partitions is not None:
            if len(columns) != 1:
                raise ValueError(f"{_name(key)}: partition filter needs one partition column")
            df = df.where(F.col(columns[0]).cast("string").isin(sorted(set(partitions))))
        per_file = df.groupBy(
            value.alias("partition"),
            F.col("_metadata.file_path").alias("path"),
            F.col("_metadata.file_size").alias("size"),
        ).agg(F.count(F.lit(1)).alias("rows"))
        return {
            r["partition"]: PartitionFiles(int(r["files"]), int(r["bytes"]), int(r["rows"]))
            for r in per_file.groupBy("partition")
            .agg(
                F.count("path").alias("files"),
                F.sum("size").alias("bytes"),
                F.sum("rows").alias("rows"),
            )
            .collect()
        }

    def stored_files(self, key: AssetKey | str) -> list[StoredFile]:
        """Every Parquet data file under the table's path, live or replaced, sorted by name.

        What the storage holds, not what a version reads: VACUUM shrinks this, a killed
        write can leave a file here that no commit added. Listed by Spark's binaryFile
        source (the storage's FileSystem, file contents unread), the log excluded.
        """
        if not self.exists(key):
            return []
        path = self.table_path(key)
        listed = (
            self.session.read.format("binaryFile")
            .option("recursiveFileLookup", "true")
            .option("pathGlobFilter", "*.parquet")
            .load(path)
            .select("path", "length")
            .collect()
        )
        base = _storage_key(path).rstrip("/") + "/"
        found = []
        for row in listed:
            name = _storage_key(row["path"]).removeprefix(base)
            if name.split("/")[0] == "_delta_log":
                continue
            folder = name.rpartition("/")[0]
            values = [part.partition("=")[2] for part in folder.split("/") if "=" in part]
            partition = "/".join(values) if values else None
            found.append(StoredFile(row["path"], name, partition, int(row["length"])))
        return sorted(found, key=lambda f: f.name)

    def missing_files(self, key: AssetKey | str, version: int) -> list[str]:
        """Data files `version` reads that the storage no longer holds (vacuumed): time
        travel to that version, or a RESTORE of it, would fail."""
        stored = {_storage_key(f.path) for f in self.stored_files(key)}
        return sorted(
            f for f in self.read(key, version).inputFiles() if _storage_key(f) not in stored
        )

    def shadows(self, suffix: str) -> list[str]:
        """The shadow tables of `suffix` that exist, one per registered table at most."""
        return [
            shadow_name(t.name, suffix) for t in TABLES if self.exists(shadow_name(t.name, suffix))
        ]

    def local_root(self) -> Path | None:
        """The root as a resolved local directory; None for a remote URI (`s3a://...`)."""
        parsed = urlparse(self.root_dir)
        if not is_uri(self.root_dir):
            return Path(self.root_dir).resolve()
        return Path(unquote(parsed.path)).resolve() if parsed.scheme == "file" else None

    def _storage(self, path: str):
        """Hadoop's FileSystem for `path` and the path itself: the storage layer Spark and
        Delta use, whatever the scheme (local, s3a, ...)."""
        return hadoop_fs(self.session, path)

    def _storage_exists(self, path: str) -> bool:
        filesystem, hadoop_path = self._storage(path)
        return bool(filesystem.exists(hadoop_path))

    def _check_schema(self, name: str, schema: StructType, df: DataFrame) -> bool:
        """Refuse dropped or retyped columns of the table's `schema`; report whether the
        write adds columns."""
        current = {f.name: f.dataType for f in schema.fields}
        incoming = {f.name: f.dataType for f in df.schema.fields}
        dropped = sorted(set(current) - set(incoming))
        if dropped:
            raise TableWriteError(
                f"{name}: the output drops column(s) {dropped}; columns are never removed "
                "without a new contract version. The table is unchanged."
            )
        retyped = {
            c: (current[c].simpleString(), incoming[c].simpleString())
            for c in current
            if current[c] != incoming[c]
        }
        if retyped:
            detail = ", ".join(f"{c}: {old} -> {new}" for c, (old, new) in sorted(retyped.items()))
            raise TableWriteError(
                f"{name}: the output retypes column(s) {detail}; the table is unchanged."
            )
        return bool(set(incoming) - set(current))

    def _find_commit(self, key: AssetKey | str, token: str, missing_ok: bool = False):
        """Our commit is the one carrying our token (None if absent and `missing_ok`: an
        idempotent append Delta skipped).

        Called under the table lock, so it is the newest commit unless a writer ignored the
        lock: read newest first, at most fifty commits back (delta_log.py: one file each,
        no Spark job).
        """
        for commit in newest_commits(self.session, self.table_path(key), _NEWEST_COMMITS):
            if commit.user_metadata.get("commit_token") == token:
                metrics = commit.metrics
                # A replace on a data predicate (the landing path's `owned_rows`) rewrites
                # the other writer's rows it finds in the same files (a compacted day
                # holds both): Delta counts those among the output as `numCopiedRows`.
                copied = int(metrics.get("numCopiedRows", 0))
                return CommitInfo(
                    version=commit.version,
                    rows_written=int(metrics.get("numOutputRows", 0)) - copied,
                    files_written=int(metrics.get("numFiles", 0)),
                    files_removed=int(metrics.get("numRemovedFiles", 0)),
                    rows_removed=int(metrics.get("numDeletedRows", 0)),
                    user_metadata=commit.user_metadata,
                    bytes_written=int(metrics.get("numOutputBytes", 0)),
                )
        if missing_ok:
            return None
        raise CommitLost(
            f"{_name(key)}: Delta reported the write as committed, but commit {token} is not "
            "in the table's history: another writer replaced that version. The log store "
            "does not exclude concurrent writers (docs/object-storage.md)."
        )

    def covers(self, key: AssetKey | str, day: date) -> bool:
        """Whether one of our commits wrote `day`'s partition.

        An empty partition is still a built one, so row counts cannot answer this; the
        partition range stamped on each commit can.
        """
        return day in self.covered_days(key, [day])

    def covered_days(self, key: AssetKey | str, days: Iterable[date]) -> set[date]:
        """The `days` some commit of ours wrote (see `covers`).

        The newest commits are read first off the log on the driver (delta_log.py, no Spark
        job): the day a run asks about (LTV's day before its range) was mostly written by one
        of the last runs. Past the newest 50, the whole history answers for what is left.
        """
        wanted = {d.isoformat(): d for d in days}
        if not wanted or not self.exists(key):
            return set()
        found: set[date] = set()

        def take(meta: dict) -> None:
            start, end = meta.get("partition_start", "9999"), meta.get("partition_end")
            if end:
                for text in [t for t in wanted if start <= t < end]:
                    found.add(wanted.pop(text))

        read_down_to = None
        for commit in newest_commits(self.session, self.table_path(key), _NEWEST_COMMITS):
            take(commit.user_metadata)
            read_down_to = commit.version
            if not wanted:
                return found
        if read_down_to == 0:  # every commit read: no older one for the history to add
            return found
        for entry in self.history(key):
            if read_down_to is None or entry["version"] < read_down_to:
                take(entry["metadata"])
        return found

    def built_partitions(self, key: AssetKey | str) -> dict[str, dict]:
        """Partition key -> metadata of the newest commit that wrote it (from the Delta log).

        Commits undone by a Delta RESTORE (versions between the restored-to version and the
        RESTORE) no longer describe the table and are skipped.
        """
        written: dict[str, dict] = {}
        undone: list[tuple[int, int]] = []
        for commit in self.history(key):  # newest first
            version = commit["version"]
            if any(low < version < high for low, high in undone):
                continue
            if commit["operation"] == "RESTORE":
                undone.append((int(commit["parameters"].get("version", version)), version))
            meta = commit["metadata"]
            for partition in commit_partition_keys(meta):
                written.setdefault(partition, {**meta, "version": version})
        return written

    def history(self, key: AssetKey | str, limit: int | None = None) -> list[dict[str, Any]]:
        """Delta history with our commit metadata decoded, newest first."""
        if not self.exists(key):
            return []
        table = self.delta_table(key)
        rows = (table.history(limit) if limit else table.history()).collect()
        return [
            {
                "version": r["version"],
                "read_version": r["readVersion"],
                "timestamp": r["timestamp"],
                "operation": r["operation"],
                "metrics": dict(r["operationMetrics"] or {}),
                "parameters": dict(r["operationParameters"] or {}),
                "metadata": json.loads(r["userMetadata"]) if r["userMetadata"] else {},
            }
            for r in rows
        ]


LOG = logging.getLogger(__name__)
# How far back a lookup reads the log one commit file at a time before a whole history
# (one Spark job reading commits in parallel) is cheaper.
_NEWEST_COMMITS = 50
_OUT_OF_RANGE = "row outside the partition range"
# Attempts of a write that conflicts with concurrent writers (object-store roots).
CONFLICT_ATTEMPTS = 5
# The commit metadata key for the conflicts a commit lost before it won.
CONFLICTS_RETRIED = "conflicts_retried"
# Delta's Python exceptions for a lost optimistic-concurrency race: siblings, not subclasses
# of DeltaConcurrentModificationException (delta.exceptions.base).
CONCURRENT_WRITE_CONFLICTS = (
    DeltaConcurrentModificationException,
    ConcurrentWriteException,
    MetadataChangedException,
    ProtocolChangedException,
    ConcurrentAppendException,
    ConcurrentDeleteReadException,
    ConcurrentDeleteDeleteException,
    ConcurrentTransactionException,
)
_T = TypeVar("_T")
# Tables whose partitioned write path shares partitions with another writer (tables.py).
_OWNED = {t.name: t for t in TABLES if t.owned_rows}


def _refuse_rows_outside(df: DataFrame, column: str, predicate: str) -> DataFrame:
    """Fail the write itself on a row outside the range (or with a NULL date).

    Delta checks rows against replaceWhere only when the table exists, so the write that
    creates it would scatter stray rows into other partitions. Checking inside the same
    Spark job, rather than with a separate scan first, keeps a first write to one pass over
    its input; a failed job commits nothing.
    """
    inside = F.coalesce(F.expr(predicate), F.lit(False))
    return df.withColumn(
        column,
        F.when(inside, F.col(column)).otherwise(
            F.raise_error(F.lit(f"{_OUT_OF_RANGE}: {predicate}"))
        ),
    )


def _root_cause(error: Py4JJavaError) -> str:
    """The innermost `Caused by:` of a JVM error (`java.io.IOException: No space left on
    device`), not the 15,000 characters of stack trace around it."""
    causes = [
        line.strip().removeprefix("Caused by: ")
        for line in str(error).splitlines()
        if line.strip().startswith("Caused by: ")
    ]
    return causes[-1] if causes else str(error.java_exception)


def _range_metadata(
    user_metadata: Mapping[str, Any],
    name: str,
    partition_column: str,
    start: date,
    end: date,
    token: str,
) -> dict[str, Any]:
    """What every commit replacing a range records: the caller's metadata, the table, the
    range (`covers`, `built_partitions` read it back) and the token that finds the commit."""
    return {
        **user_metadata,
        "table": name,
        "partition_column": partition_column,
        "partition_start": start.isoformat(),
        "partition_end": end.isoformat(),
        "commit_token": token,
    }


def _range_predicate(column: str, start: date, end: date) -> str:
    return f"`{column}` >= DATE'{start.isoformat()}' AND `{column}` < DATE'{end.isoformat()}'"


def _storage_key(uri: str) -> str:
    """One spelling per stored file: `file:/a`, `file:///a` and `/a` all give `/a`, a
    remote URI keeps its bucket (`s3a://b/k` gives `b/k`), percent-escapes are decoded."""
    parsed = urlparse(uri)
    return f"{parsed.netloc}{unquote(parsed.path)}" if parsed.netloc else unquote(parsed.path)
