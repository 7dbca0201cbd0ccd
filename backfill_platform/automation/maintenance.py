"""Weekly VACUUM: files that re-runs replaced leave the disk once past the retention window.

Every `replace_range` leaves the partition's previous files on disk, still referenced by
older Delta versions (time travel, rollback). The live snapshot keeps one file per
partition, but without VACUUM a window re-run every day adds one file set per run on disk.
VACUUM deletes only files no version inside the retention window needs, and the window is
never shorter than the shadow retention, so a cutover can still be rolled back inside it.
"""

from dagster import (
    AssetObservation,
    Config,
    DefaultScheduleStatus,
    OpExecutionContext,
    ScheduleDefinition,
    job,
    op,
)
from pydantic import Field

from backfill_platform.refusals import refusal
from backfill_platform.resources import LakehouseResource
from backfill_platform.resources.maintenance import vacuum
from backfill_platform.settings import SHADOW_RETENTION_HOURS, VACUUM_RETENTION_HOURS, setting
from backfill_platform.tables import TABLES


class VacuumConfig(Config):
    retention_hours: float | None = Field(
        default=None,
        description="Keep files newer than this (default BACKFILL_VACUUM_RETENTION_HOURS); "
        "never below BACKFILL_SHADOW_RETENTION_HOURS.",
    )


@op(description="VACUUM every lakehouse table, keeping the retention window restorable.")
def vacuum_lakehouse(
    context: OpExecutionContext, config: VacuumConfig, lakehouse: LakehouseResource
) -> None:
    retention = (
        config.retention_hours
        if config.retention_hours is not None
        else float(setting(VACUUM_RETENTION_HOURS))
    )
    floor = float(setting(SHADOW_RETENTION_HOURS))
    if retention < floor:
        raise refusal(
            f"VACUUM retention {retention:g} h is shorter than the shadow retention "
            f"({floor:g} h): a cutover inside that window could no longer be rolled back."
        )
    for registered in TABLES:
        name = registered.name
        if not lakehouse.exists(name):
            continue
        before = len(lakehouse.stored_files(name))
        vacuum(lakehouse, name, retention)
        after = len(lakehouse.stored_files(name))
        context.log_event(
            AssetObservation(
                asset_key=registered.key,
                metadata={
                    "vacuum_retention_hours": retention,
                    "vacuum_files_deleted": before - after,
                    "files_on_disk": after,
                },
            )
        )


@job(name="lakehouse_vacuum_job", description="VACUUM files older than the retention window.")
def lakehouse_vacuum_job():
    vacuum_lakehouse()


# Sunday 03:00 UTC, after the 02:00 daily run. On by default: with the 7-day retention it
# deletes nothing a rollback inside the window could need.
weekly_vacuum_schedule = ScheduleDefinition(
    name="weekly_vacuum_schedule",
    job=lakehouse_vacuum_job,
    cron_schedule="0 3 * * 0",
    execution_timezone="UTC",
    default_status=DefaultScheduleStatus.RUNNING,
)
