"""Environment settings and their defaults, in one place so the README table can't drift."""

from __future__ import annotations

from datetime import date

from dagster import EnvVar

LANDING_DIR = EnvVar("BACKFILL_LANDING_DIR")
LAKEHOUSE_DIR = EnvVar("BACKFILL_LAKEHOUSE_DIR")
START_DATE = EnvVar("BACKFILL_START_DATE")
# Last daily partition (inclusive); empty: yesterday (UTC), the partitions grow every day;
# `today`: the current UTC day too (partitions.py).
END_DATE = EnvVar("BACKFILL_END_DATE")
SPARK_MASTER = EnvVar("SPARK_MASTER")
# Object storage for `s3a://` lakehouse and landing roots (README "Deploying"). The keys are
# handed to the resource as EnvVars, so Dagster shows the variable's name, never its value.
S3_ENDPOINT = EnvVar("BACKFILL_S3_ENDPOINT")
S3_REGION = EnvVar("BACKFILL_S3_REGION")
S3_PATH_STYLE = EnvVar("BACKFILL_S3_PATH_STYLE")
S3_ACCESS_KEY_ID = EnvVar("BACKFILL_S3_ACCESS_KEY_ID")
S3_SECRET_ACCESS_KEY = EnvVar("BACKFILL_S3_SECRET_ACCESS_KEY")
PARTITIONS_PER_RUN = EnvVar("BACKFILL_PARTITIONS_PER_RUN")
# Landing input per run when the platform plans the runs itself (runner.plan_work): runs
# sized by work, not by a day count (docs/performance.md, "Runs sized by work").
RUN_TARGET_MB = EnvVar("BACKFILL_RUN_TARGET_MB")
SPARK_SHUFFLE_PARTITIONS = EnvVar("BACKFILL_SPARK_SHUFFLE_PARTITIONS")
SPARK_DRIVER_MEMORY = EnvVar("BACKFILL_SPARK_DRIVER_MEMORY")
# Check thresholds (docs/checks.md), read when a check runs.
CHECK_TRAILING_DAYS = EnvVar("BACKFILL_CHECK_TRAILING_DAYS")
CHECK_MIN_HISTORY = EnvVar("BACKFILL_CHECK_MIN_HISTORY")
CHECK_ROW_COUNT_FACTOR = EnvVar("BACKFILL_CHECK_ROW_COUNT_FACTOR")
CHECK_NULL_SPIKE = EnvVar("BACKFILL_CHECK_NULL_SPIKE")
SKEW_WORKERS = EnvVar("BACKFILL_SKEW_WORKERS")
SKEW_TOP_KEY_SHARE = EnvVar("BACKFILL_SKEW_TOP_KEY_SHARE")
SKEW_NULL_SHARE = EnvVar("BACKFILL_SKEW_NULL_SHARE")
SKEW_MAX_MEDIAN_RATIO = EnvVar("BACKFILL_SKEW_MAX_MEDIAN_RATIO")
SKEW_IMBALANCE = EnvVar("BACKFILL_SKEW_IMBALANCE")
DRIFT_THRESHOLD = EnvVar("BACKFILL_DRIFT_THRESHOLD")
SHADOW_RETENTION_HOURS = EnvVar("BACKFILL_SHADOW_RETENTION_HOURS")
VACUUM_RETENTION_HOURS = EnvVar("BACKFILL_VACUUM_RETENTION_HOURS")
# Operator ranges longer than this need an explicit confirmation (--yes).
MAX_RANGE_DAYS = EnvVar("BACKFILL_MAX_RANGE_DAYS")
# The live path (docs/live-path.md), read on every sensor tick so a change needs no reload.
LIVE_WINDOW_DAYS = EnvVar("BACKFILL_LIVE_WINDOW_DAYS")
AUTO_REPAIR_STALE = EnvVar("BACKFILL_AUTO_REPAIR_STALE")
STALENESS_AUDIT_SECONDS = EnvVar("BACKFILL_STALENESS_AUDIT_SECONDS")
# The CRM (contract 1.3, docs/crm.md). The token is read by the resource as an EnvVar only.
CRM_URL = EnvVar("BACKFILL_CRM_URL")
CRM_TOKEN = EnvVar("BACKFILL_CRM_TOKEN")
CRM_RATE_LIMIT = EnvVar("BACKFILL_CRM_RATE_LIMIT")
CRM_LIVE_RESERVE = EnvVar("BACKFILL_CRM_LIVE_RESERVE")
CRM_MAX_ATTEMPTS = EnvVar("BACKFILL_CRM_MAX_ATTEMPTS")
CRM_CONCURRENCY = EnvVar("BACKFILL_CRM_CONCURRENCY")
# Which holds the CRM rate limiter's window (docs/crm.md): `auto` (a file when
# BACKFILL_CRM_LIMITER names one, else PostgreSQL when DAGSTER_PG_HOST is set, else the
# SQLite file beside a local lakehouse root), `sqlite` or `postgres`.
CRM_LIMITER_BACKEND = EnvVar("BACKFILL_CRM_LIMITER_BACKEND")
# The SQLite file of the cross-process rate limiter; empty: beside the lakehouse root.
CRM_LIMITER = EnvVar("BACKFILL_CRM_LIMITER")
# The Dagster instance's PostgreSQL (deploy/dagster-postgres.yaml), also the CRM limiter's.
# The password is read where a connection opens, never stored in a resource or shown.
PG_HOST = EnvVar("DAGSTER_PG_HOST")
PG_PORT = EnvVar("DAGSTER_PG_PORT")
PG_USERNAME = EnvVar("DAGSTER_PG_USERNAME")
PG_PASSWORD = EnvVar("DAGSTER_PG_PASSWORD")
PG_DB = EnvVar("DAGSTER_PG_DB")
# The live order stream (contract 1.4, docs/live-stream.md): broker and topic.
KAFKA_BOOTSTRAP = EnvVar("BACKFILL_KAFKA_BOOTSTRAP")
ORDERS_TOPIC = EnvVar("BACKFILL_ORDERS_TOPIC")
# Most messages one stream micro-batch takes (Spark's maxOffsetsPerTrigger).
STREAM_MAX_OFFSETS = EnvVar("BACKFILL_STREAM_MAX_OFFSETS_PER_BATCH")
# Seconds without a stream commit before raw/orders fails its freshness policy (WARN after
# half); empty: no policy (a deployment without the stream). Read when definitions load.
STREAM_FRESHNESS_SECONDS = EnvVar("BACKFILL_STREAM_FRESHNESS_SECONDS")
# true: the stream folds each batch into staging/orders itself (seconds, not a window run).
STREAM_STAGING = EnvVar("BACKFILL_STREAM_STAGING")
# true: raw/orders carries the stream_offsets_once check, which asks the broker in every run.
STREAM_CHECK = EnvVar("BACKFILL_STREAM_CHECK")
# true: the stream_supervisor sensor is on by default (a deployment that runs the stream).
STREAM_SUPERVISOR = EnvVar("BACKFILL_STREAM_SUPERVISOR")
# The Dagster webserver the CLI launches its backfills on (`make ui` serves this one).
DAGSTER_URL = EnvVar("DAGSTER_URL")

DEFAULTS: dict[str, str] = {
    "BACKFILL_LANDING_DIR": "./data/landing",
    "BACKFILL_LAKEHOUSE_DIR": "./data/lakehouse",
    "BACKFILL_START_DATE": "2023-01-01",
    "BACKFILL_END_DATE": "",
    "SPARK_MASTER": "local[*]",
    "BACKFILL_S3_ENDPOINT": "",
    "BACKFILL_S3_REGION": "us-east-1",
    "BACKFILL_S3_PATH_STYLE": "false",
    "BACKFILL_S3_ACCESS_KEY_ID": "",
    "BACKFILL_S3_SECRET_ACCESS_KEY": "",
    "BACKFILL_PARTITIONS_PER_RUN": "92",
    "BACKFILL_RUN_TARGET_MB": "256",
    "BACKFILL_SPARK_SHUFFLE_PARTITIONS": "4",
    "BACKFILL_SPARK_DRIVER_MEMORY": "3g",
    "BACKFILL_CHECK_TRAILING_DAYS": "14",
    "BACKFILL_CHECK_MIN_HISTORY": "3",
    "BACKFILL_CHECK_ROW_COUNT_FACTOR": "3",
    "BACKFILL_CHECK_NULL_SPIKE": "0.2",
    "BACKFILL_SKEW_WORKERS": "8",
    "BACKFILL_SKEW_TOP_KEY_SHARE": "0.1",
    "BACKFILL_SKEW_NULL_SHARE": "0.25",
    "BACKFILL_SKEW_MAX_MEDIAN_RATIO": "50",
    "BACKFILL_SKEW_IMBALANCE": "2",
    "BACKFILL_DRIFT_THRESHOLD": "0.05",
    "BACKFILL_SHADOW_RETENTION_HOURS": "168",
    "BACKFILL_VACUUM_RETENTION_HOURS": "168",
    "BACKFILL_MAX_RANGE_DAYS": "366",
    "BACKFILL_LIVE_WINDOW_DAYS": "3",
    "BACKFILL_AUTO_REPAIR_STALE": "false",
    "BACKFILL_STALENESS_AUDIT_SECONDS": "1800",
    "BACKFILL_CRM_URL": "http://127.0.0.1:8765",
    "BACKFILL_CRM_RATE_LIMIT": "20",
    "BACKFILL_CRM_LIVE_RESERVE": "0.25",
    "BACKFILL_CRM_MAX_ATTEMPTS": "8",
    "BACKFILL_CRM_CONCURRENCY": "4",
    "BACKFILL_CRM_LIMITER_BACKEND": "auto",
    "BACKFILL_CRM_LIMITER": "",
    "DAGSTER_PG_HOST": "",
    "DAGSTER_PG_PORT": "5432",
    "DAGSTER_PG_USERNAME": "",
    "DAGSTER_PG_DB": "",
    "DAGSTER_URL": "http://127.0.0.1:3000",
    "BACKFILL_KAFKA_BOOTSTRAP": "127.0.0.1:9092",
    "BACKFILL_ORDERS_TOPIC": "orders",
    "BACKFILL_STREAM_MAX_OFFSETS_PER_BATCH": "100000",
    "BACKFILL_STREAM_FRESHNESS_SECONDS": "",
    "BACKFILL_STREAM_STAGING": "false",
    "BACKFILL_STREAM_CHECK": "false",
    "BACKFILL_STREAM_SUPERVISOR": "false",
}


class SettingError(ValueError):
    """A setting whose value cannot be used; the message is one line naming the variable."""


def setting(var: EnvVar) -> str:
    """Value of a setting at definition-load time, falling back to its documented default."""
    return var.get_value(default=DEFAULTS[var.env_var_name])


def int_setting(var: EnvVar, minimum: int = 1) -> int:
    """An integer setting (at least `minimum`), or `SettingError` naming it."""
    text = setting(var)
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise SettingError(f"{var.env_var_name}={text!r}: not a whole number >= {minimum}")
    return value


def day_setting(var: EnvVar) -> date | None:
    """A day setting (`YYYY-MM-DD`); None when it is empty; `SettingError` naming it."""
    text = setting(var).strip()
    if not text:
        return None
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise SettingError(f"{var.env_var_name}={text!r}: not a day (YYYY-MM-DD)") from None


def bool_setting(var: EnvVar) -> bool:
    """`true` or `false` (any case), or `SettingError` naming it."""
    text = setting(var).strip().lower()
    if text not in ("true", "false"):
        raise SettingError(f"{var.env_var_name}={text!r}: not true or false")
    return text == "true"


def secret_setting(var: EnvVar) -> EnvVar | str:
    """The EnvVar itself when it is set (Dagster resolves it at run time and shows only its
    name), else its default: the value never reaches definitions, the UI or a log."""
    return var if var.get_value() else DEFAULTS[var.env_var_name]


def fraction_setting(var: EnvVar) -> float:
    """A share in [0, 1), or `SettingError` naming it."""
    text = setting(var)
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not 0.0 <= value < 1.0:
        raise SettingError(f"{var.env_var_name}={text!r}: not a number in [0, 1)")
    return value
