"""Kafka messages as raw order rows (contract 1.4): the landing parser, Kafka's coordinates.

A message's value is one landing line, so it goes through the very parser of the landing
path (`parse_orders`) and a malformed one gets the same reject reason a landing line would.
Where a landing line has a file and a line number, a message has its topic, partition,
offset and broker timestamp; its ingest_date is the UTC day of that timestamp.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from backfill_platform.transforms.orders import KAFKA_COLUMNS, parse_orders


def parse_messages(messages: DataFrame) -> DataFrame:
    """Rows of Spark's Kafka source (`value`, `topic`, `partition`, `offset`, `timestamp`)
    as raw/orders rows: parsed like landing lines, with Kafka's coordinates.

    The value is decoded as UTF-8 when it is valid; otherwise its bytes are kept (as
    `read_lines` keeps a bad line's) and it is rejected `invalid_utf8`. An empty value is
    `invalid_json`: unlike a blank landing line, a message is never skipped.
    """
    text = F.col("value").cast("string")
    valid = F.is_valid_utf8(text)
    lines = messages.select(
        F.to_date("timestamp").alias("day"),  # the session's time zone is UTC
        F.lit(None).cast("string").alias("file_name"),
        F.lit(None).cast("string").alias("_source_path"),
        F.lit(None).cast("int").alias("line_number"),
        F.when(valid, text).otherwise(F.make_valid_utf8(text)).alias("line"),
        F.when(~valid, F.col("value")).alias("line_bytes"),
        F.lit(False).alias("is_blank"),
        F.col("topic").alias("kafka_topic"),
        F.col("partition").cast("int").alias("kafka_partition"),
        F.col("offset").cast("bigint").alias("kafka_offset"),
        F.col("timestamp").alias("kafka_timestamp"),
    )
    parsed = parse_orders(lines).withColumnRenamed("day", "ingest_date")
    kafka = list(KAFKA_COLUMNS)
    return parsed.select(
        *(c for c in parsed.columns if c not in kafka and c != "is_blank"),
        F.current_timestamp().alias("_loaded_at"),
        *kafka,
    )
