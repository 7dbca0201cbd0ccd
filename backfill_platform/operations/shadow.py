"""Shadow backfill: the same assets over a range, written beside production, never into it.

The lakehouse routes the shadowed tables to `<table>__shadow_<suffix>` for reads and writes,
so a shadow fct reads a shadow staging when both are shadowed and production otherwise.
Everything else (asset code, IO manager, commit metadata, Dagster runs) is the normal path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from dagster import AssetKey, AssetsDefinition, DagsterInstance

from backfill_platform.lineage import Lineage, upstream_keys
from backfill_platform.ranges import DayRange
from backfill_platform.resources import DeltaIOManager, LakehouseResource
from backfill_platform.runner import InProcessExecutor, run_range
from backfill_platform.tables import check_shadow_suffix, shadow_name, table

SHADOW_TAG = "backfill_platform/shadow"


def shadow_lakehouse(lake: LakehouseResource, suffix: str, keys: Sequence[AssetKey]):
    return LakehouseResource(
        root_dir=lake.root_dir,
        spark=lake.spark,
        shadow_suffix=check_shadow_suffix(suffix),
        shadow_tables=[k.to_user_string() for k in keys],
    )


def shadow_resources(
    resources: Mapping[str, object], suffix: str, keys: Sequence[AssetKey]
) -> dict[str, object]:
    """The run's resources with the lakehouse (and the IO manager over it) shadow-routed."""
    lake = shadow_lakehouse(resources["lakehouse"], suffix, keys)
    return {**resources, "lakehouse": lake, "io_manager": DeltaIOManager(lakehouse=lake)}


@dataclass
class ShadowResult:
    suffix: str
    tables: dict[str, str]  # production table -> shadow table
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
    """Materialize `selection` over first..last into shadow tables, as ranged Dagster runs
    planned and executed by the runner, exactly as production is backfilled."""
    suffix = check_shadow_suffix(suffix)
    days = DayRange(first, last)
    lineage = lineage or Lineage(assets)
    keys = lineage.expand(selection)
    shadow_res = shadow_resources(resources, suffix, keys)
    lake, shadow = resources["lakehouse"], shadow_res["lakehouse"]
    seeded = seed_self_dependencies(lake, shadow, lineage, keys, first)
    report = run_range(
        InProcessExecutor(assets, shadow_res, instance),
        lineage,
        keys,
        days,
        trigger="shadow-backfill",
        tags={SHADOW_TAG: suffix},
        per_run=per_run,
    )
    run_ids, success = report.run_ids, report.success
    return ShadowResult(
        suffix=suffix,
        tables={k.to_user_string(): shadow_name(k.to_user_string(), suffix) for k in keys},
        start=first,
        end=last,
        run_ids=run_ids,
        seeded=seeded,
        success=success,
    )
