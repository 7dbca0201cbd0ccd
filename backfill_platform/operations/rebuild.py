"""Downstream rebuild: after a cutover, the partitions that read the corrected ones are rebuilt
through the normal path (the same assets, resources and ranged Dagster runs as any backfill).

What to rebuild is the plan's blast radius minus what the cutover itself replaced; each
asset group runs its contiguous ranges oldest first, in dependency order, so LTV walks
forward from the corrected snapshots.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from dagster import AssetKey, AssetsDefinition, AssetSelection, DagsterInstance

from backfill_platform.operations.graph import (
    Lineage,
    blast_radius,
    built_partitions,
    contiguous_keys,
    range_keys,
)
from backfill_platform.resources.lakehouse import table_name
from backfill_platform.runner import chunks, materialize_range

CUTOVER_TAG = "backfill_platform/cutover_id"
TRIGGER_TAG = "backfill_platform/trigger"


@dataclass
class RebuildRun:
    assets: list[str]
    first: str
    last: str
    run_id: str
    success: bool


def downstream_work(
    lake, lineage: Lineage, selection: Sequence[AssetKey], first: str, last: str
) -> dict[AssetKey, set[str]]:
    """Built partitions downstream of the range that the range itself does not rewrite."""
    keys = lineage.expand(selection)
    written = {key: set(built_partitions(lake, key)) for key in lineage.toposorted()}
    radius = blast_radius(lineage, keys, first, last, lambda k: written[k])
    rewritten = set(range_keys(first, last))
    work = {k: (v - rewritten if k in keys else v) for k, v in radius.items()}
    return {k: v for k, v in work.items() if v}


def rebuild_downstream(
    assets: Sequence[AssetsDefinition],
    resources: Mapping[str, object],
    instance: DagsterInstance,
    selection: Sequence[AssetKey],
    first: str,
    last: str,
    cutover_id: str,
    lineage: Lineage | None = None,
    per_run: int | None = None,
) -> list[RebuildRun]:
    lineage = lineage or Lineage(assets)
    work = downstream_work(resources["lakehouse"], lineage, selection, first, last)
    runs: list[RebuildRun] = []
    for group in lineage.groups(work):
        days = set().union(*(work.get(k, set()) for k in group))
        for a, b in contiguous_keys(days):
            for x, y in chunks(a, b, per_run):
                result = materialize_range(
                    assets,
                    x,
                    y,
                    resources,
                    instance,
                    selection=AssetSelection.assets(*group),
                    raise_on_error=False,
                    tags={CUTOVER_TAG: cutover_id, TRIGGER_TAG: "cutover-downstream-rebuild"},
                )
                runs.append(
                    RebuildRun([table_name(k) for k in group], x, y, result.run_id, result.success)
                )
                if not result.success:
                    return runs
    return runs


def as_dicts(runs: list[RebuildRun]) -> list[dict]:
    return [asdict(r) for r in runs]
