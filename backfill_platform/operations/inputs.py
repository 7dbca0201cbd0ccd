"""Inputs a range needs that are gone: upstream partitions never built, or, for raw, landing
files raw was built from that the landing zone lost (re-ingesting would shrink raw)."""

from __future__ import annotations

from dagster import AssetKey

from backfill_platform.lineage import Lineage, upstream_keys
from backfill_platform.ranges import DayRange, ranges_of
from backfill_platform.resources import LakehouseResource, LandingZoneResource
from backfill_platform.resources.landing import FX_RATES, ORDERS
from backfill_platform.tables import RAW_FX_RATES, RAW_ORDERS, table

LANDING_KIND = {RAW_ORDERS: ORDERS, RAW_FX_RATES: FX_RATES}


def missing_inputs(
    lake: LakehouseResource,
    landing: LandingZoneResource,
    lineage: Lineage,
    key: AssetKey,
    keys: list[str],
    selection: list[AssetKey],
    days: DayRange,
    written: dict[AssetKey, dict[str, dict]],
) -> list[str]:
    """What `key`'s partitions `keys` read that is gone, for a run of `selection` over `days`."""
    if key in LANDING_KIND:
        return lost_landing_files(lake, landing, key, days)
    rewritten = set(days.partition_keys())
    missing = []
    for edge in lineage.parents(key):
        needed = upstream_keys(edge, keys)
        if edge.parent in selection:
            needed -= rewritten  # the range writes those itself
        built = set(written[edge.parent])
        if not built:
            gaps = sorted(k for k in needed if k <= days.last)
        else:
            gaps = sorted(k for k in needed if min(built) <= k <= max(built) and k not in built)
            if edge.parent == key:  # self-dependency: the partition before the range
                gaps = sorted(k for k in needed if k not in built)
        if gaps:
            runs = ", ".join(str(r) for r in ranges_of(gaps)[:10])
            missing.append(f"{edge.parent.to_user_string()} partitions {runs} not built")
    return missing


def lost_landing_files(
    lake: LakehouseResource, landing: LandingZoneResource, key: AssetKey, days: DayRange
) -> list[str]:
    """Files raw was built from that the landing zone no longer has (raw never shrinks)."""
    if not lake.exists(key):
        return []
    column = table(key).partition_column
    held = (
        lake.read_range(key, column, days.start, days.end)
        .select(column, "file_name")
        .distinct()
        .collect()
    )
    kind = LANDING_KIND[key]
    lost = []
    for row in sorted(held, key=lambda r: (r[column], r["file_name"])):
        day = row[column].isoformat()
        present = {p.name for p in landing.files(kind, [day])}
        if row["file_name"] not in present:
            lost.append(f"landing file {kind}/{day}/{row['file_name']} is gone")
    return lost
