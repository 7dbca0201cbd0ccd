"""Roots given as URIs go through Hadoop's FileSystem (the path object storage takes), and
the object-store keys stay out of everything but Hadoop's configuration.

The S3 server itself is exercised in `make e2e` (e2e/test_object_storage.py); here a
`file://` root takes the same code path as `s3a://` without a server.
"""

from __future__ import annotations

import stat
import time

from dagster import EnvVar

from backfill_platform.definitions import build_resources
from backfill_platform.resources import LakehouseResource, LandingZoneResource, SparkSessionResource
from backfill_platform.resources.landing import FX_RATES, ORDERS
from backfill_platform.resources.spark import (
    LOCAL_FS,
    LOCAL_FS_JAR,
    STATUS_STORE_WITHOUT_UI,
    spark_jars_dir,
)
from backfill_platform.resources.storage import hadoop_fs
from backfill_platform_tests.harness import order_line, spark_resource_for_tests


def test_a_uri_landing_zone_lists_and_counts_like_the_local_one(platform):
    platform.write_orders("2024-01-01", [order_line("a"), order_line("b"), "  ", "{bad"])
    platform.write_orders("2024-01-02", [order_line("c")], name="part-0001.jsonl")
    platform.write_bytes("orders", "ingest_date=2024-01-02", "notes.txt", b"not a delivery")
    platform.write_bytes("orders", "ingest_date=someday", "x.jsonl", b"{}\n")
    platform.write_rates("2024-01-01", {"EUR": "1.1"})
    local = LandingZoneResource(landing_dir=str(platform.landing), spark=spark_resource_for_tests())
    uri = LandingZoneResource(
        landing_dir=platform.landing.as_uri(), spark=spark_resource_for_tests()
    )
    assert uri.landing_dir.startswith("file:///")
    for kind in (ORDERS, FX_RATES):
        assert uri.delivered_days(kind) == local.delivered_days(kind)
        days = local.delivered_days(kind)
        via_fs, via_os = uri.files(kind, days), local.files(kind, days)
        assert [(f.name, f.size) for f in via_fs] == [(f.name, f.size) for f in via_os]
        assert [uri.record_count(f) for f in via_fs] == [local.record_count(f) for f in via_os]
    assert local.delivered_days(ORDERS) == ["2024-01-01", "2024-01-02"]
    assert [local.record_count(f) for f in local.files(ORDERS, ["2024-01-01"])] == [3]


def test_a_uri_lakehouse_builds_the_same_tables(platform, tmp_path):
    platform.write_rates("2024-01-01", {"EUR": "1.1"})
    platform.write_orders("2024-01-01", [order_line("a", currency="EUR"), order_line("b")])
    platform.materialize("2024-01-01")
    resources = build_resources(
        platform.landing.as_uri(),
        (tmp_path / "uri-lake").as_uri(),
        spark=spark_resource_for_tests(),
    )
    platform.resources = resources
    platform.materialize("2024-01-01")
    local = LakehouseResource(root_dir=str(platform.lakehouse), spark=spark_resource_for_tests())
    for table in ("raw/orders", "staging/orders", "marts/fct_daily_revenue"):
        rows = sorted(map(str, local.read(table).select(*_data_columns(local, table)).collect()))
        lake = resources["lakehouse"]
        assert (
            sorted(map(str, lake.read(table).select(*_data_columns(lake, table)).collect())) == rows
        )
        assert (tmp_path / "uri-lake" / table / "_delta_log").is_dir()


def _data_columns(lake: LakehouseResource, table: str) -> list[str]:
    return sorted(c for c in lake.read(table).columns if not c.startswith("_"))


def test_object_store_keys_reach_hadoop_only(monkeypatch, tmp_path):
    monkeypatch.setenv("BACKFILL_CRM_LIMITER", str(tmp_path / "shared-limiter.sqlite"))
    monkeypatch.setenv("BACKFILL_S3_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("BACKFILL_S3_SECRET_ACCESS_KEY", "wJalr-secret-value")
    monkeypatch.setenv("BACKFILL_S3_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("BACKFILL_S3_PATH_STYLE", "true")
    spark = build_resources("s3a://b/landing", "s3a://b/lake")["spark"]
    # Definitions hold the variables, not their values (the UI shows the name)...
    assert isinstance(spark.s3_secret_access_key, EnvVar)
    assert "wJalr-secret-value" not in repr(spark.__dict__)
    # ...and the session gets the value, for Hadoop's S3A only.
    conf = spark.spark_config()
    assert conf["spark.hadoop.fs.s3a.secret.key"] == "wJalr-secret-value"
    assert [k for k, v in conf.items() if v == "wJalr-secret-value"] == [
        "spark.hadoop.fs.s3a.secret.key"
    ]
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert conf["spark.delta.logStore.s3a.impl"] == "backfill_platform.S3ConditionalLogStore"


def test_without_keys_s3a_uses_the_default_credential_chain(monkeypatch, tmp_path):
    monkeypatch.setenv("BACKFILL_CRM_LIMITER", str(tmp_path / "shared-limiter.sqlite"))
    for name in ("BACKFILL_S3_ACCESS_KEY_ID", "BACKFILL_S3_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)
    conf = build_resources("s3a://b/landing", "s3a://b/lake")["spark"].spark_config()
    assert not [
        k for k in conf if k.endswith((".access.key", ".secret.key", "credentials.provider"))
    ]


def test_a_local_session_sets_the_modes_hadoop_asks_for_without_chmod(tmp_path):
    """`file://` goes through the project's file system (no `chmod` process per file), and
    it sets the mode Hadoop asks for: on a folder it creates, on a file, with a sticky bit."""
    session = spark_resource_for_tests().get_session()
    jvm = session.sparkContext._jvm
    mode = jvm.org.apache.hadoop.fs.permission.FsPermission.createImmutable
    filesystem, folder = hadoop_fs(session, (tmp_path / "made").as_uri())
    assert filesystem.getClass().getName() == LOCAL_FS
    assert filesystem.getRawFileSystem().getClass().getName() == f"{LOCAL_FS}$Raw"
    assert filesystem.mkdirs(folder, mode(0o750))
    assert stat.S_IMODE((tmp_path / "made").stat().st_mode) == 0o750
    data = tmp_path / "made" / "part-0.parquet"
    data.write_bytes(b"x")
    filesystem.setPermission(jvm.org.apache.hadoop.fs.Path(data.as_uri()), mode(0o600))
    assert stat.S_IMODE(data.stat().st_mode) == 0o600
    filesystem.setPermission(folder, mode(0o1777))  # Java cannot: Hadoop's chmod does
    assert stat.S_IMODE((tmp_path / "made").stat().st_mode) == 0o1777


def test_the_local_file_system_is_for_local_sessions_and_keeps_a_deployments_class_path():
    jar = str(spark_jars_dir() / LOCAL_FS_JAR)
    local = SparkSessionResource(master="local[2]").spark_config()
    assert local["spark.hadoop.fs.file.impl"] == LOCAL_FS
    assert local["spark.driver.extraClassPath"] == jar
    # A cluster's executors are other JVMs: they keep Hadoop's; the driver's class path
    # stays the same, so every driver matches one class-data archive.
    cluster = SparkSessionResource(master="spark://127.0.0.1:7077").spark_config()
    assert "spark.hadoop.fs.file.impl" not in cluster
    assert cluster["spark.driver.extraClassPath"] == jar
    own = SparkSessionResource(
        master="local[2]", extra_conf={"spark.driver.extraClassPath": "/opt/extra.jar"}
    ).spark_config()
    assert own["spark.driver.extraClassPath"] == f"{jar}:/opt/extra.jar"


def test_a_driver_without_its_ui_keeps_few_queries_in_sparks_status_store(spark):
    """A long-lived driver (the stream) kept 1,000 queries' plans for a UI that is off."""
    assert not SparkSessionResource().ui_enabled
    limit = int(STATUS_STORE_WITHOUT_UI["spark.sql.ui.retainedExecutions"])
    assert spark.conf.get("spark.sql.ui.retainedExecutions") == str(limit)
    for n in range(3 * limit):
        spark.range(n + 1).selectExpr("sum(id)").collect()
    store = spark._jsparkSession.sharedState().statusStore()
    deadline = time.monotonic() + 30  # the listener and the store's trimming are asynchronous
    while store.executionsCount() > limit and time.monotonic() < deadline:
        time.sleep(0.5)
    assert store.executionsCount() <= limit
