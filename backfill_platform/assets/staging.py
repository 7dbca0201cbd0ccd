"""Staging layer: one row per order (latest wins) by event day, and the quarantined rejects.

Staging of event day D reads every raw row whose event_date is D, whatever day it arrived:
Delta's per-file min/max statistics on `event_date` skip raw files that cannot hold D, so
late data is folded in without scanning all of history.
"""

import json
from datetime import date

from dagster import (
    AssetDep,
    AssetExecutionContext,
    AssetOut,
    Output,
    TimeWindowPartitionMapping,
    multi_asset,
)
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from backfill_platform.assets.common import (
    LATE_ARRIVAL_LINEAGE_DAYS,
    chunked_backfill_policy,
    run_dates,
)
from backfill_platform.assets.reference import FX_CURRENCIES
from backfill_platform.partitions import daily_partitions
from backfill_platform.resources import LakehouseResource
from backfill_platform.resources.delta_io_manager import READ_VERSIONS
from backfill_platform.tables import (
    RAW_ORDERS,
    STAGING_ORDERS,
    STAGING_REJECTS,
    table,
)
from backfill_platform.transforms.fx import known_currencies
from backfill_platform.transforms.orders import (
    KAFKA_COLUMNS,
    latest_wins,
    null_kafka_columns,
    with_unknown_currency,
)

# Event day D is built from raw ingest days D .. D+N (late arrivals). Which currencies are
# known (contract 1.1) is the unpartitioned reference node, not every raw/fx_rates day: an
# all-partitions edge to raw/fx_rates made a 3-day UI backfill target every day to today.
_LATE_ARRIVALS = TimeWindowPartitionMapping(
    start_offset=0, end_offset=LATE_ARRIVAL_LINEAGE_DAYS, allow_nonexistent_upstream_partitions=True
)


@multi_asset(
    outs={
        STAGING_ORDERS.to_python_identifier(): AssetOut(
            key=STAGING_ORDERS,
            group_name="staging",
            code_version=table(STAGING_ORDERS).code_version,
            metadata=table(STAGING_ORDERS).metadata,
            kinds={"spark", "delta"},
            description="Current state of every order (latest updated_at wins), by event day.",
        ),
        STAGING_REJECTS.to_python_identifier(): AssetOut(
            key=STAGING_REJECTS,
            group_name="staging",
            code_version=table(STAGING_REJECTS).code_version,
            metadata=table(STAGING_REJECTS).metadata,
            kinds={"spark", "delta"},
            description="Every rejected landing line with its reason, by the day it arrived.",
        ),
    },
    deps=[
        AssetDep(RAW_ORDERS, partition_mapping=_LATE_ARRIVALS),
        AssetDep(FX_CURRENCIES),
    ],
    partitions_def=daily_partitions,
    backfill_policy=chunked_backfill_policy(),
    pool="lakehouse_downstream",  # serializes staging/marts writers (deploy/dagster.yaml)
)
def staging_orders(context: AssetExecutionContext, lakehouse: LakehouseResource):
    start, end = run_dates(context)
    # One snapshot of raw for both outputs, recorded on their commits: the live stream keeps
    # appending to raw, and the blocking checks must compare with what this run read.
    version = lakehouse.current_version(RAW_ORDERS)
    read = {READ_VERSIONS: json.dumps({RAW_ORDERS.to_user_string(): version})}
    staged, rejects = staging_frames(lakehouse, version, start, end)
    yield Output(staged, output_name=STAGING_ORDERS.to_python_identifier(), metadata=read)
    yield Output(rejects, output_name=STAGING_REJECTS.to_python_identifier(), metadata=read)


def staging_frames(
    lakehouse: LakehouseResource, version: int | None, start: date, end: date
) -> tuple[DataFrame, DataFrame]:
    """Both outputs over [start, end) from raw at `version`: the orders of those event days
    (latest wins) and the rejects of those ingest days. The live stream folds its batches
    into staging with the very same frames (operations/stream.py)."""
    known = known_currencies(lakehouse)
    raw = lakehouse.read(RAW_ORDERS, version)
    in_range = raw.where(
        (F.col("event_date") >= F.lit(start))
        & (F.col("event_date") < F.lit(end))
        & F.col("reject_reason").isNull()
    )
    valid = with_unknown_currency(in_range, known).where(F.col("reject_reason").isNull())
    staged = latest_wins(valid).withColumn("_loaded_at", F.current_timestamp())
    rejects = staging_rejects(
        with_unknown_currency(
            lakehouse.read_partitions(RAW_ORDERS, start, end, version), known
        ).where(F.col("reject_reason").isNotNull())
    )
    return staged, rejects


def staging_rejects(rejected: DataFrame) -> DataFrame:
    """A rejected line with its file and line number, or a rejected message with its topic,
    partition and offset instead (contract 1.4)."""
    return rejected.withColumns(null_kafka_columns(rejected.columns)).select(
        "ingest_date",
        "file_name",
        "line_number",
        F.col("line").alias("raw_text"),
        F.col("line_bytes").alias("raw_bytes"),
        F.col("reject_reason").alias("reason"),
        "_source_path",
        F.current_timestamp().alias("_loaded_at"),
        *KAFKA_COLUMNS,
    )
