"""Per-partition commit log: which run, code version and reason wrote each partition, when."""

from __future__ import annotations

from dagster import AssetKey

from backfill_platform.partitions import commit_partition_keys
from backfill_platform.ranges import DayRange
from backfill_platform.resources import LakehouseResource


def partition_history(
    lake: LakehouseResource, keys: list[AssetKey], first: str, last: str
) -> list[dict]:
    """One entry per (table, partition, commit) in first..last, newest commit first.

    RESTORE commits carry no partition range; they are listed once per table with the
    version they restored to.
    """
    entries = []
    days = DayRange(first, last)
    for key in keys:
        for commit in lake.history(key):
            meta = commit["metadata"]
            base = {
                "table": key.to_user_string(),
                "version": commit["version"],
                "timestamp": commit["timestamp"].isoformat(sep=" ", timespec="seconds"),
                "operation": meta.get("operation") or commit["operation"],
                "run_id": meta.get("dagster_run_id"),
                "code_version": meta.get("code_version"),
                "reason": meta.get("reason") or _purge_reason(meta),
                "cutover_id": meta.get("cutover_id"),
            }
            if commit["operation"] == "RESTORE":
                entries.append(
                    {**base, "partition": "*", "restored_to": commit["parameters"].get("version")}
                )
                continue
            entries += [{**base, "partition": k} for k in commit_partition_keys(meta) if k in days]
    return entries


def _purge_reason(meta: dict) -> str | None:
    purge = meta.get("source_purge")
    return f"source purge: {purge}" if purge else None
