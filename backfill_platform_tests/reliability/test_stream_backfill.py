"""History loaded into the tables a live stream is writing (contract 1.4): the
stream runs as its detached process, fed at a steady rate, while a backfill of every layer
(with its checks) rewrites the landing zone's history over the same tables in a process of
its own. The export and the stream overlap on the launch day, and some orders come both
ways. After both finish and the rolling window has folded the stream's days in: every
offset in raw once, every landing line in raw, and staging, rejects and the marts equal to
the contract's answer over landing files and messages together. The backfill is SIGKILLed
once in the middle of a pass and run again: nothing lost, nothing twice.

Twice at RELIABILITY_SIZE=full, the store's trial alone at the small size (CI): on a local
root, where the table lock takes the two writers in turns, and on an S3-compatible store
(versitygw on 127.0.0.1) with the stream staging its own batches, where no lock orders the
writers: Delta's optimistic concurrency lets a blind append pass a replace of other rows
and finds two replaces of one day in conflict; the losing side retries, and each winning
commit records the conflicts it lost (`conflicts_retried`), counted here.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pytest
from dagster import DagsterInstance

from backfill_platform import cli
from backfill_platform.definitions import all_assets, build_resources
from backfill_platform.resources import LakehouseResource
from backfill_platform.resources.stream_process import StreamProcess
from backfill_platform.runner import backfill as run_backfill
from backfill_platform.sources.generate import generate_landing
from backfill_platform.sources.kafka_broker import kafka_broker
from backfill_platform.sources.producer import Message, Produced, produce, shop_events
from backfill_platform.tables import TABLE_NAMES
from backfill_platform_tests.e2e.object_store import S3Server
from backfill_platform_tests.harness import spark_resource_for_tests
from backfill_platform_tests.reliability.procs import REPO_ROOT, reap, spawn
from backfill_platform_tests.reliability.stream_helpers import (
    as_message,
    concurrency,
    converged,
    overlap_messages,
    stream_commit_times,
    wait_for_offsets,
)

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

FIRST = datetime(2024, 1, 1, tzinfo=UTC)
TOPIC = "orders"
SIZES = {
    # landing days, orders per landing day, backfill chunk, stream orders (before the
    # backfill + during it), stream orders per day, messages per second during the backfill
    "small": {
        "days": 6,
        "per_day": 10,
        "per_run": 6,
        "stream": (8, 16),
        "stream_day": 10,
        "rate": 1,
        "pass_seconds": 900,  # the most one pass of the backfill may take here
    },
    "full": {
        "days": 366,
        "per_day": 10,
        "per_run": 31,
        "stream": (100, 400),
        "stream_day": 100,
        "rate": 2,
        "pass_seconds": 2400,
    },
}


@pytest.fixture(scope="module")
def s3(tmp_path_factory, spark):
    server = S3Server(tmp_path_factory.mktemp("s3"))
    server.start()
    server.configure(spark)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with kafka_broker(tmp_path_factory.mktemp("kafka") / "data", TOPIC, partitions=3) as b:
        yield b


def _stream_committed_during_a_pass(events: list[dict], lake: LakehouseResource) -> bool:
    """A stream commit between a complete pass's start and its end. A pass starts before its
    first run: a "run" event marks a run's end, and the stream may commit only during the
    first run (the shop's feed is short at the small size), so it cannot mark the start."""
    passes = [(e["t"] - e["seconds"], e["t"]) for e in events if e["event"] == "pass"]
    if not passes:  # polled every 2 s: no history read before a pass has ended
        return False
    commits = stream_commit_times(lake)
    return any(start <= t <= end for start, end in passes for t in commits)


def longest_wait_while_selling(commits: list[float], selling: list[tuple[float, float]]) -> float:
    """The longest time the shop was selling with no stream commit. A gap between two
    commits is only the stream's while there was something to read: at the full size the
    feed ends long before the backfill's pass, and the time after it is no stall. Each feed
    counts from its first message to the first commit after its last."""
    longest = 0.0
    for began, ended in selling:
        after = [t for t in commits if t > ended][:1] or [ended]
        marks = [began, *[t for t in commits if began < t <= ended], *after]
        longest = max(longest, *(b - a for a, b in pairwise(marks)))
    return longest


@pytest.mark.parametrize("store", ["local", "s3a"])
def test_history_backfilled_beside_the_running_stream_equals_the_contract(
    tmp_path, spark, size, figures, broker, monkeypatch, store, request
):
    if store == "local" and size == "small":
        pytest.skip(
            "local root: RELIABILITY_SIZE=full only (CI runs the store's trial; the local root "
            "beside the stream is e2e/test_stream_deployed_backfill.py's)"
        )
    cfg = SIZES[size]
    last = (FIRST + timedelta(days=cfg["days"] - 1)).date()
    launch = datetime(last.year, last.month, last.day, tzinfo=UTC)  # L: the export's last day
    landing, lakehouse, home = tmp_path / "landing", str(tmp_path / "lake"), tmp_path / "home"
    home.mkdir()
    if store == "s3a":  # every process reads the store's settings, as a deployment's would
        s3 = request.getfixturevalue("s3")
        lakehouse = s3.bucket(f"stream-{size}") + "/lake"
        for name, value in s3.env().items():
            monkeypatch.setenv(name, value)
        # One machine: an s3a:// root needs an explicit limiter (a per-machine file is refused).
        monkeypatch.setenv("BACKFILL_CRM_LIMITER", str(tmp_path / "crm_rate_limit.sqlite"))
        # The stream stages its batches too, so both writers replace staging's shared days
        # (raw is no contest: Delta lets a blind append commute with a replace).
        monkeypatch.setenv("BACKFILL_STREAM_STAGING", "true")
    generate_landing(landing, FIRST.date(), last, cfg["per_day"], seed=21, malformed_rate=0.02)
    for name, value in {
        "DAGSTER_HOME": str(home),
        "BACKFILL_LAKEHOUSE_DIR": lakehouse,
        "BACKFILL_LANDING_DIR": str(landing),
        "BACKFILL_KAFKA_BOOTSTRAP": broker.bootstrap,
        "BACKFILL_ORDERS_TOPIC": TOPIC,
        "PYTHONPATH": str(REPO_ROOT),
    }.items():
        monkeypatch.setenv(name, value)

    before, during = cfg["stream"]
    shop = shop_events(launch, before + during, seed=21, orders_per_day=cfg["stream_day"])
    split = next(i for i, m in enumerate(shop) if m.key == f"s-21-{before:06d}")
    overlap = overlap_messages(landing, last, launch)
    produced = produce(broker.bootstrap, TOPIC, overlap + shop[:split])
    process = StreamProcess(home / "stream")
    assert cli.main(["stream", "start", "--trigger-seconds", "1"]) == 0
    work = tmp_path / "workers"
    stop = work / "stop"

    def start_backfill(name: str):
        return spawn(
            work,
            name,
            "loop",
            {
                "landing": str(landing),
                "lakehouse": lakehouse,
                "role": "backfill",
                "first": FIRST.date().isoformat(),
                "last": last.isoformat(),
                "per_run": cfg["per_run"],
                "stop": str(stop),
                "checks": True,
            },
        )

    backfill = start_backfill("backfill")
    again = None
    feed: list[Produced] = []
    selling: list[tuple[float, float]] = []  # when each feed ran

    def feeder(messages: list[Message]) -> threading.Thread:
        """The shop selling at its rate, in the background."""

        def sell() -> None:
            began = time.time()
            feed.extend(produce(broker.bootstrap, TOPIC, messages, cfg["rate"]))
            selling.append((began, time.time()))

        thread = threading.Thread(target=sell)
        thread.start()
        return thread

    # A third of the sales beside the backfill that is killed, the rest beside its rerun.
    killed_share = split + (len(shop) - split) // 3
    started = time.monotonic()
    lake = LakehouseResource(root_dir=lakehouse, spark=spark_resource_for_tests())
    try:
        # History is loaded into a stream that is live: it holds what the shop sold so far.
        wait_for_offsets(lake, TOPIC, len(produced), process)
        backfill.wait("ready", timeout=900)
        backfill.go()
        went = time.time()
        feeding = [feeder(shop[split:killed_share])]  # the shop sells while history loads
        # Part 8: once the stream has committed beside it, the backfill is SIGKILLed (its
        # Python and its JVM) with its pass in flight, and started again; the stream is
        # never stopped.
        limit = cfg["pass_seconds"]
        deadline = time.monotonic() + limit
        while not [t for t in stream_commit_times(lake) if t > went]:
            backfill.check()
            assert time.monotonic() < deadline, f"no stream commit beside the backfill in {limit} s"
            time.sleep(1)
        backfill.kill()
        killed_at = time.monotonic() - started
        again = start_backfill("backfill-again")
        again.wait("ready", timeout=900)
        again.go()
        deadline = time.monotonic() + limit  # the restart's own pass, from its start
        feeding.append(feeder(shop[killed_share:]))
        # It re-runs history (idempotently) while the shop sells, and until a whole pass has
        # had a stream commit beside it: on two busy cores one micro-batch can outlast one
        # small pass.
        while any(t.is_alive() for t in feeding) or not _stream_committed_during_a_pass(
            again.events(), lake
        ):
            again.check()
            assert process.pid() is not None, process.log.read_text()[-3000:]
            assert time.monotonic() < deadline, f"no stream commit beside a pass in {limit} s"
            time.sleep(2)
        stop.touch()
        assert again.finish(timeout=limit) == 0, again.log()
        for thread in feeding:
            thread.join(timeout=900)
        produced += feed
        wait_for_offsets(lake, TOPIC, len(produced), process)
    finally:
        reap([w for w in (backfill, again) if w is not None])
        cli.main(["stream", "stop"])
    assert process.pid() is None
    window = (went, max(e["t"] for e in again.events() if e["event"] == "pass"))

    # The rolling window folds the stream's days in (the deployment's sensor would ask).
    messages = [as_message(p) for p in produced]
    newest = max(max(m.ingest_date for m in messages), last)
    resources = build_resources(str(landing), lakehouse, spark=spark_resource_for_tests())
    with DagsterInstance.ephemeral() as instance:
        run_backfill(all_assets, last.isoformat(), newest.isoformat(), resources, instance)

    result = converged(lake, landing, FIRST.date(), newest, TOPIC, produced, overlap)
    commits = stream_commit_times(lake)
    inside = [t for t in commits if window[0] <= t <= window[1]]
    gaps = [b - a for a, b in zip([window[0], *inside], [*inside, window[1]], strict=True)]
    contest = {t: c for t, c in concurrency(lake, TABLE_NAMES).items() if any(c.values())}
    stats = {
        "store": store,
        "landing_days": cfg["days"],
        **result.figures,
        "messages_during_backfill": len(feed),
        "stream_commits_during_backfill": len(inside),
        "max_seconds_between_stream_commits": round(max(gaps), 1),
        "max_seconds_without_a_stream_commit_while_selling": round(
            longest_wait_while_selling(commits, selling), 1
        ),
        "backfill_seconds": round(window[1] - window[0], 1),
        "backfill_killed_mid_pass_at_seconds": round(killed_at, 1),
        "backfill_runs_before_the_kill": sum(e["event"] == "run" for e in backfill.events()),
        "concurrent_commits": sum(c["concurrent"] for c in contest.values()),
        "conflicts_seen_and_retried": sum(c["conflicts_retried"] for c in contest.values()),
        "concurrency_by_table": contest,
        "seconds": round(time.monotonic() - started, 1),
    }
    figures.setdefault("details", []).append(stats)
    figures["trials"] = len(figures["details"])
    print(json.dumps(stats))

    assert inside, "the stream committed nothing while the backfill ran"
    result.check()
