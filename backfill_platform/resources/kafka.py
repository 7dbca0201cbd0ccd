"""The order topic (contract 1.4): where it is, and what the broker holds of it now.

Spark's Kafka source reads the messages; the broker's end offsets (for lag) come through
confluent-kafka, a client that needs no JVM, so `stream status` answers in a second.
"""

from __future__ import annotations

import logging

from confluent_kafka import Consumer, KafkaException, TopicPartition
from dagster import ConfigurableResource
from pydantic import Field

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
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap_servers,
                "group.id": "backfill-platform-status",  # never commits: offsets asked only
                "enable.auto.commit": False,
            },
            logger=CLIENT_LOG,  # librdkafka's log to Python's logging, not the terminal
        )
        try:
            metadata = consumer.list_topics(self.topic, timeout=self.timeout_seconds)
            found = metadata.topics.get(self.topic)
            if found is None or found.error is not None or not found.partitions:
                why = found.error if found is not None and found.error else "no such topic"
                raise TopicUnavailable(f"{self.topic} at {self.bootstrap_servers}: {why}")
            return {
                p: consumer.get_watermark_offsets(
                    TopicPartition(self.topic, p), timeout=self.timeout_seconds
                )
                for p in sorted(found.partitions)
            }
        except KafkaException as error:
            raise TopicUnavailable(f"{self.topic} at {self.bootstrap_servers}: {error}") from None
        finally:
            consumer.close()


def orders_topic_from_settings() -> OrdersTopicResource:
    return OrdersTopicResource(
        bootstrap_servers=setting(KAFKA_BOOTSTRAP),
        topic=setting(ORDERS_TOPIC),
        max_offsets_per_batch=int_setting(STREAM_MAX_OFFSETS),
    )
