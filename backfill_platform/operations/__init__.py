"""Backfills as managed operations: plan, shadow, validate, cutover, rollback, decommission.

One module per step (the plan's input and run checks in `inputs` and `conflicts`, the
validation's reconciliation in `reconciliation`, the plan's Dagster job in `launchpad`);
`backfill_platform.cli` drives them against the same Dagster definitions and instance the
UI shows.
"""
