"""Runs in progress that write what a plan would rewrite: two writers of one partition race."""

from __future__ import annotations

from dagster import AssetKey, DagsterInstance, DagsterRunStatus, RunsFilter

from backfill_platform.ranges import DayRange
from backfill_platform.runner import RANGE_END_TAG, RANGE_START_TAG

# Dagster's tag on a single-partition run (ranged runs carry the range tags).
PARTITION_TAG = "dagster/partition"
ACTIVE_STATUSES = [
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
    DagsterRunStatus.CANCELING,
]


def conflicting_runs(
    instance: DagsterInstance, radius: dict[AssetKey, set[str]], exclude_run_id: str | None
) -> list[dict]:
    """In-progress runs whose asset selection and partition range overlap the radius."""
    conflicts = []
    for run in instance.get_runs(RunsFilter(statuses=ACTIVE_STATUSES)):
        if run.run_id == exclude_run_id:
            continue
        first = run.tags.get(RANGE_START_TAG) or run.tags.get(PARTITION_TAG)
        last = run.tags.get(RANGE_END_TAG) or first
        if not first:
            continue
        keys = set(DayRange(first, last).partition_keys())
        assets = sorted(
            k.to_user_string()
            for k in (run.asset_selection or radius.keys())
            if k in radius and radius[k] & keys
        )
        if assets:
            conflicts.append({"run_id": run.run_id, "assets": assets, "first": first, "last": last})
    return conflicts
