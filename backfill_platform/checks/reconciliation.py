"""Reconciliation (blocking): the equations between layers hold for every partition a run wrote.

Each check reads what the run committed (Delta) and the layer below it, aggregates both per
partition in one Spark job each, and fails with ERROR severity naming the partitions and
numbers. Blocking: a failure skips every downstream asset of the run, and the live path's
sensors hold the failing partitions (see automation/window_sensor.py).
"""

import json
from datetime import date, timedelta
from decimal import Context, Decimal, localcontext

from dagster import AssetCheckExecutionContext, AssetCheckSpec, AssetKey, asset_check
from pyspark.errors import ArithmeticException
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from backfill_platform.checks.drift import run_commit
from backfill_platform.checks.results import (
    CheckEvents,
    CheckOutcome,
    PartitionResult,
    at_once,
    log_partition_metrics,
    record,
    run_partitions,
    written_by_run,
)
from backfill_platform.partitions import daily_partitions
from backfill_platform.ranges import DayRange
from backfill_platform.resources import LakehouseResource, LandingZoneResource
from backfill_platform.resources.delta_io_manager import READ_VERSIONS
from backfill_platform.resources.landing import ORDERS
from backfill_platform.tables import (
    CUSTOMER_LTV,
    FCT_DAILY_REVENUE,
    RAW_FX_RATES,
    RAW_ORDERS,
    STAGING_ORDERS,
    STAGING_REJECTS,
)
from backfill_platform.transforms.fx import (
    REACH_DAYS,
    known_currencies,
    point_in_time_rates,
    with_usd,
)
from backfill_platform.transforms.orders import UNKNOWN_CURRENCY, with_unknown_currency
from backfill_platform.transforms.revenue import LOCAL_TYPE

# The fingerprint's customer weights (`ltv_vs_previous_day`): 1 to 2^20, multiplied into
# DECIMAL(30,10) revenue as a DECIMAL(7,0) so the product is an exact DECIMAL(38,10).
WEIGHT_MASK = 2**20 - 1
WEIGHT_TYPE = "decimal(7,0)"
# Python's decimals for those sums: wide enough that no sum or product of them rounds.
EXACT = Context(prec=100)

# Lifetime sums are added in DECIMAL(30,10), as transforms/revenue.py does, so the expected
# value is exact (Spark would round a DECIMAL(38,10) + DECIMAL(38,10) to 9 places).
SUM_TYPE = "decimal(30,10)"


def _rate(part: int, whole: int) -> float:
    return round(part / whole, 6) if whole else 0.0


@asset_check(
    asset=RAW_ORDERS,
    name="rows_match_landing_lines",
    blocking=True,
    partitions_def=daily_partitions,
)
def raw_rows_match_landing(
    context: AssetCheckExecutionContext, lakehouse: LakehouseResource, landing: LandingZoneResource
) -> CheckEvents:
    """raw/orders landing rows of each ingest day == non-blank lines of that day's landing
    files (the stream's rows of the day are not the landing zone's: docs/live-stream.md).

    The landing side is counted in plain Python from the files (not by the Spark reader raw
    uses), so a line lost or doubled by parsing, a partial write or a changed delivery shows.
    """
    outcome = raw_vs_landing(lakehouse, landing, run_partitions(context))
    log_partition_metrics(context, outcome)
    yield from record(context, outcome)


def raw_vs_landing(
    lakehouse: LakehouseResource, landing: LandingZoneResource, run: DayRange
) -> CheckOutcome:
    """The equation of `raw_rows_match_landing` over `run`'s days (`stream reconcile` also
    reads days past the last partition)."""
    expected = {
        day: sum(landing.record_count(p) for p in landing.files(ORDERS, [day]))
        for day in run.day_keys()
    }
    stats = {}
    if lakehouse.exists(RAW_ORDERS):
        landing_rows = lakehouse.read_partitions(RAW_ORDERS, run.start, run.end, owned_only=True)
        stats = {
            r["ingest_date"].isoformat(): r
            for r in landing_rows.groupBy("ingest_date")
            .agg(
                F.count(F.lit(1)).alias("rows"),
                F.count("reject_reason").alias("invalid_rows"),
                F.count(F.when(F.col("event_date") < F.col("ingest_date"), True)).alias("late"),
            )
            .collect()
        }
    results, metrics = [], {}
    for day in run.day_keys():
        row = stats.get(day)
        rows = row["rows"] if row else 0
        results.append(PartitionResult(day, expected[day], rows, rows == expected[day]))
        late = row["late"] if row else 0
        metrics[day] = {
            "rows": rows,
            "late_rows": late,
            "rejects": row["invalid_rows"] if row else 0,
            "late_arrival_rate": _rate(late, rows),
        }
    return CheckOutcome(
        "rows_match_landing_lines",
        RAW_ORDERS,
        results,
        what="raw/orders rows vs non-blank landing lines per ingest day",
        metrics=metrics,
    )


ACCOUNTS_SPEC = AssetCheckSpec(
    "accounts_for_every_raw_row",
    asset=STAGING_ORDERS,
    blocking=True,
    partitions_def=daily_partitions,
    additional_deps=[RAW_ORDERS],
    description="Per event day D: raw rows carrying D == distinct orders + superseded "
    "versions + rejects (staging_vs_raw).",
)


def versions_written(
    context: AssetCheckExecutionContext,
    lakehouse: LakehouseResource,
    key: AssetKey,
    source: AssetKey,
    run: DayRange,
) -> tuple[int | None, int | None]:
    """`versions_of_run` for the check's own run, from the run's materialization of `key`
    when it has one (no history read), else from the table's history."""
    written = written_by_run(context, key, run.partition_keys()[0])
    if written is None:
        return versions_of_run(lakehouse, key, context.op_execution_context.run_id, source)
    read = json.loads(written.get(READ_VERSIONS) or "{}").get(source.to_user_string())
    return written["delta_version"], read


def versions_of_run(
    lakehouse: LakehouseResource, key: AssetKey, run_id: str, source: AssetKey
) -> tuple[int | None, int | None]:
    """The version run `run_id` committed of `key`, and the version of `source` that write
    was computed from (the commit's READ_VERSIONS); (None, None) when the run did not write
    `key` (read the current ones)."""
    commit = run_commit(lakehouse.history(key, limit=100), run_id)
    if commit is None:
        return None, None
    read = json.loads(commit["metadata"].get(READ_VERSIONS) or "{}").get(source.to_user_string())
    return commit["version"], read


def staging_vs_raw(
    lakehouse: LakehouseResource,
    run: DayRange,
    raw_version: int | None = None,
    staging_version: int | None = None,
) -> CheckOutcome:
    """Per event day D of `run`: raw rows carrying D == distinct orders + superseded versions
    + rejects, raw at `raw_version` and staging at `staging_version` (None: the current
    versions).

    Left side: raw/orders rows that parse as valid orders with event_date D, from every ingest
    day (late arrivals and re-deliveries included). Right side: staging's orders of D
    (latest wins), plus the versions each one superseded (`raw_versions` - 1 per order:
    duplicates and older updates), plus D's rows rejected for an unknown currency. Lines
    rejected at parsing carry no event day; `rejects_vs_raw` counts them by ingest day. In
    the run that built staging, the check proves that run's commit against what it read:
    staging at the version the run committed, raw at the version it read (recorded on the
    commit). The live stream appends to raw, and with BACKFILL_STREAM_STAGING replaces
    staging's days, while a backfill runs; what it wrote after the run read or committed is
    the stream's (or the next window run's), not this run's failure. A check run on its own
    reads the current tables, so a raw row that arrived after staging was built makes it
    fail until staging is rebuilt, which is what "staging does not account for raw" means.
    """
    in_range = (F.col("event_date") >= F.lit(run.start)) & (F.col("event_date") < F.lit(run.end))
    raw = with_unknown_currency(
        lakehouse.read(RAW_ORDERS, raw_version).where(in_range & F.col("reject_reason").isNull()),
        known_currencies(lakehouse),
    )
    raw_counts = {
        r["event_date"].isoformat(): r
        for r in raw.groupBy("event_date")
        .agg(
            F.count(F.lit(1)).alias("rows"),
            F.count(F.when(F.col("reject_reason") == UNKNOWN_CURRENCY, True)).alias("rejects"),
        )
        .collect()
    }
    staged = {
        r["event_date"].isoformat(): r
        for r in lakehouse.read_partitions(STAGING_ORDERS, run.start, run.end, staging_version)
        .groupBy("event_date")
        .agg(
            F.count(F.lit(1)).alias("orders"),
            F.sum("raw_versions").alias("versions"),
            F.count(F.when(F.col("first_ingest_date") > F.col("event_date"), True)).alias("late"),
        )
        .collect()
    }
    results, metrics = [], {}
    for day in run.day_keys():
        raw_row, row = raw_counts.get(day), staged.get(day)
        expected = raw_row["rows"] if raw_row else 0
        rejects = raw_row["rejects"] if raw_row else 0
        orders = row["orders"] if row else 0
        superseded = (row["versions"] - orders) if row else 0
        actual = orders + superseded + rejects
        detail = f"{orders} orders + {superseded} superseded + {rejects} currency rejects"
        results.append(PartitionResult(day, expected, actual, actual == expected, detail))
        late = row["late"] if row else 0
        metrics[day] = {
            "rows": orders,
            "late_rows": late,
            "superseded_versions": superseded,
            "late_arrival_rate": _rate(late, orders),
        }
    return CheckOutcome(
        "accounts_for_every_raw_row",
        STAGING_ORDERS,
        results,
        what="raw rows per event day vs staged orders + superseded versions + rejects",
        metrics=metrics,
    )


REJECTS_SPEC = AssetCheckSpec(
    "rejects_match_raw",
    asset=STAGING_REJECTS,
    blocking=True,
    partitions_def=daily_partitions,
    additional_deps=[RAW_ORDERS],
    description="Per ingest day: staging/orders_rejects rows == raw rows rejected (parse or "
    "currency), at the versions the run committed and read (rejects_vs_raw).",
)


def rejects_vs_raw(
    lakehouse: LakehouseResource,
    run: DayRange,
    raw_version: int | None = None,
    rejects_version: int | None = None,
) -> CheckOutcome:
    """Per ingest day of `run`: staging/orders_rejects rows == raw rows rejected at parsing or
    for an unknown currency (raw at `raw_version`, the rejects at `rejects_version`; None:
    the current versions)."""
    raw = with_unknown_currency(
        lakehouse.read_partitions(RAW_ORDERS, run.start, run.end, raw_version),
        known_currencies(lakehouse),
    )
    expected = {
        r["ingest_date"].isoformat(): r["n"]
        for r in raw.where(F.col("reject_reason").isNotNull())
        .groupBy("ingest_date")
        .agg(F.count(F.lit(1)).alias("n"))
        .collect()
    }
    actual = {
        r["ingest_date"].isoformat(): r["n"]
        for r in lakehouse.read_partitions(STAGING_REJECTS, run.start, run.end, rejects_version)
        .groupBy("ingest_date")
        .agg(F.count(F.lit(1)).alias("n"))
        .collect()
    }
    results = []
    for day in run.partition_keys():
        want, got = expected.get(day, 0), actual.get(day, 0)
        results.append(PartitionResult(day, want, got, want == got))
    return CheckOutcome(
        "rejects_match_raw",
        STAGING_REJECTS,
        results,
        what="rejected raw rows vs staging/orders_rejects rows per ingest day",
        metrics={d: {"rejects": actual.get(d, 0)} for d in run.partition_keys()},
    )


@asset_check(
    asset=FCT_DAILY_REVENUE,
    name="matches_staging_orders",
    blocking=True,
    partitions_def=daily_partitions,
    additional_deps=[STAGING_ORDERS],
)
def fct_matches_staging(
    context: AssetCheckExecutionContext, lakehouse: LakehouseResource
) -> CheckEvents:
    """Per event day and currency: orders, paid orders, revenue_local equal staging's, exactly."""
    run = run_partitions(context)
    # In the run that built fct: the version it committed, the staging version it read.
    version, staging_version = versions_written(
        context, lakehouse, FCT_DAILY_REVENUE, STAGING_ORDERS, run
    )
    outcome = fct_vs_staging(lakehouse, run, staging_version, version)
    log_partition_metrics(context, outcome)
    yield from record(context, outcome)


def fct_vs_staging(
    lakehouse: LakehouseResource,
    run: DayRange,
    staging_version: int | None = None,
    fct_version: int | None = None,
) -> CheckOutcome:
    """The equation of `fct_matches_staging` over `run`'s partitions, staging at
    `staging_version` and fct at `fct_version` (None: the current versions). With
    BACKFILL_STREAM_STAGING the live stream replaces staging's days while a backfill runs,
    and folds them into fct later: the run's check proves its own write against what it
    read, as `staging_vs_raw` does.

    Staging's sums per (day, currency) and fct's rows are two small aggregations read at
    once and compared here, exactly (decimals), rather than one Spark join of the two: the
    rows are days x currencies, and a join's shuffle costs more than they do."""
    paid = F.col("status") == "paid"
    staged, fct = at_once(
        lambda: (
            lakehouse.read_partitions(STAGING_ORDERS, run.start, run.end, staging_version)
            .groupBy("event_date", "currency")
            .agg(
                F.count(F.lit(1)).alias("orders"),
                F.count(F.when(paid, True)).alias("paid"),
                F.coalesce(F.sum(F.when(paid, F.col("amount"))), F.lit(0))
                .cast(LOCAL_TYPE)
                .alias("local"),
            )
            .collect()
        ),
        lambda: (
            lakehouse.read_partitions(FCT_DAILY_REVENUE, run.start, run.end, fct_version)
            .select(
                "event_date",
                "currency",
                "orders",
                F.col("paid_orders").alias("paid"),
                F.col("revenue_local").cast(LOCAL_TYPE).alias("local"),
                F.col("revenue_usd").alias("usd"),
            )
            .collect()
        ),
    )
    sides: dict[str, dict[str, dict]] = {}  # day -> currency -> {"s": staging, "f": fct}
    for side, rows in (("s", staged), ("f", fct)):
        for r in rows:
            pair = sides.setdefault(r["event_date"].isoformat(), {}).setdefault(r["currency"], {})
            pair[side] = r.asDict()
    results, metrics = [], {}
    for day in run.partition_keys():
        pairs = sides.get(day)
        if pairs is None:
            results.append(PartitionResult(day, "no orders", "no rows", True))
            metrics[day] = {"orders": 0, "paid_orders": 0, "revenue_usd": 0.0}
            continue
        differing = [
            f"{currency}: staging {_shown(pair.get('s'))} vs fct {_shown(pair.get('f'))}"
            for currency, pair in sorted(pairs.items())
            if _triple(pair.get("s")) != _triple(pair.get("f"))
        ]
        staged_rows = [pair["s"] for pair in pairs.values() if "s" in pair]
        fct_rows = [pair["f"] for pair in pairs.values() if "f" in pair]
        orders, paid_orders = sum(r["orders"] for r in fct_rows), sum(r["paid"] for r in fct_rows)
        expected = (
            f"{sum(r['orders'] for r in staged_rows)} orders, "
            f"{sum(r['paid'] for r in staged_rows)} paid"
        )
        actual = f"{orders} orders, {paid_orders} paid"
        results.append(PartitionResult(day, expected, actual, not differing, "; ".join(differing)))
        usd = sum((r["usd"] for r in fct_rows if r["usd"] is not None), Decimal(0))
        metrics[day] = {"orders": orders, "paid_orders": paid_orders, "revenue_usd": float(usd)}
    return CheckOutcome(
        "matches_staging_orders",
        FCT_DAILY_REVENUE,
        results,
        what="fct_daily_revenue vs staging orders (orders/paid/revenue_local per currency)",
        metrics=metrics,
    )


def _triple(row: dict | None) -> tuple | None:
    """A (day, currency) side's orders, paid orders and local revenue; None when absent."""
    return (row["orders"], row["paid"], row["local"]) if row else None


def _shown(row: dict | None) -> str:
    return "/".join("null" if v is None else str(v) for v in _triple(row) or (None,) * 3)


@asset_check(
    asset=CUSTOMER_LTV,
    name="rolls_forward_from_previous_day",
    blocking=True,
    partitions_def=daily_partitions,
    additional_deps=[STAGING_ORDERS, RAW_FX_RATES],
)
def ltv_rolls_forward(
    context: AssetCheckExecutionContext, lakehouse: LakehouseResource
) -> CheckEvents:
    """Per snapshot day D and customer: ltv(D) == ltv(D-1) + D's paid orders and USD revenue.

    D-1 is read from the table (the snapshot before the run's range included), D's paid
    orders from staging at point-in-time FX; first_order_date must carry over or be D.
    """
    run = run_partitions(context)
    # In the run that built the snapshots: the version it committed, the staging it read.
    version, staging_version = versions_written(
        context, lakehouse, CUSTOMER_LTV, STAGING_ORDERS, run
    )
    yield from record(context, ltv_vs_previous_day(lakehouse, run, staging_version, version))


def ltv_vs_previous_day(
    lakehouse: LakehouseResource,
    run: DayRange,
    staging_version: int | None = None,
    ltv_version: int | None = None,
) -> CheckOutcome:
    """The equation of `ltv_rolls_forward` over `run`'s partitions, staging at
    `staging_version` and customer_ltv at `ltv_version` (None: the current versions), for
    the reason `fct_vs_staging` gives.

    Proven per day from sums, not by joining every (customer, day) of two snapshots: each
    customer carries a weight from a hash of its id (1 to 2^20), and per snapshot day the
    table's weighted sums of customers, lifetime orders, revenue and first-order dates must
    step from the day before by exactly the weighted sums of that day's paid orders and
    first-time customers. One wrong customer always moves a sum (its weight is never 0);
    two wrong ones cancel only if their errors stand in the ratio of their weights. The
    join is done only for days that fail, to name their customers. At the bench's scale
    the join was 24 s of a 92-day run's check and these sums are about 3 s
    (docs/performance.md).
    """
    versions = (staging_version, ltv_version)
    try:
        days = _ltv_step_sums(lakehouse, run, *versions)
    except ArithmeticException:  # a weighted sum beyond DECIMAL(38,10): prove it row by row
        return _ltv_joined(lakehouse, run, *versions)[0]
    results, failing = [], []
    for key in run.partition_keys():
        actual, want = days[key]
        expected = f"{want['customers']} customers, {want['revenue']} USD"
        shown = f"{actual['customers']} customers, {actual['revenue']} USD"
        passed = actual == want
        results.append(PartitionResult(key, expected, shown, passed))
        if not passed:
            failing.append(key)
    if failing:
        _, named = _ltv_joined(lakehouse, DayRange(failing[0], failing[-1]), *versions)
        for result in results:
            if not result.passed:
                result.detail = named.get(result.partition) or (
                    "no customer's totals differ from the day before's, so a snapshot row is "
                    "doubled, missing or extra"
                )
    return _ltv_outcome(results)


def _weight() -> Column:
    """A customer's weight in the fingerprint sums: 1 to 2^20, from a hash of its id."""
    return F.xxhash64("customer_id").bitwiseAND(F.lit(WEIGHT_MASK)) + F.lit(1)


def _ltv_step_sums(
    lakehouse: LakehouseResource,
    run: DayRange,
    staging_version: int | None,
    ltv_version: int | None,
) -> dict[str, tuple[dict, dict]]:
    """Per day of `run`: the snapshot's sums, and what the day before's sums plus the day's
    paid orders and new customers make them: four small aggregations (the snapshots, the
    new customers, the paid orders per currency, their rates), no join of orders with
    rates row by row."""
    one_day = timedelta(days=1)
    opening_day = run.start - one_day
    ltv = lakehouse.read_partitions(CUSTOMER_LTV, opening_day, run.end, ltv_version)
    weight = _weight()  # after the read: a column needs the session the read starts
    revenue = F.col("lifetime_revenue_usd").cast(SUM_TYPE)
    snapshots = {  # a sum over no value is NULL: 0 here
        r["snapshot_date"]: {k: v or 0 for k, v in r.asDict().items()}
        for r in ltv.groupBy("snapshot_date")
        .agg(
            F.count(F.lit(1)).alias("customers"),
            F.sum(revenue).alias("revenue"),
            F.sum(weight).alias("w_customers"),
            F.sum(weight * F.col("lifetime_paid_orders")).alias("w_orders"),
            F.sum(revenue * weight.cast(WEIGHT_TYPE)).alias("w_revenue"),
            F.sum(weight * F.unix_date("first_order_date")).alias("w_first"),
        )
        .collect()
    }
    paid = lakehouse.read_partitions(STAGING_ORDERS, run.start, run.end, staging_version).where(
        (F.col("status") == "paid") & F.col("customer_id").isNotNull()
    )
    # A customer is new on its first paid day in the run unless the opening snapshot has it.
    opening = ltv.where(F.col("snapshot_date") == F.lit(opening_day)).select("customer_id")
    newcomers = {
        r["day"]: r.asDict()
        for r in paid.groupBy("customer_id")
        .agg(F.min("event_date").alias("day"))
        .join(opening, "customer_id", "left_anti")
        .groupBy("day")
        .agg(
            F.count(F.lit(1)).alias("customers"),
            F.sum(weight).alias("w_customers"),
            F.sum(weight * F.unix_date("day")).alias("w_first"),
        )
        .collect()
    }
    empty = dict.fromkeys(
        ("customers", "revenue", "w_customers", "w_orders", "w_revenue", "w_first"), 0
    )
    days = {}
    with localcontext(EXACT):
        orders = _paid_sums(lakehouse, run, paid, weight)
        for day in run.days():
            before, actual = snapshots.get(day - one_day, empty), snapshots.get(day, empty)
            paid_day, new = orders.get(day, empty), newcomers.get(day, empty)
            want = {
                "customers": before["customers"] + new["customers"],
                "revenue": before["revenue"] + paid_day["revenue"],
                "w_customers": before["w_customers"] + new["w_customers"],
                "w_orders": before["w_orders"] + paid_day["w_orders"],
                "w_revenue": before["w_revenue"] + paid_day["w_revenue"],
                "w_first": before["w_first"] + new["w_first"],
            }
            days[day.isoformat()] = ({k: actual[k] for k in want}, want)
    return days


def _paid_sums(
    lakehouse: LakehouseResource, run: DayRange, paid: DataFrame, weight: Column
) -> dict[date, dict[str, Decimal | int]]:
    """Per day: USD revenue of the paid orders, and their sums weighted by customer.

    An order's USD amount is its amount times the day's point-in-time rate, exactly (no
    rounding: transforms/fx.py), so the sums are taken per (day, currency) in the local
    currency and multiplied by the rate here, in exact decimals: one small aggregation,
    not a join of every order with its rate. A pair without a rate adds nothing, so its
    day cannot match (the LTV asset fails on it first)."""
    by_pair = paid.groupBy("event_date", "currency").agg(
        F.sum("amount").alias("amount"),
        F.sum(weight).alias("w_orders"),
        F.sum(F.col("amount") * weight.cast(WEIGHT_TYPE)).alias("w_amount"),
    )
    pairs = by_pair.collect()
    if not pairs:
        return {}
    rates = point_in_time_rates(
        paid.sparkSession.createDataFrame(
            [(r["event_date"], r["currency"]) for r in pairs], "event_date date, currency string"
        ),
        lakehouse.read_partitions(RAW_FX_RATES, run.start - timedelta(days=REACH_DAYS), run.end),
    )
    rate_of = {(r["event_date"], r["currency"]): r["usd_per_unit"] for r in rates.collect()}
    sums: dict[date, dict[str, Decimal | int]] = {}
    for r in pairs:
        day = sums.setdefault(r["event_date"], {"revenue": 0, "w_orders": 0, "w_revenue": 0})
        rate = rate_of.get((r["event_date"], r["currency"])) or 0
        day["revenue"] += r["amount"] * rate
        day["w_orders"] += r["w_orders"]
        day["w_revenue"] += r["w_amount"] * rate
    return sums


def _ltv_outcome(results: list[PartitionResult]) -> CheckOutcome:
    return CheckOutcome(
        "rolls_forward_from_previous_day",
        CUSTOMER_LTV,
        results,
        what="customer_ltv(D) vs customer_ltv(D-1) + day D's paid revenue per customer",
    )


def _ltv_joined(
    lakehouse: LakehouseResource,
    run: DayRange,
    staging_version: int | None = None,
    ltv_version: int | None = None,
) -> tuple[CheckOutcome, dict[str, str]]:
    """The same equation row by row: every (customer, day) of the snapshots joined with the
    day before's and the day's paid orders; its details name the customers that differ."""
    one_day = timedelta(days=1)
    ltv = lakehouse.read_partitions(CUSTOMER_LTV, run.start - one_day, run.end, ltv_version)
    current = ltv.where(F.col("snapshot_date") >= F.lit(run.start)).select(
        "snapshot_date",
        "customer_id",
        F.col("lifetime_paid_orders").alias("c_orders"),
        F.col("lifetime_revenue_usd").cast(SUM_TYPE).alias("c_revenue"),
        F.col("first_order_date").alias("c_first"),
    )
    previous = ltv.where(F.col("snapshot_date") < F.lit(run.end - one_day)).select(
        F.date_add("snapshot_date", 1).alias("snapshot_date"),
        "customer_id",
        F.col("lifetime_paid_orders").alias("p_orders"),
        F.col("lifetime_revenue_usd").cast(SUM_TYPE).alias("p_revenue"),
        F.col("first_order_date").alias("p_first"),
    )
    paid = lakehouse.read_partitions(STAGING_ORDERS, run.start, run.end, staging_version).where(
        (F.col("status") == "paid") & F.col("customer_id").isNotNull()
    )
    rates = lakehouse.read_partitions(RAW_FX_RATES, run.start - timedelta(days=REACH_DAYS), run.end)
    day = (
        with_usd(paid, rates)
        .groupBy("customer_id", F.col("event_date").alias("snapshot_date"))
        .agg(
            F.count(F.lit(1)).alias("d_orders"),
            F.sum("amount_usd").cast(SUM_TYPE).alias("d_revenue"),
        )
    )
    zero = F.lit(0).cast(SUM_TYPE)
    expected_orders = F.coalesce("p_orders", F.lit(0)) + F.coalesce("d_orders", F.lit(0))
    expected_revenue = (F.coalesce("p_revenue", zero) + F.coalesce("d_revenue", zero)).cast(
        SUM_TYPE
    )
    expected_first = F.coalesce("p_first", F.when(F.col("d_orders") > 0, F.col("snapshot_date")))
    same = (
        F.col("c_orders").eqNullSafe(expected_orders)
        & F.col("c_revenue").eqNullSafe(expected_revenue)
        & F.col("c_first").eqNullSafe(expected_first)
    )
    joined = current.join(
        previous.join(day, ["snapshot_date", "customer_id"], "full_outer"),
        ["snapshot_date", "customer_id"],
        "full_outer",
    ).where(F.col("snapshot_date") >= F.lit(run.start))
    days = {
        r["snapshot_date"].isoformat(): r
        for r in joined.groupBy("snapshot_date")
        .agg(
            F.count("c_orders").alias("customers"),
            F.count(F.lit(1)).alias("expected_customers"),
            F.count(F.when(~same, True)).alias("mismatches"),
            F.coalesce(F.sum("c_revenue"), zero).alias("revenue"),
            F.coalesce(F.sum(expected_revenue), zero).alias("expected_revenue"),
            F.slice(F.sort_array(F.collect_list(F.when(~same, F.col("customer_id")))), 1, 5).alias(
                "examples"
            ),
        )
        .collect()
    }
    results, named = [], {}
    for key in run.partition_keys():
        row = days.get(key)
        if row is None:
            results.append(PartitionResult(key, "0 customers", "0 customers", True))
            continue
        expected = f"{row['expected_customers']} customers, {row['expected_revenue']} USD"
        actual = f"{row['customers']} customers, {row['revenue']} USD"
        detail = (
            f"{row['mismatches']} customer(s) differ, e.g. {', '.join(row['examples'])}"
            if row["mismatches"]
            else ""
        )
        results.append(PartitionResult(key, expected, actual, row["mismatches"] == 0, detail))
        named[key] = detail
    return _ltv_outcome(results), named


def layer_equation(
    lakehouse: LakehouseResource,
    landing: LandingZoneResource,
    key: AssetKey,
    run: DayRange,
) -> CheckOutcome | None:
    """`key`'s blocking equation over `run`, outside a run: validation applies it to a shadow
    lakehouse, whose tables then answer to the layer they were built from."""
    if key == RAW_ORDERS:
        return raw_vs_landing(lakehouse, landing, run)
    equation = {
        STAGING_ORDERS: staging_vs_raw,
        STAGING_REJECTS: rejects_vs_raw,
        FCT_DAILY_REVENUE: fct_vs_staging,
        CUSTOMER_LTV: ltv_vs_previous_day,
    }.get(key)
    return equation(lakehouse, run) if equation else None


reconciliation_checks = [
    raw_rows_match_landing,
    fct_matches_staging,
    ltv_rolls_forward,
]
