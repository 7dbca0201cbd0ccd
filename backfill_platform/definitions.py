"""The code location: every asset, check, schedule and sensor, with resources from settings."""

from __future__ import annotations

from pathlib import Path

from dagster import Definitions, in_process_executor

from backfill_platform.assets import all_assets, shadow_assets
from backfill_platform.assets.freshness import stream_freshness_policy, with_stream_freshness
from backfill_platform.automation import all_jobs, all_schedules, all_sensors
from backfill_platform.checks import all_checks
from backfill_platform.checks.stream import stream_checks
from backfill_platform.operations.launchpad import operations_jobs
from backfill_platform.resources import (
    CrmResource,
    DeltaIOManager,
    LakehouseResource,
    LandingZoneResource,
    SparkSessionResource,
)
from backfill_platform.resources.kafka import orders_topic_from_settings
from backfill_platform.resources.storage import local_path
from backfill_platform.settings import (
    CRM_CONCURRENCY,
    CRM_LIMITER,
    CRM_LIMITER_BACKEND,
    CRM_LIVE_RESERVE,
    CRM_MAX_ATTEMPTS,
    CRM_RATE_LIMIT,
    CRM_TOKEN,
    CRM_URL,
    LAKEHOUSE_DIR,
    LANDING_DIR,
    PG_HOST,
    S3_ACCESS_KEY_ID,
    S3_ENDPOINT,
    S3_PATH_STYLE,
    S3_REGION,
    S3_SECRET_ACCESS_KEY,
    SPARK_DRIVER_MEMORY,
    SPARK_MASTER,
    SPARK_SHUFFLE_PARTITIONS,
    STREAM_CHECK,
    SettingError,
    bool_setting,
    fraction_setting,
    int_setting,
    secret_setting,
    setting,
)


def build_resources(
    landing_dir: str | None = None,
    lakehouse_dir: str | None = None,
    spark: SparkSessionResource | None = None,
    codegen_cache_entries: int | None = None,
) -> dict[str, object]:
    """Resources from settings; tests and tools pass their own directories, the stream's
    process its smaller cache of compiled classes (`STREAM_CODEGEN_CACHE_ENTRIES`)."""
    spark = spark or SparkSessionResource(
        **({"codegen_cache_entries": codegen_cache_entries} if codegen_cache_entries else {}),
        master=setting(SPARK_MASTER),
        shuffle_partitions=int_setting(SPARK_SHUFFLE_PARTITIONS),
        driver_memory=setting(SPARK_DRIVER_MEMORY),
        s3_endpoint=setting(S3_ENDPOINT),
        s3_region=setting(S3_REGION),
        s3_path_style=bool_setting(S3_PATH_STYLE),
        s3_access_key_id=secret_setting(S3_ACCESS_KEY_ID),
        s3_secret_access_key=secret_setting(S3_SECRET_ACCESS_KEY),
    )
    root = lakehouse_dir or setting(LAKEHOUSE_DIR)
    lakehouse = LakehouseResource(root_dir=root, spark=spark)
    return {
        "crm": build_crm(root),
        "spark": spark,
        "landing": LandingZoneResource(
            landing_dir=landing_dir or setting(LANDING_DIR), spark=spark
        ),
        "lakehouse": lakehouse,
        "io_manager": DeltaIOManager(lakehouse=lakehouse),
        "orders_topic": orders_topic_from_settings(),
    }


def build_crm(lakehouse_dir: str) -> CrmResource:
    """The CRM client from settings, with the rate limiter `crm_limiter_choice` picks."""
    backend, path = crm_limiter_choice(lakehouse_dir)
    return CrmResource(
        url=setting(CRM_URL),
        token=CRM_TOKEN,
        rate_limit=int_setting(CRM_RATE_LIMIT),
        live_reserve=fraction_setting(CRM_LIVE_RESERVE),
        max_attempts=int_setting(CRM_MAX_ATTEMPTS),
        concurrency=int_setting(CRM_CONCURRENCY),
        limiter_backend=backend,
        limiter_path=path,
    )


def crm_limiter_choice(lakehouse_dir: str) -> tuple[str, str]:
    """("postgres", "") or ("sqlite", file) for the CRM rate limiter (docs/crm.md).

    `auto` (the default): the file BACKFILL_CRM_LIMITER names, else the Dagster instance's
    PostgreSQL when DAGSTER_PG_HOST is set (every machine of the deployment reaches it), else
    `crm_rate_limit.sqlite` beside a local lakehouse root. An `s3a://` root with no shared
    limiter is refused: its runs may start on several machines, each with its own file,
    together sending a multiple of the limit."""
    choice = setting(CRM_LIMITER_BACKEND).strip().lower() or "auto"
    if choice not in ("auto", "sqlite", "postgres"):
        raise SettingError(f"BACKFILL_CRM_LIMITER_BACKEND={choice!r}: not auto, sqlite or postgres")
    path, pg_host = setting(CRM_LIMITER).strip(), setting(PG_HOST).strip()
    if choice == "auto":
        choice = "sqlite" if path or not pg_host else "postgres"
    if choice == "postgres":
        if not pg_host:
            raise SettingError(
                "BACKFILL_CRM_LIMITER_BACKEND=postgres but DAGSTER_PG_HOST is empty: the limiter "
                "uses the Dagster instance's PostgreSQL (DAGSTER_PG_HOST, _PORT, _USERNAME, "
                "_PASSWORD, _DB)"
            )
        return "postgres", ""
    if path:
        return "sqlite", path
    local_root = local_path(lakehouse_dir)
    if local_root is None:
        raise SettingError(
            f"BACKFILL_LAKEHOUSE_DIR={lakehouse_dir} is object storage, so runs may start on "
            "several machines, but the CRM rate limiter would be a file per machine: set "
            "DAGSTER_PG_* (the Dagster instance's PostgreSQL; BACKFILL_CRM_LIMITER_BACKEND="
            "postgres) or BACKFILL_CRM_LIMITER to a file every run's machine shares"
        )
    return "sqlite", default_limiter_path(local_root)


def default_limiter_path(lakehouse_dir: str) -> str:
    """The SQLite file beside a local lakehouse root (one machine's processes share it)."""
    return str(Path(lakehouse_dir).resolve().parent / "crm_rate_limit.sqlite")


defs = Definitions(
    assets=[*with_stream_freshness(all_assets, stream_freshness_policy()), *shadow_assets],
    # The boundary check asks the broker in every raw/orders run: only where the deployment
    # runs the stream and says so (checks/stream.py).
    asset_checks=[*all_checks, *(stream_checks if bool_setting(STREAM_CHECK) else [])],
    resources=build_resources(),
    jobs=[*all_jobs, *operations_jobs],
    schedules=all_schedules,
    sensors=all_sensors,
    # One process and one Spark session per run: a ranged run pays JVM start-up once.
    executor=in_process_executor,
)
