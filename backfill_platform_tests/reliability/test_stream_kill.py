"""The stream SIGKILLed inside a micro-batch (contract 1.4, exactly once in raw): after the
batch's Delta commit but before the checkpoint marks it done, and before it wrote anything.
The restarted stream re-runs that batch over the same offsets; Delta's transaction id skips
it when it had committed. Nothing is lost, nothing is twice."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime

import pytest
from pyspark.sql import functions as F

from backfill_platform.operations.stream import catch_up
from backfill_platform.resources import LakehouseResource
from backfill_platform.resources.kafka import OrdersTopicResource
from backfill_platform.sources.kafka_broker import kafka_broker
from backfill_platform.sources.producer import produce, shop_events
from backfill_platform_tests.harness import spark_resource_for_tests
from backfill_platform_tests.reliability.procs import REPO_ROOT
from backfill_platform_tests.reliability.stream_child import BATCH_SIZE

pytestmark = pytest.mark.reliability

KILL_POINTS = {"small": ["after_commit"], "full": ["after_commit", "before_commit"]}
KILLED_BATCH = 1


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with kafka_broker(tmp_path_factory.mktemp("kafka") / "data", "orders", 2) as b:
        yield b


@pytest.mark.parametrize("when", KILL_POINTS["full"])
def test_stream_killed_inside_a_batch_loses_and_doubles_nothing(
    when, size, figures, broker, tmp_path, spark
):
    if when not in KILL_POINTS[size]:
        pytest.skip(f"{when}: RELIABILITY_SIZE=full only")
    topic = f"orders_{when}"
    broker.create_topic(topic, 2)
    launch = datetime(2024, 2, 1, tzinfo=UTC)
    produced = produce(broker.bootstrap, topic, shop_events(launch, 15, seed=11))
    assert len(produced) > (KILLED_BATCH + 1) * BATCH_SIZE  # the killed batch is not the last
    lakehouse = tmp_path / "lakehouse"

    child = subprocess.run(
        [
            *(sys.executable, "-m", "backfill_platform_tests.reliability.stream_child"),
            *(str(lakehouse), broker.bootstrap, topic, str(KILLED_BATCH), when),
        ],
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        start_new_session=True,  # its own process group: the kill takes the JVM too
        capture_output=True,
        text=True,
    )
    assert child.returncode == -9, child.stderr[-3000:]

    lake = LakehouseResource(root_dir=str(lakehouse), spark=spark_resource_for_tests())
    orders = OrdersTopicResource(
        bootstrap_servers=broker.bootstrap, topic=topic, max_offsets_per_batch=BATCH_SIZE
    )
    restarted = catch_up(lake, orders)
    first = restarted.batches[0]
    assert first.batch_id == KILLED_BATCH  # the checkpoint re-ran the unfinished batch
    # Committed before the kill: skipped on replay; killed before writing: written now.
    assert (first.delta_version is None) == (when == "after_commit")

    rows = lake.read("raw/orders").where(F.col("kafka_topic") == topic)
    held = sorted((r[0], r[1]) for r in rows.select("kafka_partition", "kafka_offset").collect())
    expected = sorted((p.partition, p.offset) for p in produced)
    lost = len(set(expected) - set(held))
    doubled = len(held) - len(set(held))
    figures.setdefault("stream_kills", []).append(
        {"kill_point": when, "messages": len(expected), "lost": lost, "duplicated": doubled}
    )
    assert held == expected
