"""How fresh `raw/orders` must be when the live stream feeds it (contract 1.4).

Dagster's own freshness policy, evaluated by the daemon's freshness daemon: the stream
reports every committed micro-batch as a runless materialization of the days it wrote, so
"materialized within the window" is "the stream committed within the window". Attached only
where the deployment runs the stream (`BACKFILL_STREAM_FRESHNESS_SECONDS` set): a batch-only
deployment, whose files land daily, would show the asset failing between deliveries.

Why not `build_last_update_freshness_checks` and its sensor: that sensor does not evaluate a
check again after a failure, counting on the next run that materializes the asset to run
its checks; the stream materializes without runs, so the check would stay failed after the
stream recovered.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from dagster import AssetsDefinition, FreshnessPolicy

from backfill_platform.settings import STREAM_FRESHNESS_SECONDS, int_setting, setting
from backfill_platform.tables import RAW_ORDERS

# Dagster refuses windows under a minute; a shorter setting is a SettingError naming it.
MINIMUM_SECONDS = 60


def stream_freshness_policy() -> FreshnessPolicy | None:
    """FAIL when the stream committed nothing for the setting's seconds, WARN after half of
    them (when that half is a minute or more); None when the setting is empty."""
    if not setting(STREAM_FRESHNESS_SECONDS).strip():
        return None
    seconds = int_setting(STREAM_FRESHNESS_SECONDS, minimum=MINIMUM_SECONDS)
    warn = seconds // 2
    return FreshnessPolicy.time_window(
        fail_window=timedelta(seconds=seconds),
        warn_window=timedelta(seconds=warn) if warn >= MINIMUM_SECONDS else None,
    )


def with_stream_freshness(
    assets: Sequence[AssetsDefinition], policy: FreshnessPolicy | None
) -> list[AssetsDefinition]:
    """The assets, `raw/orders` carrying `policy` (unchanged when there is none)."""
    if policy is None:
        return list(assets)
    return [
        a.map_asset_specs(
            lambda spec: (
                spec.replace_attributes(freshness_policy=policy) if spec.key == RAW_ORDERS else spec
            )
        )
        if RAW_ORDERS in a.keys
        else a
        for a in assets
    ]
