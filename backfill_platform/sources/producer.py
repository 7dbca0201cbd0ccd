"""The demo producer: the live shop's order events onto the topic (contract 1.4).

    python -m backfill_platform.sources.producer --launch 2026-01-01T00:00:00Z --orders 200

New orders from the launch instant L on, their later versions (some days late, so out of
order), exact duplicates and malformed messages; each message keyed by order id, its value
one landing line (the records `generate.py` writes to the landing zone, so both sources
share one format). Deterministic for (seed, L, first order): the same messages, the same
timestamps, the same partitions (murmur2 of the key, as Java clients).

Timestamps are the producer's (the topic's CreateTime): the event clock of the simulated
shop, `86400 / orders_per_day` seconds per order from L, so a message's ingest_date is
reproducible whenever it is sent. The clock may lie in the past: the broker accepts that
(it refuses only timestamps over an hour ahead), and the demo topic keeps every message
(`retention.ms=-1`) so old timestamps are never expired. `--rate` paces the sending only.
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from confluent_kafka import KafkaException, Producer

from backfill_platform.resources.kafka import CLIENT_LOG
from backfill_platform.settings import KAFKA_BOOTSTRAP, ORDERS_TOPIC, setting
from backfill_platform.sources.generate import lateness_days, malformed_line, order_lines

LOG = logging.getLogger(__name__)
# How long one wait for a full producer queue polls for delivery reports.
QUEUE_WAIT_SECONDS = 0.5


@dataclass(frozen=True)
class Message:
    key: str
    value: str | bytes  # bytes: a value as sent, not UTF-8 (a malformed message)
    timestamp: datetime
    kind: str  # "version", "duplicate" or "malformed:<kind>"


@dataclass(frozen=True)
class Produced:
    """A message as the broker stored it."""

    topic: str
    partition: int
    offset: int
    message: Message


def shop_events(
    launch: datetime,
    orders: int,
    seed: int = 7,
    first_order: int = 0,
    orders_per_day: int = 100,
    duplicate_rate: float = 0.05,
    malformed_rate: float = 0.05,
    until: datetime | None = None,
) -> list[Message]:
    """Orders `first_order` .. `first_order + orders - 1` of the shop launched at `launch`,
    every version as a message at the instant it is sent, in sending order.

    A version is sent when it is made, or `lateness_days` later (so later versions of an
    order can precede earlier ones); a duplicate follows its original within two days.
    `until`: the shop's "now": messages due later are not sent yet (the same messages
    before it, whatever `until` is).
    """
    rng = random.Random(f"stream/{seed}/{launch.isoformat()}/{first_order}")
    spacing = timedelta(seconds=86_400 / orders_per_day)
    pool = max(50, orders_per_day * 5)
    messages: list[tuple[datetime, int, Message]] = []
    for n in range(first_order, first_order + orders):
        event_at = launch + n * spacing
        order_id = f"s-{seed}-{n:06d}"
        for updated, line in order_lines(rng, order_id, event_at, pool):
            sent = max(updated, event_at) + timedelta(days=lateness_days(rng))
            messages.append((sent, len(messages), Message(order_id, line, sent, "version")))
            if rng.random() < duplicate_rate:
                again = sent + timedelta(minutes=rng.randint(1, 2 * 24 * 60))
                messages.append((again, len(messages), Message(order_id, line, again, "duplicate")))
        if rng.random() < malformed_rate * 2:  # ~2 versions per order: the rate is per message
            kind, text = malformed_line(rng, event_at.date(), n)
            messages.append(
                (event_at, len(messages), Message(f"bad-{n}", text, event_at, f"malformed:{kind}"))
            )
    sent = [m for _, _, m in sorted(messages, key=lambda t: (t[0], t[1]))]
    return [m for m in sent if until is None or m.timestamp < until]


def produce(
    bootstrap: str,
    topic: str,
    messages: list[Message],
    rate: float = 0.0,
    config: Mapping[str, object] | None = None,
) -> list[Produced]:
    """Send `messages` in order (at most `rate` per second when > 0) and wait until the
    broker has acknowledged each; returns where each one was stored. The producer is
    idempotent, so its own retries never add a copy (the duplicates are deliberate).

    librdkafka queues what it has not sent yet, up to `queue.buffering.max.messages`
    (100,000) and `queue.buffering.max.kbytes`; an unpaced send outruns the broker, and a
    full queue refuses the next message (BufferError). The send then waits for the queue as
    confluent-kafka's examples do: poll, which serves delivery reports and so frees room,
    and the same message again; nothing is dropped. `config`: more client settings."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "partitioner": "murmur2_random",
            "linger.ms": 5,
            **(config or {}),
        },
        logger=CLIENT_LOG,
    )
    stored: list[Produced | None] = [None] * len(messages)
    failures: list[str] = []

    def delivered(index: int):
        def report(error, record) -> None:
            if error is not None:
                failures.append(str(error))
            else:
                stored[index] = Produced(
                    record.topic(), record.partition(), record.offset(), messages[index]
                )

        return report

    started, waits = time.monotonic(), 0
    for index, message in enumerate(messages):
        if rate > 0:
            ahead = started + index / rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
        while True:
            try:
                producer.produce(
                    topic,
                    key=message.key.encode(),
                    value=message.value
                    if isinstance(message.value, bytes)
                    else message.value.encode(),
                    timestamp=int(message.timestamp.timestamp() * 1000),
                    on_delivery=delivered(index),
                )
                break
            except BufferError:  # the local queue is full: let deliveries free it
                waits += 1
                producer.poll(QUEUE_WAIT_SECONDS)
        producer.poll(0)
    if waits:
        LOG.debug("waited %d time(s) for the producer's full queue", waits)
    left = producer.flush(60)
    if left or failures:
        raise KafkaException(
            f"{left} message(s) not acknowledged, {len(failures)} failed: {failures[:3]}"
        )
    return [s for s in stored if s is not None]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default=None, help="default BACKFILL_KAFKA_BOOTSTRAP")
    parser.add_argument("--topic", default=None, help="default BACKFILL_ORDERS_TOPIC")
    parser.add_argument("--launch", required=True, help="L, e.g. 2026-01-01T00:00:00Z")
    parser.add_argument("--orders", type=int, default=100)
    parser.add_argument("--first-order", type=int, default=0, help="continue after a run")
    parser.add_argument("--orders-per-day", type=int, default=100)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--rate", type=float, default=0.0, help="messages/s; 0: unpaced")
    args = parser.parse_args(argv)
    launch = datetime.fromisoformat(args.launch.replace("Z", "+00:00")).astimezone(UTC)
    messages = shop_events(launch, args.orders, args.seed, args.first_order, args.orders_per_day)
    topic = args.topic or setting(ORDERS_TOPIC)
    started = time.monotonic()
    try:
        stored = produce(args.bootstrap or setting(KAFKA_BOOTSTRAP), topic, messages, args.rate)
    except KafkaException as error:
        print(f"Refused: {error}", file=sys.stderr)
        return 1
    seconds = time.monotonic() - started
    kinds: dict[str, int] = {}
    for produced in stored:
        kind = produced.message.kind.split(":")[0]
        kinds[kind] = kinds.get(kind, 0) + 1
    first, last = (f"{messages[i].timestamp:%Y-%m-%d %H:%M}" for i in (0, -1))
    print(
        f"produced {len(stored)} messages to {topic} in {seconds:.1f} s "
        f"({', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))}); "
        f"orders {args.first_order}..{args.first_order + args.orders - 1}, "
        f"timestamps {first}..{last} UTC; "
        f"next: --first-order {args.first_order + args.orders}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
