"""History backfilled through the deployment beside the running stream (contract 1.4):
the stream runs as the operator starts it (`backfill-platform stream start`, its batches
reported to the deployment's instance) and the shop sells at 1 message/s, while a backfill
of every layer over the export's days is launched the way the UI's dialog launches it
(GraphQL) and run by the daemon in runs of their own. The stream's days are then folded in
by `backfill-platform backfill` on the deployment, and the boundary is proven: every offset
once, every landing line, staging, rejects and the marts equal to the contract's answer
over both sources, and `stream reconcile` agrees. The reliability suite's twin
(test_stream_backfill.py) runs the backfill in a process of its own and SIGKILLs it."""

from __future__ import annotations

import subprocess
import sys
import threading
from datetime import UTC, date, datetime, timedelta

import pytest
from dagster import DagsterInstance

from backfill_platform.operations.stream import STREAM_WRITER
from backfill_platform.ranges import DayRange
from backfill_platform.resources.stream_process import StreamProcess
from backfill_platform.sources.generate import generate_landing
from backfill_platform.sources.kafka_broker import kafka_broker
from backfill_platform.sources.producer import Produced, produce, shop_events
from backfill_platform.tables import RAW_ORDERS, TABLE_NAMES
from backfill_platform_tests.e2e.browser import chromium
from backfill_platform_tests.e2e.conftest import ALL_ASSETS, BACKFILL_TIMEOUT, start_deployment
from backfill_platform_tests.e2e.services import REPO_ROOT, cli_env, run_cli
from backfill_platform_tests.e2e.tables import lakehouse_for
from backfill_platform_tests.e2e.test_ui_browser import ARTIFACTS, open_page
from backfill_platform_tests.reliability.stream_helpers import (
    as_message,
    converged,
    overlap_messages,
    stream_commit_times,
    wait_for_offsets,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TOPIC = "orders"
FIRST = date(2024, 1, 1)
DAYS, PER_DAY, SEED = 6, 10, 23
# The shop: more orders than it can sell before the backfill ends (it stops selling then),
# at 50 a day, so the stream's days stay few and its last event day (launch + 6 days) stays
# within transforms/fx.REACH_DAYS of the last rate, however long the backfill takes: at 40 a
# day a slow backfill let it sell into a day no rate covers, and the fold refused that day.
SHOP_ORDERS, SHOP_PER_DAY, BEFORE = 300, 50, 8
# The stream's trigger: a micro-batch of a few messages costs its JVM about 4 CPU-s, so at
# 1 s the stream took a core from the backfill beside it; every 10 s it still commits many
# times during the backfill's runs, which is what the test asserts.
TRIGGER_SECONDS = "10"

RUN_TIMES = """
query ($ids: [String!]) {
  runsOrError(filter: {runIds: $ids}) {
    ... on Runs { results { runId status startTime endTime } }
  }
}
"""


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with kafka_broker(tmp_path_factory.mktemp("kafka") / "data", TOPIC, partitions=3) as b:
        yield b


def test_ui_backfill_beside_the_running_stream_converges_to_the_contract(tmp_path, broker, spark):
    last = FIRST + timedelta(days=DAYS - 1)
    launch = datetime(last.year, last.month, last.day, tzinfo=UTC)  # L: the export's last day
    landing = tmp_path / "landing"
    generate_landing(landing, FIRST, last, PER_DAY, seed=SEED, malformed_rate=0.02)
    deployment = start_deployment(
        tmp_path / "deployment",
        landing=landing,
        extra_env={"BACKFILL_KAFKA_BOOTSTRAP": broker.bootstrap, "BACKFILL_ORDERS_TOPIC": TOPIC},
    )
    dagster = deployment.dagster
    lake = lakehouse_for(deployment.lakehouse, spark)
    process = StreamProcess(dagster.home / "stream")
    shop = shop_events(launch, SHOP_ORDERS, seed=SEED, orders_per_day=SHOP_PER_DAY)
    overlap = overlap_messages(landing, last, launch)
    everything = ",".join(TABLE_NAMES)
    selling = threading.Event()
    feed: list[Produced] = []

    def sell() -> None:
        """The shop at 1 message/s until the backfill has finished."""
        for i in range(BEFORE, len(shop), 2):
            if not selling.is_set():
                return
            feed.extend(produce(broker.bootstrap, TOPIC, shop[i : i + 2], 1))

    shopkeeper = threading.Thread(target=sell)
    try:
        # History is loaded into a stream that is live: it holds what the shop sold so far.
        produced = produce(broker.bootstrap, TOPIC, overlap + shop[:BEFORE])
        started, _ = run_cli(deployment, "stream", "start", "--trigger-seconds", TRIGGER_SECONDS)
        assert started.returncode == 0, started.stdout + started.stderr
        wait_for_offsets(lake, TOPIC, len(produced), process)

        selling.set()
        shopkeeper.start()
        backfill_id = dagster.launch_backfill(ALL_ASSETS, FIRST.isoformat(), last.isoformat())
        status = dagster.wait_backfill(backfill_id, BACKFILL_TIMEOUT)
        selling.clear()
        run_ids = [r["runId"] for r in status["runs"]]
        runs = dagster.graphql(RUN_TIMES, {"ids": run_ids})["runsOrError"]["results"]
        shopkeeper.join(timeout=120)
        produced += feed
        wait_for_offsets(lake, TOPIC, len(produced), process)
        assert process.pid() is not None, "the stream stopped"

        newest = max(last, *(as_message(p).ingest_date for p in produced))
        message_days = {as_message(p).ingest_date.isoformat() for p in produced}
        # What a user sees: a day only the stream wrote, its runless materializations on
        # the asset's page (screenshot in test-artifacts/), beside the backfill's days.
        ARTIFACTS.mkdir(exist_ok=True)
        with chromium() as driver:
            open_page(
                driver,
                f"{dagster.url}/assets/raw/orders?view=events&partition={newest.isoformat()}",
                ["stream batch", newest.isoformat()],
            )
            driver.save_screenshot(str(ARTIFACTS / "stream-day-events.png"))
            # Every day materialized: the backfill's history and each day a message landed
            # on. The shop's late versions land days after the rest, so the days after the
            # export can have gaps: how many it sold before the backfill ended decides.
            history = set(DayRange.of_days(FIRST, last).day_keys())
            days = len(history | message_days)
            partitions = f"{dagster.url}/assets/raw/orders?view=partitions"
            open_page(driver, partitions, [f"Materialized ({days})"])
            driver.save_screenshot(str(ARTIFACTS / "stream-partitions.png"))

        # The stream's days folded in by the CLI on the deployment (the rolling window's job).
        folded, fold = run_cli(
            deployment, "backfill", "--select", everything, "--start", last.isoformat(),
            "--end", newest.isoformat(), "--reason", "e2e: fold the stream's days in",
        )  # fmt: skip
        boundary, report = run_cli(
            deployment, "stream", "reconcile", "--start", FIRST.isoformat(),
            "--end", newest.isoformat(), refusal_fails=False,
        )  # fmt: skip
        assert process.pid() is not None, "the stream stopped"
    finally:
        selling.clear()
        if shopkeeper.is_alive():
            shopkeeper.join(timeout=120)
        subprocess.run(
            [sys.executable, "-m", "backfill_platform", "stream", "stop"],
            cwd=REPO_ROOT,
            env=cli_env(deployment),
            capture_output=True,
            timeout=120,
        )
        dagster.stop()

    assert status["status"] == "COMPLETED_SUCCESS", status
    assert runs and all(r["status"] == "SUCCESS" for r in runs), runs
    window = (min(r["startTime"] for r in runs), max(r["endTime"] for r in runs))
    inside = [t for t in stream_commit_times(lake) if window[0] <= t <= window[1]]
    print(
        f"backfill: {len(runs)} runs over {window[1] - window[0]:.0f} s; "
        f"{len(inside)} stream commits inside it; {len(feed)} messages sold meanwhile"
    )
    assert inside, "the stream committed nothing while the daemon's runs ran"
    assert folded.returncode == 0 and fold["outcome"] == "COMPLETED_SUCCESS", fold

    result = converged(lake, landing, FIRST, newest, TOPIC, produced, overlap)
    print(result.figures)
    result.check()
    assert boundary.returncode == 0, boundary.stdout + boundary.stderr
    assert report["failed_days"] == [], report

    # The deployment saw the stream: a runless raw/orders materialization, written by the
    # stream, for every day it wrote (the asset's partitions page shows them).
    with DagsterInstance.from_config(str(dagster.home)) as instance:
        records = instance.fetch_materializations(RAW_ORDERS, limit=10_000).records
    streamed = {
        r.asset_materialization.partition
        for r in records
        if r.run_id == "" and r.asset_materialization.metadata["writer"].value == STREAM_WRITER
    }
    assert streamed == message_days, (streamed, message_days)
