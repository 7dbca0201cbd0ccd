"""Environment settings, their defaults and meanings, in one place so docs/settings.md can't
drift (it is generated from here)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from datetime import date
from pathlib import Path

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
CHECK_QUERIES_AT_ONCE = EnvVar("BACKFILL_CHECK_QUERIES_AT_ONCE")
KEEP_WRITTEN_RANGES = EnvVar("BACKFILL_KEEP_WRITTEN_RANGES")
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
# A raw/orders day is compacted once it holds this many small files (the stream's batches).
STREAM_COMPACT_FILES = EnvVar("BACKFILL_STREAM_COMPACT_FILES")
# true: the stream folds each batch into staging/orders itself (seconds, not a window run).
STREAM_STAGING = EnvVar("BACKFILL_STREAM_STAGING")
# true (with STREAM_STAGING): the stream folds the staged days on into the two marts.
STREAM_MARTS = EnvVar("BACKFILL_STREAM_MARTS")
# The longest LTV roll-forward (snapshots) one batch's fold rebuilds.
STREAM_MARTS_DAYS = EnvVar("BACKFILL_STREAM_MARTS_DAYS")
# true: raw/orders carries the stream_offsets_once check, which asks the broker in every run.
STREAM_CHECK = EnvVar("BACKFILL_STREAM_CHECK")
# true: the stream_supervisor sensor is on by default (a deployment that runs the stream).
STREAM_SUPERVISOR = EnvVar("BACKFILL_STREAM_SUPERVISOR")
# The Dagster webserver the CLI launches its backfills on (`make ui` serves this one).
DAGSTER_URL = EnvVar("DAGSTER_URL")


@dataclass(frozen=True)
class Setting:
    """One environment setting: its default when unset and a line for docs/settings.md."""

    name: str
    default: str
    meaning: str
    # How the page shows the default where the bare value would mislead (an empty one).
    shown: str = ""

    def row(self) -> str:
        default = self.shown or (f"`{self.default}`" if self.default else "empty")
        return f"| `{self.name}` | {default} | {self.meaning} |"


# The order of docs/settings.md. `python -m backfill_platform.settings` writes that page from
# this table; test_settings_page.py fails when they differ.
SETTINGS: tuple[Setting, ...] = (
    Setting(
        "BACKFILL_LANDING_DIR",
        "./data/landing",
        "landing zone root (contract section 1); a local path or `s3a://bucket/prefix`",
    ),
    Setting(
        "BACKFILL_LAKEHOUSE_DIR",
        "./data/lakehouse",
        "Delta tables root (contract section 2); a local path or `s3a://bucket/prefix` "
        "([object-storage.md](object-storage.md))",
    ),
    Setting(
        "BACKFILL_S3_ENDPOINT",
        "",
        "S3-compatible endpoint URL for `s3a://` roots",
        "empty: AWS for the region",
    ),
    Setting("BACKFILL_S3_REGION", "us-east-1", "the bucket's region"),
    Setting(
        "BACKFILL_S3_PATH_STYLE",
        "false",
        "`true`: path-style bucket addressing (most self-hosted S3 servers)",
    ),
    Setting(
        "BACKFILL_S3_ACCESS_KEY_ID",
        "",
        "static access key; read as a Dagster `EnvVar`",
        "empty: S3A's default chain (`AWS_*`, profile, instance/pod role)",
    ),
    Setting(
        "BACKFILL_S3_SECRET_ACCESS_KEY",
        "",
        "its secret; read as a Dagster `EnvVar`, never logged or shown",
    ),
    Setting(
        "BACKFILL_START_DATE",
        "2023-01-01",
        "first daily partition (UTC); `make demo` / `make ui` / `make cli` set it to the "
        "demo's first day",
    ),
    Setting(
        "BACKFILL_END_DATE",
        "",
        "last daily partition (inclusive); `make demo` / `make ui` / `make cli` set it to "
        "the landing zone's newest day (with `STREAM=on`, the stream's last day)",
        "empty: yesterday (UTC); `today`: the current UTC day too (a deployment running the "
        "live stream, so today's batches are reported as they commit)",
    ),
    Setting("SPARK_MASTER", "local[*]", "Spark master URL (`spark://host:7077` for a cluster)"),
    Setting(
        "BACKFILL_PARTITIONS_PER_RUN",
        "92",
        "days per run of a deployment's backfill (Dagster's `BackfillPolicy`) and of the "
        "live path's runs; set, it also fixes an in-process backfill's days per run (as "
        "`--per-run` does)",
    ),
    Setting(
        "BACKFILL_RUN_TARGET_MB",
        "256",
        "in process (`make demo`, the CLI's `--in-process`, repairs, shadows): as few runs "
        "as keep each near this much landing input, balanced "
        '([performance.md](performance.md), "Runs sized by work")',
    ),
    Setting("BACKFILL_SPARK_SHUFFLE_PARTITIONS", "4", "`spark.sql.shuffle.partitions`"),
    Setting("BACKFILL_SPARK_DRIVER_MEMORY", "3g", "`spark.driver.memory`"),
    Setting(
        "BACKFILL_CHECK_TRAILING_DAYS",
        "14",
        "quality checks: days before a partition that form its baseline ([checks.md](checks.md))",
    ),
    Setting(
        "BACKFILL_CHECK_MIN_HISTORY",
        "3",
        "quality checks: earlier days with rows needed before volume / NULL-rate bounds apply",
    ),
    Setting(
        "BACKFILL_CHECK_ROW_COUNT_FACTOR",
        "3",
        "rows of a day must lie within median/F .. median x F of the baseline (WARN)",
    ),
    Setting(
        "BACKFILL_CHECK_NULL_SPIKE",
        "0.2",
        "a column's NULL share may exceed its baseline mean by at most this (WARN)",
    ),
    Setting(
        "BACKFILL_CHECK_QUERIES_AT_ONCE",
        "true",
        "a check step runs its independent Spark queries at the same time, one thread each "
        "(`false`: one after another, e.g. to compare; [checks.md](checks.md))",
    ),
    Setting(
        "BACKFILL_KEEP_WRITTEN_RANGES",
        "true",
        "a run keeps in memory the range it writes of staging/orders, its rejects and "
        "fct_daily_revenue, and its later steps and checks read it there (`false`: from Delta, "
        "e.g. to compare, or where the driver's memory is short; "
        "[performance.md](performance.md))",
    ),
    Setting(
        "BACKFILL_SKEW_WORKERS",
        "8",
        "N of the hash partitioning the skew check simulates on customer_id",
    ),
    Setting(
        "BACKFILL_SKEW_TOP_KEY_SHARE",
        "0.1",
        "skew WARN above this share of a day's rows on one customer",
    ),
    Setting(
        "BACKFILL_SKEW_NULL_SHARE",
        "0.25",
        "skew WARN above this share of NULL customer_id (guests)",
    ),
    Setting(
        "BACKFILL_SKEW_MAX_MEDIAN_RATIO", "50", "skew WARN above this max/median rows per customer"
    ),
    Setting(
        "BACKFILL_SKEW_IMBALANCE",
        "2",
        "skew WARN above this largest/mean hash bucket across N workers",
    ),
    Setting(
        "BACKFILL_DRIFT_THRESHOLD",
        "0.05",
        "drift WARN above this relative change (or NULL-rate change) vs the previous Delta version",
    ),
    Setting(
        "BACKFILL_SHADOW_RETENTION_HOURS",
        "168",
        "how long a cut-over shadow and old files are kept",
    ),
    Setting(
        "BACKFILL_VACUUM_RETENTION_HOURS",
        "168",
        "the weekly VACUUM (`weekly_vacuum_schedule`, Sunday 03:00 UTC) keeps files this "
        "young; never below the shadow retention",
    ),
    Setting(
        "BACKFILL_MAX_RANGE_DAYS",
        "366",
        "operator ranges longer than this need an explicit confirmation (`--yes`)",
    ),
    Setting(
        "BACKFILL_LIVE_WINDOW_DAYS",
        "3",
        "the event days the rolling window rebuilds ([live-path.md](live-path.md))",
    ),
    Setting(
        "BACKFILL_AUTO_REPAIR_STALE",
        "false",
        "`true`: the staleness sensor requests the repair itself",
    ),
    Setting(
        "BACKFILL_STALENESS_AUDIT_SECONDS",
        "1800",
        "least time between staleness audits while the last one was clean",
    ),
    Setting(
        "BACKFILL_CRM_URL",
        "http://127.0.0.1:8765",
        "the CRM's base URL; when set, `make demo` / `make ui` start no demo CRM "
        "([crm.md](crm.md))",
    ),
    Setting(
        "BACKFILL_CRM_TOKEN",
        "",
        "bearer token; read as a Dagster `EnvVar`, never logged",
        "none (`make demo` / `make ui`: `demo-crm-token`)",
    ),
    Setting("BACKFILL_CRM_RATE_LIMIT", "20", "CRM requests per second, all processes together"),
    Setting(
        "BACKFILL_CRM_LIVE_RESERVE",
        "0.25",
        "share of the limit kept for the live path: backfills together use at most "
        "floor((1 - reserve) x limit) per second",
    ),
    Setting(
        "BACKFILL_CRM_MAX_ATTEMPTS",
        "8",
        "attempts per customer on 5xx, timeouts and dropped connections (429s wait "
        "`Retry-After` and do not count)",
    ),
    Setting(
        "BACKFILL_CRM_CONCURRENCY",
        "4",
        "CRM calls in flight at once per run (threads); the rate limit still sets the "
        "pace, this hides the CRM's latency",
    ),
    Setting(
        "BACKFILL_CRM_LIMITER_BACKEND",
        "auto",
        "which holds the CRM rate limiter's window: `auto` (the file "
        "`BACKFILL_CRM_LIMITER` names; else the Dagster instance's PostgreSQL when "
        "`DAGSTER_PG_HOST` is set; else the SQLite file beside a local lakehouse root), "
        "`sqlite` or `postgres`; an `s3a://` root with neither is refused",
    ),
    Setting(
        "BACKFILL_CRM_LIMITER",
        "",
        "the SQLite file every process's rate limiter shares (one machine, or a volume "
        "every machine mounts)",
        "empty: `crm_rate_limit.sqlite` beside the lakehouse root",
    ),
    Setting(
        "DAGSTER_PG_HOST",
        "",
        "the Dagster instance's PostgreSQL (`deploy/dagster-postgres.yaml`), also the CRM "
        "limiter's under `auto`/`postgres`",
    ),
    Setting("DAGSTER_PG_PORT", "5432", "its port"),
    Setting("DAGSTER_PG_USERNAME", "", "its user"),
    Setting("DAGSTER_PG_PASSWORD", "", "its password, read where a connection opens, never logged"),
    Setting("DAGSTER_PG_DB", "", "its database"),
    Setting(
        "BACKFILL_KAFKA_BOOTSTRAP",
        "127.0.0.1:9092",
        "the live stream's Kafka bootstrap servers (contract 1.4); `make kafka-start` "
        "starts a broker there (controller on the next port when free)",
    ),
    Setting("BACKFILL_ORDERS_TOPIC", "orders", "the order topic"),
    Setting(
        "BACKFILL_STREAM_MAX_OFFSETS_PER_BATCH",
        "100000",
        "most messages per stream micro-batch (Spark's `maxOffsetsPerTrigger`)",
    ),
    Setting(
        "BACKFILL_STREAM_FRESHNESS_SECONDS",
        "",
        "where the stream runs: `raw/orders` fails its freshness policy after this many "
        "seconds without a stream commit, warns after half (at least `60`; empty: no "
        "policy)",
    ),
    Setting(
        "BACKFILL_STREAM_COMPACT_FILES",
        "32",
        "the stream compacts a `raw/orders` day (Delta's OPTIMIZE, beside the stream) once "
        "it holds this many files under 8 MiB: after the round that follows each batch, a "
        "day holds fewer, whatever its batch count (at least `2`)",
    ),
    Setting(
        "BACKFILL_STREAM_STAGING",
        "false",
        "`true`: the stream folds each batch into `staging/orders` and its rejects itself "
        "(skipping days a freeze holds), instead of leaving staging to the rolling window",
    ),
    Setting(
        "BACKFILL_STREAM_MARTS",
        "false",
        "`true` (with `BACKFILL_STREAM_STAGING`): the stream folds the staged days on into "
        "`marts/fct_daily_revenue` and `marts/customer_ltv`, with their checks, within the "
        "batch (docs/live-stream.md)",
    ),
    Setting(
        "BACKFILL_STREAM_MARTS_DAYS",
        "7",
        "the most LTV snapshots one batch's fold rebuilds: an order later than that leaves "
        "its roll-forward to the rolling window and the staleness sensor",
    ),
    Setting(
        "BACKFILL_STREAM_CHECK",
        "false",
        "`true` where the stream runs: `raw/orders` carries the non-blocking "
        "`stream_offsets_once` check (every broker offset once per day), which asks the "
        "broker in every `raw/orders` run",
    ),
    Setting(
        "BACKFILL_STREAM_SUPERVISOR",
        "false",
        "`true`: the `stream_supervisor` sensor is running by default (it starts the "
        "stream when it is not running); `make ui STREAM=on` sets it",
    ),
    Setting(
        "DAGSTER_URL",
        "http://127.0.0.1:3000",
        "the Dagster webserver the CLI launches `backfill`, `shadow`, the cutover's "
        "rebuild and `stale --repair` on ([operations.md](operations.md))",
    ),
)
DEFAULTS: dict[str, str] = {s.name: s.default for s in SETTINGS}

# Read by Dagster or the Makefile, not by the code location; on the page for completeness.
OTHER_SETTINGS: tuple[Setting, ...] = (
    Setting(
        "DAGSTER_HOME",
        "",
        "Dagster instance; gets `deploy/dagster.yaml` (under `local-postgres`, with its "
        "storage set to the local server); command logs go to its `backfill-logs/`",
        "`./.dagster_home` (the Makefile's; the CLI uses the repository's when unset)",
    ),
    Setting(
        "DAGSTER_STORAGE",
        "local-postgres",
        "a Makefile variable: Dagster's instance for `make demo`, `ui`, `cli`: "
        "`local-postgres` a PostgreSQL server of the demo's own (the virtualenv's) in "
        "`POSTGRES_DATA` (`data/postgres`), `sqlite` files in DAGSTER_HOME, `postgres` "
        "`deploy/dagster-postgres.yaml` with a server from `DAGSTER_PG_*`",
    ),
    Setting(
        "DAGSTER_EVENT_BATCH_SIZE",
        "1000",
        "Dagster's own setting: a step's per-partition events in one storage call where "
        "the storage can (PostgreSQL); the Makefile exports it, the demo's and CLI's "
        "process set it when unset",
    ),
)
SETTINGS_PAGE = Path(__file__).resolve().parents[1] / "docs" / "settings.md"


def settings_page() -> str:
    """docs/settings.md, from SETTINGS and OTHER_SETTINGS."""
    rows = "\n".join(s.row() for s in SETTINGS)
    other = "\n".join(s.row() for s in OTHER_SETTINGS)
    return (
        "# Settings\n\n"
        "Environment variables, read with Dagster's `EnvVar` when the code location loads "
        "(the live path's on every sensor tick). Generated from `backfill_platform/settings.py` "
        "by `python -m backfill_platform.settings`; a test fails when this page and the code "
        "differ.\n\n"
        "| variable | default | meaning |\n|---|---|---|\n"
        f"{rows}\n\n"
        "Read by Dagster or the Makefile:\n\n"
        "| variable | default | meaning |\n|---|---|---|\n"
        f"{other}\n"
    )


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


if __name__ == "__main__":
    SETTINGS_PAGE.write_text(settings_page())
    print(f"wrote {SETTINGS_PAGE.relative_to(Path.cwd().resolve())}")
    sys.exit(0)
