"""The live path's jobs: the same assets and IO manager a backfill uses, selected per purpose."""

from dagster import AssetObservation, AssetSelection, OpExecutionContext, define_asset_job, job, op

from backfill_platform.assets.reference import FX_CURRENCIES
from backfill_platform.automation.maintenance import lakehouse_vacuum_job
from backfill_platform.automation.staleness import detect
from backfill_platform.partitions import daily_partitions
from backfill_platform.resources import LakehouseResource
from backfill_platform.tables import (
    CRM_FED_RAW,
    CUSTOMER_LTV,
    FCT_DAILY_REVENUE,
    STAGING_ORDERS,
    STAGING_REJECTS,
    tables_in,
)

# Marks the observation on staging/orders that carries a staleness audit's report.
AUDIT_MARKER = "staleness_audit"

# What raw data a window run reacts to (the trigger tag itself is runner.TRIGGER_TAG).
REACTS_TO_TAG = "backfill_platform/reacts_to"

# From the registry, so a table added to a layer joins its live jobs.
# The CRM's raw table reads staging/orders, so it runs with the downstream layers.
RAW_KEYS = tuple(t.key for t in tables_in(["raw"]) if t.key not in CRM_FED_RAW)
DOWNSTREAM_KEYS = (*CRM_FED_RAW, *(t.key for t in tables_in(["staging", "marts"])))

# Every delivery also re-observes the known currencies (reference/fx_currencies): a list of
# small CSVs in the same run, so a new currency marks staging stale without a run of its own.
raw_ingest_job = define_asset_job(
    "raw_ingest_job",
    selection=AssetSelection.assets(*RAW_KEYS, FX_CURRENCIES),
    partitions_def=daily_partitions,
    description="Ingest delivered landing days into raw/orders and raw/fx_rates; observe "
    "the known currencies.",
)

rolling_window_job = define_asset_job(
    "rolling_window_job",
    selection=AssetSelection.assets(*DOWNSTREAM_KEYS),
    partitions_def=daily_partitions,
    description="Rebuild staging and the marts over the last N event days in one ranged run.",
)

live_day_job = define_asset_job(
    "live_day_job",
    selection=AssetSelection.assets(*RAW_KEYS, *DOWNSTREAM_KEYS),
    partitions_def=daily_partitions,
    description="Every layer for one day: the daily schedule's catch-all for yesterday.",
)

repair_staging_job = define_asset_job(
    "repair_stale_staging_job",
    selection=AssetSelection.assets(STAGING_ORDERS, STAGING_REJECTS, FCT_DAILY_REVENUE),
    partitions_def=daily_partitions,
    description="Targeted repair: staging and daily revenue of exactly the stale event days.",
)

repair_ltv_job = define_asset_job(
    "repair_customer_ltv_job",
    selection=AssetSelection.assets(CUSTOMER_LTV),
    partitions_def=daily_partitions,
    description="Targeted repair: customer_ltv from the first stale snapshot to the newest.",
)


@op(description="Counts late rows beyond each built partition and records the report.")
def staleness_audit(context: OpExecutionContext, lakehouse: LakehouseResource) -> None:
    """Spark work belongs in a run, not in the sensor: the audit scans raw here and leaves its
    report as an observation on staging/orders, which the staleness sensor reads."""
    report = detect(lakehouse)
    context.log_event(
        AssetObservation(
            asset_key=STAGING_ORDERS,
            metadata={AUDIT_MARKER: True, **report.metadata(), "summary": report.summary()},
        )
    )
    if report.stale:
        context.log.warning(f"stale partitions: {report.summary()}")


@job(name="staleness_audit_job", description="Audit every built partition for late rows.")
def staleness_audit_job():
    staleness_audit()


all_jobs = [
    raw_ingest_job,
    rolling_window_job,
    live_day_job,
    repair_staging_job,
    repair_ltv_job,
    staleness_audit_job,
    lakehouse_vacuum_job,
]
