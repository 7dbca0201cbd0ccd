"""Environment settings and their defaults, in one place so the README table can't drift."""

from __future__ import annotations

from dagster import EnvVar

LANDING_DIR = EnvVar("BACKFILL_LANDING_DIR")
LAKEHOUSE_DIR = EnvVar("BACKFILL_LAKEHOUSE_DIR")
START_DATE = EnvVar("BACKFILL_START_DATE")
SPARK_MASTER = EnvVar("SPARK_MASTER")
PARTITIONS_PER_RUN = EnvVar("BACKFILL_PARTITIONS_PER_RUN")
SPARK_SHUFFLE_PARTITIONS = EnvVar("BACKFILL_SPARK_SHUFFLE_PARTITIONS")
SPARK_DRIVER_MEMORY = EnvVar("BACKFILL_SPARK_DRIVER_MEMORY")
SHADOW_RETENTION_HOURS = EnvVar("BACKFILL_SHADOW_RETENTION_HOURS")

DEFAULTS: dict[str, str] = {
    "BACKFILL_LANDING_DIR": "./data/landing",
    "BACKFILL_LAKEHOUSE_DIR": "./data/lakehouse",
    "BACKFILL_START_DATE": "2023-01-01",
    "SPARK_MASTER": "local[*]",
    "BACKFILL_PARTITIONS_PER_RUN": "92",
    "BACKFILL_SPARK_SHUFFLE_PARTITIONS": "4",
    "BACKFILL_SPARK_DRIVER_MEMORY": "3g",
    "BACKFILL_SHADOW_RETENTION_HOURS": "168",
}


def setting(var: EnvVar) -> str:
    """Value of a setting at definition-load time, falling back to its documented default."""
    return var.get_value(default=DEFAULTS[var.env_var_name])
