"""Table upkeep: the weekly VACUUM (replaced files leave the disk, the live table does not
change, a retention shorter than the shadow retention is refused) and the compaction of the
stream's small files (a bound on files per day, no row changed, writers never conflicted)."""

import time
from datetime import date
from pathlib import Path

from dagster import DagsterEventType, DagsterInstance
from pyspark.sql import functions as F

from backfill_platform.automation.maintenance import lakehouse_vacuum_job, weekly_vacuum_schedule
from backfill_platform.resources import LakehouseResource
from backfill_platform.resources.maintenance import DayCompactor, compact_days, small_files
from backfill_platform.tables import RAW_ORDERS
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


# -- compaction of raw/orders' small stream files -------------------------------------------
DAY, NEXT = "2024-01-10", "2024-01-11"
APP = "raw_orders_stream:test"


def _messages(spark, batch: int, days: list[str], per_day: int = 3):
    """A stream batch's raw rows: `per_day` messages per ingest day, offsets of their own."""
    return spark.createDataFrame(
        [
            (day, "orders", batch * 100 + n * 10 + i, f"m{batch}-{n}-{i}")
            for n, day in enumerate(days)
            for i in range(per_day)
        ],
        "day string, kafka_topic string, kafka_offset long, line string",
    ).select(F.to_date("day").alias("ingest_date"), "kafka_topic", "kafka_offset", "line")


def _landing(spark, day: str, lines: list[str]):
    return spark.createDataFrame(
        [(day, None, None, line) for line in lines],
        "day string, kafka_topic string, kafka_offset long, line string",
    ).select(F.to_date("day").alias("ingest_date"), "kafka_topic", "kafka_offset", "line")


def _append(lake: LakehouseResource, spark, batch: int, days: list[str]):
    """One batch as the stream appends it: one file per ingest day, Delta's idempotent append."""
    rows = _messages(spark, batch, days).repartition("ingest_date")
    meta = {"writer": "stream", "batch_id": batch, "rows": 3 * len(days)}
    return lake.append_once(RAW_ORDERS, rows, "ingest_date", APP, batch, meta)


def _rows(lake: LakehouseResource) -> list[tuple]:
    return sorted((tuple(r) for r in lake.read(RAW_ORDERS).collect()), key=str)


def test_compaction_bounds_a_days_small_files_and_changes_no_row(tmp_path, spark):
    """A day is compacted once it holds N small files, so after each batch's round it holds
    fewer than N, whatever its batch count; the landing file of the day is merged too. The
    compaction commits no data change: the rows, the idempotent append's bookkeeping (a
    replayed batch is still skipped) and everything that reads raw's commits are as before,
    and a landing re-ingest of the compacted day replaces only its own rows."""
    lake = LakehouseResource(root_dir=str(tmp_path / "lake"), spark=spark_resource_for_tests())
    landing = lake.replace_range(
        RAW_ORDERS,
        _landing(spark, DAY, ["l1", "l2"]),
        "ingest_date",
        date(2024, 1, 10),
        date(2024, 1, 11),
        {"dagster_run_id": "landing-run"},
    )
    built = lake.built_partitions(RAW_ORDERS)
    n, compacted, written = 3, [], _rows(lake)
    for batch in range(6):
        days = [DAY, NEXT] if batch < 2 else [DAY]
        _append(lake, spark, batch, days)
        written += [tuple(r) for r in _messages(spark, batch, days).collect()]
        done = compact_days(lake, RAW_ORDERS, [DAY, NEXT], min_files=n)
        assert all(count < n for count in small_files(lake, RAW_ORDERS).values())
        if done is not None:
            assert done.small_files == {DAY: n} and done.files_removed == n
            assert done.files_added == 1 and done.seconds > 0
            compacted.append(batch)
    # The landing file and 6 batch files: compacted at 3, then at 1 + 2 new, twice.
    assert compacted == [1, 3, 5] and small_files(lake, RAW_ORDERS) == {DAY: 1, NEXT: 2}
    assert _rows(lake) == sorted(written, key=str)  # no row changed, none lost or copied
    history = lake.history(RAW_ORDERS)
    optimized = [c for c in history if c["operation"] == "OPTIMIZE"]
    assert len(optimized) == 3 and all(c["metadata"] == {} for c in optimized)
    # Readers of raw's commits skip them: they find the landing run's commit as before.
    assert lake.built_partitions(RAW_ORDERS) == built
    assert built[DAY]["version"] == landing.version
    assert lake.covered_days(RAW_ORDERS, [date(2024, 1, 10)]) == {date(2024, 1, 10)}

    # A batch re-run after the compactions (a restarted stream) is still skipped by Delta.
    version = lake.current_version(RAW_ORDERS)
    assert _append(lake, spark, 4, [DAY]) is None
    assert lake.current_version(RAW_ORDERS) == version

    # The landing path re-ingests the compacted day: its own rows replaced, the stream's kept
    # (Delta rewrites them beside the new lines; the commit counts only the lines it wrote).
    commit = lake.replace_range(
        RAW_ORDERS,
        _landing(spark, DAY, ["l1", "l2", "l3"]),
        "ingest_date",
        date(2024, 1, 10),
        date(2024, 1, 11),
        {"dagster_run_id": "re-ingest"},
    )
    assert commit.rows_written == 3 and commit.rows_removed == 2
    lines = [tuple(r) for r in _landing(spark, DAY, ["l1", "l2", "l3"]).collect()]
    assert _rows(lake) == sorted([*(r for r in written if r[1] is not None), *lines], key=str)


def test_compaction_gives_way_to_a_writer_holding_the_table(tmp_path, spark):
    """While another writer (a landing run, the stream's append) holds raw/orders' lock, a
    compaction commits nothing and says why; the compactor tries the day again later, and
    its last round compacts it once the table is free."""
    lake = LakehouseResource(root_dir=str(tmp_path / "lake"), spark=spark_resource_for_tests())
    for batch in range(3):
        _append(lake, spark, batch, [DAY])
    version = lake.current_version(RAW_ORDERS)
    with lake.table_lock(RAW_ORDERS):
        done = compact_days(lake, RAW_ORDERS, [DAY], min_files=3)
        assert done.gave_way == "another writer holds the table" and done.files_removed == 0
        assert lake.current_version(RAW_ORDERS) == version
        heard = []
        compactor = DayCompactor(lake, RAW_ORDERS, min_files=3, on_round=heard.append)
        compactor.note([DAY])
        deadline = time.monotonic() + 120
        while not heard and time.monotonic() < deadline:
            time.sleep(0.2)
        assert heard and heard[0].gave_way  # its round found the day, and the table held
    assert compactor.close()[-1].files_removed == 3  # the last round, once free
    assert small_files(lake, RAW_ORDERS) == {DAY: 1}
    assert lake.current_version(RAW_ORDERS) == version + 1


def test_the_compactor_counts_appends_and_reads_the_log_after_another_writer(tmp_path, spark):
    """The compactor adds one file per noted append to a day's count; a commit it did not
    see (here a landing run's replace of the day, one more small file) makes it count the
    day from the log at the next append, so the day is compacted at the threshold although
    only four of its five small files came from the stream's appends."""
    lake = LakehouseResource(root_dir=str(tmp_path / "lake"), spark=spark_resource_for_tests())
    _append(lake, spark, 0, [DAY])
    compactor = DayCompactor(lake, RAW_ORDERS, min_files=5)
    for batch in (1, 2):
        compactor.note([DAY], _append(lake, spark, batch, [DAY]).version)
    lake.replace_range(
        RAW_ORDERS,
        _landing(spark, DAY, ["l1"]),
        "ingest_date",
        date(2024, 1, 10),
        date(2024, 1, 11),
        {"dagster_run_id": "landing-run"},
    )
    compactor.note([DAY], _append(lake, spark, 3, [DAY]).version)
    deadline = time.monotonic() + 120
    while small_files(lake, RAW_ORDERS) != {DAY: 1} and time.monotonic() < deadline:
        time.sleep(0.5)
    rounds = compactor.close()
    assert [r.small_files for r in rounds] == [{DAY: 5}], rounds
    assert small_files(lake, RAW_ORDERS) == {DAY: 1}
