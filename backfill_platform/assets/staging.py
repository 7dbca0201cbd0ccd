"""Staging layer: one row per order (latest wins) by event day, and the quarantined rejects.

Staging of event day D reads every raw row whose event_date is D, whatever day it arrived:
Delta's per-file min/max statistics on `event_date` skip raw files that cannot hold D, so
late data is folded in without scanning all of history.

The two outputs share one op (one read of raw, one snapshot) but not their days: orders are
by event day, rejects by ingest day, and a later version of an order placed weeks earlier
changes the one on its event day and the other on its arrival day. The multi-asset is
therefore subsettable (Dagster's `can_subset`, outputs not required): a run builds the
outputs its selection names, each over its own days, as the live stream's fold does
(operations/stream.py). Selecting both whole instead would rebuild orders of every arrival
day and rejects of every event day a late version reaches: idempotent, but work nobody
asked for, on days a freeze may hold, and a Dagster asset backfill launched with different
days per output could not be cut into runs at all (it runs a non-subsettable multi-asset
only on days every one of its outputs targets).
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
            is_required=False,  # a run may select the rejects alone (module docstring)
        ),
        STAGING_REJECTS.to_python_identifier(): AssetOut(
            key=STAGING_REJECTS,
            group_name="staging",
            code_version=table(STAGING_REJECTS).code_version,
            metadata=table(STAGING_REJECTS).metadata,
            kinds={"spark", "delta"},
            description="Every rejected landing line with its reason, by the day it arrived.",
            is_required=False,
        ),
    },
    deps=[
        AssetDep(RAW_ORDERS, partition_mapping=_LATE_ARRIVALS),
        AssetDep(FX_CURRENCIES),
    ],
    partitions_def=daily_partitions,
    backfill_policy=chunked_backfill_policy(),
    pool="lakehouse_downstream",  # serializes staging/marts writers (deploy/dagster.yaml)
    can_subset=True,
)
def staging_orders(context: AssetExecutionContext, lakehouse: LakehouseResource):
    """The selected outputs over the run's days. Chosen by output name, not asset key: the
    shadow twins (assets/shadow.py) run this op under other keys with the same outputs."""
    start, end = run_dates(context)
    # One snapshot of raw for the outputs, recorded on their commits: the live stream keeps
    # appending to raw, and the blocking checks must compare with what this run read.
    version = lakehouse.current_version(RAW_ORDERS)
    read = {READ_VERSIONS: json.dumps({RAW_ORDERS.to_user_string(): version})}
    staged, rejects = staging_frames(lakehouse, version, start, end)  # lazy: unread if unused
    selected = context.selected_output_names
    for key, frame in ((STAGING_ORDERS, staged), (STAGING_REJECTS, rejects)):
        if key.to_python_identifier() in selected:
            yield Output(frame, output_name=key.to_python_identifier(), metadata=read)


def staging_frames(
    lakehouse: LakehouseResource,
    version: int | None,
    start: date,
    end: date,
    known: list[str] | None = None,
) -> tuple[DataFrame, DataFrame]:
    """Both outputs over [start, end) from raw at `version`: the orders of those event days
    (latest wins) and the rejects of those ingest days. The live stream folds its batches
    into staging with the very same frames (operations/stream.py), judged with the known
    currencies (`known`, read here if not given) it chose the days by."""
    known = known_currencies(lakehouse) if known is None else known
    raw = lakehouse.read(RAW_ORDERS, version)
    in_range = raw.where(
        (F.col("event_date") >= F.lit(start))
        & (F.col("event_date") < F.lit(end))
        & F.col("reject_reason").isNull()
    )
    valid = staging_reasons(in_range, known).where(F.col("reject_reason").isNull())
    staged = latest_wins(valid).withColumn("_loaded_at", F.current_timestamp())
    rejects = staging_rejects(
        staging_reasons(lakehouse.read_partitions(RAW_ORDERS, start, end, version), known).where(
            F.col("reject_reason").isNotNull()
        )
    )
    return staged, rejects


def staging_reasons(raw: DataFrame, known: list[str]) -> DataFrame:
    """Raw rows with `reject_reason` as staging judges them: the parser's reason, else the
    rules that need more than the line (a currency with no rate anywhere, contract 1.1).
    Staging's outputs, and the stream's choice of the days a batch changes in them, judge
    rows here alone, so the fold and a run keep and reject the same rows."""
    return with_unknown_currency(raw, known)


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
