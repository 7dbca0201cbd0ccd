"""The CRM's tables (contract 1.3, 2): every answer kept, SCD2 versions, revenue by segment.

`raw/crm_customer_history` for event days R calls the CRM only for customers with orders
in R whose newest kept answer was fetched before one of those orders' event_time (an
answer fetched at F is final up to F), and appends the answers: a re-run calls nothing
and commits nothing. `staging/customers` is rebuilt whole from the newest answers under
its table lock when raw kept new ones since its last build. `marts/fct_revenue_by_segment`
attributes each order to the version in force at its event_time. All three are
daily-partitioned on event days so they run in the same chunked backfills and live jobs as
the other marts.
"""

from dataclasses import dataclass
from datetime import UTC

from dagster import (
    AssetDep,
    AssetExecutionContext,
    AssetIn,
    Failure,
    MaterializeResult,
    asset,
)
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from backfill_platform.assets.common import chunked_backfill_policy, run_dates
from backfill_platform.assets.marts import _FX_REACH, _orders_in_usd
from backfill_platform.partitions import daily_partitions
from backfill_platform.resources import CrmResource, LakehouseResource, SparkSessionResource
from backfill_platform.resources.crm import CrmError
from backfill_platform.resources.crm_limiter import BACKFILL, LIVE
from backfill_platform.tables import (
    FCT_REVENUE_BY_SEGMENT,
    RAW_CRM_HISTORY,
    RAW_FX_RATES,
    STAGING_CUSTOMERS,
    STAGING_ORDERS,
    table,
)
from backfill_platform.transforms.customers import (
    RAW_HISTORY_SCHEMA,
    customers_to_fetch,
    revenue_by_segment,
    scd2_versions,
    uncovered_customers,
)

# A run that sets this tag to `live` calls from the live share; schedule and sensor runs
# are live anyway; every other run (backfills, the runner, the UI) is a backfill.
CRM_KIND_TAG = "backfill_platform/crm_kind"
_LIVE_TAGS = ("dagster/schedule_name", "dagster/sensor_name")
# staging/customers' commits record the raw history they were built from: "table id@version".
BUILT_FROM = "built_from_raw"


def crm_kind(tags: dict[str, str]) -> str:
    if tags.get(CRM_KIND_TAG) == LIVE or any(t in tags for t in _LIVE_TAGS):
        return LIVE
    return BACKFILL


def kept_history(lakehouse: LakehouseResource) -> DataFrame | None:
    return lakehouse.read(RAW_CRM_HISTORY) if lakehouse.exists(RAW_CRM_HISTORY) else None


def covered_days(context: AssetExecutionContext, run_id: str, key) -> dict[str, str]:
    """Commit metadata: the event days the run covered, so built_partitions and the plan
    see these tables' partitions like any other table's."""
    start, end = run_dates(context)
    return {
        "dagster_run_id": run_id,
        "asset_key": key.to_user_string(),
        "code_version": table(key).code_version,
        "partition_start": start.isoformat(),
        "partition_end": end.isoformat(),
    }


def orders_of(lakehouse: LakehouseResource, context: AssetExecutionContext) -> DataFrame:
    if not lakehouse.exists(STAGING_ORDERS):
        raise Failure("staging/orders has not been built; materialize it for this range first.")
    start, end = run_dates(context)
    return lakehouse.read_range(STAGING_ORDERS, "event_date", start, end)


@asset(
    key=RAW_CRM_HISTORY,
    group_name="raw",
    partitions_def=daily_partitions,
    backfill_policy=chunked_backfill_policy(),
    code_version=table(RAW_CRM_HISTORY).code_version,
    metadata=table(RAW_CRM_HISTORY).metadata,
    deps=[AssetDep(STAGING_ORDERS)],
    kinds={"spark", "delta"},
)
def crm_customer_history(
    context: AssetExecutionContext, lakehouse: LakehouseResource, crm: CrmResource
) -> MaterializeResult:
    """Every CRM answer the run needed, appended as received (status and body text)."""
    orders = orders_of(lakehouse, context)
    needed = sorted(
        r["customer_id"] for r in customers_to_fetch(orders, kept_history(lakehouse)).collect()
    )
    kind = crm_kind(context.run.tags)
    try:
        answers, stats = crm.fetch(needed, kind=kind, run_id=context.run_id)
    except CrmError as error:
        if error.answers:  # answers received before the failure stay kept
            _append(context, lakehouse, error.answers, covered=False)
        # Transient (an outage, timeouts past the attempts): the run retries keep it.
        raise Failure(str(error)) from None
    # A run that kept no answer for days the log already records has nothing to commit.
    committed = bool(answers) or not lakehouse.recorded_days(
        RAW_CRM_HISTORY, context.partition_keys, table(RAW_CRM_HISTORY).code_version
    )
    if committed:
        _append(context, lakehouse, answers)
    if stats.throttled_429:
        context.log.warning(f"the CRM answered 429 {stats.throttled_429} times to this run")
    return MaterializeResult(
        metadata={"crm_kind": kind, "committed": committed, **stats.metadata()}
    )


def _append(
    context: AssetExecutionContext, lakehouse: LakehouseResource, answers, covered: bool = True
) -> None:
    """Keep answers; `covered=False` (a failed run's) stamps no event days on the commit."""
    rows = [
        (a.customer_id, a.fetched_at, a.fetched_at.astimezone(UTC).date(), a.status, a.body, run)
        for a in answers
        for run in [context.run_id]
    ]
    df = lakehouse.session.createDataFrame(rows, RAW_HISTORY_SCHEMA).withColumn(
        "_loaded_at", F.current_timestamp()
    )
    # Appended even when empty: the commit records the event days this run covered.
    metadata = covered_days(context, context.run_id, RAW_CRM_HISTORY)
    if not covered:
        metadata = {k: v for k, v in metadata.items() if not k.startswith("partition_")}
    lakehouse.append(RAW_CRM_HISTORY, df, "fetched_date", metadata)


@asset(
    key=STAGING_CUSTOMERS,
    group_name="staging",
    partitions_def=daily_partitions,
    backfill_policy=chunked_backfill_policy(),
    code_version=table(STAGING_CUSTOMERS).code_version,
    deps=[AssetDep(RAW_CRM_HISTORY)],
    kinds={"spark", "delta"},
)
def staging_customers(
    context: AssetExecutionContext, lakehouse: LakehouseResource
) -> MaterializeResult:
    """SCD2 versions of every customer from the newest kept answer, rebuilt whole.

    The read of raw and the overwrite happen under this table's lock, so a run that
    finished later always writes a table holding every answer kept before it. When raw
    has kept no answer since the version the table was built from (a re-run, or days whose
    customers were all fetched before), a rebuild would write the same rows: the run then
    commits no change, only the days it covered, as raw's own commit of no answers does,
    and nothing at all when the log already records its days (a re-run): a new version of
    the same rows would only make every later reader build that version's state."""
    # A twin (shadow/staging/customers) writes its run's shadow, never production.
    target, key = lakehouse.run_target(context.asset_key)
    if not lakehouse.exists(RAW_CRM_HISTORY):
        raise Failure("raw/crm_customer_history has not been built; materialize it first.")
    with target.table_lock(f"{target.storage_name(key)}.rebuild"):
        raw_id, raw_version = lakehouse.content_id(RAW_CRM_HISTORY)
        metadata = {
            **covered_days(context, context.run_id, key),
            BUILT_FROM: f"{raw_id}@{raw_version}",
        }
        last = _last_build(target, key)
        rebuilt = not (
            last is not None
            and last.raw_id == raw_id
            and lakehouse.added_nothing(RAW_CRM_HISTORY, last.raw_version, raw_version)
        )
        if rebuilt:
            versions = scd2_versions(lakehouse.read(RAW_CRM_HISTORY, raw_version)).withColumn(
                "_loaded_at", F.current_timestamp()
            )
            version = target.overwrite(key, versions, metadata)
            counts = _counts(target.read(key, version))
        else:
            # The rows are the last build's, so are their counts: a commit of no change
            # carries them on, a run after the build itself counts them.
            counts = last.counts or _counts(target.read(key))
            if target.recorded_days(key, context.partition_keys, table(key).code_version):
                version = last.version  # a re-run of recorded days: nothing to commit
            else:
                version = target.record_unchanged(key, {**metadata, **counts})
    return MaterializeResult(
        metadata={
            "delta_version": version,
            "rebuilt": rebuilt,
            "committed": rebuilt or version != last.version,
            "raw_version": raw_version,
            **counts,
        }
    )


_COUNTS = ("versions", "customers")


@dataclass(frozen=True)
class _Build:
    """What staging/customers' newest commit says its rows were built from."""

    version: int  # the newest commit's
    raw_id: str  # raw/crm_customer_history's Delta table id
    raw_version: int
    counts: dict[str, int] | None  # `_COUNTS`, once a commit of no change carries them


def _last_build(target: LakehouseResource, key) -> _Build | None:
    """The raw history the table's rows come from, if its newest commit is this asset's
    rebuild or commit of no change at its current code version (a RESTORE, a cutover or
    any other writer's commit makes the next run rebuild)."""
    newest = target.newest_commit(key)
    if newest is None or newest.operation not in ("WRITE", "DELETE"):
        return None
    meta = newest.user_metadata
    if (
        meta.get("code_version") != table(key).code_version
        or meta.get("write_mode") not in ("overwrite", "none")
        or BUILT_FROM not in meta
    ):
        return None
    raw_id, _, raw_version = str(meta[BUILT_FROM]).rpartition("@")
    counts = {k: int(meta[k]) for k in _COUNTS} if all(k in meta for k in _COUNTS) else None
    return _Build(newest.version, raw_id, int(raw_version), counts)


def _counts(versions: DataFrame) -> dict[str, int]:
    row = versions.agg(
        F.count(F.lit(1)).alias("versions"), F.count_distinct("customer_id").alias("customers")
    ).first()
    return {k: int(row[k]) for k in _COUNTS}


@asset(
    key=FCT_REVENUE_BY_SEGMENT,
    pool="lakehouse_downstream",
    group_name="marts",
    partitions_def=daily_partitions,
    backfill_policy=chunked_backfill_policy(),
    code_version=table(FCT_REVENUE_BY_SEGMENT).code_version,
    metadata=table(FCT_REVENUE_BY_SEGMENT).metadata,
    ins={
        "staged": AssetIn(STAGING_ORDERS),
        "fx": AssetIn(RAW_FX_RATES, partition_mapping=_FX_REACH),
    },
    deps=[AssetDep(STAGING_CUSTOMERS), AssetDep(RAW_CRM_HISTORY)],
    kinds={"spark", "delta"},
)
def fct_revenue_by_segment(
    context: AssetExecutionContext,
    spark: SparkSessionResource,
    lakehouse: LakehouseResource,
    staged: DataFrame | None,
    fx: DataFrame | None,
) -> DataFrame:
    """Orders, paid orders and USD revenue per (event_date, segment, country), each order
    attributed to its customer's version in force at its event_time (never today's).

    Fails, naming customers, when an order's customer has no kept answer covering it."""
    orders = _orders_in_usd(staged, fx, spark.get_session())
    missing = uncovered_customers(orders, kept_history(lakehouse))
    if missing:
        shown = ", ".join(repr(c) for c in missing[:10])
        raise Failure(
            f"{len(missing)} customers have no CRM answer covering their orders ({shown}); "
            "materialize raw/crm_customer_history and staging/customers for this range first."
        )
    if not lakehouse.exists(STAGING_CUSTOMERS):
        raise Failure("staging/customers has not been built; materialize it first.")
    versions = lakehouse.read(STAGING_CUSTOMERS)
    return revenue_by_segment(orders, versions).withColumn("_loaded_at", F.current_timestamp())
