"""The staleness sensor: audits built partitions for late rows beyond the window, reports
them and, with auto repair on, requests the targeted backfill.

Spark-free: the scan runs in `staleness_audit_job` runs this sensor requests, and only when
the instance says something can be stale (`stale_signals`) and no run or backfill that
would make the audit moot is queued or running; the sensor reads the audits' reports
(observations on staging/orders) and the runs in progress.
"""

import json
import time
from datetime import date

from dagster import (
    DagsterInstance,
    DefaultSensorStatus,
    RunRequest,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from backfill_platform.automation.active_runs import active_run_ids, blocked_days
from backfill_platform.automation.freeze import frozen_days
from backfill_platform.automation.live_jobs import (
    AUDIT_MARKER,
    DOWNSTREAM_KEYS,
    RAW_KEYS,
    lakehouse_vacuum_job,
    repair_ltv_job,
    repair_staging_job,
    staleness_audit_job,
)
from backfill_platform.automation.stale_signals import stale_signals
from backfill_platform.automation.staleness import (
    LTV_STEP,
    REPAIR_COMMAND,
    STAGING_STEP,
    StalenessReport,
)
from backfill_platform.automation.window_sensor import live_window
from backfill_platform.runner import TRIGGER_TAG, active_runs, range_tags
from backfill_platform.settings import AUTO_REPAIR_STALE, STALENESS_AUDIT_SECONDS, setting
from backfill_platform.tables import STAGING_ORDERS

AUTO_REPAIR_ENV = AUTO_REPAIR_STALE.env_var_name
# The trigger of the repair runs this sensor requests; it waits while any is active.
REPAIR_TRIGGER = "stale-repair"


def auto_repair() -> bool:
    """BACKFILL_AUTO_REPAIR_STALE, read per tick."""
    return setting(AUTO_REPAIR_STALE).strip().lower() in {"1", "true", "yes"}


def audit_interval_seconds() -> int:
    """How long a clean audit stands before changes trigger a new one (default 30 min)."""
    return int(setting(STALENESS_AUDIT_SECONDS))


def latest_write(instance: DagsterInstance) -> int:
    """Storage id of the newest materialization of any lakehouse table (0 if none)."""
    newest = 0
    for key in (*RAW_KEYS, *DOWNSTREAM_KEYS):
        records = instance.fetch_materializations(key, limit=1).records
        if records:
            newest = max(newest, records[0].storage_id)
    return newest


def latest_audit(instance: DagsterInstance):
    """The newest staleness audit observation on staging/orders, or None."""
    for record in instance.fetch_observations(STAGING_ORDERS, limit=20).records:
        observation = record.asset_observation
        if observation and AUDIT_MARKER in observation.metadata:
            return record
    return None


def moot_makers(instance: DagsterInstance) -> list[str]:
    """Queued or running runs and requested backfills that write tables: an audit queued
    behind them would report on data they are about to change (and hold a run slot)."""
    quiet = {staleness_audit_job.name, lakehouse_vacuum_job.name}
    runs = [run.run_id for run in active_runs(instance) if run.job_name not in quiet]
    backfills = [  # between a backfill's runs none is active, but the backfill is
        f"backfill {b.backfill_id}"
        for b in instance.get_backfills(limit=50)
        if b.status.value == "REQUESTED"
    ]
    return runs + backfills


def audit_or_repair(instance: DagsterInstance) -> list[str]:
    return active_run_ids(instance, job_name=staleness_audit_job.name) + active_run_ids(
        instance, tags={TRIGGER_TAG: REPAIR_TRIGGER}
    )


def _cursor(text: str | None) -> dict:
    """{"checked": newest write found unable to make anything stale, "repaired": audit id}."""
    if not text:
        return {}
    if text.isdigit():  # the earlier plain form: the audit a repair was requested for
        return {"repaired": int(text)}
    return json.loads(text)


@sensor(
    jobs=[staleness_audit_job, repair_staging_job, repair_ltv_job],
    minimum_interval_seconds=60,
    default_status=DefaultSensorStatus.RUNNING,
    description="Audits built partitions for late rows beyond the window and offers repair.",
)
def stale_partitions_sensor(context: SensorEvaluationContext):
    """When tables changed since the last audit it requests a new audit (at most every
    BACKFILL_STALENESS_AUDIT_SECONDS while nothing is stale). It acts only on an audit newer
    than every write: it reports the stale days with counts on every tick (the audit's
    observation on staging/orders holds them too), and with BACKFILL_AUTO_REPAIR_STALE=true
    requests the targeted backfill: first the stale staging/fct ranges, then, after the next
    audit sees them rebuilt, customer_ltv from the first stale snapshot on, so LTV never
    reads staging that is still being rewritten.
    """
    instance = context.instance
    cursor = _cursor(context.cursor)
    changed = latest_write(instance)
    if not changed:
        return SkipReason("no lakehouse table has been written yet")
    audit = latest_audit(instance)
    report = (
        StalenessReport.from_metadata(
            {k: v.value for k, v in audit.asset_observation.metadata.items()}
        )
        if audit
        else None
    )
    if audit is None or audit.storage_id < changed:
        busy = audit_or_repair(instance)
        if busy:
            return SkipReason(f"waiting for run(s) {busy}")
        clean = report is None or not report.stale
        checked = max(audit.storage_id if audit else 0, cursor.get("checked", 0))
        if clean and checked >= changed:
            return SkipReason("nothing can be stale: no write since the last look can")
        writers = moot_makers(instance)
        if writers:
            return SkipReason(f"audit deferred: {writers} still writing tables (it would be moot)")
        signals = stale_signals(instance, checked, live_window(instance)) if clean else ["stale"]
        if not signals:
            return SensorResult(
                skip_reason=SkipReason(
                    "nothing can be stale: writes since the last look reach no built "
                    "partition outside the live window"
                ),
                cursor=json.dumps({**cursor, "checked": changed}),
            )
        age = time.time() - audit.timestamp if audit else None
        if report is not None and not report.stale and age < audit_interval_seconds():
            return SkipReason(f"{signals[0]}; next audit in {audit_interval_seconds() - age:.0f} s")
        context.log.info(f"requesting a staleness audit: {'; '.join(signals)}")
        return RunRequest(
            run_key=f"audit:{changed}",
            job_name=staleness_audit_job.name,
            tags={
                TRIGGER_TAG: "staleness-audit",
                "backfill_platform/audit_reason": signals[0][:200],
            },
        )

    if not report.stale:
        return SkipReason("no stale partitions")
    window = live_window(instance)
    # Days under correction are rebuilt by the correction's cutover, not repaired here.
    frozen = frozen_days(instance, DOWNSTREAM_KEYS)
    left = sorted({f"{f.freeze_id} ({f.reason})" for f in frozen.values()})
    exclude = [*(window.days() if window else []), *map(date.fromisoformat, frozen)]
    steps = report.plan(exclude=exclude)
    # Every LTV snapshot carries all earlier days, so an LTV repair from a stale day rewrites
    # each later snapshot: held while one of them is frozen, taken up once the freeze lifts.
    held = [s for s in steps if s.kind == LTV_STEP and set(s.days.partition_keys()) & set(frozen)]
    steps = [s for s in steps if s not in held]
    if not steps:
        where = f"all inside the live window {window}" + (
            f" or frozen by {'; '.join(left)}" if left else ""
        )
        if held:
            where = (
                f"{held[0].describe()} waits: it would rewrite snapshots frozen by "
                f"{'; '.join(left)}"
            )
        return SkipReason(f"{report.summary()}: {where}")
    if left:
        context.log.info(f"leaving frozen days alone: {'; '.join(left)}")
    plan = "; ".join(s.describe() for s in steps)
    if not auto_repair():
        return SkipReason(
            f"STALE: {report.summary()}. Targeted backfill: {plan}. "
            f"Run `{REPAIR_COMMAND}` or set {AUTO_REPAIR_ENV}=true."
        )
    if cursor.get("repaired") == audit.storage_id:
        return SkipReason(f"repair of audit {audit.storage_id} already requested: {plan}")
    phase = [s for s in steps if s.kind == STAGING_STEP] or steps[-1:]
    writing = blocked_days(instance)
    busy = sorted(
        {writing[day] for s in phase for day in s.days.partition_keys() if day in writing}
    )
    if busy:
        return SkipReason(f"stale days are being written by run(s) {busy}; waiting")
    context.log.info(f"{report.summary()}; requesting {[s.describe() for s in phase]}")
    return SensorResult(
        run_requests=[
            RunRequest(
                run_key=f"repair:{s.kind}:{s.days}:audit-{audit.storage_id}",
                job_name=(repair_staging_job if s.kind == STAGING_STEP else repair_ltv_job).name,
                tags={**range_tags(s.days), TRIGGER_TAG: REPAIR_TRIGGER},
            )
            for s in phase
        ],
        cursor=json.dumps({**cursor, "repaired": audit.storage_id}),
    )
