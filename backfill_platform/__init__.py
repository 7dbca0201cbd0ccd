"""backfill_platform: idempotent, bounded, reconcilable backfills on Dagster, PySpark and Delta."""
