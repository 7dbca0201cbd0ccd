"""Raw layer: every landing line as delivered, keyed by the day it arrived.

Nothing is dropped here: invalid lines are kept with their text (and bytes, if not UTF-8)
and a `reject_reason`, so staging can quarantine them and reconciliation can count them.
"""

from dagster import AssetExecutionContext, MetadataValue, asset
from pyspark.sql import Observation
from pyspark.sql import functions as F

from backfill_platform.assets.common import chunked_backfill_policy, run_dates
from backfill_platform.assets.preservation import (
    SourcePreservationConfig,
    guard_source,
    held_rows,
    rows_per_file,
)
from backfill_platform.partitions import daily_partitions
from backfill_platform.refusals import refusal
from backfill_platform.resources import (
    LakehouseResource,
    LandingZoneResource,
    SparkSessionResource,
)
from backfill_platform.resources.delta_io_manager import ObservedFrame
from backfill_platform.resources.landing import FX_RATES, ORDERS
from backfill_platform.tables import RAW_FX_RATES, RAW_ORDERS, table
from backfill_platform.transforms.fx import fx_problems, known_after, parse_rates
from backfill_platform.transforms.lines import counted, read_lines
from backfill_platform.transforms.orders import null_kafka_columns, parse_orders


@asset(
    key=RAW_ORDERS,
    pool="lakehouse_raw",  # concurrency pool: serializes raw writers (deploy/dagster.yaml)
    group_name="raw",
    partitions_def=daily_partitions,
    backfill_policy=chunked_backfill_policy(),
    code_version=table(RAW_ORDERS).code_version,
    metadata=table(RAW_ORDERS).metadata,
    kinds={"spark", "delta"},
)
def raw_orders(
    context: AssetExecutionContext,
    config: SourcePreservationConfig,
    spark: SparkSessionResource,
    landing: LandingZoneResource,
    lakehouse: LakehouseResource,
) -> ObservedFrame:
    """Order lines of the run's ingest days, with parsed fields and a reject reason.

    Replaces only landing lines: the stream's rows of the same ingest days stay (tables.py,
    `owned_rows`). Refuses to replace raw by fewer lines than it holds (assets/preservation.py). The
    row counts of the metadata are taken inside the write (`ObservedFrame`): the delivery
    is parsed once, straight into the Delta files; a re-ingest, which the guard compares
    first, also counts the delivery's lines per file before.
    """
    files = landing.files(ORDERS, context.partition_keys)
    held = held_rows(lakehouse, RAW_ORDERS, *run_dates(context))
    # Counted as read, before the parse: the parse then compiles apart (`counted`).
    lines, read = counted(read_lines(spark.get_session(), files, "ingest_date"), "raw_lines")
    every_line = (
        parse_orders(lines)
        .withColumnRenamed("day", "ingest_date")
        .withColumn("_loaded_at", F.current_timestamp())
        .withColumns(null_kafka_columns())
    )
    # The guard needs records per file, not parsed rows: counted on the driver from the
    # files raw holds rows of, as the raw reconciliation counts them, so the parse streams
    # straight into the write (a cache of the parsed re-ingest spilled to disk and made a
    # re-run a third slower; a Spark count of the split lines was 1.9 s of a 92-day run,
    # the driver's 0.25 s: docs/performance.md).
    delivered = landing.records_per_file(ORDERS, files, held.keys()) if held else {}
    guard_source(context, config, RAW_ORDERS, held, delivered)
    stats = Observation("raw_orders")
    observed = every_line.observe(
        stats,
        F.count(F.when(~F.col("is_blank"), F.col("reject_reason"))).alias("invalid_rows"),
        F.count(F.when(F.col("event_date") < F.col("ingest_date"), True)).alias("late_rows"),
    )
    context.add_output_metadata(
        {
            "landing_files": len(files),
            "files": MetadataValue.md("\n".join(f"- `{f}`" for f in files[:50]) or "none"),
        }
    )
    return ObservedFrame(observed.where(~F.col("is_blank")).drop("is_blank"), (read, stats))


@asset(
    key=RAW_FX_RATES,
    pool="lakehouse_raw",
    group_name="raw",
    partitions_def=daily_partitions,
    backfill_policy=chunked_backfill_policy(),
    code_version=table(RAW_FX_RATES).code_version,
    metadata=table(RAW_FX_RATES).metadata,
    kinds={"spark", "delta"},
)
def raw_fx_rates(
    context: AssetExecutionContext,
    config: SourcePreservationConfig,
    spark: SparkSessionResource,
    landing: LandingZoneResource,
    lakehouse: LakehouseResource,
) -> ObservedFrame:
    """Rate lines of the run's rate days; a bad header or a conflicting rate fails the run.

    A few kilobytes per run: the files are read once into a cache that the header and
    conflict checks, the guard and the write share; the counts come from the write. The
    commit records the known currencies after it when the delivery tells them
    (`known_after`), so the run's staging step need not scan the new version for them.
    """
    files = landing.files(FX_RATES, context.partition_keys)
    before = lakehouse.content_id(RAW_FX_RATES)  # read first: what `known_after` builds on
    held = held_rows(lakehouse, RAW_FX_RATES, *run_dates(context))
    lines = read_lines(spark.get_session(), files, "rate_date").persist()
    rates = parse_rates(lines).withColumn("_loaded_at", F.current_timestamp())
    headers, conflicts, currencies = fx_problems(lines, rates) if files else ([], [], set())
    if headers:
        raise refusal(
            "FX files without the header 'currency,usd_per_unit': " + "; ".join(headers),
            metadata={"files": MetadataValue.json(headers)},
        )
    if conflicts:
        raise refusal("Two different rates for one currency and day: " + "; ".join(conflicts))
    delivered = rows_per_file(RAW_FX_RATES, rates) if held else {}
    guard_source(context, config, RAW_FX_RATES, held, delivered)
    stats = Observation("raw_fx_rates")
    observed = rates.observe(
        stats, F.count(F.lit(1)).alias("rows"), F.count("reject_reason").alias("invalid_rows")
    )
    context.add_output_metadata({"landing_files": len(files)})
    known = known_after(lakehouse, before, currencies, replaces_rows=bool(held))
    return ObservedFrame(observed, (stats,), known)
