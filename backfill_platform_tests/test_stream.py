"""The live stream (contract 1.4) against a real Kafka broker, real Spark and real Delta:
every message in raw/orders exactly once across catch-ups, rejects with their reason, and
a landing re-ingest that keeps the stream's rows of its day."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pyspark.sql import functions as F

from backfill_platform import cli
from backfill_platform.checks.reconciliation import raw_vs_landing
from backfill_platform.operations.stream import catch_up, stream_status
from backfill_platform.ranges import DayRange
from backfill_platform.resources.kafka import OrdersTopicResource
from backfill_platform.sources.kafka_broker import kafka_broker
from backfill_platform.sources.producer import produce, shop_events
from backfill_platform.transforms.orders import latest_wins
from backfill_platform_tests.harness import Platform, order_line

pytestmark = pytest.mark.slow

TOPIC = "orders"
LAUNCH = datetime(2024, 1, 10, tzinfo=UTC)


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with kafka_broker(tmp_path_factory.mktemp("kafka") / "data", TOPIC, partitions=3) as b:
        yield b


@pytest.fixture(scope="module")
def stream_platform(tmp_path_factory, spark, broker):
    return Platform.create(tmp_path_factory.mktemp("stream"))


def _orders(broker) -> OrdersTopicResource:
    return OrdersTopicResource(bootstrap_servers=broker.bootstrap, topic=TOPIC)


def _stream_rows(platform: Platform) -> list[dict]:
    df = platform.table("raw/orders").where(F.col("kafka_topic").isNotNull())
    return [
        r.asDict()
        for r in df.select(
            "kafka_topic", "kafka_partition", "kafka_offset", "line", "reject_reason", "ingest_date"
        ).collect()
    ]


def _coordinates(rows) -> list[tuple]:
    return sorted((r["kafka_topic"], r["kafka_partition"], r["kafka_offset"]) for r in rows)


def test_messages_land_in_raw_exactly_once(stream_platform, broker, monkeypatch):
    platform, orders = stream_platform, _orders(broker)
    first = shop_events(LAUNCH, orders=20, seed=3, orders_per_day=10)
    kinds = {m.kind.split(":")[0] for m in first}
    assert {"version", "duplicate", "malformed"} <= kinds  # the sample has every kind
    produced = produce(broker.bootstrap, TOPIC, first)
    assert len(produced) == len(first) and len({p.partition for p in produced}) > 1

    report = catch_up(platform.resources["lakehouse"], orders)
    assert report.rows == len(produced)
    rows = _stream_rows(platform)
    assert _coordinates(rows) == sorted((p.topic, p.partition, p.offset) for p in produced)
    by_offset = {(r["kafka_partition"], r["kafka_offset"]): r for r in rows}
    for p in produced:
        row = by_offset[(p.partition, p.offset)]
        assert row["line"] == p.message.value
        assert row["ingest_date"] == p.message.timestamp.date()
        malformed = p.message.kind.startswith("malformed")
        assert (row["reject_reason"] is not None) == malformed, (p.message, row)

    # Nothing new: a second catch-up commits nothing and raw keeps its version.
    version = platform.version("raw/orders")
    again = catch_up(platform.resources["lakehouse"], orders)
    assert again.rows == 0
    assert platform.version("raw/orders") == version

    # More messages: only they are added, each once. Through the CLI this time.
    more = produce(broker.bootstrap, TOPIC, shop_events(LAUNCH, 5, seed=3, first_order=20))
    monkeypatch.setenv("BACKFILL_LAKEHOUSE_DIR", str(platform.lakehouse))
    monkeypatch.setenv("BACKFILL_LANDING_DIR", str(platform.landing))
    monkeypatch.setenv("BACKFILL_KAFKA_BOOTSTRAP", broker.bootstrap)
    monkeypatch.setenv("BACKFILL_ORDERS_TOPIC", TOPIC)
    assert cli.main(["stream", "catch-up", "--json"]) == 0
    everything = produced + more
    assert _coordinates(_stream_rows(platform)) == sorted(
        (p.topic, p.partition, p.offset) for p in everything
    )

    status = stream_status(platform.resources["lakehouse"], orders)
    assert status.lag == 0
    for partition in status.partitions:
        assert partition.copies_in_raw == 0
        assert partition.checkpoint_next == partition.end == partition.in_raw_next
    assert status.last_batch is not None and status.last_batch["rows"] == len(more)


def test_landing_reingest_keeps_the_days_stream_rows(stream_platform, broker):
    """raw/orders' landing path replaces only landing rows of its ingest days: a re-ingest
    of a day the stream also wrote leaves every stream row of that day in place."""
    platform = stream_platform
    if not platform.resources["lakehouse"].exists("raw/orders"):
        produce(broker.bootstrap, TOPIC, shop_events(LAUNCH, 5, seed=4))
        catch_up(platform.resources["lakehouse"], _orders(broker))
    stream_before = sorted(map(str, _stream_rows(platform)))
    day = min(r["ingest_date"] for r in _stream_rows(platform)).isoformat()
    platform.write_orders(day, [order_line("landing-1"), order_line("landing-2"), "not json"])
    for _ in range(2):  # an ingest, then a re-ingest of the same day
        platform.materialize(day, selection=["raw/orders"])
        assert sorted(map(str, _stream_rows(platform))) == stream_before
        landing = platform.rows("raw/orders", f"kafka_topic IS NULL AND ingest_date = '{day}'")
        assert sorted(r["line_number"] for r in landing) == [1, 2, 3]
        assert [r["reject_reason"] for r in landing if r["line_number"] == 3] == ["invalid_json"]
    # raw/orders' blocking reconciliation compares the day's landing rows with its files.
    outcome, _ = raw_vs_landing(
        platform.resources["lakehouse"], platform.resources["landing"], DayRange(day, day)
    )
    assert not outcome.failed


def test_latest_wins_prefers_a_message_on_the_same_ingest_date(spark):
    """Contract 1.4: equal updated_at and ingest_date, a message beats a landing line;
    between messages the greater timestamp, then partition, then offset wins."""
    day, when = "DATE'2024-01-10'", "TIMESTAMP'2024-01-10 10:00:00'"
    rows = spark.sql(
        f"""SELECT * FROM VALUES
        ('a', {when}, {day}, 'z.jsonl', 9, NULL, NULL, NULL, NULL, 'landing'),
        ('a', {when}, {day}, NULL, NULL, 'orders', 0, 5L, {when}, 'message'),
        ('b', {when}, {day}, NULL, NULL, 'orders', 1, 7L, {when}, 'p1'),
        ('b', {when}, {day}, NULL, NULL, 'orders', 2, 3L, {when}, 'p2'),
        ('b', {when}, {day}, NULL, NULL, 'orders', 0, 9L, {when} - INTERVAL 1 SECOND, 'older'),
        ('c', {when}, {day} + 1, 'a.jsonl', 1, NULL, NULL, NULL, NULL, 'later day'),
        ('c', {when}, {day}, NULL, NULL, 'orders', 0, 1L, {when}, 'earlier day')
        AS t(order_id, updated_at, ingest_date, file_name, line_number, kafka_topic,
             kafka_partition, kafka_offset, kafka_timestamp, status)"""
    ).select(
        "*",
        F.lit(None).cast("string").alias("customer_id"),
        F.col("updated_at").alias("event_time"),
        F.to_date("updated_at").alias("event_date"),
        F.lit("USD").alias("currency"),
        F.lit(1).cast("decimal(18,2)").alias("amount"),
    )
    won = {r["order_id"]: r["status"] for r in latest_wins(rows).collect()}
    assert won == {"a": "message", "b": "p2", "c": "later day"}
