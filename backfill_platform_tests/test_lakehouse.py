"""The write path itself: replace a range atomically, refuse what would corrupt the table."""

from datetime import date
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
from pyspark.sql import functions as F

from backfill_platform.checks.drift import commit_profiles, profiles
from backfill_platform.operations.decommission import decommission
from backfill_platform.ranges import DayRange
from backfill_platform.resources import LakehouseResource
from backfill_platform.resources import lakehouse as lakehouse_module
from backfill_platform.resources.delta_files import USER_METADATA_CONF, ZeroCopyUnavailable
from backfill_platform.resources.lakehouse import PartitionFiles, TableWriteError
from backfill_platform.resources.maintenance import vacuum
from backfill_platform.tables import table
from backfill_platform_tests.harness import spark_resource_for_tests

TABLE = "marts/example"


@pytest.fixture
def lake(tmp_path, spark) -> LakehouseResource:
    return LakehouseResource(root_dir=str(tmp_path / "lake"), spark=spark_resource_for_tests())


def _days(spark, rows):
    return spark.createDataFrame(rows, "d string, v int").select(
        F.to_date("d").alias("d"), F.col("v")
    )


def _table(lake, name=TABLE):
    return sorted((str(r["d"]), r["v"]) for r in lake.read(name).collect())


def test_replace_range_replaces_exactly_the_range_and_is_idempotent(lake, spark):
    lake.replace_range(
        TABLE,
        _days(spark, [("2024-01-01", 1), ("2024-01-02", 2), ("2024-01-03", 3)]),
        "d",
        date(2024, 1, 1),
        date(2024, 1, 4),
        {"why": "first"},
    )
    # A re-run of the middle day with new content replaces that day only.
    for _ in range(2):
        commit = lake.replace_range(
            TABLE, _days(spark, [("2024-01-02", 20)]), "d", date(2024, 1, 2), date(2024, 1, 3), {}
        )
    assert _table(lake) == [("2024-01-01", 1), ("2024-01-02", 20), ("2024-01-03", 3)]
    assert commit.rows_written == 1 and commit.rows_removed == 1
    # An empty output for a day means the day now has no rows: replaced, not skipped.
    lake.replace_range(TABLE, _days(spark, []), "d", date(2024, 1, 3), date(2024, 1, 4), {})
    assert _table(lake) == [("2024-01-01", 1), ("2024-01-02", 20)]
    assert lake.delta_table(TABLE).detail().first()["partitionColumns"] == ["d"]


def test_rows_outside_the_range_are_refused_and_the_table_is_unchanged(lake, spark):
    lake.replace_range(
        TABLE, _days(spark, [("2024-01-01", 1)]), "d", date(2024, 1, 1), date(2024, 1, 2), {}
    )
    version = lake.current_version(TABLE)
    for bad in ([("2024-01-01", 5), ("2024-01-09", 9)], [(None, 7)]):
        with pytest.raises(TableWriteError, match=r"outside the run's partition range"):
            lake.replace_range(
                TABLE, _days(spark, bad), "d", date(2024, 1, 1), date(2024, 1, 2), {}
            )
    assert lake.current_version(TABLE) == version
    assert _table(lake) == [("2024-01-01", 1)]


def test_the_write_that_creates_a_table_refuses_rows_outside_its_range_too(lake, spark):
    """Delta enforces replaceWhere only on an existing table (found by the reliability
    properties): the first write must not scatter stray rows into other partitions."""
    for bad in ([("2024-01-01", 1), ("2024-01-09", 9)], [(None, 7)]):
        with pytest.raises(TableWriteError, match=r"outside the run's partition range"):
            lake.replace_range(
                TABLE, _days(spark, bad), "d", date(2024, 1, 1), date(2024, 1, 2), {}
            )
        assert not lake.exists(TABLE)


def test_a_shared_table_is_replaced_on_its_partitions_alone_until_another_writer_is_there(
    lake, spark
):
    """raw/orders' write path owns its landing rows only (the stream's have a kafka_topic).
    Where the range holds none of the stream's rows, the replace drops the range's files
    on the partition column alone, without reading them (a data predicate made Delta read
    and rewrite every file of a re-ingested range); where it holds some, only the owned
    rows are replaced. Either way a row the path does not own is refused."""
    name, day1, day2, end = "raw/orders", date(2024, 1, 1), date(2024, 1, 2), date(2024, 1, 3)

    def rows(values):
        return spark.createDataFrame(values, "d string, v int, kafka_topic string").select(
            F.to_date("d").alias("ingest_date"), "v", "kafka_topic"
        )

    def last_predicate():
        return lake.delta_table(name).history(1).first()["operationParameters"]["predicate"]

    landing = [("2024-01-01", 1, None), ("2024-01-02", 2, None)]
    lake.replace_range(name, rows(landing), "ingest_date", day1, end, {})
    files = lake.detail(name).num_files
    commit = lake.replace_range(name, rows(landing), "ingest_date", day1, end, {})
    assert "kafka_topic" not in last_predicate() and commit.files_removed == files
    lake.append(name, rows([("2024-01-02", 99, "orders")]), "ingest_date", {})
    commit = lake.replace_range(name, rows(landing), "ingest_date", day1, end, {})
    assert "kafka_topic" in last_predicate() and commit.rows_removed == 2
    assert sorted((r["v"], r["kafka_topic"]) for r in lake.read(name).collect()) == [
        (1, None),
        (2, None),
        (99, "orders"),
    ]
    version = lake.current_version(name)
    for first, last in ((day1, day2), (day1, end)):  # alone on day 1; shared over both days
        with pytest.raises(TableWriteError, match="does not own"):
            lake.replace_range(
                name, rows([("2024-01-01", 5, "orders")]), "ingest_date", first, last, {}
            )
    assert lake.current_version(name) == version


def test_a_run_reads_what_it_wrote_from_memory_while_the_table_holds_it(lake, spark, capsys):
    """A kept range is read from memory at its write's version only, and reads exactly as
    the table does; a wider range, an older version or the range after another writer's
    commit is read from the table, and a shared table is never kept."""
    jan = [date(2024, 1, day) for day in range(1, 5)]
    lake.replace_range(
        TABLE, _days(spark, [("2024-01-01", 1), ("2024-01-02", 2)]), "d", jan[0], jan[2], {}
    )
    lake.replace_range(
        TABLE,
        _days(spark, [("2024-01-02", 20), ("2024-01-03", 30)]),
        "d",
        jan[1],
        jan[3],
        {},
        keep=True,
    )

    def read(start, end, version=None, name=TABLE, column="d"):
        df = lake.read_range(name, column, start, end, version)
        df.explain()
        return sorted(tuple(r)[:2] for r in df.collect()), "InMemory" in capsys.readouterr().out

    written = [(date(2024, 1, 2), 20), (date(2024, 1, 3), 30)]
    assert read(jan[1], jan[3]) == (written, True)
    assert read(jan[1], jan[3], version=1) == (written, True)
    assert read(jan[2], jan[3]) == (written[1:], True)
    assert read(jan[0], jan[3]) == ([(jan[0], 1), *written], False)  # wider: the table
    assert read(jan[0], jan[2], version=0) == ([(jan[0], 1), (jan[1], 2)], False)
    assert read(jan[3], date(2024, 1, 5)) == ([], False)  # outside what was kept
    lake.replace_range(TABLE, _days(spark, [("2024-01-03", 31)]), "d", jan[2], jan[3], {})
    assert read(jan[1], jan[3]) == ([written[0], (jan[2], 31)], False)

    shared = spark.createDataFrame([("2024-01-01", 1, None)], "d string, v int, kafka_topic string")
    rows = shared.select(F.to_date("d").alias("ingest_date"), "v", "kafka_topic")
    lake.replace_range("raw/orders", rows, "ingest_date", jan[0], jan[1], {}, keep=True)
    assert read(jan[0], jan[1], name="raw/orders", column="ingest_date") == (
        [(jan[0], 1)],
        False,
    )


def test_new_columns_are_added_dropped_or_retyped_columns_refused(lake, spark):
    day = (date(2024, 1, 1), date(2024, 1, 2))
    lake.replace_range(TABLE, _days(spark, [("2024-01-01", 1)]), "d", *day, {})
    wider = _days(spark, [("2024-01-01", 2)]).withColumn("extra", F.lit("x"))
    lake.replace_range(TABLE, wider, "d", *day, {})
    assert "extra" in lake.read(TABLE).columns
    version = lake.current_version(TABLE)
    with pytest.raises(TableWriteError, match=r"drops column\(s\) \['extra'\]"):
        lake.replace_range(TABLE, _days(spark, [("2024-01-01", 3)]), "d", *day, {})
    retyped = wider.withColumn("v", F.col("v").cast("string"))
    with pytest.raises(TableWriteError, match=r"retypes column\(s\) v: int -> string"):
        lake.replace_range(TABLE, retyped, "d", *day, {})
    assert lake.current_version(TABLE) == version


def test_every_commit_carries_its_metadata(lake, spark):
    commit = lake.replace_range(
        TABLE,
        _days(spark, [("2024-01-01", 1)]),
        "d",
        date(2024, 1, 1),
        date(2024, 1, 2),
        {"dagster_run_id": "run-1", "code_version": "v7"},
    )
    latest = lake.history(TABLE, limit=1)[0]
    assert latest["version"] == commit.version
    assert latest["metadata"]["dagster_run_id"] == "run-1"
    assert latest["metadata"]["code_version"] == "v7"
    assert lake.covers(TABLE, date(2024, 1, 1)) and not lake.covers(TABLE, date(2024, 1, 2))


def test_covered_days_reads_the_newest_commits_then_the_whole_history(lake, spark, monkeypatch):
    """A day written past the newest commits the log is read for is found in the history."""
    monkeypatch.setattr(lakehouse_module, "_NEWEST_COMMITS", 2)
    for day in (1, 2, 3, 5):  # versions 0..3; day 4 never written
        start = date(2024, 1, day)
        lake.replace_range(
            TABLE, _days(spark, [(start.isoformat(), day)]), "d", start, start.replace(day=day + 1),
            {},
        )  # fmt: skip
    days = [date(2024, 1, d) for d in range(1, 7)]
    assert lake.covered_days(TABLE, days) == {date(2024, 1, d) for d in (1, 2, 3, 5)}
    assert lake.covers(TABLE, date(2024, 1, 1)) and not lake.covers(TABLE, date(2024, 1, 4))
    assert lake.covered_days("marts/absent", days) == set()


def _revenue(spark, days_and_orders):
    return spark.createDataFrame(
        [(date(2024, 1, d), n) for d, n in days_and_orders], "event_date date, orders int"
    )


def test_commit_changes_reads_one_replace_from_the_change_feed_or_declines(lake, spark):
    """A replace's removed and written rows come from Delta's change feed of that commit
    alone, within the asked days; a commit that changed the schema, or a table created
    without the feed, is declined (None), so the caller reads the two versions instead."""
    name, first, last = "marts/fct_daily_revenue", date(2024, 1, 1), date(2024, 1, 4)
    lake.replace_range(
        name, _revenue(spark, [(1, 1), (2, 2), (3, 3)]), "event_date", first, last, {}
    )
    second, third = date(2024, 1, 2), date(2024, 1, 3)
    commit = lake.replace_range(name, _revenue(spark, [(2, 20)]), "event_date", second, third, {})
    changes = lake.commit_changes(name, commit.version, first, last)
    assert sorted(
        (r["_change_type"], r["event_date"].day, r["orders"]) for r in changes.collect()
    ) == [
        ("delete", 2, 2),
        ("insert", 2, 20),
    ]
    assert lake.commit_changes(name, commit.version, third, last).count() == 0
    widened = lake.replace_range(
        name,
        _revenue(spark, [(3, 30)]).withColumn("paid_orders", F.lit(1)),
        "event_date",
        third,
        last,
        {},
    )
    assert lake.commit_changes(name, widened.version, first, last) is None

    feed_off = {"spark.databricks.delta.properties.defaults.enableChangeDataFeed": "false"}
    with lake.spark.temporary_conf(feed_off):
        lake.replace_range("staging/orders", _orders(spark, 1), "event_date", first, second, {})
    again = lake.replace_range("staging/orders", _orders(spark, 2), "event_date", first, second, {})
    assert lake.commit_changes("staging/orders", again.version, first, second) is None


def _orders(spark, amount):
    return spark.createDataFrame(
        [("o1", date(2024, 1, 1), amount), ("o2", date(2024, 1, 1), None)],
        "order_id string, event_date date, amount int",
    )


def test_drift_profiles_a_commit_the_feed_missed_by_time_travel(lake, spark):
    """A feed switched on after a commit (ALTER TABLE) holds no record of it: the drift
    profiles of that commit fall back to the two versions, with the same figures."""
    registered, run = table("staging/orders"), DayRange("2024-01-01", "2024-01-01")
    first, second = date(2024, 1, 1), date(2024, 1, 2)
    with lake.spark.temporary_conf(
        {"spark.databricks.delta.properties.defaults.enableChangeDataFeed": "false"}
    ):
        lake.replace_range("staging/orders", _orders(spark, 1), "event_date", first, second, {})
        commit = lake.replace_range(
            "staging/orders", _orders(spark, 5), "event_date", first, second, {}
        )
    path = lake.table_path("staging/orders")
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    # The log cannot tell (no metadata changed at that commit); the feed's read can.
    assert lake.commit_changes("staging/orders", commit.version, first, second) is not None
    by_versions = profiles(
        lake.read_partitions("staging/orders", first, second, commit.version - 1),
        lake.read_partitions("staging/orders", first, second, commit.version),
        "event_date",
        "order_id",
        ["amount"],
    )
    assert commit_profiles(lake, registered, run, commit.version, own_commit=True) == by_versions
    assert by_versions[0]["2024-01-01"]["sum:amount"] == 1.0
    assert by_versions[1]["2024-01-01"]["sum:amount"] == 5.0

    # A commit the feed holds gives the same figures as the two versions.
    feed = lake.replace_range("staging/orders", _orders(spark, 7), "event_date", first, second, {})
    assert lake.commit_changes("staging/orders", feed.version, first, second) is not None
    assert commit_profiles(lake, registered, run, feed.version, own_commit=True) == profiles(
        lake.read_partitions("staging/orders", first, second, feed.version - 1),
        lake.read_partitions("staging/orders", first, second, feed.version),
        "event_date",
        "order_id",
        ["amount"],
    )


def test_table_state_is_read_through_delta_and_the_storage(lake, spark):
    """Live files per partition from Delta's snapshot, every stored file (replaced ones
    too) from the storage, and what VACUUM took from a version, without local paths."""
    days = (date(2024, 1, 1), date(2024, 1, 4))
    rows = [("2024-01-01", 1), ("2024-01-02", 2), ("2024-01-02", 3), ("2024-01-03", 4)]
    lake.replace_range(TABLE, _days(spark, rows), "d", *days, {})
    lake.replace_range(
        TABLE, _days(spark, [("2024-01-03", 5)]), "d", date(2024, 1, 3), date(2024, 1, 4), {}
    )
    live = lake.partition_files(TABLE)
    assert {p: (f.files, f.rows) for p, f in live.items()} == {
        "2024-01-01": (1, 1),
        "2024-01-02": (1, 2),
        "2024-01-03": (1, 1),
    }
    detail = lake.detail(TABLE)
    assert detail.partition_columns == ("d",)
    assert detail.num_files == 3
    assert detail.size_in_bytes == sum(f.bytes for f in live.values())
    assert lake.partition_files(TABLE, ["2024-01-02", "2024-01-09"]) == {
        "2024-01-02": live["2024-01-02"]
    }
    assert lake.partition_files(TABLE, version=0)["2024-01-03"].rows == 1

    stored = lake.stored_files(TABLE)
    assert [f.partition for f in stored].count("2024-01-03") == 2  # the replaced file stays
    assert all(f.name.startswith("d=2024-01-0") and f.name.endswith(".parquet") for f in stored)
    assert sum(f.size for f in stored if f.partition != "2024-01-03") == sum(
        live[p].bytes for p in ("2024-01-01", "2024-01-02")
    )
    assert lake.missing_files(TABLE, 0) == []

    assert vacuum(lake, TABLE, retention_hours=0) == 1
    assert len(lake.stored_files(TABLE)) == 3
    (gone,) = lake.missing_files(TABLE, 0)
    assert "d=2024-01-03/" in gone
    assert lake.partition_files(TABLE) == live
    assert lake.detail("marts/absent") is None and lake.partition_files("marts/absent") == {}
    assert lake.stored_files("marts/absent") == []
    assert live["2024-01-01"] == PartitionFiles(1, live["2024-01-01"].bytes, 1)


def test_exists_means_a_table_at_exactly_that_path(lake, spark):
    lake.replace_range(
        TABLE, _days(spark, [("2024-01-01", 1)]), "d", date(2024, 1, 1), date(2024, 1, 2), {}
    )
    assert lake.exists(TABLE)
    assert not lake.exists(f"{TABLE}/d=2024-01-01")  # inside a table is not a table
    assert not lake.exists("marts/absent")
    Path(lake.table_path("marts/empty"), "_delta_log").mkdir(parents=True)
    assert not lake.exists("marts/empty")  # a log folder without a commit


def test_a_uri_root_is_addressed_as_a_uri(tmp_path, monkeypatch):
    """An object-store root is never turned into a local path (no Spark needed for this)."""
    monkeypatch.chdir(tmp_path)
    lake = LakehouseResource(
        root_dir="s3a://bucket/lake/",
        spark=spark_resource_for_tests(),
        shadow_suffix="v2",
        shadow_tables=["marts/fct_daily_revenue"],
    )
    assert lake.table_path("raw/orders") == "s3a://bucket/lake/raw/orders"
    assert lake.table_path("marts/fct_daily_revenue") == (
        "s3a://bucket/lake/marts/fct_daily_revenue__shadow_v2"
    )
    with lake.table_lock("raw/orders"):
        pass
    assert list(tmp_path.iterdir()) == []  # no `s3a:` folder appeared in the working dir
    local = LakehouseResource(root_dir=str(tmp_path / "lake"), spark=spark_resource_for_tests())
    assert local.table_path("raw/orders") == str((tmp_path / "lake" / "raw" / "orders").resolve())


FCT = "marts/fct_daily_revenue"  # a registered table: decommission finds its shadows


def _range_inodes(lake, name, first, last):
    files = lake.read_range(name, "d", first, last).select("_metadata.file_path").distinct()
    stats = [Path(unquote(urlparse(r[0]).path)).stat() for r in files.collect()]
    return {(s.st_ino, s.st_nlink) for s in stats}


def test_zero_copy_cutover_adopts_the_shadows_files_and_outlives_the_shadow(lake, spark):
    """Zero-copy: the range's files are the shadow's own (no data written), one commit;
    dropping the shadow and VACUUMing production to zero retention leaves every partition
    of production readable."""
    first, last = date(2024, 1, 2), date(2024, 1, 4)
    lake.replace_range(
        FCT, _days(spark, [(f"2024-01-0{d}", d) for d in range(1, 6)]), "d",
        date(2024, 1, 1), date(2024, 1, 6), {},
    )  # fmt: skip
    shadow = lake.shadowing("fix", [FCT])
    shadow.replace_range(
        FCT, _days(spark, [("2024-01-02", 20), ("2024-01-03", 30)]), "d", first, last, {}
    )
    before = lake.current_version(FCT)
    commit = lake.adopt_range(
        FCT, shadow, "d", first, last, {"operation": "cutover", "shadow_suffix": "fix"},
        source_version=shadow.current_version(FCT),
    )  # fmt: skip
    expected = [("2024-01-01", 1), ("2024-01-02", 20), ("2024-01-03", 30), ("2024-01-04", 4),
                ("2024-01-05", 5)]  # fmt: skip
    assert _table(lake, FCT) == expected
    assert spark.conf.get(USER_METADATA_CONF, None) is None  # the commit's metadata only
    assert commit.version == before + 1
    assert (commit.rows_written, commit.rows_removed) == (2, 2)
    assert (commit.files_written, commit.files_removed, commit.bytes_written) == (2, 2, 0)
    # Each production file of the range is the shadow's file: same inode, two links.
    adopted = _range_inodes(lake, FCT, first, last)
    assert adopted == _range_inodes(shadow, FCT, first, last)
    assert {links for _, links in adopted} == {2}
    (latest,) = lake.history(FCT, limit=1)
    assert latest["operation"] == "Manual Update" and latest["metadata"]["operation"] == "cutover"
    assert (latest["metadata"]["partition_start"], latest["metadata"]["partition_end"]) == (
        "2024-01-02",
        "2024-01-04",
    )

    gone = decommission(
        lake, "fix", retention_hours=0, vacuum_retention_hours=0, shorten_history=True
    )
    assert gone.dropped == [f"{FCT}__shadow_fix"] and gone.vacuumed == [FCT]
    assert not Path(shadow.table_path(FCT)).exists()
    assert lake.missing_files(FCT, before)  # VACUUM did run: the replaced files are gone
    assert _table(lake, FCT) == expected
    assert {links for _, links in _range_inodes(lake, FCT, first, last)} == {1}


def test_zero_copy_where_it_cannot_apply_is_refused_and_touches_nothing(lake, spark, tmp_path):
    day = (date(2024, 1, 1), date(2024, 1, 2))
    lake.replace_range(FCT, _days(spark, [("2024-01-01", 1)]), "d", *day, {})
    shadow = lake.shadowing("fix", [FCT])
    wider = _days(spark, [("2024-01-01", 2)]).withColumn("note", F.lit("x"))
    shadow.replace_range(FCT, wider, "d", *day, {})
    version, files = lake.current_version(FCT), sorted(Path(lake.table_path(FCT)).rglob("*"))
    with pytest.raises(ZeroCopyUnavailable, match="schema differs"):
        lake.adopt_range(FCT, shadow, "d", *day, {})
    with pytest.raises(ZeroCopyUnavailable, match="not both partitioned by v alone"):
        lake.adopt_range(FCT, shadow, "v", *day, {})
    assert lake.current_version(FCT) == version
    assert sorted(Path(lake.table_path(FCT)).rglob("*")) == files
    remote = LakehouseResource(root_dir="s3a://bucket/lake", spark=spark_resource_for_tests())
    assert "object store" in remote.zero_copy_blocker(FCT, remote.shadowing("fix", [FCT]), "d")
    assert "second writer" in lake.zero_copy_blocker("raw/orders", shadow, "event_date")
