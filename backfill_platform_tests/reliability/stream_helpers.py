"""What the stream's suites (reliability, and e2e's deployed backfill) share: the Kafka
offsets raw/orders holds, the stream's commit times, the orders both sources carry."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from pyspark.sql import functions as F

from backfill_platform.operations.stream import STREAM_WRITER
from backfill_platform.reconcile import expected_fct_by_key, fct_by_key, reconcile_marts
from backfill_platform.reference import StreamMessage, compute_contract_answer
from backfill_platform.resources import LakehouseResource
from backfill_platform.resources.storage import hadoop_fs
from backfill_platform.sources.producer import Message, Produced
from backfill_platform_tests.harness import contest

OVERLAP = 5  # landing lines of the launch day that the stream also carries


def offsets(lake: LakehouseResource, topic: str) -> list[tuple[int, int]]:
    """(partition, offset) of every row of `topic` in raw/orders, sorted, copies kept."""
    # Asked of the file system: this JVM's Delta would keep taking the path for no table
    # once it found none there; a read of a table with a first commit looks for new ones.
    first_commit = f"{lake.table_path('raw/orders')}/_delta_log/{0:020d}.json"
    filesystem, path = hadoop_fs(lake.session, first_commit)
    if not filesystem.exists(path):
        return []
    rows = lake.read("raw/orders").where(F.col("kafka_topic") == topic)
    return sorted((r[0], r[1]) for r in rows.select("kafka_partition", "kafka_offset").collect())


def wait_for_offsets(lake, topic: str, count: int, process, timeout: float = 600) -> None:
    """Until raw holds `count` rows of `topic`; fails with the stream's log if it died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(offsets(lake, topic)) >= count:
            return
        if process.pid() is None:
            raise AssertionError(f"the stream process died:\n{process.log.read_text()[-3000:]}")
        time.sleep(2)
    raise AssertionError(
        f"raw did not reach {count} rows of {topic}:\n{process.log.read_text()[-3000:]}"
    )


def overlap_messages(landing, day, launch: datetime) -> list[Message]:
    """The export's first valid lines of its last day sent again by the stream an hour
    after launch: the same records both ways, on the same ingest day (counted once; the
    message wins where the line was its order's latest version)."""
    staged = compute_contract_answer(landing).staging
    folder = landing / "orders" / f"ingest_date={day.isoformat()}"
    chosen = []
    for path in sorted(folder.glob("*.jsonl")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            order = staged.get(order_id_of(line))
            if order is not None and (order.file_name, order.line_number) == (path.name, number):
                chosen.append(Message(order.order_id, line, launch + timedelta(hours=1), "both"))
    return chosen[:OVERLAP]


def order_id_of(line: str) -> str | None:
    try:
        doc = json.loads(line)
    except ValueError:
        return None
    return doc.get("order_id") if isinstance(doc, dict) else None


def as_message(p: Produced) -> StreamMessage:
    ms = int(p.message.timestamp.timestamp() * 1000)
    return StreamMessage(p.topic, p.partition, p.offset, ms, p.message.value.encode())


def stream_commit_times(lake: LakehouseResource) -> list[float]:
    return sorted(
        c["timestamp"].replace(tzinfo=UTC).timestamp()
        for c in lake.history("raw/orders")
        if c["metadata"].get("writer") == STREAM_WRITER
    )


def concurrency(lake: LakehouseResource, tables) -> dict[str, dict[str, int]]:
    """Per table, its writers' contest (`harness.contest`)."""
    return {table: contest(lake.history(table)) for table in tables}


@dataclass
class Converged:
    """The tables after both writers, against the contract's answer over landing + messages:
    `pairs` holds (in the tables, the answer) per figure that must be equal."""

    figures: dict
    pairs: dict[str, tuple]
    differing: list[str]
    reconciliation: object

    def check(self) -> None:
        for name, (got, want) in self.pairs.items():
            assert got == want, name  # every offset once, every landing line, ...
        assert self.figures["staging_differing"] == 0, self.differing[:5]
        # An order in both sources is one staging row; the export's line was the order's
        # latest version, so the stream's copy of it won (a message beats a line on one
        # ingest day), unless a later version came from the stream itself.
        assert self.figures["orders_in_both_sources"] == OVERLAP
        assert self.figures["both_sources_won_by_message"] == OVERLAP
        assert self.reconciliation.ok, "\n".join(self.reconciliation.details)


def converged(lake, landing, first, newest, topic: str, produced: list[Produced], overlap):
    """Every offset, landing line, staging row, reject and mart figure of first..newest."""
    messages = [as_message(p) for p in produced]
    answer = compute_contract_answer(landing, last_date=newest, messages=messages)
    held = offsets(lake, topic)
    expected = sorted((p.partition, p.offset) for p in produced)
    staged = {r["order_id"]: r for r in lake.read("staging/orders").collect()}
    differing = [
        order_id
        for order_id, want in answer.staging.items()
        if (got := staged.get(order_id)) is None
        or (got["status"], got["amount"], got["event_date"], got["customer_id"])
        != (want.status, want.amount, want.event_date, want.customer_id)
        or (got["ingest_date"], got["file_name"], got["line_number"])
        != (want.ingest_date, want.file_name, want.line_number)
    ]
    raw = lake.read("raw/orders")
    landing_rows = {
        r["ingest_date"]: r["count"]
        for r in raw.where("kafka_topic IS NULL").groupBy("ingest_date").count().collect()
    }
    rejects = lake.read("staging/orders_rejects").collect()
    overlap_ids = {m.key for m in overlap}
    won = [i for i in overlap_ids if i in staged and staged[i]["file_name"] is None]
    reconciliation = reconcile_marts(lake, landing, first, newest, messages)
    return Converged(
        figures={
            "landing_lines": sum(answer.raw_line_counts.values()),
            "messages": len(expected),
            "offsets_missing": len(set(expected) - set(held)),
            "offsets_duplicated": len(held) - len(set(held)),
            "orders_in_both_sources": len(overlap_ids),
            "both_sources_won_by_message": len(won),
            "staging_rows": len(staged),
            "staging_expected": len(answer.staging),
            "staging_differing": len(differing) + len(set(staged) - set(answer.staging)),
            "marts_equal_contract": reconciliation.ok,
        },
        pairs={
            "offsets in raw, each once": (held, expected),
            "landing lines in raw per ingest day": (landing_rows, answer.raw_line_counts),
            "landing rejects": (
                sorted(
                    (r["ingest_date"], r["file_name"], r["line_number"], r["reason"])
                    for r in rejects
                    if r["kafka_topic"] is None
                ),
                sorted(
                    (r.ingest_date, r.file_name, r.line_number, r.reason) for r in answer.rejects
                ),
            ),
            "message rejects": (
                sorted(
                    (r["kafka_topic"], r["kafka_partition"], r["kafka_offset"], r["reason"])
                    for r in rejects
                    if r["kafka_topic"] is not None
                ),
                sorted(answer.message_rejects),
            ),
            "fct_daily_revenue": (
                fct_by_key(lake.read("marts/fct_daily_revenue").collect()),
                expected_fct_by_key(answer),
            ),
        },
        differing=differing,
        reconciliation=reconciliation,
    )
