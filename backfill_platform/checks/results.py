"""What every check shares: the run's partitions and one evaluation per partition.

Every check computes its verdict per partition itself (one Spark aggregation over the run's
range, never one job per day). `record` then logs ONE `AssetCheckEvaluation` per partition
(`partition=<day>`, that day's numbers as metadata), in a single-day run and in a ranged
run alike: Dagster 1.13 turns an `AssetCheckResult` of a ranged run into a single
`partition=None` evaluation and leaves the per-partition rows PLANNED, so the asset's
Checks tab could not say which day failed. A blocking check that failed on some days fails
its step naming those days (Dagster cannot skip part of a ranged step; see docs/checks.md).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from dagster import (
    AssetCheckEvaluation,
    AssetCheckExecutionContext,
    AssetCheckKey,
    AssetCheckSeverity,
    AssetKey,
    AssetObservation,
    AssetRecordsFilter,
    DagsterInstance,
    Failure,
    Output,
    deserialize_value,
)

from backfill_platform.ranges import DayRange
from backfill_platform.refusals import refusal
from backfill_platform.settings import CHECK_QUERIES_AT_ONCE, bool_setting

# Metadata of evaluations recorded before per-partition evaluations: the partitions one
# evaluation covered and those that failed. Still read, so older history keeps counting.
PARTITIONS = "partitions"
FAILED_PARTITIONS = "failed_partitions"
MAX_LISTED = 5  # failing partitions spelled out in a blocking failure

# What a check op yields: its evaluations, one per partition, and its output.
CheckEvents = Iterator[AssetCheckEvaluation | Output]


def at_once(*queries: Callable[[], Any]) -> list[Any]:
    """Each query's result, in order, the queries run at the same time from one thread each.

    A check's queries are small next to a write: most of each one's time is the driver
    reading a Delta snapshot, planning and waiting between stages, while the executors'
    cores idle, so independent queries of one check overlap on one JVM instead of queueing
    (docs/performance.md). The first query to fail raises its error here.
    """
    if len(queries) <= 1 or not bool_setting(CHECK_QUERIES_AT_ONCE):
        return [query() for query in queries]
    with ThreadPoolExecutor(max_workers=len(queries), thread_name_prefix="check-query") as pool:
        futures = [pool.submit(query) for query in queries]
        return [future.result() for future in futures]


def run_partitions(context: AssetCheckExecutionContext) -> DayRange:
    """The check's partitions: one key in a single-partition run, the range in a ranged run."""
    op_context = context.op_execution_context
    if not op_context.has_partition_key and not op_context.has_partition_key_range:
        raise refusal(
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
    """All partitions of one check, turned into per-partition evaluations in one place."""

    check_name: str
    asset_key: AssetKey
    results: list[PartitionResult]
    severity: AssetCheckSeverity = AssetCheckSeverity.ERROR
    what: str = ""  # one line: what was compared
    extra_metadata: dict[str, Any] = field(default_factory=dict)
    # Per-partition numbers added to that partition's evaluation.
    metrics: Mapping[str, Mapping[str, float | int]] = field(default_factory=dict)

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

    def describe(self, result: PartitionResult) -> str:
        """`<what>. FAIL 2024-03-04: expected 43, got 42 (detail)`: one day and its numbers."""
        verdict = "pass" if result.passed else "FAIL"
        text = f"{result.partition}: expected {result.expected}, got {result.actual}"
        return f"{self.what}. {verdict} {text}" + (f" ({result.detail})" if result.detail else "")

    def evaluations(
        self,
        blocking: bool,
        targets: Mapping[str, Any] | None = None,
    ) -> list[AssetCheckEvaluation]:
        """One evaluation per partition, carrying that partition's numbers (`metrics`) as
        metadata and pointing at the partition's materialization it verified (`targets`)."""
        targets = targets or {}
        return [
            AssetCheckEvaluation(
                asset_key=self.asset_key,
                check_name=self.check_name,
                passed=r.passed,
                severity=self.severity,
                description=self.describe(r),
                blocking=blocking,
                partition=r.partition,
                target_materialization_data=targets.get(r.partition),
                metadata={
                    "expected": _value(r.expected),
                    "actual": _value(r.actual),
                    **({"detail": r.detail} if r.detail else {}),
                    **dict(self.metrics.get(r.partition, {})),
                    **self.extra_metadata,
                },
            )
            for r in self.results
        ]


def _value(value: Any) -> Any:
    """Numbers stay numbers (the UI plots them per partition); anything else becomes text."""
    return value if isinstance(value, int | float) and not isinstance(value, bool) else str(value)


class BlockingCheckFailed(Failure):
    """A blocking check failed for some of the run's partitions; names them."""


def record(
    context: AssetCheckExecutionContext,
    *outcomes: CheckOutcome,
) -> CheckEvents:
    """Yield each outcome as one evaluation per partition, then the check's output.

    A blocking ERROR outcome with failed partitions raises `BlockingCheckFailed` after every
    evaluation is logged: the step fails naming the failed days, and Dagster does not
    execute the assets downstream of it in this run (for any day of the range: a ranged
    step cannot be split).
    """
    specs = {spec.key: spec for spec in context.check_specs}
    outputs = context.op_execution_context.op_def.output_defs
    instance = context.op_execution_context.instance
    targets: dict[AssetKey, dict[str, Any]] = {}
    blocked: list[str] = []
    for outcome in outcomes:
        spec = specs[AssetCheckKey(outcome.asset_key, outcome.check_name)]
        if outcome.asset_key not in targets:
            partitions = [r.partition for r in outcome.results]
            targets[outcome.asset_key] = latest_materializations(
                instance, outcome.asset_key, partitions
            )
        yield from outcome.evaluations(spec.blocking, targets[outcome.asset_key])
        if spec.blocking and outcome.severity == AssetCheckSeverity.ERROR and outcome.failed:
            days = [r.partition for r in outcome.failed]
            listed = "; ".join(outcome.describe(r) for r in outcome.failed[:MAX_LISTED])
            more = f" and {len(days) - MAX_LISTED} more" if len(days) > MAX_LISTED else ""
            blocked.append(
                f"{spec.key.to_user_string()} failed for {len(days)} of "
                f"{len(outcome.results)} partition(s): {', '.join(days)}. {listed}{more}"
            )
            continue
        name = outputs[0].name if len(outputs) == 1 else spec.get_python_identifier()
        yield Output(None, output_name=name)
    if blocked:
        # Retried, not a refusal (refusals.py): a check compares tables another run of the
        # same backfill may be rewriting at that moment; bad data fails the retries too.
        raise BlockingCheckFailed(
            "Blocking check failed; the assets downstream of this run were not executed "
            "(a ranged step cannot skip single days: fix the data and re-run the range). "
            + " | ".join(blocked)
        )


def written_by_run(
    context: AssetCheckExecutionContext, key: AssetKey, partition: str
) -> dict[str, Any] | None:
    """The metadata of this run's materialization of `key` (the IO manager's `delta_version`,
    `files_removed`, the asset's `read_versions`; a ranged run writes the same on each of its
    partitions), None when the run did not write `key` through the IO manager.

    One query for the run's first partition in the event log, instead of the table's Delta
    history: a history read is a Spark job, and each check of a run would pay one. The
    newest few are read, not one: the stream reports its own runless materializations.
    """
    run_id = context.op_execution_context.run_id
    page = AssetRecordsFilter(asset_key=key, asset_partitions=[partition])
    for rec in context.instance.fetch_materializations(page, limit=10).records:
        if rec.run_id == run_id and rec.asset_materialization is not None:
            metadata = rec.asset_materialization.metadata
            if "delta_version" in metadata:
                return {k: getattr(v, "value", v) for k, v in metadata.items()}
    return None


def latest_materializations(
    instance: DagsterInstance, key: AssetKey, partitions: Sequence[str]
) -> dict[str, Any]:
    """Partition -> pointer to its latest materialization, as an evaluation's target.

    Dagster shows a partition's check status only while the evaluation targets the
    partition's latest materialization (otherwise a newer materialization "clears" it), and
    fills the target itself only for a single-partition `AssetCheckResult`. The pointer
    type is not exported, so it is built from its serialized form, the one the event log
    stores and Dagster must keep reading (`deserialize_value`, public).
    """
    found: dict[str, Any] = {}

    def fetch(keys: Sequence[str], limit: int) -> None:
        page = AssetRecordsFilter(asset_key=key, asset_partitions=list(keys))
        for rec in instance.fetch_materializations(page, limit=limit).records:
            if rec.partition_key and rec.partition_key not in found:
                found[rec.partition_key] = _target(rec.storage_id, rec.run_id, rec.timestamp)

    # One query for the range (a ranged run wrote each partition once), then one per
    # partition that page did not reach (re-materialized since, or never materialized).
    fetch(partitions, 2 * len(partitions))
    for partition in [p for p in partitions if p not in found]:
        fetch([partition], 1)
    return found


def _target(storage_id: int, run_id: str, timestamp: float) -> Any:
    return deserialize_value(
        json.dumps(
            {
                "__class__": "AssetCheckEvaluationTargetMaterializationData",
                "storage_id": storage_id,
                "run_id": run_id,
                "timestamp": timestamp,
            }
        )
    )


def log_partition_metrics(context: AssetCheckExecutionContext, outcome: CheckOutcome) -> None:
    """The outcome's numbers per partition (`metrics`), as one AssetObservation per
    partition of its asset.

    A ranged run's materializations all share the output's metadata (Dagster issue #18123:
    no per-partition output metadata), so per-partition numbers for the asset page's plots
    travel as partitioned observations; the checks already hold the per-partition counts.
    """
    for partition, values in sorted(outcome.metrics.items()):
        context.op_execution_context.log_event(
            AssetObservation(
                asset_key=outcome.asset_key, partition=partition, metadata=dict(values)
            )
        )


def failed_partitions_by_check(
    instance: DagsterInstance, check_keys: Iterable[AssetCheckKey], history: int = 1000
) -> dict[str, list[str]]:
    """Partition -> names of the given checks whose LATEST evaluation of it failed.

    Walking a check's evaluations newest first gives every partition's latest verdict: an
    evaluation is for its `partition`, or (older ones) for the partitions its metadata lists.
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
            if evaluation.partition is not None:
                covered = [evaluation.partition]
                failed = set() if evaluation.passed else {evaluation.partition}
            else:
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
