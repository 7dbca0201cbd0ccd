"""What every check shares: the run's partitions and a per-partition result table.

Dagster records a check on a partitioned asset once per run, so a ranged run covering 31
days gets one evaluation. Every check here therefore evaluates each partition the run
covered itself (one Spark aggregation over the run's range) and returns the verdict per
partition as a table in the evaluation's metadata, with the covered and failing partition
keys as JSON lists the automation reads (`failed_partitions_by_check`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckKey,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetKey,
    AssetObservation,
    DagsterInstance,
    Failure,
    MetadataValue,
    TableColumn,
    TableRecord,
    TableSchema,
)

from backfill_platform.ranges import DayRange

PARTITIONS = "partitions"
FAILED_PARTITIONS = "failed_partitions"
MAX_LISTED = 5  # failing partitions spelled out in the verdict text


def run_partitions(context: AssetCheckExecutionContext) -> DayRange:
    """The check's partitions: one key in a single-partition run, the range in a ranged run."""
    op_context = context.op_execution_context
    if not op_context.has_partition_key and not op_context.has_partition_key_range:
        raise Failure(
            "This check verifies the partitions a run wrote; launch it with a partition or a "
            "partition range (it runs with every materialization of its asset)."
        )
    window = op_context.partition_time_window
    return DayRange.of_dates(window.start.date(), window.end.date())


@dataclass
class PartitionResult:
    """One partition's verdict; `expected`/`actual` are short human-readable values."""

    partition: str
    expected: Any
    actual: Any
    passed: bool
    detail: str = ""


@dataclass
class CheckOutcome:
    """All partitions of one check, turned into an AssetCheckResult in one place."""

    check_name: str
    asset_key: AssetKey
    results: list[PartitionResult]
    severity: AssetCheckSeverity = AssetCheckSeverity.ERROR
    what: str = ""  # one line: what was compared
    extra_metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> list[PartitionResult]:
        return [r for r in self.results if not r.passed]

    def verdict(self) -> str:
        failed = self.failed
        checked = len(self.results)
        if not failed:
            return f"{self.what}: all {checked} partition(s) pass."
        listed = "; ".join(
            f"{r.partition}: expected {r.expected}, got {r.actual}"
            + (f" ({r.detail})" if r.detail else "")
            for r in failed[:MAX_LISTED]
        )
        more = f"; and {len(failed) - MAX_LISTED} more" if len(failed) > MAX_LISTED else ""
        return f"{self.what}: {len(failed)} of {checked} partition(s) FAIL: {listed}{more}."

    def to_result(self) -> AssetCheckResult:
        return AssetCheckResult(
            asset_key=self.asset_key,
            check_name=self.check_name,
            passed=not self.failed,
            severity=self.severity,
            description=self.verdict(),
            metadata={
                "verdict": self.verdict(),
                "partitions_checked": len(self.results),
                "partitions_failed": len(self.failed),
                PARTITIONS: MetadataValue.json([r.partition for r in self.results]),
                FAILED_PARTITIONS: MetadataValue.json([r.partition for r in self.failed]),
                "results": result_table(self.results),
                **self.extra_metadata,
            },
        )


_SCHEMA = TableSchema(
    columns=[
        TableColumn("partition", "string"),
        TableColumn("expected", "string"),
        TableColumn("actual", "string"),
        TableColumn("passed", "bool"),
        TableColumn("detail", "string"),
    ]
)


def result_table(results: Sequence[PartitionResult]) -> MetadataValue:
    return MetadataValue.table(
        records=[
            TableRecord(
                {
                    "partition": r.partition,
                    "expected": str(r.expected),
                    "actual": str(r.actual),
                    "passed": r.passed,
                    "detail": r.detail,
                }
            )
            for r in results
        ],
        schema=_SCHEMA,
    )


def log_partition_metrics(
    context: AssetCheckExecutionContext,
    asset_key: AssetKey,
    metrics: Mapping[str, Mapping[str, float | int]],
) -> None:
    """Numeric metadata per partition, as one AssetObservation per partition.

    A ranged run's materializations all share the output's metadata (Dagster issue #18123:
    no per-partition output metadata), so per-partition numbers for the asset page's plots
    travel as partitioned observations; the checks already hold the per-partition counts.
    """
    for partition, values in sorted(metrics.items()):
        context.op_execution_context.log_event(
            AssetObservation(asset_key=asset_key, partition=partition, metadata=dict(values))
        )


def failed_partitions_by_check(
    instance: DagsterInstance, check_keys: Iterable[AssetCheckKey], history: int = 200
) -> dict[str, list[str]]:
    """Partition -> names of the given checks whose LATEST evaluation of it failed.

    Each evaluation lists the partitions it covered, so walking a check's evaluations newest
    first gives every partition's latest verdict, whichever run (single or ranged) made it.
    """
    failing: dict[str, list[str]] = {}
    for key in check_keys:
        seen: set[str] = set()
        for record in instance.event_log_storage.get_asset_check_execution_history(
            key, limit=history
        ):
            evaluation = record.event.asset_check_evaluation if record.event else None
            if evaluation is None:
                continue
            covered = _json_list(evaluation.metadata.get(PARTITIONS))
            failed = set(_json_list(evaluation.metadata.get(FAILED_PARTITIONS)))
            for partition in covered:
                if partition in seen:
                    continue
                seen.add(partition)
                if partition in failed and evaluation.severity == AssetCheckSeverity.ERROR:
                    failing.setdefault(partition, []).append(key.name)
    return failing


def _json_list(value) -> list[str]:
    return list(value.value) if value is not None else []
