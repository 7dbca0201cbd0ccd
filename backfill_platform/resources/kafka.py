"""The order topic (contract 1.4): where it is, and what the broker holds of it now.

Spark's Kafka source reads the messages; the broker's end offsets (for lag) come through
confluent-kafka, a client that needs no JVM, so `stream status` answers in a second.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from datetime import datetime

from confluent_kafka import Consumer, KafkaException, TopicPartition
from dagster import ConfigurableResource
from pydantic import Field
from pyspark.sql import DataFrame, SparkSession

from backfill_platform.settings import (
    KAFKA_BOOTSTRAP,
    ORDERS_TOPIC,
    STREAM_MAX_OFFSETS,
    int_setting,
    setting,
)

CLIENT_LOG = logging.getLogger("backfill_platform.kafka_client")
# The stream's Structured Streaming query: its name, checkpoint directory and process files.
QUERY_NAME = "raw_orders_stream"
# librdkafka's retries ("coordinator load in progress") are not for the terminal; a caller
# that configures logging still sees them.
CLIENT_LOG.addHandler(logging.NullHandler())


class TopicUnavailable(RuntimeError):
    """The broker did not answer, or does not have the topic; nothing was read or written."""


class OrdersTopicResource(ConfigurableResource):
    """Broker and topic of the live order stream."""

    bootstrap_servers: str = Field(
        default="127.0.0.1:9092", description="Kafka bootstrap servers (BACKFILL_KAFKA_BOOTSTRAP)."
    )
    topic: str = Field(default="orders", description="The order topic (BACKFILL_ORDERS_TOPIC).")
    max_offsets_per_batch: int = Field(
        default=100_000,
        description="Most messages per micro-batch (BACKFILL_STREAM_MAX_OFFSETS_PER_BATCH).",
    )
    timeout_seconds: float = Field(default=15.0, description="Broker metadata requests.")

    def source_options(self) -> dict[str, str]:
        """Spark's Kafka source options: the whole retained topic on a first start."""
        return {
            "kafka.bootstrap.servers": self.bootstrap_servers,
            "subscribe": self.topic,
            "startingOffsets": "earliest",
            "maxOffsetsPerTrigger": str(self.max_offsets_per_batch),
            # A gap (offsets removed by retention before they were read) fails the query
            # rather than skipping messages silently.
            "failOnDataLoss": "true",
        }

    def end_offsets(self) -> dict[int, tuple[int, int]]:
        """Partition -> (earliest retained offset, next offset to be written)."""
        consumer = self._consumer()
        try:
            return {
                p: consumer.get_watermark_offsets(
                    TopicPartition(self.topic, p), timeout=self.timeout_seconds
                )
                for p in self._partitions(consumer)
            }
        except KafkaException as error:
            raise TopicUnavailable(f"{self.topic} at {self.bootstrap_servers}: {error}") from None
        finally:
            consumer.close()

    def offsets_at(self, instant: datetime) -> dict[int, int]:
        """Partition -> the first offset whose timestamp is at or after `instant` (the
        broker's own time index); the partition's end when there is none."""
        consumer = self._consumer()
        ms = int(instant.timestamp() * 1000)
        try:
            found = consumer.offsets_for_times(
                [TopicPartition(self.topic, p, ms) for p in self._partitions(consumer)],
                timeout=self.timeout_seconds,
            )
            ends = {
                t.partition: consumer.get_watermark_offsets(t, timeout=self.timeout_seconds)[1]
                for t in found
            }
        except KafkaException as error:
            raise TopicUnavailable(f"{self.topic} at {self.bootstrap_servers}: {error}") from None
        finally:
            consumer.close()
        return {t.partition: t.offset if t.offset >= 0 else ends[t.partition] for t in found}

    def read(
        self, session: SparkSession, spans: dict[int, tuple[int, int | None]] | None = None
    ) -> DataFrame:
        """The retained messages as a batch DataFrame (Spark's Kafka source): every one, or
        partition -> [first, end) offsets of `spans` (end None: the partition's latest)."""
        reader = session.read.format("kafka").option(
            "kafka.bootstrap.servers", self.bootstrap_servers
        )
        if spans is None:
            reader = reader.option("subscribe", self.topic)
        else:
            parts = sorted(p for p, (lo, hi) in spans.items() if hi is None or hi > lo)
            ends = {str(p): -1 if spans[p][1] is None else spans[p][1] for p in parts}
            reader = (
                reader.option("assign", json.dumps({self.topic: parts}))
                .option(
                    "startingOffsets",
                    json.dumps({self.topic: {str(p): spans[p][0] for p in parts}}),
                )
                .option("endingOffsets", json.dumps({self.topic: ends}))
            )
        return reader.option("failOnDataLoss", "true").load()

    def _consumer(self) -> Consumer:
        return Consumer(
            {
                "bootstrap.servers": self.bootstrap_servers,
                "group.id": "backfill-platform-status",  # never commits: offsets asked only
                "enable.auto.commit": False,
            },
            logger=CLIENT_LOG,  # librdkafka's log to Python's logging, not the terminal
        )

    def _partitions(self, consumer: Consumer) -> list[int]:
        try:
            metadata = consumer.list_topics(self.topic, timeout=self.timeout_seconds)
        except KafkaException as error:
            raise TopicUnavailable(f"{self.topic} at {self.bootstrap_servers}: {error}") from None
        found = metadata.topics.get(self.topic)
        if found is None or found.error is not None or not found.partitions:
            why = found.error if found is not None and found.error else "no such topic"
            raise TopicUnavailable(f"{self.topic} at {self.bootstrap_servers}: {why}")
        return sorted(found.partitions)


def offset_spans(spans: Mapping[int, tuple[int, int]]) -> dict[str, dict[str, int]]:
    """Kafka partition -> {"first": offset, "next": offset}, as commits, the instance and
    `--json` record spans of offsets. One convention everywhere, Kafka's: a position is the
    next offset to read (the broker's end offset, a consumer's committed offset, Spark's
    checkpoint), so a span is its first offset and the one after its last, each named."""
    return {str(p): {"first": lo, "next": after} for p, (lo, after) in sorted(spans.items())}


def merge_span(spans: dict[int, tuple[int, int]], partition: int, first: int, after: int) -> None:
    """Widen `spans`' span of `partition` (first offset, next offset) to cover `first` to
    `after`, or start it."""
    lo, hi = spans.get(partition, (first, after))
    spans[partition] = (min(lo, first), max(hi, after))


def orders_topic_from_settings() -> OrdersTopicResource:
    return OrdersTopicResource(
        bootstrap_servers=setting(KAFKA_BOOTSTRAP),
        topic=setting(ORDERS_TOPIC),
        max_offsets_per_batch=int_setting(STREAM_MAX_OFFSETS),
    )
