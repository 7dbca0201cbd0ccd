"""Backfills as managed operations: plan, shadow, validate, cutover, rollback, decommission.

One module per step; `backfill_platform.cli` drives them against the same Dagster
definitions and instance the UI shows.
"""
