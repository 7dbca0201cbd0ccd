"""Order records: parsing and validation (contract 1.1) and latest-wins deduplication.

Parsing uses Spark's VARIANT (`try_parse_json`): unlike `from_json`, it keeps each JSON
value's type (a number is not a string, `1e2` is a DOUBLE, `12.5` an exact DECIMAL) and
refuses NaN, Infinity and duplicate keys, which is what the contract's rules need.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

REQUIRED_FIELDS = ("order_id", "event_time", "updated_at", "status", "currency", "amount")
STRING_FIELDS = ("order_id", "event_time", "updated_at", "status", "currency")
STATUSES = ("placed", "paid", "refunded", "cancelled")
TIMESTAMP_PATTERN = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})$"
MAX_AMOUNT = 10**16  # amounts are stored as DECIMAL(18,2)
AMOUNT_TYPE = "decimal(18,2)"
UNKNOWN_CURRENCY = "unknown_currency"


# raw/orders' columns for a message's coordinates (contract 1.4, transforms/messages.py);
# NULL on every landing line, so a row with a `kafka_topic` is a stream row (tables.py: the
# landing path replaces only the others).
KAFKA_COLUMNS = {
    "kafka_topic": "string",
    "kafka_partition": "int",
    "kafka_offset": "bigint",
    "kafka_timestamp": "timestamp",
}
# Where a row came from: a landing file's line or a message's coordinates. Each source
# leaves the other's NULL by design, so NULL-rate checks leave them out: a day the stream
# feeds is not a NULL spike in file_name.
SOURCE_COORDINATES = ("file_name", "line_number", *KAFKA_COLUMNS)

FIELDS = (*REQUIRED_FIELDS, "customer_id")
# A JSON text that parsed is an object iff its first non-whitespace character is "{"
# (RFC 8259); schema_of_variant would walk the whole document to name its type.
OBJECT_TEXT = r"^[ \t\r\n]*\{"


def _timestamp(text: str) -> Column:
    """RFC 3339 with a mandatory offset; the cast checks the calendar (no Feb 30)."""
    return F.when(
        F.regexp_like(text, F.lit(TIMESTAMP_PATTERN)), F.expr(f"try_cast({text} AS timestamp)")
    )


def parse_orders(lines: DataFrame) -> DataFrame:
    """Adds typed order fields and `reject_reason` (NULL for a valid line) to landing lines.

    Rules are checked in the contract's order and the first failure names the reason, so a
    line with several faults always gets the same reason. The currency rule needs the whole
    FX history and is applied in staging (`with_unknown_currency`). Each field is taken
    from the document once (`_v_*`) and typed once (`_t_*`, `_s_*`): Spark does not share
    a sub-expression between the branches of the CASE that picks the reason.
    """
    doc = F.col("_doc")
    v = {f: F.col(f"_v_{f}") for f in FIELDS}  # the field as VARIANT, NULL if absent
    t = {f: F.col(f"_t_{f}") for f in FIELDS}  # its JSON type: STRING, BIGINT, DECIMAL(3,1)...
    s = {f: F.col(f"_s_{f}") for f in FIELDS}  # its value as text
    amount_type = t["amount"]
    is_number = amount_type.isin("BIGINT", "DOUBLE") | amount_type.startswith("DECIMAL")
    amount_text = s["amount"]
    amount_value = F.col("_amount_value")
    present = {f: v[f].isNotNull() & ~F.is_variant_null(v[f]) for f in FIELDS}

    checks: list[tuple[Column, str]] = [
        (F.col("line_bytes").isNotNull(), "invalid_utf8"),
        (doc.isNull(), "invalid_json"),
        (~F.regexp_like("line", F.lit(OBJECT_TEXT)), "not_an_object"),
    ]
    checks += [(~present[f], f"missing_field:{f}") for f in REQUIRED_FIELDS]
    checks += [
        (t["order_id"] != "STRING", "wrong_type:order_id"),
        (present["customer_id"] & (t["customer_id"] != "STRING"), "wrong_type:customer_id"),
    ]
    checks += [(t[f] != "STRING", f"wrong_type:{f}") for f in STRING_FIELDS[1:]]
    checks += [
        (~(is_number | (amount_type == "STRING")), "wrong_type:amount"),
        (s["order_id"] == "", "empty_order_id"),
        (F.col("_event_time").isNull(), "invalid_timestamp:event_time"),
        (F.col("_updated_at").isNull(), "invalid_timestamp:updated_at"),
        (~s["status"].isin(*STATUSES), "unknown_status"),
        # JSON numbers: an exponent (or more digits than DECIMAL holds) parses as DOUBLE.
        (is_number & (amount_type == "DOUBLE"), "invalid_amount"),
        (
            F.regexp_like(amount_text, F.lit(r"^-\d+(\.\d+)?$"))
            & (F.expr("try_cast(_s_amount AS decimal(38,10))") < 0),
            "negative_amount",
        ),
        (~F.regexp_like(amount_text, F.lit(r"^\d+(\.\d+)?$")), "invalid_amount"),
        # Trailing zeros don't count: JSON numbers reach us normalized (1.50 -> 1.5).
        (~F.regexp_like(amount_text, F.lit(r"^\d+(\.\d{0,2}0*)?$")), "too_many_decimals"),
        (amount_value.isNull() | (amount_value >= MAX_AMOUNT), "amount_out_of_range"),
    ]
    reason = F.lit(None).cast("string")
    for condition, name in reversed(checks):
        reason = F.when(F.coalesce(condition, F.lit(False)), F.lit(name)).otherwise(reason)

    parsed = (
        lines.withColumn("_doc", F.when(F.col("line_bytes").isNull(), F.try_parse_json("line")))
        .withColumns({f"_v_{f}": F.try_variant_get(doc, f"$.{f}", "variant") for f in FIELDS})
        .withColumns({f"_t_{f}": F.schema_of_variant(v[f]) for f in FIELDS})
        .withColumns({f"_s_{f}": F.try_variant_get(v[f], "$", "string") for f in FIELDS})
        .withColumns(
            {
                "_event_time": _timestamp("_s_event_time"),
                "_updated_at": _timestamp("_s_updated_at"),
                "_amount_value": F.expr("try_cast(_s_amount AS decimal(38,2))"),
            }
        )
        .withColumn("reject_reason", reason)
    )
    valid = F.col("reject_reason").isNull()
    return parsed.select(
        *lines.columns,
        F.when(valid, s["order_id"]).alias("order_id"),
        F.when(valid, s["customer_id"]).alias("customer_id"),
        F.when(valid, F.col("_event_time")).alias("event_time"),
        F.when(valid, F.col("_updated_at")).alias("updated_at"),
        F.when(valid, s["status"]).alias("status"),
        F.when(valid, s["currency"]).alias("currency"),
        F.when(valid, amount_value.cast(AMOUNT_TYPE)).alias("amount"),
        F.when(valid, F.to_date(F.col("_event_time"))).alias("event_date"),
        "reject_reason",
    )


def null_kafka_columns(present: list[str] | None = None) -> dict[str, Column]:
    """The Kafka columns of landing lines, all NULL (those not in `present`, if given)."""
    return {
        name: F.lit(None).cast(kind)
        for name, kind in KAFKA_COLUMNS.items()
        if name not in (present or ())
    }


def with_unknown_currency(raw: DataFrame, known_currencies: list[str]) -> DataFrame:
    """Marks otherwise valid rows whose currency has no rate anywhere (contract 1.1)."""
    unknown = F.col("reject_reason").isNull() & ~F.col("currency").isin(*known_currencies)
    return raw.withColumn(
        "reject_reason", F.when(unknown, F.lit(UNKNOWN_CURRENCY)).otherwise(F.col("reject_reason"))
    )


def latest_wins(valid: DataFrame) -> DataFrame:
    """One row per order_id: the version with the greatest updated_at, ties broken by the
    latest arrival: greatest ingest_date; on one ingest_date a stream message before a
    landing line; between messages greatest broker timestamp, partition, offset; between
    landing lines greatest file name, then line number (contract 1.1 and 1.4).

    max(struct) compares field by field, so this is one hash aggregation with partial
    (map-side) aggregation rather than a sort of every version. Landing lines' Kafka
    columns are all NULL, so they compare equal there and the file name decides.
    """
    valid = valid.withColumns(null_kafka_columns(valid.columns))
    version = F.struct(
        "updated_at",
        "ingest_date",
        F.col("kafka_topic").isNotNull().alias("is_message"),
        "kafka_timestamp",
        "kafka_partition",
        "kafka_offset",
        "file_name",
        "line_number",
        "order_id",
        "customer_id",
        "event_time",
        "event_date",
        "status",
        "currency",
        "amount",
    )
    return (
        valid.groupBy("order_id")
        .agg(
            F.max(version).alias("v"),
            F.count(F.lit(1)).alias("raw_versions"),
            F.min("ingest_date").alias("first_ingest_date"),
        )
        .select(
            F.col("v.event_date").alias("event_date"),
            "order_id",
            F.col("v.customer_id").alias("customer_id"),
            F.col("v.event_time").alias("event_time"),
            F.col("v.updated_at").alias("updated_at"),
            F.col("v.status").alias("status"),
            F.col("v.currency").alias("currency"),
            F.col("v.amount").alias("amount"),
            F.col("v.ingest_date").alias("ingest_date"),
            F.col("v.file_name").alias("file_name"),
            F.col("v.line_number").alias("line_number"),
            "raw_versions",
            "first_ingest_date",
        )
    )
