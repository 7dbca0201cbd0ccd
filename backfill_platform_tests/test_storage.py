"""Roots given as URIs go through Hadoop's FileSystem (the path object storage takes), and
the object-store keys stay out of everything but Hadoop's configuration.

The S3 server itself is exercised in `make e2e` (e2e/test_object_storage.py); here a
`file://` root takes the same code path as `s3a://` without a server.
"""

from __future__ import annotations

from dagster import EnvVar

from backfill_platform.definitions import build_resources
from backfill_platform.resources import LakehouseResource, LandingZoneResource
from backfill_platform.resources.landing import FX_RATES, ORDERS
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
