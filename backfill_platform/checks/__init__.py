"""Asset checks that prove every partition a run wrote: reconciliation, quality, skew, drift."""

from backfill_platform.checks.drift import drift_checks
from backfill_platform.checks.quality import quality_checks
from backfill_platform.checks.reconciliation import reconciliation_checks
from backfill_platform.checks.skew import skew_checks

all_checks = [*reconciliation_checks, *quality_checks, *skew_checks, *drift_checks]

__all__ = ["all_checks"]
