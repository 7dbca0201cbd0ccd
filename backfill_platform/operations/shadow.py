"""Shadow backfill: the same assets over a range, written beside production, never into it.

The lakehouse routes the shadowed tables to `<table>__shadow_<suffix>` for reads and writes,
so a shadow fct reads a shadow staging when both are shadowed and production otherwise.
Everything else (asset code, IO manager, commit metadata, Dagster runs) is the normal path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import date, timedelta

from dagster import AssetKey, AssetsDefinition, AssetSelection, DagsterInstance

from backfill_platform.assets.common import RAW_FX_RATES, RAW_ORDERS
from backfill_platform.operations.graph import Lineage, range_keys, upstream_keys
from backfill_platform.resources import DeltaIOManager, LakehouseResource
from backfill_platform.resources.lakehouse import shadow_name, table_name
from backfill_platform.runner import chunks, materialize_range

SHADOW_TAG = "backfill_platform/shadow"
TRIGGER_TAG = "backfill_platform/trigger"


def shadow_lakehouse(lake: LakehouseResource, suffix: str, keys: Sequence[AssetKey]):
    return LakehouseResource(
        root_dir=lake.root_dir,
        spark=lake.spark,
        shadow_suffix=suffix,
        shadow_tables=[table_name(k) for k in keys],
    )


def shadow_resources(
    resources: Mapping[str, object], suffix: str, keys: Sequence[AssetKey]
) -> dict[str, object]:
    """The run's resources with the lakehouse (and the IO manager over it) shadow-routed."""
    lake = shadow_lakehouse(resources["lakehouse"], suffix, keys)
    return {**resources, "lakehouse": lake, "io_manager": DeltaIOManager(lakehouse=lake)}


def check_suffix(suffix: str) -> str:
    if not suffix or not suffix.replace("_", "").isalnum():
        raise ValueError(f"shadow suffix {suffix!r}: use letters, digits and '_' only")
    return suffix


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
    rewritten = set(range_keys(first, first))
    for key in keys:
        for edge in lineage.parents(key):
            if edge.parent != key:
                continue
            before = sorted(upstream_keys(edge, rewritten) - rewritten)
            if not before or not lake.exists(key):
                continue
            column = lineage.column[key]
            start, end = date.fromisoformat(before[0]), date.fromisoformat(before[-1])
            end += timedelta(days=1)
            shadow.replace_range(
                key,
                lake.read_range(key, column, start, end),
                column,
                start,
                end,
                user_metadata={
                    "operation": "shadow-seed",
                    "seeded_from_version": lake.current_version(key),
                    "code_version": "seeded-from-production",
                },
            )
            seeded[shadow.storage_name(key)] = f"{before[0]}..{before[-1]}"
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
    """Materialize `selection` over first..last into shadow tables, as ranged Dagster runs.

    Raw goes first over the whole range (staging reads later ingest days), then the rest
    chunk by chunk, oldest first, exactly as `runner.backfill` orders production.
    """
    lineage = lineage or Lineage(assets)
    keys = lineage.expand(selection)
    suffix = check_suffix(suffix)
    shadow_res = shadow_resources(resources, suffix, keys)
    lake, shadow = resources["lakehouse"], shadow_res["lakehouse"]
    seeded = seed_self_dependencies(lake, shadow, lineage, keys, first)
    raw = [k for k in keys if k in (RAW_ORDERS, RAW_FX_RATES)]
    rest = [k for k in keys if k not in raw]
    run_ids, success = [], True
    for group in (raw, rest):
        if not group:
            continue
        for a, b in chunks(first, last, per_run):
            result = materialize_range(
                assets,
                a,
                b,
                shadow_res,
                instance,
                selection=AssetSelection.assets(*group),
                raise_on_error=False,
                tags={SHADOW_TAG: suffix, TRIGGER_TAG: "shadow-backfill"},
            )
            run_ids.append(result.run_id)
            if not result.success:
                success = False
                break
        if not success:
            break
    return ShadowResult(
        suffix=suffix,
        tables={table_name(k): shadow_name(table_name(k), suffix) for k in keys},
        start=first,
        end=last,
        run_ids=run_ids,
        seeded=seeded,
        success=success,
    )
