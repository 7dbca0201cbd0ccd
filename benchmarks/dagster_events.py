"""What Dagster's event log costs a backfill: the events its runs wrote, and what one event
costs on the same storage, measured in the same benchmark session.

A ranged run writes one ASSET_MATERIALIZATION_PLANNED and one ASSET_MATERIALIZATION per
asset and partition (Dagster's own, so the UI can show every partition's status), and the
platform's checks one ASSET_CHECK_EVALUATION per check and partition plus one
ASSET_OBSERVATION per partition of the reconciliation metrics (docs/checks.md). Each is a
write to the instance's storage: on the SQLite storage of `deploy/dagster.yaml` a write
opens its own database connections, on the bench's PostgreSQL (`runner.recording_instance`)
one pooled connection takes a step's events in one batch. The price is measured with a
trivial asset and check, no Spark, so it holds Dagster's cost alone.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

# The per-partition events of a backfill's runs, and what each costs in the calibration.
PER_PARTITION = (
    "ASSET_MATERIALIZATION_PLANNED",
    "ASSET_MATERIALIZATION",
    "ASSET_OBSERVATION",
    "ASSET_CHECK_EVALUATION",
)


def events_of(instance, run_ids: Iterable[str]) -> dict[str, int]:
    """Events of the runs by type, the per-partition ones first, and their total."""
    counts: Counter[str] = Counter()
    for run_id in run_ids:
        for entry in instance.all_logs(run_id):
            counts[entry.dagster_event.event_type_value if entry.dagster_event else "LOG"] += 1
    found = {name: counts.pop(name, 0) for name in PER_PARTITION}
    return {
        **found,
        "other": sum(counts.values()),
        "total": sum(found.values()) + sum(counts.values()),
    }


def price(dagster_home: Path, partitions: int = 92, repeat: int = 2) -> dict[str, float]:
    """Milliseconds per materialized partition (its planned and materialization events) and
    per check evaluation, on a new instance in `dagster_home` (written to as the bench's
    instances are, `runner.recording_instance`): the slope between a one-partition and a
    `partitions`-partition run, best of `repeat`."""
    from dagster import (
        AssetCheckEvaluation,
        AssetKey,
        DagsterInstance,
        DailyPartitionsDefinition,
        Output,
        asset,
        asset_check,
        materialize,
    )

    days = DailyPartitionsDefinition(start_date="2024-01-01")

    @asset(partitions_def=days, key=AssetKey(["calibration", "events"]))
    def events() -> None:
        return None

    @asset_check(asset=events, name="one_per_partition", partitions_def=days)
    def one_per_partition(context):
        for key in context.op_execution_context.partition_keys:
            yield AssetCheckEvaluation(
                asset_key=events.key,
                check_name="one_per_partition",
                passed=True,
                partition=key,
                metadata={"rows": 1},
            )
        yield Output(None)

    from backfill_platform.runner import recording_instance

    instance = recording_instance(DagsterInstance.from_config(str(dagster_home)))
    try:

        def best(assets: list, count: int) -> float:
            last = days.get_partition_keys()[count - 1]
            tags = {
                "dagster/asset_partition_range_start": "2024-01-01",
                "dagster/asset_partition_range_end": last,
            }
            seconds = []
            for _ in range(repeat + 1):  # the first warms Dagster's code paths
                started = time.perf_counter()
                materialize(assets, instance=instance, tags=tags)
                seconds.append(time.perf_counter() - started)
            return min(seconds[1:])

        one, many = best([events], 1), best([events], partitions)
        checked = best([events, one_per_partition], partitions)
    finally:
        instance.dispose()
    per_partition = (many - one) / (partitions - 1) * 1000
    return {
        "ms_per_materialized_partition": round(per_partition, 2),
        "ms_per_event": round(per_partition / 2, 2),
        "ms_per_check_evaluation": round((checked - many) / partitions * 1000, 2),
        "partitions": partitions,
    }


def estimate(events: dict[str, int], prices: dict[str, float]) -> float:
    """Seconds the per-partition events cost at the calibrated prices (an observation is
    priced as a materialization event: both are asset events, written alike)."""
    asset_events = sum(events[n] for n in PER_PARTITION if n != "ASSET_CHECK_EVALUATION")
    return round(
        (
            asset_events * prices["ms_per_event"]
            + events["ASSET_CHECK_EVALUATION"] * prices["ms_per_check_evaluation"]
        )
        / 1000,
        1,
    )


def summary(phases: dict[str, Any], prices: dict[str, float]) -> dict[str, Any]:
    """Per phase: its events and what they cost at the calibrated prices."""
    return {
        "price": prices,
        "phases": {
            name: {**events, "estimated_seconds": estimate(events, prices)}
            for name, events in phases.items()
        },
    }
