"""Downstream rebuild: after a cutover, the partitions that read the corrected ones are rebuilt
through the normal path (the same assets, resources and ranged Dagster runs as any backfill).

What to rebuild is the plan's blast radius minus what the cutover itself replaced; each
asset group runs its contiguous ranges oldest first, in dependency order, so LTV walks
forward from the corrected snapshots.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from dagster import AssetKey, AssetsDefinition, DagsterInstance

from backfill_platform.lineage import Lineage, blast_radius
from backfill_platform.ranges import DayRange
from backfill_platform.runner import Executor, InProcessExecutor, RunReport, run_work

CUTOVER_TAG = "backfill_platform/cutover_id"


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
    written = {key: set(lake.built_partitions(key)) for key in lineage.toposorted()}
    radius = blast_radius(lineage, keys, first, last, lambda k: written[k])
    rewritten = set(DayRange(first, last).partition_keys())
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
    executor: Executor | None = None,
) -> RunReport:
    """The rebuild's report (in process by default; `executor` e.g. a deployment's)."""
    lineage = lineage or Lineage(assets)
    work = downstream_work(resources["lakehouse"], lineage, selection, first, last)
    return run_work(
        executor or InProcessExecutor(assets, resources, instance),
        lineage,
        work,
        trigger="cutover-downstream-rebuild",
        tags={CUTOVER_TAG: cutover_id},
        per_run=per_run,
    )


def rebuild_runs(report: RunReport) -> list[RebuildRun]:
    return [
        RebuildRun(list(r.assets), r.first_key, r.last_key, r.run_id, r.success)
        for r in report.runs
    ]


def as_dicts(runs: list[RebuildRun]) -> list[dict]:
    return [asdict(r) for r in runs]
