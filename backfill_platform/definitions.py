"""The code location: every asset, check, schedule and sensor, with resources from settings."""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

from dagster import Definitions, in_process_executor

from backfill_platform.assets import all_assets, shadow_assets
from backfill_platform.automation import all_jobs, all_schedules, all_sensors
from backfill_platform.checks import all_checks
from backfill_platform.operations.launchpad import operations_jobs
from backfill_platform.resources import (
    CrmResource,
    DeltaIOManager,
    LakehouseResource,
    LandingZoneResource,
    SparkSessionResource,
)
from backfill_platform.resources.storage import is_uri
from backfill_platform.settings import (
    CRM_CONCURRENCY,
    CRM_LIMITER,
    CRM_LIVE_RESERVE,
    CRM_MAX_ATTEMPTS,
    CRM_RATE_LIMIT,
    CRM_TOKEN,
    CRM_URL,
    LAKEHOUSE_DIR,
    LANDING_DIR,
    S3_ACCESS_KEY_ID,
    S3_ENDPOINT,
    S3_PATH_STYLE,
    S3_REGION,
    S3_SECRET_ACCESS_KEY,
    SPARK_DRIVER_MEMORY,
    SPARK_MASTER,
    SPARK_SHUFFLE_PARTITIONS,
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
) -> dict[str, object]:
    """Resources from settings; tests and tools pass their own directories."""
    spark = spark or SparkSessionResource(
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
    }


def build_crm(lakehouse_dir: str) -> CrmResource:
    """The CRM client from settings; its limiter file defaults to one beside the lakehouse
    root, so every process of one deployment shares it (docs/crm.md)."""
    return CrmResource(
        url=setting(CRM_URL),
        token=CRM_TOKEN,
        rate_limit=int_setting(CRM_RATE_LIMIT),
        live_reserve=fraction_setting(CRM_LIVE_RESERVE),
        max_attempts=int_setting(CRM_MAX_ATTEMPTS),
        concurrency=int_setting(CRM_CONCURRENCY),
        limiter_path=setting(CRM_LIMITER) or default_limiter_path(lakehouse_dir),
    )


def default_limiter_path(lakehouse_dir: str) -> str:
    """Beside a local lakehouse root; for an object-store root (`s3a://...`), in the
    machine's temporary directory: SQLite needs a local file, so the limit is per machine
    there unless BACKFILL_CRM_LIMITER names a shared one (docs/crm.md)."""
    if is_uri(lakehouse_dir):
        digest = hashlib.sha256(lakehouse_dir.encode()).hexdigest()[:16]
        return str(Path(tempfile.gettempdir()) / f"backfill_crm_rate_limit_{digest}.sqlite")
    return str(Path(lakehouse_dir).resolve().parent / "crm_rate_limit.sqlite")


defs = Definitions(
    assets=[*all_assets, *shadow_assets],
    asset_checks=all_checks,
    resources=build_resources(),
    jobs=[*all_jobs, *operations_jobs],
    schedules=all_schedules,
    sensors=all_sensors,
    # One process and one Spark session per run: a ranged run pays JVM start-up once.
    executor=in_process_executor,
)
