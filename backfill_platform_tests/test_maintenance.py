"""The weekly VACUUM: replaced files leave the disk, the live table does not change, and a
retention shorter than the shadow retention is refused."""

from datetime import date
from pathlib import Path

from dagster import DagsterEventType, DagsterInstance
from pyspark.sql import functions as F

from backfill_platform.automation.maintenance import lakehouse_vacuum_job, weekly_vacuum_schedule
from backfill_platform.resources import LakehouseResource
from backfill_platform_tests.harness import spark_resource_for_tests

TABLE = "marts/fct_daily_revenue"  # any production table name; the schema does not matter


def _rewrite(lake: LakehouseResource, spark, value: int) -> None:
    rows = spark.createDataFrame(
        [("2024-01-01", value), ("2024-01-02", value)], "event_date string, v int"
    ).select(F.to_date("event_date").alias("event_date"), "v")
    lake.replace_range(TABLE, rows, "event_date", date(2024, 1, 1), date(2024, 1, 3), {})


def _files_on_disk(lake: LakehouseResource) -> int:
    return sum(1 for _ in Path(lake.table_path(TABLE)).rglob("*.parquet"))


def _vacuum(lake, retention_hours):
    return lakehouse_vacuum_job.execute_in_process(
        resources={"lakehouse": lake},
        run_config={"ops": {"vacuum_lakehouse": {"config": {"retention_hours": retention_hours}}}},
        instance=DagsterInstance.ephemeral(),
        raise_on_error=False,
    )


def test_vacuum_deletes_replaced_files_and_keeps_the_table(tmp_path, spark, monkeypatch):
    lake = LakehouseResource(root_dir=str(tmp_path / "lake"), spark=spark_resource_for_tests())
    for value in (1, 2, 3):
        _rewrite(lake, spark, value)
    assert _files_on_disk(lake) == 6  # 2 partitions x 3 writes, 2 of them live

    refused = _vacuum(lake, retention_hours=0)  # shadow retention is 168 h by default
    assert not refused.success
    assert "shorter than the shadow retention" in str(refused.all_events)
    assert _files_on_disk(lake) == 6

    monkeypatch.setenv("BACKFILL_SHADOW_RETENTION_HOURS", "0")
    result = _vacuum(lake, retention_hours=0)
    assert result.success
    assert _files_on_disk(lake) == 2
    assert sorted((str(r["event_date"]), r["v"]) for r in lake.read(TABLE).collect()) == [
        ("2024-01-01", 3),
        ("2024-01-02", 3),
    ]
    (observation,) = [
        e.event_specific_data.asset_observation
        for e in result.all_events
        if e.event_type == DagsterEventType.ASSET_OBSERVATION
    ]
    assert observation.metadata["vacuum_files_deleted"].value == 4
    # Delta's own retention check is restored for everyone else in the session.
    assert spark.conf.get("spark.databricks.delta.retentionDurationCheck.enabled") == "true"


def test_vacuum_runs_weekly_in_utc():
    assert weekly_vacuum_schedule.cron_schedule == "0 3 * * 0"
    assert weekly_vacuum_schedule.execution_timezone == "UTC"
