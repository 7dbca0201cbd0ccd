"""Shadow backfill: the same code over a range, written beside production, never into it.

The runs materialize the shadow twins (`shadow/<table>` keys, assets/shadow.py) tagged with
`SHADOW_SUFFIX_TAG`, so Dagster records them as shadow materializations and production's
latest materialization is untouched. The IO manager writes `<table>__shadow_<suffix>`; a
shadow fct reads the shadow staging where it exists and production's otherwise. A
deployment launches the same twins with the same tag (after `seed_self_dependencies`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from dagster import AssetKey, AssetsDefinition, DagsterInstance

from backfill_platform.assets.shadow import shadow_twins
from backfill_platform.lineage import Lineage, upstream_keys
from backfill_platform.ranges import DayRange
from backfill_platform.resources import LakehouseResource
from backfill_platform.runner import InProcessExecutor, run_range
from backfill_platform.tables import (
    SHADOW_SUFFIX_TAG,
    check_shadow_suffix,
    shadow_key,
    shadow_name,
    table,
)


def shadow_lakehouse(lake: LakehouseResource, suffix: str, keys: Sequence[AssetKey]):
    """`lake` with `keys` routed to their shadows (validation, cutover, seeding)."""
    return lake.shadowing(check_shadow_suffix(suffix), keys)


@dataclass
class ShadowResult:
    suffix: str
    tables: dict[str, str]  # production table -> shadow table
    assets: list[str]  # the shadow asset keys materialized
    start: str
    end: str
    run_ids: list[str]
    seeded: dict[str, str]  # shadow table -> partitions copied from production
    success: bool

    def to_dict(self) -> dict:
        return asdict(self)


def seed_self_dependencies(
    lake: LakehouseResource, shadow: LakehouseResource, lineage: Lineage, keys, first: str
) -> dict[str, str]:
    """Copy into the shadow the production partitions a self-dependent asset reads before
    the range (LTV's previous snapshot), so the shadow starts where production stands."""
    seeded = {}
    rewritten = {first}
    for key in keys:
        for edge in lineage.parents(key):
            if edge.parent != key:
                continue
            before = sorted(upstream_keys(edge, rewritten) - rewritten)
            if not before or not lake.exists(key):
                continue
            column = table(key).partition_column
            span = DayRange(before[0], before[-1])
            shadow.replace_range(
                key,
                lake.read_range(key, column, span.start, span.end),
                column,
                span.start,
                span.end,
                user_metadata={
                    "operation": "shadow-seed",
                    "seeded_from_version": lake.current_version(key),
                    "code_version": "seeded-from-production",
                },
            )
            seeded[shadow.storage_name(key)] = str(span)
    return seeded


def run_shadow(
    assets: Sequence[AssetsDefinition],
    resources: Mapping[str, object],
    instance: DagsterInstance,
    selection: Sequence[AssetKey],
    first: str,
    last: str,
    suffix: str,
    lineage: Lineage | None = None,
    per_run: int | None = None,
) -> ShadowResult:
    """Materialize the shadow twins of `selection` over first..last into shadow tables, as
    ranged Dagster runs planned and executed by the runner, exactly as production is
    backfilled (same chunks, stages and pools), with production's resources."""
    suffix = check_shadow_suffix(suffix)
    days = DayRange(first, last)
    lineage = lineage or Lineage(assets)
    keys = lineage.expand(selection)
    lake = resources["lakehouse"]
    seeded = seed_self_dependencies(
        lake, shadow_lakehouse(lake, suffix, keys), lineage, keys, first
    )
    twins = shadow_twins(assets)
    with_twins = [*assets, *twins]
    report = run_range(
        InProcessExecutor(with_twins, resources, instance),
        Lineage(with_twins),
        [shadow_key(k) for k in keys],
        days,
        trigger="shadow-backfill",
        tags={SHADOW_SUFFIX_TAG: suffix},
        per_run=per_run,
    )
    run_ids, success = report.run_ids, report.success
    return ShadowResult(
        suffix=suffix,
        tables={k.to_user_string(): shadow_name(k.to_user_string(), suffix) for k in keys},
        assets=[shadow_key(k).to_user_string() for k in keys],
        start=first,
        end=last,
        run_ids=run_ids,
        seeded=seeded,
        success=success,
    )
