"""The live stream's throughput and latency (`make bench-stream`, docs/live-stream.md).

A real one-node broker, the demo shop's messages, the platform's own stream (Structured
Streaming, raw/orders exactly once, each batch folded into staging: BACKFILL_STREAM_STAGING):

- **alone**: `--messages` produced up front, then one catch-up; events/s = messages over
  the query's seconds (raw and staging written, JVM already warm);
- **steady**: the shop produces `--rate` messages/s for `--seconds` while the stream runs
  (a micro-batch every `--trigger-seconds`); each message's latency is the wall time from
  its send to the end of the batch that put it in staging/orders (its `on_batch` call),
  p50/p95/max, and the batches' count and longest.

Prints a table, writes `benchmarks/results/stream-<timestamp>.json`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
TOPIC = "orders"
LAUNCH = datetime(2024, 1, 10, tzinfo=UTC)
CURRENCIES = {"EUR": "1.1", "GBP": "1.3", "JPY": "0.007", "CHF": "1.1"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000, help="alone: produced first")
    parser.add_argument("--rate", type=float, default=1_000.0, help="steady: messages/s")
    parser.add_argument("--seconds", type=float, default=60.0, help="steady: how long")
    parser.add_argument("--trigger-seconds", type=float, default=1.0)
    parser.add_argument("--partitions", type=int, default=4)
    args = parser.parse_args(argv)

    from backfill_platform.operations.stream import StagingFold, catch_up
    from backfill_platform.resources.kafka import OrdersTopicResource
    from backfill_platform.sources.kafka_broker import kafka_broker
    from backfill_platform.sources.producer import produce, shop_events
    from backfill_platform_tests.harness import Platform

    work = Path(tempfile.mkdtemp(prefix="bench-stream-"))
    platform = Platform.create(work / "platform")
    lake = platform.resources["lakehouse"]
    # FX rates for the stream's days, so staging stages orders in every currency.
    days = [(LAUNCH + timedelta(days=d)).date().isoformat() for d in range(-1, 3)]
    for day in days:
        platform.write_rates(day, CURRENCIES)
    platform.materialize(days[0], days[-1], selection=["raw/fx_rates"])
    fold = StagingFold()
    result: dict = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "args": vars(args)}
    with kafka_broker(work / "kafka", TOPIC, partitions=args.partitions) as broker:
        orders = OrdersTopicResource(bootstrap_servers=broker.bootstrap, topic=TOPIC)
        # A day's worth of shop per message batch: a live batch covers one or two days.
        per_day = max(args.messages, int(args.rate * args.seconds))
        warm = produce(broker.bootstrap, TOPIC, shop_events(LAUNCH, 50, orders_per_day=per_day))
        catch_up(lake, orders, fold=fold)  # JVM, Kafka client and Delta warm

        messages = shop_events(LAUNCH, args.messages // 2, first_order=50, orders_per_day=per_day)
        messages = messages[: args.messages]
        produced = produce(broker.bootstrap, TOPIC, messages)
        alone = catch_up(lake, orders, fold=fold)
        result["alone"] = {
            "messages": len(produced),
            "batches": len(alone.batches),
            "seconds": round(alone.seconds, 2),
            "events_per_second": round(len(produced) / alone.seconds, 1),
            "staging_seconds": round(sum(b.staging_seconds for b in alone.batches), 2),
        }
        print(f"alone: {result['alone']}", flush=True)

        steady = _steady(lake, orders, fold, args, first_order=50 + args.messages, per_day=per_day)
        result["steady"] = steady
        result["warm_up_messages"] = len(warm)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"stream-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=2))
    a, s = result["alone"], result["steady"]
    print()
    print("| run | messages | events/s | batches | latency p50 s | p95 s | max s | target |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    print(
        f"| alone (raw + staging) | {a['messages']:,} | {a['events_per_second']:,.0f} | "
        f"{a['batches']} | - | - | - | >= 5,000 events/s: "
        f"{'met' if a['events_per_second'] >= 5000 else 'NOT met'} |"
    )
    print(
        f"| steady {args.rate:,.0f}/s for {args.seconds:.0f} s | {s['messages']:,} | "
        f"{s['events_per_second']:,.0f} | {s['batches']} | {s['latency_p50']} | "
        f"{s['latency_p95']} | {s['latency_max']} | p95 <= 60 s: "
        f"{'met' if s['latency_p95'] <= 60 else 'NOT met'} |"
    )
    print(f"\nwritten {out}")
    return 0


def _steady(lake, orders, fold, args, first_order: int, per_day: int) -> dict:
    """The stream running while the shop sends at `args.rate`; latency per message."""
    from backfill_platform.operations.stream import run_stream
    from backfill_platform.sources.producer import produce, shop_events

    sent_at: dict[tuple[int, int], float] = {}
    done_at: dict[tuple[int, int], float] = {}
    batches: list[float] = []
    stop = threading.Event()

    def on_batch(batch) -> None:
        now = time.monotonic()
        batches.append(batch.seconds)
        for p, (lo, hi) in batch.offsets.items():
            for offset in range(lo, hi + 1):
                done_at.setdefault((p, offset), now)

    stream = threading.Thread(
        target=run_stream,
        args=(lake, orders, stop, args.trigger_seconds),
        kwargs={"on_batch": on_batch, "fold": fold},
    )
    stream.start()
    total = int(args.rate * args.seconds)
    messages = shop_events(LAUNCH, total, first_order=first_order, orders_per_day=per_day)[:total]
    tick = 0.5
    per_tick = max(1, int(args.rate * tick))
    started = time.monotonic()
    for index in range(0, len(messages), per_tick):
        ahead = started + (index / per_tick) * tick - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
        now = time.monotonic()
        for p in produce(orders.bootstrap_servers, TOPIC, messages[index : index + per_tick]):
            sent_at[(p.partition, p.offset)] = now
    produced_seconds = time.monotonic() - started
    deadline = time.monotonic() + 300
    while len(set(sent_at) - set(done_at)) and time.monotonic() < deadline:
        time.sleep(0.5)
    stop.set()
    stream.join()
    latencies = sorted(done_at[k] - t for k, t in sent_at.items() if k in done_at)
    quantiles = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else [0.0] * 99
    return {
        "messages": len(sent_at),
        "produced_seconds": round(produced_seconds, 2),
        "events_per_second": round(len(sent_at) / produced_seconds, 1),
        "not_staged": len(set(sent_at) - set(done_at)),
        "batches": len(batches),
        "longest_batch_seconds": round(max(batches, default=0.0), 2),
        "latency_p50": round(quantiles[49], 2),
        "latency_p95": round(quantiles[94], 2),
        "latency_max": round(latencies[-1], 2) if latencies else None,
    }


if __name__ == "__main__":
    sys.exit(main())
