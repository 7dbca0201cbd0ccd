"""A shadow backfill launched on the deployment: the shadow assets as one Dagster backfill.

In process, `shadow.run_shadow` routes the production assets' writes to shadow tables
through the run's resources. A deployment's daemon builds the resources itself, so there the
shadow writes are assets of their own, `shadow/<production key>`, which read the shadow
suffix from the run tag `SHADOW_SUFFIX_TAG` (assets/shadow.py); `shadow_launch` is the one
place that turns a shadow into that launch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dagster import AssetKey

from backfill_platform.lineage import Lineage
from backfill_platform.operations.shadow import (
    ShadowResult,
    seed_self_dependencies,
    shadow_lakehouse,
)
from backfill_platform.ranges import DayRange
from backfill_platform.runner import Executor, RunReport, RunSpec, run_plan
from backfill_platform.tables import (
    SHADOW_SUFFIX_TAG,
    check_shadow_suffix,
    shadow_key,
    shadow_name,
)


def shadow_keys(lineage: Lineage, selection: Sequence[AssetKey]) -> tuple[AssetKey, ...]:
    """The shadow assets a shadow of `selection` (plus what runs with it) writes."""
    return tuple(shadow_key(key) for key in lineage.expand(selection))


def shadow_launch(
    lineage: Lineage, selection: Sequence[AssetKey], days: DayRange, suffix: str
) -> tuple[list[RunSpec], dict[str, str]]:
    """The shadow assets over `days`, and the tags that name the shadow."""
    plan = [RunSpec(shadow_keys(lineage, selection), days)]
    return plan, {SHADOW_SUFFIX_TAG: suffix}


def launch_shadow(
    executor: Executor,
    resources: Mapping[str, object],
    lineage: Lineage,
    selection: Sequence[AssetKey],
    days: DayRange,
    suffix: str,
) -> tuple[ShadowResult, RunReport]:
    """Seed what the shadow reads before the range (as in process), then launch and follow."""
    suffix = check_shadow_suffix(suffix)
    keys = lineage.expand(selection)
    lake = resources["lakehouse"]
    shadow = shadow_lakehouse(lake, suffix, keys)
    seeded = seed_self_dependencies(lake, shadow, lineage, keys, days.first)
    plan, tags = shadow_launch(lineage, keys, days, suffix)
    report = run_plan(executor, plan, "shadow-backfill", tags)
    result = ShadowResult(
        suffix=suffix,
        tables={k.to_user_string(): shadow_name(k.to_user_string(), suffix) for k in keys},
        assets=[shadow_key(k).to_user_string() for k in keys],
        start=days.first,
        end=days.last,
        run_ids=report.run_ids,
        seeded=seeded,
        success=report.success,
    )
    return result, report
