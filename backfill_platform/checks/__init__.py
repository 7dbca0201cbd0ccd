"""Asset checks that prove every partition a run wrote: reconciliation, quality, skew, drift."""

from dagster import AssetCheckKey, AssetKey

from backfill_platform.checks.crm import crm_checks
from backfill_platform.checks.drift import drift_checks
from backfill_platform.checks.reconciliation import reconciliation_checks
from backfill_platform.checks.staging import staging_checks

all_checks = [
    *reconciliation_checks,
    *staging_checks,
    *drift_checks,
    *crm_checks,
]


def blocking_check_keys(asset_key: AssetKey) -> list[AssetCheckKey]:
    """The blocking checks of an asset: the ones whose failure holds its partitions."""
    return [
        spec.key
        for checks in all_checks
        for spec in checks.check_specs
        if spec.blocking and spec.asset_key == asset_key
    ]


__all__ = ["all_checks", "blocking_check_keys"]
