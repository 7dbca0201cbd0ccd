"""The checks of a run's staging/orders and its rejects, in one step.

Four checks read staging or raw over the run's days once staging is written: the accounting
of every raw row (`staging_vs_raw`), the rejects' (`rejects_vs_raw`), quality and skew. They
run as one Dagster step whose queries run at the same time (`at_once`): each is small next
to the write, mostly the driver's snapshot, planning and stage waits, so on one JVM they
overlap instead of queueing, and the step reads the run's materializations once for the
evaluations' targets. Each check keeps its own name, severity, blocking flag and one
evaluation per day; a blocking failure fails the step after every evaluation is logged, as
a check step of its own would (results.record). The step can run part of its checks
(`can_subset`): the daemon launches runs that select staging/orders' checks without the
rejects' (or one check from the UI), and the step then runs only the selected checks'
queries.
"""

from functools import partial

from dagster import AssetCheckExecutionContext, AssetCheckKey, multi_asset_check

from backfill_platform.checks.quality import QUALITY_SPECS, quality_outcomes
from backfill_platform.checks.reconciliation import (
    ACCOUNTS_SPEC,
    REJECTS_SPEC,
    rejects_vs_raw,
    staging_vs_raw,
    versions_written,
)
from backfill_platform.checks.results import (
    CheckEvents,
    at_once,
    log_partition_metrics,
    record,
    run_partitions,
)
from backfill_platform.checks.skew import SKEW_SPEC, skew_outcome
from backfill_platform.resources import LakehouseResource
from backfill_platform.tables import RAW_ORDERS, STAGING_ORDERS, STAGING_REJECTS

# The two equations against raw: their check, the table whose write they prove, the equation.
AGAINST_RAW = (
    (ACCOUNTS_SPEC, STAGING_ORDERS, staging_vs_raw),
    (REJECTS_SPEC, STAGING_REJECTS, rejects_vs_raw),
)


@multi_asset_check(
    specs=[ACCOUNTS_SPEC, REJECTS_SPEC, *QUALITY_SPECS, SKEW_SPEC],
    name="staging_orders_checks",
    can_subset=True,
)
def staging_orders_checks(
    context: AssetCheckExecutionContext, lakehouse: LakehouseResource
) -> CheckEvents:
    """staging/orders and its rejects account for every raw row; order_id unique, required
    values set, volume and NULL rates within trailing bounds; customer_id skew."""
    run = run_partitions(context)
    selected = context.selected_asset_check_keys
    queries = {}
    for spec, table, equation in AGAINST_RAW:
        if spec.key in selected:
            # In the run that built the table: the version it committed, the raw version it read.
            version, raw_version = versions_written(context, lakehouse, table, RAW_ORDERS, run)
            queries[spec.key] = partial(equation, lakehouse, run, raw_version, version)
    if any(spec.key in selected for spec in QUALITY_SPECS):
        queries["quality"] = partial(quality_outcomes, lakehouse, run)
    if SKEW_SPEC.key in selected:
        queries[SKEW_SPEC.key] = partial(skew_outcome, lakehouse, run)
    answers = dict(zip(queries, at_once(*queries.values()), strict=True))
    outcomes = [answers[spec.key] for spec, _, _ in AGAINST_RAW if spec.key in answers]
    for outcome in outcomes:
        log_partition_metrics(context, outcome)
    outcomes += [
        outcome
        for outcome in answers.get("quality", [])
        if AssetCheckKey(outcome.asset_key, outcome.check_name) in selected
    ]
    if SKEW_SPEC.key in answers:
        outcomes.append(answers[SKEW_SPEC.key])
    yield from record(context, *outcomes)


staging_checks = [staging_orders_checks]
