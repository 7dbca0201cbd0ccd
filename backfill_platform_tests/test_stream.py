"""The live stream (contract 1.4) against a real Kafka broker, real Spark and real Delta:
every message in raw/orders exactly once across catch-ups, rejects with their reason, and
a landing re-ingest that keeps the stream's rows of its day."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from functools import partial
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from dagster import (
    AssetCheckKey,
    AssetKey,
    AssetMaterialization,
    AssetRecordsFilter,
    DagsterInstance,
    build_sensor_context,
)
from pyspark.sql import functions as F

from backfill_platform import cli
from backfill_platform.assets import all_assets
from backfill_platform.automation.window_sensor import rolling_window_sensor
from backfill_platform.checks.reconciliation import (
    fct_vs_staging,
    raw_vs_landing,
    staging_vs_raw,
    versions_of_run,
)
from backfill_platform.checks.results import CheckOutcome, PartitionResult
from backfill_platform.checks.stream import stream_vs_topic
from backfill_platform.definitions import build_resources
from backfill_platform.operations.mart_fold import MartsFolded
from backfill_platform.operations.replay import plan_replay, replay
from backfill_platform.operations.stream import (
    BatchReport,
    StagingFold,
    catch_up,
    fold_into_staging,
    run_stream,
    stream_status,
)
from backfill_platform.operations.stream_events import StreamReporter, held_days, report_batch
from backfill_platform.ranges import DayRange
from backfill_platform.resources.kafka import OrdersTopicResource
from backfill_platform.resources.maintenance import small_files
from backfill_platform.resources.stream_process import StreamProcess
from backfill_platform.runner import RANGE_END_TAG, RANGE_START_TAG
from backfill_platform.sources.crm_process import free_port
from backfill_platform.sources.kafka_broker import kafka_broker, new_cluster_id, running_broker
from backfill_platform.sources.kafka_broker import main as kafka_cli
from backfill_platform.sources.producer import Message, produce, shop_events
from backfill_platform.tables import (
    FCT_DAILY_REVENUE,
    RAW_ORDERS,
    STAGING_ORDERS,
    STAGING_REJECTS,
)
from backfill_platform.transforms.orders import latest_wins
from backfill_platform_tests.harness import (
    Platform,
    order_line,
    point_cli_at,
    spark_resource_for_tests,
)
from backfill_platform_tests.sensor_ticks import REPO, instance_at
from backfill_platform_tests.test_contract_rules import REJECTS
from benchmarks.soak_stream import java_child

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


def _offsets_by_partition(produced) -> dict[int, list[int]]:
    found: dict[int, list[int]] = {}
    for p in produced:
        found.setdefault(p.partition, []).append(p.offset)
    return found


def _coordinates(rows) -> list[tuple]:
    return sorted((r["kafka_topic"], r["kafka_partition"], r["kafka_offset"]) for r in rows)


def _streamed_days(instance: DagsterInstance) -> Counter:
    """Rows per raw/orders day that the instance saw the stream's batches write."""
    records = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=RAW_ORDERS), limit=10_000
    ).records
    days: Counter = Counter()
    for record in records:
        event = record.asset_materialization
        assert event.metadata["writer"].value == "stream", event
        days[event.partition] += event.metadata["rows"].value
    return days


def test_messages_land_in_raw_exactly_once(stream_platform, broker, monkeypatch, tmp_path):
    platform, orders = stream_platform, _orders(broker)
    reported = partial(report_batch, platform.instance, TOPIC)
    first = shop_events(LAUNCH, orders=20, seed=3, orders_per_day=10)
    kinds = {m.kind.split(":")[0] for m in first}
    assert {"version", "duplicate", "malformed"} <= kinds  # the sample has every kind
    # The shop's "now" (make demo STREAM=on): the same messages, up to it.
    now = LAUNCH + timedelta(days=1)
    assert (
        shop_events(LAUNCH, orders=20, seed=3, orders_per_day=10, until=now)
        == [m for m in first if m.timestamp < now]
        != first
    )
    produced = produce(broker.bootstrap, TOPIC, first)
    assert len(produced) == len(first) and len({p.partition for p in produced}) > 1

    report = catch_up(platform.resources["lakehouse"], orders, on_batch=reported)
    assert report.rows == len(produced)
    # Dagster sees the stream: each batch a runless materialization of every day it wrote.
    per_day = Counter(p.message.timestamp.date().isoformat() for p in produced)
    assert _streamed_days(platform.instance) == per_day
    # Offsets in Kafka's convention, named: the first of the batch and the next after it.
    (batch,) = report.batches
    spans = {
        str(p): {"first": min(o), "next": max(o) + 1}
        for p, o in _offsets_by_partition(produced).items()
    }
    assert report.to_dict()["batches"][0]["offsets"] == spans
    p, span = next(iter(spans.items()))
    assert f"p{p} first {span['first']} next {span['next']}" in batch.describe()
    for record in platform.instance.fetch_materializations(RAW_ORDERS, limit=100).records:
        assert record.asset_materialization.metadata["offsets"].value == spans
    # Staging and the marts follow the stream through the rolling window: its sensor reacts
    # to the stream's materializations with one ranged run up to the newest streamed day.
    with build_sensor_context(instance=platform.instance) as context:
        result = rolling_window_sensor(context)
    (request,) = result.run_requests
    assert request.tags[RANGE_START_TAG] <= min(per_day)
    assert request.tags[RANGE_END_TAG] == max(per_day)
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
    again = catch_up(platform.resources["lakehouse"], orders, on_batch=reported)
    assert again.rows == 0
    assert platform.version("raw/orders") == version
    assert _streamed_days(platform.instance) == per_day

    # More messages: only they are added, each once. Through the CLI this time.
    more = produce(broker.bootstrap, TOPIC, shop_events(LAUNCH, 5, seed=3, first_order=20))
    monkeypatch.setenv("BACKFILL_LAKEHOUSE_DIR", str(platform.lakehouse))
    monkeypatch.setenv("BACKFILL_LANDING_DIR", str(platform.landing))
    monkeypatch.setenv("BACKFILL_KAFKA_BOOTSTRAP", broker.bootstrap)
    monkeypatch.setenv("BACKFILL_ORDERS_TOPIC", TOPIC)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    assert cli.main(["stream", "catch-up", "--json"]) == 0
    with DagsterInstance.get() as instance:  # the command's instance saw its batches
        assert _streamed_days(instance) == Counter(
            p.message.timestamp.date().isoformat() for p in more
        )
    everything = produced + more
    assert _coordinates(_stream_rows(platform)) == sorted(
        (p.topic, p.partition, p.offset) for p in everything
    )

    status = stream_status(platform.resources["lakehouse"], orders)
    assert status.lag == 0
    held = _offsets_by_partition(everything)
    for partition in status.partitions:
        assert partition.copies_in_raw == 0 and partition.missing_in_raw == 0
        assert partition.checkpoint_next == partition.broker_next == partition.raw_next
        assert partition.raw_next == max(held.get(partition.partition, [-1])) + 1
        n = partition.raw_next
        assert f"broker earliest 0 next {n}, raw next {n} (" in status.describe()
        assert f"checkpoint next {n}, lag 0" in status.describe()
    assert status.last_batch is not None and status.last_batch["rows"] == len(more)
    assert status.last_batch["offsets"] == {
        str(p): {"first": min(o), "next": max(o) + 1}
        for p, o in _offsets_by_partition(more).items()
    }

    # The status can fail: an offset deleted from raw below its newest is a gap it counts.
    lake, version = platform.resources["lakehouse"], platform.version("raw/orders")
    busiest = Counter(p.partition for p in everything).most_common(1)[0][0]
    victim = min((p for p in everything if p.partition == busiest), key=lambda p: p.offset)
    lake.delta_table(RAW_ORDERS).delete(
        f"kafka_partition = {victim.partition} AND kafka_offset = {victim.offset}"
    )
    gaps = {p.partition: p.missing_in_raw for p in stream_status(lake, orders).partitions}
    assert gaps[victim.partition] == 1 and sum(gaps.values()) == 1, gaps
    lake.delta_table(RAW_ORDERS).restoreToVersion(version)


def test_landing_and_stream_share_raw_and_staging(stream_platform, broker):
    """raw/orders' landing path replaces only landing rows of its ingest days: a re-ingest
    of a day the stream also wrote leaves every stream row of that day in place. Staging
    counts an order that came both ways once: on one ingest day the message wins."""
    platform, lake = stream_platform, stream_platform.resources["lakehouse"]
    day = LAUNCH.date().isoformat()
    at = "2024-01-10T08:00:00Z"
    both = Message("both-1", order_line("both-1", at, status="paid"), LAUNCH, "version")
    produce(broker.bootstrap, TOPIC, [both])
    catch_up(lake, _orders(broker))
    stream_before = sorted(map(str, _stream_rows(platform)))
    assert day in {r["ingest_date"].isoformat() for r in _stream_rows(platform)}
    platform.write_orders(
        day,
        [
            order_line("landing-1", at),
            order_line("landing-2", at),
            "not json",
            order_line("both-1", at, status="placed"),  # same updated_at and ingest day
        ],
    )
    for _ in range(2):  # an ingest, then a re-ingest of the same day
        platform.materialize(day, selection=["raw/orders"])
        assert sorted(map(str, _stream_rows(platform))) == stream_before
        landing = platform.rows("raw/orders", f"kafka_topic IS NULL AND ingest_date = '{day}'")
        assert sorted(r["line_number"] for r in landing) == [1, 2, 3, 4]
        assert [r["reject_reason"] for r in landing if r["line_number"] == 3] == ["invalid_json"]
    # raw/orders' blocking reconciliation compares the day's landing rows with its files.
    outcome = raw_vs_landing(lake, platform.resources["landing"], DayRange(day, day))
    assert not outcome.failed

    for rate_day in ("2024-01-09", "2024-01-10"):
        platform.write_rates(rate_day, {"EUR": "1.1", "GBP": "1.3", "JPY": "0.007", "CHF": "1.1"})
    platform.materialize("2024-01-09", day, selection=["raw/fx_rates"])
    platform.materialize(day, selection=["staging/orders", "staging/orders_rejects"])
    staged = {r["order_id"]: r for r in platform.rows("staging/orders", f"event_date = '{day}'")}
    assert staged["both-1"]["status"] == "paid" and staged["both-1"]["file_name"] is None
    assert staged["both-1"]["raw_versions"] == 2
    valid_ids = {
        r["order_id"]
        for r in platform.rows("raw/orders", f"event_date = '{day}' AND reject_reason IS NULL")
    }
    assert set(staged) == valid_ids and {"landing-1", "landing-2"} <= valid_ids
    # Rejected messages keep their topic, partition and offset in place of file and line.
    rejects = platform.rows("staging/orders_rejects", f"ingest_date = '{day}'")
    raw_rejects = platform.rows(
        "raw/orders", f"ingest_date = '{day}' AND reject_reason IS NOT NULL"
    )

    def where(rows):
        return sorted(
            str((r["kafka_partition"], r["kafka_offset"], r["line_number"])) for r in rows
        )

    assert where(rejects) == where(raw_rejects)
    assert any(r["kafka_offset"] is not None for r in rejects)


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


@contextmanager
def _holding_the_next_port():
    """A free client port whose next port this test holds. A free port's neighbour may be
    another process's (CI's run of 2026-11-29 failed binding it), so draw until both are ours."""
    for _ in range(50):
        port = free_port()
        holder = socket.socket()
        try:
            holder.bind(("127.0.0.1", port + 1))
        except OSError:
            holder.close()
            continue
        with holder:
            holder.listen()
            yield port
        return
    raise RuntimeError("no free pair of neighbouring ports on 127.0.0.1 in 50 draws")


def test_kafka_start_finds_another_controller_port_when_the_next_one_is_taken(tmp_path, capsys):
    """`make kafka-start` puts the controller on the port after the client's. When another
    process holds that one (an ephemeral port, as on a busy CI machine), the broker starts
    on another port instead of exiting at start (CI's `make demo STREAM=on`, 2026-11-28)."""
    data = tmp_path / "kafka"
    with _holding_the_next_port() as port:
        bootstrap = f"127.0.0.1:{port}"
        try:
            assert kafka_cli(["start", "--data", str(data), "--bootstrap", bootstrap]) == 0
            assert f"broker at {bootstrap}, topic orders" in capsys.readouterr().out
            voters = (data / "server.properties").read_text()
            assert f"CONTROLLER://127.0.0.1:{port + 1}" not in voters
        finally:
            running_broker(data, bootstrap).stop()


def test_a_new_cluster_id_never_reads_as_an_option():
    """1 in 64 random ids in URL-safe base64 start with '-': Kafka's storage tool then took
    the id for an option and the broker did not start (seen 2026-11-29). 2,000 draws would
    hold about 31 such ids without the rule."""
    ids = [new_cluster_id() for _ in range(2000)]
    assert not [i for i in ids if "-" in i] and len(set(ids)) == len(ids)
    assert {len(i) for i in ids} == {22}


def test_a_streamed_day_past_the_partitions_is_held_not_reported():
    """Today's messages: the partitions end yesterday. A batch that wrote a partition and
    today reports the partition only; today is held (no materialization of a partition the
    code location does not define), named on raw/orders, and a stream started later takes
    it up. The rolling window and the staleness sensor keep working on the partitions, also
    where an instance holds a materialization of such a day (any process can report one)."""
    from backfill_platform.automation.stale_sensor import stale_partitions_sensor

    today = datetime.now(UTC).date().isoformat()
    in_range = "2024-01-10"
    with DagsterInstance.ephemeral() as instance:
        batch = BatchReport(0, 2, 0, {0: (0, 2)}, {in_range: 1, today: 1}, 1, 0.1)
        assert report_batch(instance, TOPIC, batch) == [today]
        assert set(instance.get_materialized_partitions(RAW_ORDERS)) == {in_range}

        reporter = StreamReporter(instance, None, TOPIC)  # releases nothing: no Spark needed
        reporter(replace(batch, batch_id=1, rows_by_day={today: 1}))
        assert reporter.held == [today] and held_days(instance, TOPIC) == [today]
        assert "held " + today in reporter.notes[0]
        assert StreamReporter(instance, None, TOPIC).held == [today]  # the next start's
        assert StreamReporter(instance, None, "another_topic").held == []
        assert set(instance.get_materialized_partitions(RAW_ORDERS)) == {in_range}

        instance.report_runless_asset_event(AssetMaterialization(RAW_ORDERS, partition=today))
        with build_sensor_context(instance=instance) as context:
            (request,) = rolling_window_sensor(context).run_requests
        assert request.tags[RANGE_END_TAG] == in_range
        with build_sensor_context(instance=instance) as context:
            stale_partitions_sensor(context)  # evaluates without an error


def test_end_date_today_reports_todays_stream_batches_as_they_commit():
    """BACKFILL_END_DATE=today, for a deployment whose stream writes today's messages: the
    current UTC day is a partition, so a batch of today's rows is reported at once (and the
    freshness policy sees it), not held until midnight. Read when the partitions are
    defined, so in an interpreter of its own; another word is refused naming the setting."""
    code = """if True:
        from datetime import UTC, datetime
        from dagster import DagsterInstance
        from backfill_platform.operations.stream import BatchReport
        from backfill_platform.operations.stream_events import report_batch
        from backfill_platform.tables import RAW_ORDERS
        today = datetime.now(UTC).date().isoformat()
        with DagsterInstance.ephemeral() as instance:
            batch = BatchReport(0, 1, 0, {0: (0, 1)}, {today: 1}, 1, 0.1)
            held = report_batch(instance, "orders", batch)
            print(held, sorted(instance.get_materialized_partitions(RAW_ORDERS)) == [today])
    """
    for end, shown in (("today", "[] True"), ("", "['")):
        done = subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "BACKFILL_END_DATE": end},
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0 and done.stdout.startswith(shown), done.stdout + done.stderr
    done = subprocess.run(
        [sys.executable, "-c", "import backfill_platform.partitions"],
        env={**os.environ, "BACKFILL_END_DATE": "tomorrow"},
        capture_output=True,
        text=True,
    )
    assert "BACKFILL_END_DATE='tomorrow': not a day (YYYY-MM-DD) or today" in done.stderr


def test_the_supervisor_runs_by_default_only_where_the_setting_says():
    """BACKFILL_STREAM_SUPERVISOR (`make ui STREAM=on`): the daemon starts the stream's
    sensor without a click; otherwise it waits to be turned on. Read when definitions load,
    so each value gets a fresh interpreter, as a code server would."""
    unset = {k: v for k, v in os.environ.items() if k != "BACKFILL_STREAM_SUPERVISOR"}
    for value, status in (("true", "RUNNING"), (None, "STOPPED")):
        shown = subprocess.run(
            [
                sys.executable,
                "-c",
                "from backfill_platform.definitions import defs; "
                "print(defs.get_sensor_def('stream_supervisor').default_status.value)",
            ],
            env=unset if value is None else {**unset, "BACKFILL_STREAM_SUPERVISOR": value},
            capture_output=True,
            text=True,
            check=True,
        )
        assert shown.stdout.strip() == status, (value, shown.stdout, shown.stderr)


def test_stream_freshness_policy_only_on_raw_orders_and_only_when_set(monkeypatch):
    """BACKFILL_STREAM_FRESHNESS_SECONDS: empty, no policy (a deployment without the stream);
    set, raw/orders fails after it and warns after half of it; below Dagster's minute, refused
    naming the variable. The daemon's evaluation: e2e/test_stream_freshness.py."""
    from backfill_platform.assets import all_assets
    from backfill_platform.assets.freshness import stream_freshness_policy, with_stream_freshness
    from backfill_platform.settings import SettingError

    def policies(assets) -> dict:
        return {
            spec.key: spec.freshness_policy
            for a in assets
            for spec in a.specs
            if spec.freshness_policy is not None
        }

    monkeypatch.delenv("BACKFILL_STREAM_FRESHNESS_SECONDS", raising=False)
    assert stream_freshness_policy() is None
    assert policies(with_stream_freshness(all_assets, stream_freshness_policy())) == {}

    monkeypatch.setenv("BACKFILL_STREAM_FRESHNESS_SECONDS", "600")
    (key, policy), *others = policies(
        with_stream_freshness(all_assets, stream_freshness_policy())
    ).items()
    assert key == RAW_ORDERS and not others
    assert policy.fail_window.to_timedelta().total_seconds() == 600
    assert policy.warn_window.to_timedelta().total_seconds() == 300

    for bad in ("30", "ten minutes"):
        monkeypatch.setenv("BACKFILL_STREAM_FRESHNESS_SECONDS", bad)
        with pytest.raises(SettingError, match=f"BACKFILL_STREAM_FRESHNESS_SECONDS='{bad}'"):
            stream_freshness_policy()


def test_boundary_reconciles_and_replay_rewrites_a_window(
    stream_platform, broker, monkeypatch, tmp_path
):
    """`stream reconcile` proves the boundary per day and fails on a gap or an overlap; the
    `stream_offsets_once` check reports it per day in a run; `replay` puts a window of the
    log back in place of damaged rows (and only those), rebuilds staging from them and
    reconciles; offsets the stream has not reached are left to it. Runs after the tests
    above, on their topic, raw and staging (landing and staging of 2024-01-10)."""
    platform, lake, orders = (
        stream_platform,
        stream_platform.resources["lakehouse"],
        _orders(broker),
    )
    day = LAUNCH.date().isoformat()
    point_cli_at(monkeypatch, tmp_path, platform.landing, platform.lakehouse)
    monkeypatch.setenv("BACKFILL_KAFKA_BOOTSTRAP", broker.bootstrap)
    monkeypatch.setenv("BACKFILL_ORDERS_TOPIC", TOPIC)
    reconcile = ["stream", "reconcile", "--start", day, "--end", day, "--json"]

    status, payload, text = cli.execute(reconcile)
    assert status == 0, text
    (result,) = payload["days"]
    assert result["ok"] and result["missing"] == 0 and result["extra_copies"] == 0
    assert result["messages"] == result["streamed"] > 0 and result["pending"] == 0
    assert result["landing_lines"] == result["landing_rows"] == 4
    assert result["both_sources"] == result["both_staged_once"] == 1  # both-1, staged once
    assert payload["landing_last_day"] == day and payload["overlap_days"] == [day]
    assert payload["first_message"].startswith(day)

    # It can fail: one message's row twice (an overlap), then one missing (a gap).
    version = platform.version("raw/orders")
    stream_day = lake.read(RAW_ORDERS).where(f"kafka_topic = '{TOPIC}' AND ingest_date = '{day}'")
    victim = stream_day.orderBy("kafka_partition", "kafka_offset").limit(1)
    victim.write.format("delta").mode("append").save(lake.table_path(RAW_ORDERS))
    status, payload, _ = cli.execute(reconcile)
    assert status == 1 and payload["days"][0]["extra_copies"] == 1, payload
    lake.delta_table(RAW_ORDERS).restoreToVersion(version)
    (p, o) = victim.select("kafka_partition", "kafka_offset").first()
    lake.delta_table(RAW_ORDERS).delete(f"kafka_partition = {p} AND kafka_offset = {o}")
    status, payload, text = cli.execute(reconcile)
    assert status == 1 and payload["days"][0]["missing"] == 1 and "FAIL" in text, text
    # The same proof as a non-blocking asset check of raw/orders' run of the day.
    from backfill_platform.checks.stream import stream_checks
    from backfill_platform.runner import materialize_range

    run = materialize_range(
        [*all_assets, *stream_checks],
        day,
        day,
        {**platform.resources, "orders_topic": orders},
        platform.instance,
        selection=[RAW_ORDERS],
    )
    (evaluation,) = [
        e for e in run.get_asset_check_evaluations() if e.check_name == "stream_offsets_once"
    ]
    assert not evaluation.passed and evaluation.partition == day
    assert evaluation.metadata["missing"].value == 1
    lake.delta_table(RAW_ORDERS).restoreToVersion(version)

    # Replay: a message not streamed yet stays the stream's.
    pending = produce(
        broker.bootstrap,
        TOPIC,
        [Message("late-1", order_line("late-1", "2024-01-10T09:00:00Z"), LAUNCH, "version")],
    )[0]
    plan = plan_replay(lake, orders, datetime(2030, 1, 1, tzinfo=UTC), since=LAUNCH)
    lo, hi = plan.left_to_stream[pending.partition]
    assert lo <= pending.offset < hi and plan.spans[pending.partition][1] == lo

    # A parse that went wrong on the window's rows, built into staging...
    window_to = "2024-01-11T00:00:00Z"
    plan = plan_replay(lake, orders, datetime(2024, 1, 11, tzinfo=UTC), since=LAUNCH)
    in_window = " OR ".join(
        f"(kafka_partition = {p} AND kafka_offset >= {a} AND kafka_offset < {b})"
        for p, (a, b) in plan.spans.items()
    )
    before_raw = sorted(map(str, _stream_rows(platform)))
    before_staging = platform.rows("staging/orders", f"event_date = '{day}'")
    lake.delta_table(RAW_ORDERS).update(
        f"kafka_topic = '{TOPIC}' AND reject_reason IS NULL AND ({in_window})",
        {"status": F.lit("corrupted")},
    )
    platform.materialize(day, selection=["staging/orders", "staging/orders_rejects"])
    assert "corrupted" in {r["status"] for r in platform.rows("staging/orders")}
    landing_before = platform.rows("raw/orders", "kafka_topic IS NULL")

    # ...is replayed from the log: those rows again, staging rebuilt, the day reconciled.
    replayed = ["replay", "--from", day, "--to", window_to, "--in-process", "--json"]
    status, payload, text = cli.execute(replayed)
    assert status == 0, text
    assert payload["rows"] == plan.messages > 0 and payload["event_days"][0] == day
    assert any("staging/orders" in r["assets"] and r["success"] for r in payload["rebuild_runs"])
    assert all(d["ok"] for d in payload["reconciliation"]["days"]), text
    assert sorted(map(str, _stream_rows(platform))) == before_raw
    assert platform.rows("raw/orders", "kafka_topic IS NULL") == landing_before
    assert "corrupted" not in {r["status"] for r in platform.table("raw/orders").collect()}
    assert platform.rows("staging/orders", f"event_date = '{day}'") == before_staging
    commits = [h["metadata"] for h in lake.history(RAW_ORDERS, limit=len(payload["chunks"]))]
    assert {c.get("writer") for c in commits} == {"replay"}
    # Idempotent: the same window again leaves the same rows.
    again = replay(
        lake, orders, plan_replay(lake, orders, datetime(2024, 1, 11, tzinfo=UTC), LAUNCH)
    )
    assert sum(c.rows for c in again.chunks) == plan.messages
    assert sorted(map(str, _stream_rows(platform))) == before_raw

    # Refused before anything is read: a partition the topic lacks, a bad instant.
    for argv, named in (
        (["replay", "--from-offsets", "9:0", "--to", window_to, "--in-process"], "partition 9"),
        (["replay", "--from", "yesterday", "--to", window_to, "--in-process"], "--from"),
    ):
        status, _, text = cli.execute(argv)
        assert status == 1 and named in text, text


def test_stream_stages_its_batches_itself(stream_platform, broker, monkeypatch, tmp_path):
    """BACKFILL_STREAM_STAGING=true: the batch's orders are in staging/orders when the
    catch-up returns, no Dagster run involved, equal to what the staging asset builds, and
    reported to the instance; a frozen day is left alone. Runs after the tests above (the
    message `late-1` of the replay test is still unstreamed)."""
    platform, lake = stream_platform, stream_platform.resources["lakehouse"]
    day = LAUNCH.date().isoformat()
    point_cli_at(monkeypatch, tmp_path, platform.landing, platform.lakehouse)
    monkeypatch.setenv("BACKFILL_KAFKA_BOOTSTRAP", broker.bootstrap)
    monkeypatch.setenv("BACKFILL_ORDERS_TOPIC", TOPIC)
    monkeypatch.setenv("BACKFILL_STREAM_STAGING", "true")
    refunded = order_line("both-1", "2024-01-10T20:00:00Z", status="refunded")
    produce(broker.bootstrap, TOPIC, [Message("both-1", refunded, LAUNCH, "version")])

    status, payload, text = cli.execute(["stream", "catch-up", "--json"])
    assert status == 0, text
    (batch,) = payload["batches"]
    assert batch["rows"] == 2 and list(batch["staged"]["staging/orders"]) == [day]
    staged = {r["order_id"]: r for r in platform.rows("staging/orders", f"event_date = '{day}'")}
    assert staged["both-1"]["status"] == "refunded" and "late-1" in staged
    with DagsterInstance.get() as instance:
        (event,) = [
            r.asset_materialization
            for r in instance.fetch_materializations(
                AssetRecordsFilter(asset_key=AssetKey(["staging", "orders"])), limit=10
            ).records
        ]
        assert event.partition == day and event.metadata["writer"].value == "stream"
    # The staging asset's own run over the day builds the very same rows.
    folded = platform.rows("staging/orders", f"event_date = '{day}'")
    built = platform.materialize(day, selection=["staging/orders", "staging/orders_rejects"])
    assert platform.rows("staging/orders", f"event_date = '{day}'") == folded

    version = platform.version("staging/orders")
    staged_days, held, _ = fold_into_staging(
        lake, platform.version("raw/orders"), [day], [day], frozen=lambda days: {day}
    )
    assert staged_days == {} and held == [day]
    assert platform.version("staging/orders") == version
    # fct of the day, from that staging: its commit records the staging version its run
    # read (the IO manager's loaded inputs).
    marts = platform.materialize(day, selection=["marts/fct_daily_revenue"])
    fct_version, fct_read = versions_of_run(lake, FCT_DAILY_REVENUE, marts.run_id, STAGING_ORDERS)
    assert fct_read == version

    # A message for the same day, folded after that run committed: the run's blocking
    # check proves the run's own commit (staging at the version it wrote, raw at the one it
    # read); pairing its raw with the stream's newer staging would blame the run (seen on
    # an object store, where the fold can land between a run's write and its check).
    later = order_line("after-run-1", "2024-01-10T21:00:00Z")
    produce(broker.bootstrap, TOPIC, [Message("after-run-1", later, LAUNCH, "new")])
    status, _, text = cli.execute(["stream", "catch-up"])
    assert status == 0, text
    staging_version, raw_version = versions_of_run(lake, STAGING_ORDERS, built.run_id, RAW_ORDERS)
    assert staging_version == version < platform.version("staging/orders")
    span = DayRange(day, day)
    (at_run,) = staging_vs_raw(lake, span, raw_version, staging_version).results
    assert at_run.passed, at_run
    (mixed,) = staging_vs_raw(lake, span, raw_version).results
    assert not mixed.passed and mixed.actual == mixed.expected + 1, mixed
    (now,) = staging_vs_raw(lake, span).results  # the current tables agree too
    assert now.passed, now
    # fct's check likewise proves the run's fct against the staging it read; the stream's
    # newer staging holds one more order of the day than the run's fct.
    (fct_at_run,) = fct_vs_staging(lake, span, fct_read, fct_version).results
    assert fct_at_run.passed, fct_at_run
    (fct_now,) = fct_vs_staging(lake, span).results
    assert not fct_now.passed, fct_now


def test_a_flood_of_malformed_messages_is_rejected_one_by_one(broker, spark, tmp_path):
    """Part 8's flood: every malformed kind of the contract's rules (and empty values) many
    times over, between valid orders, through several batches with staging folded in. Each
    message is in raw once with the reason its landing line would get, each bad one is one
    reject in staging/orders_rejects with its topic, partition and offset, every valid
    order is staged, and the stream goes on batch after batch."""
    topic, copies = "orders_flood", 10
    broker.create_topic(topic, 3)
    platform = Platform.create(tmp_path / "flood")
    day = LAUNCH.date().isoformat()
    platform.write_rates(day, {"EUR": "1.1"})
    platform.materialize(day, selection=["raw/fx_rates"])
    bad = [(line, reason) for _, line, reason in REJECTS] + [("", "invalid_json")]
    messages, expected = [], []
    for n in range(copies):
        valid = order_line(f"flood-ok-{n}", "2024-01-10T10:00:00Z", currency="EUR")
        for line, reason in [*bad, (valid, None)]:
            messages.append(Message(f"k-{len(messages)}", line, LAUNCH, "flood"))
            expected.append(reason)
    produced = produce(broker.bootstrap, topic, messages)
    assert len(produced) == len(messages) == copies * (len(REJECTS) + 2)

    orders = OrdersTopicResource(
        bootstrap_servers=broker.bootstrap, topic=topic, max_offsets_per_batch=100
    )
    report = catch_up(platform.resources["lakehouse"], orders, fold=StagingFold())
    assert len(report.batches) >= 3 and report.rows == len(messages)
    assert report.rejects == copies * len(bad)
    want = {(p.partition, p.offset): expected[i] for i, p in enumerate(produced)}
    raw = platform.table("raw/orders").where(F.col("kafka_topic") == topic)
    got = {(r["kafka_partition"], r["kafka_offset"]): r["reject_reason"] for r in raw.collect()}
    assert raw.count() == len(got) and got == want  # each once, each with its reason
    rejects = platform.table("staging/orders_rejects").where(F.col("kafka_topic") == topic)
    kept = {(r["kafka_partition"], r["kafka_offset"]): r["reason"] for r in rejects.collect()}
    assert rejects.count() == len(kept) and kept == {k: v for k, v in want.items() if v}
    staged = {r["order_id"] for r in platform.rows("staging/orders", "order_id LIKE 'flood-ok-%'")}
    assert staged == {f"flood-ok-{n}" for n in range(copies)}


def test_replay_of_later_versions_weeks_after_their_orders_rebuilds_each_output_on_its_days(
    broker, spark, monkeypatch, tmp_path
):
    """A topic the platform has not seen carries later versions of orders placed (and
    landed by file) weeks earlier, and a malformed message. Replaying the messages' days
    rebuilds staging/orders on the orders' event day and the rejects on the messages'
    ingest days: days that do not overlap, so each output runs on its own (Dagster refuses
    a job selecting one output of a multi-asset that cannot subset, and the replay would
    stop after replacing the raw rows), and the window reconciles."""
    topic, placed = "orders_weeks_late", "2024-02-20"
    broker.create_topic(topic, 1)
    platform = Platform.create(tmp_path / "platform")
    lake = platform.resources["lakehouse"]
    placed_at = f"{placed}T10:00:00Z"
    platform.write_rates(placed, {"EUR": "1.10"})
    platform.write_orders(placed, [order_line("w1", placed_at), order_line("w2", placed_at)])
    platform.materialize(placed, selection=["raw/orders", "raw/fx_rates"])
    sent = datetime(2024, 3, 16, 9, tzinfo=UTC)
    later = [
        Message(
            "w1",
            order_line("w1", placed_at, "2024-03-16T09:00:00Z", status="refunded"),
            sent,
            "version",
        ),
        Message("x", "{bad", sent + timedelta(days=1), "malformed:invalid_json"),
        Message(
            "w2",
            order_line("w2", placed_at, "2024-03-18T09:00:00Z", amount="25.00"),
            sent + timedelta(days=2),
            "version",
        ),
    ]
    produce(broker.bootstrap, topic, later)
    orders = OrdersTopicResource(bootstrap_servers=broker.bootstrap, topic=topic)
    assert catch_up(lake, orders).rows == len(later)
    # The later versions misread (the parse bug a replay follows), and built into staging.
    lake.delta_table(RAW_ORDERS).update(
        f"kafka_topic = '{topic}' AND reject_reason IS NULL", {"status": F.lit("corrupted")}
    )
    outputs = ["staging/orders", "staging/orders_rejects", "marts/fct_daily_revenue"]
    platform.materialize(placed, selection=outputs)
    assert {r["status"] for r in platform.rows("staging/orders")} == {"corrupted"}
    placed_rejects = lake.built_partitions(STAGING_REJECTS)[placed]

    (tmp_path / "home").mkdir()
    point_cli_at(monkeypatch, tmp_path / "home", platform.landing, platform.lakehouse)
    monkeypatch.setenv("BACKFILL_KAFKA_BOOTSTRAP", broker.bootstrap)
    monkeypatch.setenv("BACKFILL_ORDERS_TOPIC", topic)
    window = ["--from", "2024-03-16T00:00:00Z", "--to", "2024-03-19T00:00:00Z"]
    status, payload, text = cli.execute(["replay", *window, "--in-process", "--json"])
    assert status == 0, text
    arrived = ["2024-03-16", "2024-03-17", "2024-03-18"]
    assert payload["event_days"] == [placed] and payload["ingest_days"] == arrived
    assert [(r["assets"], r["first"], r["last"]) for r in payload["rebuild_runs"]] == [
        (["staging/orders", "marts/fct_daily_revenue"], placed, placed),
        (["staging/orders_rejects"], arrived[0], arrived[-1]),
    ]
    staged = {r["order_id"]: (r["status"], r["amount"]) for r in platform.rows("staging/orders")}
    assert staged == {"w1": ("refunded", Decimal("10.00")), "w2": ("paid", Decimal("25.00"))}
    (fct,) = platform.rows("marts/fct_daily_revenue")
    assert (fct["orders"], fct["paid_orders"]) == (2, 1)
    # Each output only on its own days: no order of an arrival day, no reject of the event day.
    assert set(lake.built_partitions(STAGING_ORDERS)) == {placed}
    assert lake.built_partitions(STAGING_REJECTS)[placed] == placed_rejects
    (reject,) = platform.rows("staging/orders_rejects")
    assert (reject["reason"], reject["ingest_date"].isoformat()) == ("invalid_json", arrived[1])
    assert all(day["ok"] for day in payload["reconciliation"]["days"]), text


def test_the_offset_check_reads_from_the_ranges_first_instant_and_counts_late_clocks(
    broker, spark, tmp_path
):
    """The stream check asks the broker's time index where the range starts and reads from
    there, not from the topic's beginning; a message whose producer clock (CreateTime) is
    older than the one before it still counts on its own day, so the read ends at the
    partition's latest, not at the range's end."""
    topic = "orders_clock"
    broker.create_topic(topic, 1)
    day = [LAUNCH + timedelta(days=n) for n in range(3)]
    clocks = [day[0], day[0] + timedelta(hours=1), day[2], day[1], day[2] + timedelta(hours=1)]
    messages = [
        Message(f"k-{n}", order_line(f"clock-{n}", f"{at:%Y-%m-%dT%H:%M:%SZ}"), at, "version")
        for n, at in enumerate(clocks)
    ]
    assert [p.offset for p in produce(broker.bootstrap, topic, messages)] == [0, 1, 2, 3, 4]
    orders = OrdersTopicResource(bootstrap_servers=broker.bootstrap, topic=topic)
    # The first offset at or after the second day's start: the third day's message at 2.
    assert orders.offsets_at(day[1]) == {0: 2}
    platform = Platform.create(tmp_path / "clock")
    lake = platform.resources["lakehouse"]
    assert catch_up(lake, orders).rows == 5
    keys = [d.date().isoformat() for d in day]
    for first in range(3):
        metrics = stream_vs_topic(lake, orders, DayRange(keys[first], keys[2])).metrics
        assert {k: (m["messages"], m["streamed"], m["missing"]) for k, m in metrics.items()} == {
            k: (n, n, 0) for k, n in zip(keys[first:], (2, 1, 2)[first:], strict=True)
        }
    # The second day alone: its one message sits after the third day's first one.
    metrics = stream_vs_topic(lake, orders, DayRange(keys[1], keys[1])).metrics
    assert (metrics[keys[1]]["messages"], metrics[keys[1]]["missing"]) == (1, 0)


def _cli_process(env: dict[str, str], *argv: str) -> tuple[int, dict, str]:
    """The CLI as a process of its own, as `make cli` runs it (its own partitions from the
    environment): exit status, the `--json` payload, and everything it printed."""
    done = subprocess.run(
        [sys.executable, "-m", "backfill_platform", *argv, "--json"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    printed = done.stdout + done.stderr
    assert "Traceback" not in printed, printed
    return done.returncode, json.loads(done.stdout), printed


def test_days_past_the_partitions_are_held_reconciled_and_reported_once_defined(
    broker, spark, tmp_path
):
    """`make produce STREAM_FIRST=300 ...` past the demo's days: the messages are stamped
    after BACKFILL_END_DATE. The stream keeps their rows in raw/orders (every offset once)
    but writes no materialization of a partition the code location does not define; it
    names the held days. `stream reconcile` as `make cli` runs it (the end at the landing
    zone's last day) proves them too, in one exit 0 and no traceback. Started again with a
    later end, the stream reports the day that is now a partition, with its rows."""
    topic, days = "orders_past", ["2024-01-10", "2024-01-11", "2024-01-12"]
    broker.create_topic(topic, 2)
    messages = [
        Message(
            f"past-{day}-{hour}",
            order_line(f"past-{day}-{hour}", f"{day}T0{hour}:00:00Z"),
            datetime.fromisoformat(f"{day}T0{hour}:00:00+00:00"),
            "version",
        )
        for day in days
        for hour in range(3)
    ]
    produced = produce(broker.bootstrap, topic, messages)
    per_day = Counter(p.message.timestamp.date().isoformat() for p in produced)
    home = tmp_path / "home"
    instance_at(home).dispose()
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "BACKFILL_LANDING_DIR": str(tmp_path / "landing"),
        "BACKFILL_LAKEHOUSE_DIR": str(tmp_path / "lakehouse"),
        "BACKFILL_START_DATE": "2024-01-01",
        "BACKFILL_END_DATE": days[0],
        "BACKFILL_KAFKA_BOOTSTRAP": broker.bootstrap,
        "BACKFILL_ORDERS_TOPIC": topic,
    }
    (tmp_path / "landing").mkdir()

    status, payload, printed = _cli_process(env, "stream", "catch-up")
    assert status == 0, printed
    assert payload["rows"] == len(produced) and payload["held_days"] == days[1:], printed
    assert f"held 2 days {days[1]}..{days[2]}: after the last partition {days[0]}" in printed
    lake = build_resources(
        str(tmp_path / "landing"), str(tmp_path / "lakehouse"), spark=spark_resource_for_tests()
    )["lakehouse"]
    rows = lake.read(RAW_ORDERS).where(F.col("kafka_topic") == topic)
    assert sorted((r["kafka_partition"], r["kafka_offset"]) for r in rows.collect()) == sorted(
        (p.partition, p.offset) for p in produced
    )  # not lost: every message in raw, once
    with DagsterInstance.from_config(str(home)) as instance:
        assert _streamed_days(instance) == {days[0]: per_day[days[0]]}
        assert held_days(instance, topic) == days[1:]

    status, payload, printed = _cli_process(env, "stream", "reconcile")
    assert status == 0, printed
    assert [d["day"] for d in payload["days"]] == days and payload["failed_days"] == []
    assert payload["past_partitions"] == days[1:] and payload["last_partition"] == days[0]
    assert all(d["messages"] == d["streamed"] == per_day[d["day"]] for d in payload["days"])

    env["BACKFILL_END_DATE"] = days[1]
    status, payload, printed = _cli_process(env, "stream", "catch-up")
    assert status == 0, printed
    assert payload["batches"] == [] and payload["held_days"] == days[2:], printed
    assert f"reported {days[1]}, held until now a partition" in printed
    with DagsterInstance.from_config(str(home)) as instance:
        assert _streamed_days(instance) == {d: per_day[d] for d in days[:2]}
        (released,) = instance.fetch_materializations(
            AssetRecordsFilter(asset_key=RAW_ORDERS, asset_partitions=[days[1]]), limit=5
        ).records
        spans = released.asset_materialization.metadata["day_offsets"].value
        on_day = [p for p in produced if p.message.timestamp.date().isoformat() == days[1]]
        assert spans == {
            str(p): {"first": min(o), "next": max(o) + 1}
            for p, o in _offsets_by_partition(on_day).items()
        }
        assert held_days(instance, topic) == days[2:]


def test_the_producer_waits_for_its_full_queue_and_sends_every_message_once(broker, caplog):
    """An unpaced send larger than the producer's local queue (here 200 messages, as
    librdkafka's 100,000 is to a 50,000-order demo send): it waits for room instead of
    dying on BufferError, and every message is on the broker exactly once."""
    topic = "orders_queue"
    broker.create_topic(topic, 2)
    messages = shop_events(LAUNCH, 1500, seed=11, orders_per_day=20_000)
    caplog.set_level(logging.DEBUG, logger="backfill_platform.sources.producer")
    produced = produce(
        broker.bootstrap, topic, messages, config={"queue.buffering.max.messages": 200}
    )
    assert len(messages) > 2000 and len(produced) == len(messages)
    waited = [r.getMessage() for r in caplog.records if "full queue" in r.getMessage()]
    assert waited, "the queue never filled: the test does not test the wait"
    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": "queue", "enable.auto.commit": False}
    )
    try:
        ends = OrdersTopicResource(bootstrap_servers=broker.bootstrap, topic=topic).end_offsets()
        consumer.assign([TopicPartition(topic, p, 0) for p in ends])
        got: list[tuple] = []
        deadline = time.monotonic() + 120
        while len(got) < sum(end for _, end in ends.values()) and time.monotonic() < deadline:
            for record in consumer.consume(1000, timeout=5):
                assert record.error() is None, record.error()
                got.append((record.key().decode(), record.value().decode(), record.timestamp()[1]))
    finally:
        consumer.close()
    sent = [(m.key, m.value, int(m.timestamp.timestamp() * 1000)) for m in messages]
    assert Counter(got) == Counter(sent)  # each once: nothing dropped, nothing doubled


def test_the_supervisors_tick_says_what_it_did(broker, tmp_path):
    """The daemon's own tick of `stream_supervisor`: Dagster's UI labels a tick without runs
    "0 runs requested", so the tick carries what it did as its skip reason (the label's
    tooltip and the tick's details), its cursor (the tick table's Cursor column) and a line
    in its logs. Starting the stream: "started the stream (pid N)"; the next tick, running."""
    topic = "orders_supervised_ui"
    broker.create_topic(topic, 1)
    home = tmp_path / "home"
    instance_at(home).dispose()
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "DAGSTER_DISABLE_TELEMETRY": "1",
        "BACKFILL_STREAM_SUPERVISOR": "true",
        "BACKFILL_START_DATE": "2024-01-01",
        "BACKFILL_LANDING_DIR": str(tmp_path / "landing"),
        "BACKFILL_LAKEHOUSE_DIR": str(tmp_path / "lakehouse"),
        "BACKFILL_KAFKA_BOOTSTRAP": broker.bootstrap,
        "BACKFILL_ORDERS_TOPIC": topic,
    }
    (tmp_path / "landing").mkdir()
    process = StreamProcess(home / "stream")
    with open(tmp_path / "daemon.log", "wb") as log:
        daemon = subprocess.Popen(
            [str(Path(sys.executable).parent / "dagster-daemon"), "run", "-w", "workspace.yaml"],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        ticks = _supervisor_ticks(home, count=2, timeout=300)
        pid = process.pid()
        assert pid is not None
        started, running = ticks[-1], ticks[-2]  # newest first
        assert started.skip_reason == f"started the stream (pid {pid}): it was not running"
        assert started.cursor == f"started pid {pid}"
        assert running.skip_reason == f"the stream is running (pid {pid}); nothing to do"
        assert running.cursor == f"running pid {pid}"
        assert started.log_key, "the tick's logs were not captured"
        logged = [
            f.read_text(errors="replace")
            for f in home.rglob("*")
            if f.is_file() and f.suffix in (".err", ".out")
        ]
        assert any(started.skip_reason in text for text in logged)
        # The stream's JVM keeps Spark's 100 compiled query classes, not the runs' 1,000: a
        # kept class holds its source in the heap of a JVM that lives for months.
        assert _driver_property(pid, "spark.sql.codegen.cache.maxEntries") == "100"
    finally:
        os.killpg(daemon.pid, signal.SIGTERM)
        try:
            daemon.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(daemon.pid, signal.SIGKILL)
            daemon.wait()
        process.stop()


def _driver_property(pid: int, name: str, timeout: float = 180) -> str | None:
    """A system property of the Spark driver JVM under process `pid` (spark-submit sets the
    session's settings as such), once that JVM runs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        jvm = java_child(pid)
        if jvm is not None:
            shown = subprocess.run(
                ["jcmd", str(jvm), "VM.system_properties"], capture_output=True, text=True
            ).stdout
            for line in shown.splitlines():
                if line.startswith(f"{name}="):
                    return line.split("=", 1)[1]
        time.sleep(1)
    return None


def _supervisor_ticks(home: Path, count: int, timeout: float) -> list:
    """The stream_supervisor's stored ticks, newest first, once it has `count` finished."""
    deadline = time.monotonic() + timeout
    while True:
        with DagsterInstance.from_config(str(home)) as instance:
            states = [s for s in instance.all_instigator_state() if s.name == "stream_supervisor"]
            ticks = [
                t
                for s in states
                for t in instance.get_ticks(s.instigator_origin_id, s.selector_id, limit=10)
                if t.status.value == "SKIPPED"
            ]
        if len(ticks) >= count:
            return sorted(ticks, key=lambda t: t.timestamp, reverse=True)[:count]
        assert time.monotonic() < deadline, f"{len(ticks)} supervisor tick(s) in {timeout} s"
        time.sleep(5)


def _raw_events(instance: DagsterInstance) -> dict[str, list]:
    """raw/orders' materializations per day, oldest first."""
    records = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=RAW_ORDERS), limit=10_000, ascending=True
    ).records
    found: dict[str, list] = {}
    for record in records:
        found.setdefault(record.asset_materialization.partition, []).append(
            record.asset_materialization
        )
    return found


def test_the_stream_reports_each_partition_at_most_once_per_interval():
    """Coalescing, on the reporter alone: 40 batches writing two days and folding one, a
    report interval of 1 s. Each partition gets a materialization at once, then at most one
    per interval (a timer reports the last batches of a quiet spell), then what is pending
    when the stream stops; together they carry every row, and each day's last one carries
    the final offsets and batch. A day past the partitions is held, never reported."""
    days, today = ["2024-01-10", "2024-01-11"], datetime.now(UTC).date().isoformat()
    with DagsterInstance.ephemeral() as instance:
        with StreamReporter(instance, None, TOPIC, interval_seconds=1.0) as reporter:
            started, after = time.monotonic(), {0: 0, 1: 0}
            for batch_id in range(40):
                spans = {p: (after[p], after[p] + 2) for p in after}
                after = {p: after[p] + 2 for p in after}
                rows = {days[0]: 3, days[1]: 1} | ({today: 1} if batch_id == 7 else {})
                staged = {"staging/orders": {days[0]: 100 + batch_id}}
                reporter(
                    BatchReport(
                        batch_id,
                        sum(rows.values()),
                        0,
                        spans,
                        rows,
                        batch_id + 1,
                        0.1,
                        staged=staged,
                    )
                )
                time.sleep(0.05)
            elapsed = time.monotonic() - started
            time.sleep(1.5)  # quiet: the timer reports what the last batches left pending
            assert reporter.reported == sum(len(e) for e in _raw_events(instance).values()) + len(
                instance.fetch_materializations(AssetKey(["staging", "orders"]), 100).records
            )
            quiet = reporter.reported
            assert reporter.held == [today] and "held " + today in reporter.notes[0]
        assert reporter.reported == quiet  # the timer had left nothing for the stop
        raw = _raw_events(instance)
        assert set(raw) == set(days)
        bound = elapsed / reporter.interval + 2
        for day, per_batch in ((days[0], 3), (days[1], 1)):
            events = raw[day]
            assert 2 <= len(events) <= bound < 40, (day, len(events), bound)
            assert events[0].metadata["batches"].value == 1  # the first batch, at once
            assert sum(e.metadata["rows"].value for e in events) == 40 * per_batch
            assert sum(e.metadata["batches"].value for e in events) == 40
            last = events[-1].metadata
            assert last["batch_id"].value == 39 and last["delta_version"].value == 40
            assert last["offsets"].value["0"]["next"] == last["offsets"].value["1"]["next"] == 80
        staged = instance.fetch_materializations(AssetKey(["staging", "orders"]), 100).records
        assert (
            len(staged) <= bound
            and staged[0].asset_materialization.metadata["delta_version"].value == 139
        )  # newest first


def test_checks_of_days_folded_before_are_reported_alone_and_only_for_the_newest_commit():
    """The marts' checks wait for their interval (`MartsFold.check_seconds`), so a batch can
    carry evaluations of days an earlier batch folded: they are reported as evaluations
    alone (no second materialization), and a later commit of the day drops the evaluation
    still pending before it (it verified the day before that commit)."""
    fct, day, other = "marts/fct_daily_revenue", "2024-01-10", "2024-01-11"

    def outcome(*days: str) -> CheckOutcome:
        results = [PartitionResult(d, 1, 1, True) for d in days]
        return CheckOutcome("matches_staging_orders", AssetKey.from_user_string(fct), results)

    def batch(batch_id: int, written: dict[str, int], checked: tuple[str, ...]) -> BatchReport:
        folded = MartsFolded(written={fct: written} if written else {})
        folded.outcomes = [outcome(*checked)] if checked else []
        staged = {fct: written} if written else {}
        return BatchReport(batch_id, 0, 0, {}, {}, None, 0.1, staged=staged, marts=folded)

    with DagsterInstance.ephemeral() as instance:
        with StreamReporter(instance, None, TOPIC, interval_seconds=600) as reporter:
            reporter(batch(0, {day: 5}, (day,)))  # folded and checked: both reported at once
            reporter(batch(1, {other: 6}, ()))  # folded, its check waits
            reporter(batch(2, {}, (other,)))  # the check of batch 1's day, from a later batch
            reporter(batch(3, {day: 7}, ()))  # the day again, not checked yet
            reporter(batch(4, {}, (day,)))  # its check, which verifies version 7
            reporter(batch(5, {day: 8}, ()))  # a newer commit: that check is stale
        checks = instance.event_log_storage.get_asset_check_execution_history(
            AssetCheckKey(AssetKey.from_user_string(fct), "matches_staging_orders"), limit=10
        )
        materialized = instance.fetch_materializations(AssetKey.from_user_string(fct), 10)
    versions = {
        (r.asset_materialization.partition, r.asset_materialization.metadata["delta_version"].value)
        for r in materialized.records
    }
    # day: batch 0's, then batches 3 and 5 as one (at the stop); other: batch 1's
    assert versions == {(day, 5), (day, 8), (other, 6)} and reporter.reported == 3
    # day's check of batch 0, other's of batch 2; batch 4's was superseded by batch 5's commit
    assert sorted(c.partition for c in checks) == [day, other], checks


def test_a_stream_of_small_batches_keeps_raw_files_and_events_bounded(broker, spark, tmp_path):
    """The stream as it runs for months, in miniature: 16 batches of at most 4 messages
    over two ingest days, a day compacted at 4 small files, a report interval longer than
    the run. Every message is in raw once, each day holds fewer than 4 small files once the
    stream stopped (compacted beside it, no row changed), and each day has two
    materializations (the first batch at once, the rest when the stream stopped) that carry
    every row and end at the final offsets; the stream's status skips the compactions'
    commits to find its last batch."""
    topic, days = "orders_upkeep", ["2024-01-10", "2024-01-11"]
    broker.create_topic(topic, 2)
    platform = Platform.create(tmp_path / "upkeep")
    lake = platform.resources["lakehouse"]
    orders = OrdersTopicResource(
        bootstrap_servers=broker.bootstrap, topic=topic, max_offsets_per_batch=4
    )
    messages = [
        Message(
            f"u-{i}",
            order_line(f"u-{i}", f"{days[i % 2]}T10:00:00Z"),
            datetime.fromisoformat(f"{days[i % 2]}T10:00:00+00:00") + timedelta(seconds=i),
            "version",
        )
        for i in range(64)
    ]
    produced = produce(broker.bootstrap, topic, messages)
    stop, seen, heard = threading.Event(), [], []
    with StreamReporter(platform.instance, lake, topic, interval_seconds=3600) as reporter:

        def on_batch(batch: BatchReport) -> None:
            reporter(batch)
            seen.append(batch)

        done: dict = {}
        stream = threading.Thread(
            target=lambda: done.update(
                report=run_stream(
                    lake, orders, stop, 1.0, on_batch, compact_files=4, on_compaction=heard.append
                )
            )
        )
        stream.start()
        deadline = time.monotonic() + 400
        while sum(b.rows for b in seen) < len(produced) and time.monotonic() < deadline:
            time.sleep(0.5)
        stop.set()
        stream.join()
    report = done["report"]
    assert report.rows == len(produced) and len(report.batches) >= 16
    raw = lake.read(RAW_ORDERS).where(F.col("kafka_topic") == topic)
    assert sorted((r["kafka_partition"], r["kafka_offset"]) for r in raw.collect()) == sorted(
        (p.partition, p.offset) for p in produced
    )
    files = small_files(lake, RAW_ORDERS)
    assert set(files) == set(days) and max(files.values()) < 4, files
    # a round compacts every day at the threshold: one file out per day
    assert report.compactions
    assert all(c.files_added == len(c.small_files) for c in report.compactions)
    optimized = [c for c in lake.history(RAW_ORDERS) if c["operation"] == "OPTIMIZE"]
    assert len(optimized) == len(report.compactions)

    per_day = Counter(p.message.timestamp.date().isoformat() for p in produced)
    final = {p: max(b.offsets[p][1] for b in report.batches if p in b.offsets) for p in (0, 1)}
    for day, events in _raw_events(platform.instance).items():
        assert len(events) == 2, (day, [e.metadata["batches"].value for e in events])
        assert sum(e.metadata["rows"].value for e in events) == per_day[day]
        last = events[-1].metadata
        assert last["batch_id"].value == max(b.batch_id for b in seen if day in b.rows_by_day)
        assert {int(p): s["next"] for p, s in last["offsets"].value.items()} == final
    status = stream_status(lake, orders)
    assert status.lag == 0 and status.last_batch["batch_id"] == report.batches[-1].batch_id
