"""Runs in progress that write what a plan would rewrite: two writers of one partition race."""

from __future__ import annotations

from dagster import AssetKey, DagsterInstance

from backfill_platform.runner import active_runs, run_days


def conflicting_runs(
    instance: DagsterInstance, radius: dict[AssetKey, set[str]], exclude_run_id: str | None
) -> list[dict]:
    """In-progress runs whose asset selection and partition range overlap the radius."""
    conflicts = []
    for run in active_runs(instance):
        days = run_days(run)
        if run.run_id == exclude_run_id or days is None:
            continue
        # every day of its range: a run launched while the partitions reached further (a
        # code location with the stream's days) may write days past today's last partition
        keys = set(days.day_keys())
        assets = sorted(
            k.to_user_string()
            for k in (run.asset_selection or radius.keys())
            if k in radius and radius[k] & keys
        )
        if assets:
            conflicts.append(
                {"run_id": run.run_id, "assets": assets, "first": days.first, "last": days.last}
            )
    return conflicts
