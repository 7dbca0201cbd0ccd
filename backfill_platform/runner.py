"""Running ranges through Dagster from Python: the demo, tests, benchmarks and the CLI.

These are real Dagster runs recorded in the instance (visible in the UI), executed in this
process so one Spark session serves them all. The daemon's asset backfills do the same
thing from the UI; this module exists for scripted use without a daemon.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from dagster import (
    AssetKey,
    AssetsDefinition,
    AssetSelection,
    DagsterInstance,
    ExecuteInProcessResult,
    PartitionKeyRange,
    materialize,
)

from backfill_platform.assets.common import RAW_FX_RATES, RAW_ORDERS
from backfill_platform.partitions import daily_partitions
from backfill_platform.settings import PARTITIONS_PER_RUN, setting

RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"


@dataclass(frozen=True)
class RangeRun:
    first_key: str
    last_key: str
    run_id: str
    success: bool


def materialize_range(
    assets: Sequence[AssetsDefinition],
    first_key: str,
    last_key: str,
    resources: Mapping[str, object],
    instance: DagsterInstance,
    selection: AssetSelection | Sequence[AssetKey] | None = None,
    raise_on_error: bool = True,
    tags: Mapping[str, str] | None = None,
    run_config: Mapping[str, object] | None = None,
) -> ExecuteInProcessResult:
    """One Dagster run over the partition keys first_key..last_key (both inclusive)."""
    return materialize(
        assets,
        selection=selection,
        resources=resources,
        instance=instance,
        run_config=run_config,
        tags={**(tags or {}), RANGE_START_TAG: first_key, RANGE_END_TAG: last_key},
        raise_on_error=raise_on_error,
    )


def chunks(first_key: str, last_key: str, per_run: int | None = None) -> list[tuple[str, str]]:
    """The backfill's runs: consecutive partition-key ranges of at most `per_run` keys."""
    per_run = per_run or int(setting(PARTITIONS_PER_RUN))
    keys = daily_partitions.get_partition_keys_in_range(PartitionKeyRange(first_key, last_key))
    return [(keys[i], keys[min(i + per_run, len(keys)) - 1]) for i in range(0, len(keys), per_run)]


def backfill(
    assets: Sequence[AssetsDefinition],
    first_key: str,
    last_key: str,
    resources: Mapping[str, object],
    instance: DagsterInstance,
    per_run: int | None = None,
    on_run: Callable[[RangeRun], None] | None = None,
) -> list[RangeRun]:
    """Every layer over a range, chunked, in the order the dependencies demand.

    Raw goes first over the whole range, because staging of day D reads raw rows that
    arrived up to days later (and all FX files); then staging and the marts go chunk by
    chunk, oldest first, as the self-dependent LTV requires. This is the order Dagster's
    asset backfill derives from the partition mappings.
    """
    raw = [RAW_ORDERS, RAW_FX_RATES]
    rest = AssetSelection.all() - AssetSelection.assets(*raw)
    runs: list[RangeRun] = []
    for selection in (AssetSelection.assets(*raw), rest):
        for first, last in chunks(first_key, last_key, per_run):
            result = materialize_range(
                assets, first, last, resources, instance, selection=selection
            )
            run = RangeRun(first, last, result.run_id, result.success)
            runs.append(run)
            if on_run:
                on_run(run)
    return runs
