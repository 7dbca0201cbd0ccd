"""backfill_platform: idempotent, bounded, reconcilable backfills on Dagster, PySpark and Delta.

The package uses a few Dagster APIs marked beta or preview (backfill policies, partitioned
asset checks, `allow_nonexistent_upstream_partitions`); Dagster warns once per decorator
call, which floods every process that loads the code location. They are filtered here,
where every import of the package starts, by Dagster's public warning classes.
"""

import warnings

from dagster import BetaWarning, PreviewWarning

warnings.filterwarnings("ignore", category=BetaWarning)
warnings.filterwarnings("ignore", category=PreviewWarning)
