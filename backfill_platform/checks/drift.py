"""Drift against the previous Delta version: a backfill's blast radius, per partition (WARN).

A run's commit is found in the Delta history by the run id the IO manager stamps on it; the
version before it is the table as the run found it. For the run's partitions that already
held rows there, row count, measure sums, distinct keys and per-column NULL rates of both
versions are compared, in one aggregation; none when the run's replace removed no file, so
there were no earlier rows. The run's own commit replaced exactly its partitions, so Delta's
change data feed of that commit holds both sides (the rows it removed and the rows it
wrote) without rebuilding the older version's snapshot, as time travel must: 3 Spark jobs a
table instead of 8 to 11 (docs/performance.md). Time travel stays for a check run on its
own (the newest commit over the run's days may cover other days) and where the feed does
not hold the commit.
"""

from dagster import (
    AssetCheckExecutionContext,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetKey,
    asset_check,
)
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from backfill_platform.checks.results import (
    CheckEvents,
    CheckOutcome,
    PartitionResult,
    record,
    run_partitions,
    written_by_run,
)
from backfill_platform.partitions import daily_partitions
from backfill_platform.ranges import DayRange
from backfill_platform.resources import LakehouseResource
from backfill_platform.settings import DRIFT_THRESHOLD, setting
from backfill_platform.tables import TABLES, Table
from backfill_platform.transforms.orders import SOURCE_COORDINATES

CHECK_NAME = "drift_vs_previous_version"


def run_commit(history: list[dict], run_id: str) -> dict | None:
    """The commit run `run_id` made, in a table's `history` (newest first)."""
    return next((c for c in history if c["metadata"].get("dagster_run_id") == run_id), None)


def commit_of_run(lakehouse: LakehouseResource, key: AssetKey, run: DayRange) -> dict | None:
    """For a check run on its own: the newest commit that wrote any of the run's partitions."""
    for commit in lakehouse.history(key, limit=100):
        meta = commit["metadata"]
        start, end = meta.get("partition_start"), meta.get("partition_end")
        if start and end and start < run.end.isoformat() and end > run.start.isoformat():
            return commit
    return None


def _profile(df: DataFrame, by: list[str], key: str, measures: list[str]) -> list[dict]:
    skipped = {*by, *SOURCE_COORDINATES}
    columns = [c for c in df.columns if not c.startswith("_") and c not in skipped]
    return [
        r.asDict()
        for r in df.groupBy(*by)
        .agg(
            F.count(F.lit(1)).alias("rows"),
            F.count_distinct(key).alias("distinct_keys"),
            *(F.sum(m).cast("double").alias(f"sum:{m}") for m in measures),
            *(F.count(F.when(F.col(c).isNull(), True)).alias(f"null:{c}") for c in columns),
        )
        .collect()
    ]


def profiles(
    old: DataFrame, new: DataFrame, column: str, key: str, measures: list[str]
) -> tuple[dict[str, dict], dict[str, dict]]:
    """Per-partition profiles of two versions of the same partitions. With the same columns,
    one Spark job over both (a version tag to group by) instead of one job each: a tiny
    day's cost is the number of jobs, not their rows."""
    if old.columns != new.columns:
        by_day = [column]
        return (
            {r[column].isoformat(): r for r in _profile(old, by_day, key, measures)},
            {r[column].isoformat(): r for r in _profile(new, by_day, key, measures)},
        )
    both = old.withColumn(_TAG, F.lit(0)).unionByName(new.withColumn(_TAG, F.lit(1)))
    return _tagged_profiles(both, column, key, measures)


def change_profiles(
    changes: DataFrame, column: str, key: str, measures: list[str]
) -> tuple[dict[str, dict], dict[str, dict]]:
    """`profiles` of one commit's change feed: its removed rows are the old version's
    partitions, its written rows the new one's."""
    kinds = changes.where(F.col("_change_type").isin("delete", "insert"))
    both = kinds.withColumn(_TAG, F.when(F.col("_change_type") == "delete", 0).otherwise(1))
    return _tagged_profiles(both, column, key, measures)


_TAG = "_profiled_version"  # 0: the old version's rows, 1: the new one's


def _tagged_profiles(
    both: DataFrame, column: str, key: str, measures: list[str]
) -> tuple[dict[str, dict], dict[str, dict]]:
    """Both versions' per-partition profiles in one Spark job, split by `_TAG`."""
    found: tuple[dict[str, dict], dict[str, dict]] = ({}, {})
    for row in _profile(both, [column, _TAG], key, measures):
        found[row.pop(_TAG)][row[column].isoformat()] = row
    return found


def commit_profiles(
    lakehouse: LakehouseResource,
    registered: Table,
    run: DayRange,
    version: int,
    own_commit: bool,
) -> tuple[dict[str, dict], dict[str, dict]]:
    """The run's partitions before and after commit `version`: from that commit's change
    feed when it is the run's own replace of whole partitions, else by time travel."""
    key, column = registered.key, registered.partition_column
    key_column, measures = registered.key_columns[0], list(registered.measures)
    whole_partitions = own_commit and registered.owned_rows is None
    changes = (
        lakehouse.commit_changes(key, version, run.start, run.end) if whole_partitions else None
    )
    if changes is not None:
        try:
            return change_profiles(changes, column, key_column, measures)
        except AnalysisException as error:  # the feed was switched on after this commit
            if error.getCondition() != "DELTA_MISSING_CHANGE_DATA":
                raise
    return profiles(
        lakehouse.read_partitions(key, run.start, run.end, version - 1),
        lakehouse.read_partitions(key, run.start, run.end, version),
        column,
        key_column,
        measures,
    )


def _relative(new: float, old: float) -> float:
    if old == new:
        return 0.0
    return abs(new - old) / abs(old) if old else float("inf")


def compare(old: dict, new: dict | None) -> dict[str, float]:
    """Change per metric: relative for counts and sums, absolute for NULL rates."""
    new = new or {"rows": 0, "distinct_keys": 0}
    changes = {
        name: _relative(float(new.get(name) or 0), float(old.get(name) or 0))
        for name in old
        if name == "rows" or name == "distinct_keys" or name.startswith("sum:")
    }
    for name in old:
        if name.startswith("null:"):
            old_rate = (old[name] or 0) / old["rows"] if old["rows"] else 0.0
            new_rate = (new.get(name) or 0) / new["rows"] if new["rows"] else 0.0
            changes[name.replace("null:", "null_rate:")] = abs(new_rate - old_rate)
    return changes


def drift_check(registered: Table) -> AssetChecksDefinition:
    """The drift check of a registered table: its partition column, first key column and
    measures come from the registry."""
    key, key_column, measures = registered.key, registered.key_columns[0], registered.measures

    @asset_check(
        asset=key,
        name=CHECK_NAME,
        partitions_def=daily_partitions,
        description=f"{registered.name} vs its previous Delta version for the partitions a run "
        f"rewrote: rows, sums of {', '.join(measures)}, distinct {key_column}, NULL rate per "
        "column (WARN above BACKFILL_DRIFT_THRESHOLD).",
    )
    def _drift(context: AssetCheckExecutionContext, lakehouse: LakehouseResource) -> CheckEvents:
        run = run_partitions(context)
        threshold = float(setting(DRIFT_THRESHOLD))
        written = written_by_run(context, key, run.partition_keys()[0])
        if written is not None:
            version, nothing_replaced = written["delta_version"], written["files_removed"] == 0
        else:  # run on its own: the newest commit that wrote the run's days
            commit = commit_of_run(lakehouse, key, run)
            version, nothing_replaced = (commit["version"] if commit else None), False
        old_profile: dict[str, dict] = {}
        new_profile: dict[str, dict] = {}
        # The run's own replace that removed no file rewrote no earlier rows: nothing to read.
        if version and not nothing_replaced:
            old_profile, new_profile = commit_profiles(
                lakehouse, registered, run, version, own_commit=written is not None
            )
        results, worst_change = [], 0.0
        for partition in run.partition_keys():
            old = old_profile.get(partition)
            if not old:
                results.append(PartitionResult(partition, "-", "-", True, "no earlier rows"))
                continue
            new = new_profile.get(partition)
            changes = compare(old, new)
            over = {m: c for m, c in changes.items() if c > threshold}
            worst = max(changes, key=changes.get)
            worst_change = max(worst_change, min(changes[worst], 1e9))
            rows_new = new["rows"] if new else 0
            detail = ", ".join(
                f"{m} {'+inf' if c == float('inf') else f'{c:.1%}'}" for m, c in over.items()
            )
            results.append(
                PartitionResult(
                    partition,
                    f"{old['rows']} rows (v{version - 1})",
                    f"{rows_new} rows (v{version})",
                    not over,
                    detail or f"largest change {worst} {changes[worst]:.1%}",
                )
            )
        outcome = CheckOutcome(
            CHECK_NAME,
            key,
            results,
            severity=AssetCheckSeverity.WARN,
            what=f"{registered.name} change vs previous version (threshold {threshold:.0%})",
            extra_metadata={
                "delta_version": version if version is not None else -1,
                "rewritten_partitions": sum(1 for p in run.partition_keys() if p in old_profile),
                "largest_change": float(worst_change),
            },
        )
        yield from record(context, outcome)

    return _drift


drift_checks = [drift_check(t) for t in TABLES if t.measures]
