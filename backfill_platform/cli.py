"""`backfill-platform`: backfills as managed operations, against the Dagster instance the UI shows.

    backfill      the selection over a range, as a Dagster backfill on the deployment
    retry         re-run only the failed partitions of a deployment's backfill
    cancel        cancel a deployment's backfill
    plan          blast radius, missing inputs, sizes, code versions, conflicting runs
    shadow        the selection over a range into shadow tables (refused if the plan is blocked)
    validate      shadow vs production per partition + reconciliation, recorded in the UI
    cutover       production's range replaced by the shadow's in one commit per table,
                  then the downstream partitions rebuilt through the normal path
    rollback      every table of a cutover restored to its version before it
    report        a cutover's correction report for the numbers' owners: why, who, when, the
                  old and new values per day and in total, what was rebuilt (also in the UI)
    decommission  drop a shadow and VACUUM old files once the retention window has passed
    freeze        mark a range of the selection and everything downstream as under correction:
                  the live path leaves it alone, consumers are told the version to read
    unfreeze      lift a freeze (cutover and rollback lift theirs themselves)
    history       per-partition commit log: run, code version, operation, reason; freezes
    stale         partitions built before late rows arrived (exit 1 if any); --repair rebuilds them
    stream        the live order stream into raw/orders: `catch-up` (every message available
                  now, then stop), `run` (until SIGTERM), `start` / `stop` (`run` detached),
                  `status` (offsets per partition, lag, the last batch, the process),
                  `reconcile` (per day: every offset once, landing lines, staging, the handoff)
    replay        re-read a window of the order topic into raw/orders (after a parse fix),
                  rebuild what it changed downstream, reconcile the window

Settings come from the environment (README); runs and events go to DAGSTER_HOME's instance
(unset: the repository's .dagster_home, as the Makefile sets it). Dagster's and Spark's logs
go to a file under DAGSTER_HOME/backfill-logs whose path is printed first (on stderr); long
work shows progress bars there. Every command prints human-readable text, or JSON with --json, on
stdout; a refusal or a user error is one line and exit status 1, never a traceback.
Ranges are inclusive days everywhere: --start 2025-12-06 --end 2026-01-07 is printed as
2025-12-06..2026-01-07.

backfill, shadow, cutover's downstream rebuild and stale --repair run on the Dagster
deployment at DAGSTER_URL (default http://127.0.0.1:3000, `make ui`) as one asset backfill:
queued, under its pools and run retries, on its Backfills page. The command follows it and
exits with its outcome; Ctrl-C stops following and leaves it running. --in-process runs the
work in this process instead (tests, scripts); an unreachable deployment is an error.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict
from functools import cached_property
from typing import Any

from dagster import AssetKey, DagsterInstance

from backfill_platform.automation.freeze import (
    FreezeRefused,
    active_freezes,
    freeze,
    frozen_days,
    lift_finished,
    unfreeze,
)
from backfill_platform.automation.stale_repair import REPAIR_TRIGGER, run_repair
from backfill_platform.automation.staleness import REPAIR_COMMAND, detect
from backfill_platform.console import RunProgress, dagster_home, log_dir, logs_to_file, shown
from backfill_platform.definitions import all_assets, build_resources
from backfill_platform.deployment import (
    REASON_TAG,
    BackfillDetached,
    DagsterDeployment,
    DeploymentError,
    DeploymentExecutor,
    follow_backfill,
)
from backfill_platform.lineage import Lineage
from backfill_platform.operations.arguments import (
    CORRECTABLE_LAYERS,
    OPERATOR_ERRORS,
    InvalidArgument,
    check_instant,
    check_offsets,
    check_range,
    check_reason,
    check_retention_hours,
    check_selection,
    check_tags,
)
from backfill_platform.operations.boundary import reconcile_boundary
from backfill_platform.operations.cutover import CutoverRefused, cutover
from backfill_platform.operations.decommission import DecommissionRefused, decommission
from backfill_platform.operations.history import partition_history
from backfill_platform.operations.launchpad import PLAN_MARKER, preflight_plan_job
from backfill_platform.operations.mart_fold import FrozenDays, MartsFold
from backfill_platform.operations.rebuild import as_dicts, rebuild_downstream, rebuild_runs
from backfill_platform.operations.replay import (
    REPLAY_TAG,
    downstream_of_replay,
    plan_replay,
    replay,
)
from backfill_platform.operations.report import ReportRefused, correction_report, record_report
from backfill_platform.operations.rollback import RollbackRefused, rollback
from backfill_platform.operations.shadow import run_shadow
from backfill_platform.operations.shadow_deployed import launch_shadow, shadow_keys
from backfill_platform.operations.stream import (
    STREAM_CODEGEN_CACHE_ENTRIES,
    StagingFold,
    catch_up,
    run_stream,
    stream_status,
)
from backfill_platform.operations.stream_events import StreamReporter, report_seconds
from backfill_platform.operations.validate import ValidationRefused, validate_shadow
from backfill_platform.ranges import DayRange
from backfill_platform.resources.kafka import TopicUnavailable, orders_topic_from_settings
from backfill_platform.resources.maintenance import TableDropRefused
from backfill_platform.resources.spark import SparkJarsMissing
from backfill_platform.resources.stream_process import (
    TRIGGER_SECONDS,
    StreamProcess,
    StreamProcessError,
)
from backfill_platform.runner import (
    Executor,
    InProcessExecutor,
    RangeRun,
    RunReport,
    failure_reason,
    observing,
    recording_instance,
    run_range,
    run_work,
)
from backfill_platform.settings import (
    SHADOW_RETENTION_HOURS,
    STREAM_COMPACT_FILES,
    STREAM_MARTS,
    STREAM_MARTS_DAYS,
    STREAM_STAGING,
    SettingError,
    bool_setting,
    int_setting,
    setting,
)
from backfill_platform.tables import (
    CUSTOMER_LTV,
    FCT_DAILY_REVENUE,
    STAGING_ORDERS,
    STAGING_REJECTS,
    TABLE_NAMES,
    check_shadow_suffix,
)

# What an operator can get wrong, or a guard can refuse: printed as one line, exit status 1.
# Anything else is a bug and keeps its traceback.
REFUSALS = (
    *OPERATOR_ERRORS,
    CutoverRefused,
    RollbackRefused,
    ReportRefused,
    DecommissionRefused,
    FreezeRefused,
    TableDropRefused,
    ValidationRefused,
    SettingError,
    SparkJarsMissing,
    DeploymentError,
    TopicUnavailable,
    StreamProcessError,
)
# Commands whose work runs on the deployment unless --in-process is given.
DEPLOYED_COMMANDS = ("backfill", "shadow", "cutover", "stale", "replay")
# What the progress bars call the work each command plans (runner triggers).
PROGRESS_LABELS = {
    "backfill": "backfill",
    "shadow-backfill": "shadow",
    "cutover-downstream-rebuild": "rebuild downstream",
    REPAIR_TRIGGER: "repair stale",
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="backfill-platform",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[1:]),
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help_text: str, ranged: bool = True, suffix: bool = False):
        parser = sub.add_parser(name, help=help_text)
        parser.add_argument("--json", action="store_true", help="print JSON")
        if name in DEPLOYED_COMMANDS:
            parser.add_argument(
                "--in-process",
                action="store_true",
                help="run here instead of as a backfill on the deployment at DAGSTER_URL",
            )
        if ranged:
            parser.add_argument(
                "--select",
                required=name not in ("history",),
                help="comma-separated asset keys, e.g. marts/fct_daily_revenue,marts/customer_ltv",
            )
            parser.add_argument("--start", required=True, help="first partition (YYYY-MM-DD)")
            parser.add_argument(
                "--end", required=True, help="last partition (YYYY-MM-DD), inclusive"
            )
        if suffix:
            parser.add_argument(
                "--suffix", required=True, help="shadow name: <table>__shadow_<suffix>"
            )
        return parser

    cmd = command("backfill", "the selection over a range on the deployment")
    cmd.add_argument("--reason", default=None, help="why (a tag on the backfill and its runs)")
    cmd.add_argument(
        "--tag",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a tag on the backfill and its runs (repeatable), e.g. dagster/max_retries=0",
    )
    cmd.add_argument("--per-run", type=int, default=None, help="partitions per run (in process)")
    cmd.add_argument(
        "--yes", action="store_true", help="confirm a range over BACKFILL_MAX_RANGE_DAYS"
    )
    for name, text in (("retry", "re-run only what failed"), ("cancel", "cancel it")):
        cmd = command(name, f"a deployment's backfill: {text}", ranged=False)
        cmd.add_argument("backfill_id", help="the backfill's id (printed when it was launched)")
    command("plan", "preflight plan")
    cmd = command("shadow", "shadow backfill", suffix=True)
    cmd.add_argument(
        "--override-plan", action="store_true", help="run although the plan is blocked"
    )
    cmd.add_argument("--per-run", type=int, default=None, help="partitions per run")
    cmd.add_argument(
        "--yes", action="store_true", help="confirm a range over BACKFILL_MAX_RANGE_DAYS"
    )
    cmd = command("validate", "compare shadow and production", suffix=True)
    cmd.add_argument(
        "--no-reconcile", action="store_true", help="skip the shadow's between-layer reconciliation"
    )
    cmd.add_argument("--sample", type=int, default=5, help="changed rows to show per table")
    cmd = command("cutover", "replace production's range by the shadow's", suffix=True)
    cmd.add_argument("--reason", required=True, help="why (recorded in the Delta commit)")
    cmd.add_argument("--force", action="store_true", help="cut over without a passed validation")
    cmd.add_argument("--no-rebuild", action="store_true", help="do not rebuild downstream")
    cmd.add_argument(
        "--copy",
        action="store_true",
        help="rewrite the rows instead of adopting the shadow's files (zero-copy, the default "
        "where it applies)",
    )
    cmd.add_argument(
        "--yes", action="store_true", help="confirm a range over BACKFILL_MAX_RANGE_DAYS"
    )
    cmd = command("rollback", "restore the tables of a cutover", ranged=False)
    cmd.add_argument("--cutover-id", default=None, help="default: the newest cutover")
    cmd.add_argument("--reason", required=True, help="why (recorded in the Delta commit)")
    cmd.add_argument("--force", action="store_true", help="also undo unrelated later commits")
    cmd = command("decommission", "drop a shadow and vacuum", ranged=False, suffix=True)
    cmd.add_argument(
        "--retention-hours",
        type=float,
        default=None,
        help="window after the cutover (default BACKFILL_SHADOW_RETENTION_HOURS, 168)",
    )
    cmd.add_argument(
        "--vacuum-retention-hours",
        type=float,
        default=None,
        help="history production keeps (default and floor BACKFILL_VACUUM_RETENTION_HOURS, "
        "168; lower only with --shorten-history)",
    )
    cmd.add_argument(
        "--shorten-history",
        action="store_true",
        help="allow --vacuum-retention-hours below the configured retention",
    )
    cmd = command("report", "a cutover's correction report (Markdown)", ranged=False)
    cmd.add_argument("cutover_id", help="the cutover's id (printed by cutover)")
    cmd = command("freeze", "mark a range as under correction (and what is downstream)")
    cmd.add_argument("--reason", required=True, help="why (shown on every frozen asset)")
    cmd.add_argument(
        "--yes", action="store_true", help="confirm a range over BACKFILL_MAX_RANGE_DAYS"
    )
    cmd = command("unfreeze", "lift a freeze", ranged=False)
    cmd.add_argument("--id", dest="freeze_id", default=None, help="the freeze (default: all)")
    cmd.add_argument("--select", default=None, help="comma-separated asset keys (default: all)")
    cmd.add_argument("--reason", required=True, help="why (shown on every asset it lifts)")
    command("history", "per-partition commit log")
    cmd = command("stale", "partitions built before late rows arrived", ranged=False)
    cmd.add_argument("--repair", action="store_true", help="run the targeted backfill")
    cmd = command("stream", "the live order stream (BACKFILL_KAFKA_BOOTSTRAP)", ranged=False)
    cmd.add_argument(
        "action",
        choices=("catch-up", "run", "start", "stop", "status", "reconcile"),
        help="catch-up: every message available now into raw/orders, then stop; run: the "
        "stream until SIGTERM or Ctrl-C; start/stop: run as a detached process; "
        "status: offsets, lag, the last batch and the process; reconcile: the boundary "
        "with the landing zone per day (exit 1 if a day fails)",
    )
    cmd.add_argument("--start", default=None, help="reconcile: first day (default: the stream's)")
    cmd.add_argument("--end", default=None, help="reconcile: last day, inclusive")
    cmd.add_argument(
        "--trigger-seconds",
        type=float,
        default=TRIGGER_SECONDS,
        help="run/start: a micro-batch at most this often while messages arrive",
    )
    cmd = command("replay", "re-read a window of the order topic into raw/orders", ranged=False)
    cmd.add_argument("--from", dest="since", default=None, help="first instant (ISO 8601)")
    cmd.add_argument(
        "--from-offsets", default=None, help="or first offsets: partition:offset,... (0:120,1:98)"
    )
    cmd.add_argument("--to", required=True, help="end instant, exclusive (ISO 8601)")
    cmd.add_argument("--no-rebuild", action="store_true", help="do not rebuild downstream")
    return parser


class Session:
    """Asset graph, resources and instance from the environment, built once per command.

    Resources and the instance are built on first use, after the command has checked its
    arguments: a refused command opens no instance and starts no Spark.
    """

    def __init__(self):
        dagster_home()  # DAGSTER_HOME, or the repository's .dagster_home when unset
        self.assets = all_assets
        self.lineage = Lineage(all_assets)
        self.codegen_cache_entries: int | None = None  # the stream's, set before first use

    @cached_property
    def resources(self) -> dict:
        return build_resources(codegen_cache_entries=self.codegen_cache_entries)

    @cached_property
    def instance(self) -> DagsterInstance:
        try:
            return recording_instance()
        except Exception as error:
            # Imported here: at the top, dagster_postgres added 0.5 s to every command's start;
            # an instance on PostgreSQL that failed has imported it already.
            from dagster_postgres.utils import DagsterPostgresException

            if not isinstance(error, DagsterPostgresException):
                raise
            raise SettingError(
                f"DAGSTER_HOME={dagster_home()}: its PostgreSQL storage does not answer "
                f"({error}); `make postgres-start` starts the demo's server"
            ) from error

    @property
    def lake(self):
        return self.resources["lakehouse"]

    def plan(self, select: list[str], days: DayRange) -> dict:
        """The plan through its Dagster job, so the run and its markdown show in the UI."""
        config = {"select": select, "start": days.first, "end": days.last}
        result = preflight_plan_job.execute_in_process(
            run_config={"ops": {"preflight_plan": {"config": config}}},
            instance=self.instance,
            resources=self.resources,
        )
        observation = result.asset_observations_for_node("preflight_plan")[0]
        return {"run_id": result.run_id, **observation.metadata["plan_json"].value} | {
            "markdown": observation.metadata[PLAN_MARKER].value
        }


Outcome = tuple[int, Any, str]  # (exit status, JSON payload, text)


def _deployment(args, title: str) -> DeploymentExecutor | None:
    """The deployment's executor, or None with --in-process; unreachable is an error."""
    if getattr(args, "in_process", False):
        return None
    deployment = DagsterDeployment()
    deployment.check_reachable()
    return DeploymentExecutor(deployment, title=title)


def _backfill_lines(report: RunReport) -> list[str]:
    """What a person needs about a deployment's backfill: its id, outcome, URL, the retry."""
    if report.backfill_id is None:
        return []
    lines = [f"  backfill {report.backfill_id}: {report.outcome} ({report.backfill_url})"]
    if not report.success:
        lines.append(f"  re-run only what failed: backfill-platform retry {report.backfill_id}")
    return lines


def _backfill_payload(report: RunReport) -> dict:
    return {
        "backfill_id": report.backfill_id,
        "backfill_url": report.backfill_url,
        "outcome": report.outcome,
    }


def _select(args) -> list[str]:
    return [name for name in (getattr(args, "select", None) or "").split(",") if name.strip()]


def _days(args) -> DayRange:
    return check_range(args.start, args.end, confirmed=getattr(args, "yes", True))


def _correctable(session: Session, args) -> list:
    """The selection of a shadow, validation or cutover: staging and marts tables only."""
    return check_selection(session.lineage, _select(args), CORRECTABLE_LAYERS)


def _backfill(session: Session, args) -> Outcome:
    days = _days(args)
    keys = check_selection(session.lineage, _select(args))
    tags = check_tags(args.tag)
    if args.reason is not None:
        tags[REASON_TAG] = check_reason(args.reason)
    executor: Executor | None = _deployment(args, f"backfill {len(keys)} asset(s) {days}")
    if executor is not None:
        executor.deployment.check_serves(session.lineage.expand(keys))
    report = run_range(
        executor or InProcessExecutor(session.assets, session.resources, session.instance),
        session.lineage,
        keys,
        days,
        trigger="backfill",
        tags=tags,
        per_run=args.per_run,
    )
    lines = [f"backfill {days}: {'ok' if report.success else 'FAILED'}", *_backfill_lines(report)]
    lines += _run_lines("", report.runs, session.instance)
    payload = {**_backfill_payload(report), "runs": [asdict(r) for r in report.runs]}
    return (0 if report.success else 1), payload, "\n".join(lines)


def _run_lines(verb: str, runs: Sequence[RangeRun], instance: DagsterInstance) -> list[str]:
    """A line per run, and under a failed one the reason its first failed step gave, so the
    terminal says why without opening the log."""
    lines = []
    for r in runs:
        lines.append(
            f"  {verb}{','.join(r.assets)} {r.first_key}..{r.last_key}: "
            f"{'ok' if r.success else 'FAILED'} (run {r.run_id})"
        )
        if not r.success:
            reason = r.reason or failure_reason(instance, r.run_id)
            lines.append(f"    why: {reason or 'no step failed; the run in the UI says why'}")
    return lines


def _follow(act: Callable[[DagsterDeployment], str], cancelled: bool = False) -> Outcome:
    """`act` on the deployment (it returns the backfill to follow), then follow it."""
    deployment = DagsterDeployment()
    deployment.check_reachable()
    backfill_id = act(deployment)
    report = follow_backfill(DeploymentExecutor(deployment), backfill_id, cancelled=cancelled)
    lines = [f"backfill {backfill_id}: {'ok' if report.success else 'FAILED'}"]
    lines += _backfill_lines(report)
    return (0 if report.success else 1), _backfill_payload(report), "\n".join(lines)


def _retry(session: Session, args) -> Outcome:
    """Only the failed partitions of a backfill, as a new backfill, followed to its end."""
    return _follow(lambda deployment: deployment.retry(args.backfill_id))


def _cancel(session: Session, args) -> Outcome:
    """Cancel, then follow until the backfill's runs have stopped."""

    def cancel(deployment: DagsterDeployment) -> str:
        deployment.cancel(args.backfill_id)
        return args.backfill_id

    return _follow(cancel, cancelled=True)


def _plan(session: Session, args) -> Outcome:
    days = _days(args)
    check_selection(session.lineage, _select(args))
    plan = session.plan(_select(args), days)
    return (0 if plan["ok"] else 1), plan, plan["markdown"] + f"\n\n(run {plan['run_id']})"


def _shadow(session: Session, args) -> Outcome:
    days = _days(args)
    keys = _correctable(session, args)
    executor = _deployment(args, f"shadow {args.suffix} {days}")
    if executor is not None:  # before the plan's Spark job: refuse early, naming what is missing
        executor.deployment.check_serves(shadow_keys(session.lineage, keys))
    plan = session.plan(_select(args), days)
    if not plan["ok"] and not args.override_plan:
        text = plan["markdown"] + "\n\nRefused: the plan is blocked (--override-plan to run)."
        return 1, {"refused": True, "plan": plan}, text
    report = None
    if executor is None:
        result = run_shadow(
            session.assets,
            session.resources,
            session.instance,
            keys,
            days.first,
            days.last,
            args.suffix,
            lineage=session.lineage,
            per_run=args.per_run,
        )
    else:
        result, report = launch_shadow(
            executor, session.resources, session.lineage, keys, days, args.suffix
        )
    lines = [f"shadow {result.suffix} {days}: {'ok' if result.success else 'FAILED'}"]
    lines += _backfill_lines(report) if report else []
    lines += [f"  {table} -> {shadow}" for table, shadow in result.tables.items()]
    lines += [f"  seeded {table} with production {span}" for table, span in result.seeded.items()]
    lines += [f"  run {run_id}" for run_id in result.run_ids]
    payload = {**result.to_dict(), **(_backfill_payload(report) if report else {})}
    return (0 if result.success else 1), payload, "\n".join(lines)


def _validate(session: Session, args) -> Outcome:
    days = _days(args)
    keys = _correctable(session, args)
    validation = validate_shadow(
        session.lake,
        session.resources["landing"],
        session.instance,
        keys,
        days.first,
        days.last,
        args.suffix,
        lineage=session.lineage,
        reconcile=not args.no_reconcile,
        sample=args.sample,
    )
    return (0 if validation.passed else 1), validation.to_dict(), validation.markdown()


def _cutover(session: Session, args) -> Outcome:
    days = _days(args)
    keys = _correctable(session, args)
    executor = None if args.no_rebuild else _deployment(args, f"rebuild after cutover {days}")
    if executor is not None:  # before production changes: the rebuild must be launchable
        executor.deployment.check_serves(session.lineage.toposorted())
    done = cutover(
        session.lake,
        session.instance,
        keys,
        days.first,
        days.last,
        args.suffix,
        args.reason,
        args.force,
        lineage=session.lineage,
        copy=args.copy,
    )
    report = (
        RunReport()
        if args.no_rebuild
        else rebuild_downstream(
            session.assets,
            session.resources,
            session.instance,
            keys,
            days.first,
            days.last,
            done.cutover_id,
            lineage=session.lineage,
            executor=executor,
        )
    )
    runs = rebuild_runs(report)
    lines = [f"cutover {done.cutover_id} {days} (validation {done.validation_id})"]
    lines += [
        f"  {t.table}: v{t.version_before} -> v{t.version_after} from {t.shadow_table} "
        f"v{t.shadow_version} ({t.rows_replaced} rows replaced by {t.rows_written}; "
        + (
            "zero-copy: the shadow's files adopted, no data written)"
            if t.copy_reason is None
            else f"copied, {t.data_bytes_written:,} data bytes written: {t.copy_reason})"
        )
        for t in done.tables
    ]
    lines += [
        f"  rebuilt {','.join(run.assets)} {run.first}..{run.last}: "
        f"{'ok' if run.success else 'FAILED'} (run {run.run_id})"
        for run in runs
    ] or ["  nothing downstream to rebuild"]
    lines += _backfill_lines(report)
    if report.success:
        # Finished: no longer under correction, before the report, the asset's newest word.
        lifted = lift_finished(
            session.instance,
            session.lineage.expand(keys),
            f"cutover {done.cutover_id} is live",
            days=days,
        )
        lines += [f"  unfrozen {f.asset_key.to_user_string()} {f.days}" for f in lifted]
        # The one-page summary for the numbers' owners, in the UI too.
        correction = correction_report(session.lake, session.instance, done.cutover_id)
        record_report(session.instance, correction)
        lines.append(f"  correction report: backfill-platform report {done.cutover_id}")
    payload = {**done.to_dict(), "rebuild_runs": as_dicts(runs), **_backfill_payload(report)}
    return (0 if report.success else 1), payload, "\n".join(lines)


def _report(session: Session, args) -> Outcome:
    correction = correction_report(session.lake, session.instance, args.cutover_id)
    return 0, correction.to_dict(), correction.markdown()


def _rollback(session: Session, args) -> Outcome:
    undone = rollback(session.lake, session.instance, args.reason, args.cutover_id, args.force)
    lines = [f"rolled back cutover {undone.cutover_id}"]
    for table in undone.tables:
        lines.append(
            f"  {table.table}: restored to v{table.restored_to} (commit v{table.restore_version})"
        )
        lines += [f"    undone {commit}" for commit in table.undone_commits]
    restored = [AssetKey.from_user_string(t.table) for t in undone.tables]
    lifted = lift_finished(
        session.instance,
        session.lineage.expand(restored),
        f"cutover {undone.cutover_id} rolled back",
    )
    lines += [f"  unfrozen {f.asset_key.to_user_string()} {f.days}" for f in lifted]
    return 0, undone.to_dict(), "\n".join(lines)


def _decommission(session: Session, args) -> Outcome:
    hours = (
        args.retention_hours
        if args.retention_hours is not None
        else float(setting(SHADOW_RETENTION_HOURS))
    )
    gone = decommission(
        session.lake,
        args.suffix,
        hours,
        vacuum_retention_hours=args.vacuum_retention_hours,
        shorten_history=args.shorten_history,
    )
    text = f"dropped {', '.join(gone.dropped)}; vacuumed {', '.join(gone.vacuumed) or 'nothing'} "
    text += f"keeping {gone.vacuum_retention_hours:g} h of history "
    text += f"(shadow retention {gone.retention_hours:g} h)"
    return 0, gone.to_dict(), text


def _history(session: Session, args) -> Outcome:
    days = DayRange(args.start, args.end)
    keys = check_selection(session.lineage, _select(args) or TABLE_NAMES)
    entries = partition_history(session.lake, keys, days.first, days.last)
    lines = [
        f"{e['table']:<26} {e['partition']:<10} v{e['version']:<4} {e['timestamp']} "
        f"{e['operation']:<14} run={(e['run_id'] or '-')[:8]} code={e['code_version'] or '-'}"
        + (f" reason={e['reason']!r}" if e["reason"] else "")
        for e in entries
    ]
    frozen = [f for f in active_freezes(session.instance, keys) if f.days.overlaps(days)]
    lines += [f"FROZEN {f.describe()}" for f in frozen]
    return 0, entries, "\n".join(lines) or "no commits in range"


def _freeze(session: Session, args) -> Outcome:
    days = _days(args)
    keys = session.lineage.expand(check_selection(session.lineage, _select(args)))
    made = freeze(session.instance, session.lake, keys, days, args.reason)
    lines = [f"froze {days} of {len(made)} asset(s) as {made[0].freeze_id}: {args.reason}"]
    lines += [f"  {f.describe()}" for f in made]
    lines.append(
        "  the live path leaves these days alone until cutover, rollback or "
        f"`backfill-platform unfreeze --id {made[0].freeze_id}`"
    )
    return 0, [f.to_dict() for f in made], "\n".join(lines)


def _unfreeze(session: Session, args) -> Outcome:
    selected = _select(args)
    keys = check_selection(session.lineage, selected) if selected else session.lineage.toposorted()
    lifted = unfreeze(session.instance, keys, args.reason, freeze_id=args.freeze_id)
    lines = [f"lifted {len(lifted)} freeze(s): {args.reason}"]
    lines += [f"  {f.asset_key.to_user_string()} {f.days} ({f.freeze_id})" for f in lifted]
    return 0, [f.to_dict() for f in lifted], "\n".join(lines)


def _stale(session: Session, args) -> Outcome:
    """The staleness report; exit 1 while stale partitions remain unrepaired."""
    report = detect(session.lake)
    payload: dict[str, Any] = report.metadata()
    lines = [report.summary()] + [f"  {step.describe()}" for step in report.plan()]
    if not report.stale:
        return 0, payload, "\n".join(lines)
    if not args.repair:
        lines.append(f"Run `{REPAIR_COMMAND}` to rebuild them in this order.")
        return 1, payload, "\n".join(lines)
    executor = _deployment(args, "repair stale partitions")
    if executor is None:
        runs = run_repair(report.plan(), session.assets, session.resources, session.instance)
    else:
        runs = run_repair(
            report.plan(), session.assets, session.resources, session.instance, executor=executor
        )
    payload["repair_runs"] = [asdict(run) for run in runs.runs]
    payload["repair_not_run"] = [f"{','.join(spec.assets)} {spec.days}" for spec in runs.not_run]
    lines += _run_lines("repaired ", runs.runs, session.instance)
    lines += _backfill_lines(runs)
    payload.update(_backfill_payload(runs) if runs.backfill_id else {})
    if not runs.success and not runs.backfill_id:
        lines.append(f"  {len(runs.not_run)} later run(s) not started; fix and run again")
    return (0 if runs.success else 1), payload, "\n".join(lines)


def _stream(session: Session, args) -> Outcome:
    """`stream catch-up` runs the stream until it has every message available now;
    `stream status` reads the broker, raw/orders and the checkpoint."""
    orders = orders_topic_from_settings()
    process = StreamProcess(dagster_home() / "stream")
    if args.action == "catch-up":
        with StreamReporter(session.instance, session.lake, orders.topic) as reporter:
            reporter.release()
            report = catch_up(
                session.lake,
                orders,
                on_batch=reporter,
                fold=staging_fold(session.instance),
                compact_files=stream_compact_files(),
            )
        text = "\n".join([report.describe(), *(f"  {note}" for note in reporter.notes)])
        payload = report.to_dict() | {"held_days": reporter.held, "notes": reporter.notes}
        return 0, payload, text
    if args.action == "run":
        return _run_stream(session, orders, args.trigger_seconds)
    if args.action == "start":
        pid = process.start(args.trigger_seconds)
        text = f"stream started (pid {pid}), output in {shown(process.log)}; stream stop ends it"
        return 0, {"pid": pid, "log": str(process.log)}, text
    if args.action == "stop":
        pid = process.stop()
        text = f"stream (pid {pid}) stopped" if pid else "no stream process running"
        return 0, {"stopped": pid}, text
    if args.action == "reconcile":
        days = DayRange(args.start, args.end) if args.start or args.end else None
        boundary = reconcile_boundary(session.lake, session.resources["landing"], orders, days)
        return (1 if boundary.failed else 0), boundary.to_dict(), boundary.describe()
    status = stream_status(session.lake, orders)
    pid = process.pid()
    running = f"process: running (pid {pid})" if pid else "process: not running"
    return 0, status.to_dict() | {"pid": pid}, f"{status.describe()}\n  {running}"


def _replay(session: Session, args) -> Outcome:
    """Replay a window of the log, rebuild downstream of what it changed (on the deployment
    unless --in-process), then reconcile the window's days like a backfill."""
    orders = orders_topic_from_settings()
    to = check_instant(args.to, "--to")
    since = check_instant(args.since, "--from") if args.since else None
    offsets = check_offsets(args.from_offsets) if args.from_offsets else None
    if (since is None) == (offsets is None):
        raise InvalidArgument("replay: give exactly one of --from and --from-offsets")
    executor = None if args.no_rebuild else _deployment(args, "rebuild after a replay")
    plan = plan_replay(session.lake, orders, to, since, offsets)
    done = replay(session.lake, orders, plan, session.instance)
    work = {} if args.no_rebuild else downstream_of_replay(session.lineage, session.lake, done)
    runs = run_work(
        executor or InProcessExecutor(session.assets, session.resources, session.instance),
        session.lineage,
        work,
        trigger="replay",
        tags={REPLAY_TAG: done.replay_id},
    )
    lines = [done.describe()]
    lines += _run_lines("rebuilt ", runs.runs, session.instance) or [
        "  nothing downstream to rebuild"
    ]
    lines += _backfill_lines(runs)
    payload = done.to_dict() | {"rebuild_runs": as_dicts(rebuild_runs(runs))}
    days = sorted({*done.ingest_days, *done.event_days})
    status = 0 if runs.success else 1
    if days and runs.success:
        boundary = reconcile_boundary(
            session.lake, session.resources["landing"], orders, DayRange(days[0], days[-1])
        )
        payload["reconciliation"] = boundary.to_dict()
        lines.append(boundary.describe())
        status = 1 if boundary.failed else 0
    return status, payload, "\n".join(lines)


def staging_fold(instance: DagsterInstance) -> StagingFold | None:
    """BACKFILL_STREAM_STAGING: the stream stages its batches itself, except the days a
    freeze holds on staging (the live path leaves a frozen range alone); with
    BACKFILL_STREAM_MARTS it folds them on into the marts, except the days frozen there."""
    if not bool_setting(STREAM_STAGING):
        return None

    def frozen_on(keys: list[AssetKey]) -> FrozenDays:
        def frozen(days: list[str]) -> set[str]:
            held = frozen_days(instance, keys, DayRange(min(days), max(days)))
            return set(held) & set(days)

        return frozen

    marts = None
    if bool_setting(STREAM_MARTS):
        marts = MartsFold(
            frozen=frozen_on([FCT_DAILY_REVENUE, CUSTOMER_LTV]),
            max_days=int_setting(STREAM_MARTS_DAYS),
            check_seconds=report_seconds(),  # as often as Dagster hears of each mart day
        )
    return StagingFold(frozen=frozen_on([STAGING_ORDERS, STAGING_REJECTS]), marts=marts)


def stream_compact_files() -> int:
    """BACKFILL_STREAM_COMPACT_FILES: the small files at which the stream compacts a day."""
    return int_setting(STREAM_COMPACT_FILES, minimum=2)


def _run_stream(session: Session, orders, trigger_seconds: float) -> Outcome:
    """The stream in this process until SIGTERM or Ctrl-C; one line per batch as it commits."""
    session.codegen_cache_entries = STREAM_CODEGEN_CACHE_ENTRIES  # before Spark starts
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())

    compact_files = stream_compact_files()
    with StreamReporter(session.instance, session.lake, orders.topic) as reporter:

        def show(batch) -> None:
            said = len(reporter.notes)
            reporter(batch)
            print(batch.describe(), flush=True)
            for note in reporter.notes[said:]:
                print(f"  {note}", flush=True)

        into = "raw/orders and staging" if bool_setting(STREAM_STAGING) else "raw/orders"
        print(f"streaming {orders.topic} from {orders.bootstrap_servers} into {into}", flush=True)
        print(
            f"  reports each partition at most every {reporter.interval:g} s; compacts a day "
            f"at {compact_files} small files",
            flush=True,
        )
        reporter.release()
        for note in reporter.notes:
            print(f"  {note}", flush=True)
        report = run_stream(
            session.lake,
            orders,
            stop,
            trigger_seconds,
            on_batch=show,
            fold=staging_fold(session.instance),
            compact_files=compact_files,
            on_compaction=lambda done: print(f"  {done.describe()}", flush=True),
        )
    return 0, report.to_dict(), f"stream stopped after {len(report.batches)} batch(es)"


COMMANDS = {
    "backfill": _backfill,
    "retry": _retry,
    "cancel": _cancel,
    "plan": _plan,
    "shadow": _shadow,
    "validate": _validate,
    "cutover": _cutover,
    "rollback": _rollback,
    "decommission": _decommission,
    "report": _report,
    "freeze": _freeze,
    "unfreeze": _unfreeze,
    "history": _history,
    "stale": _stale,
    "stream": _stream,
    "replay": _replay,
}


def check(args) -> None:
    """What can be refused without an instance, Spark or a log file."""
    if getattr(args, "suffix", None) is not None:
        check_shadow_suffix(args.suffix)
    if getattr(args, "retention_hours", None) is not None:
        check_retention_hours(args.retention_hours)
    if getattr(args, "vacuum_retention_hours", None) is not None:
        check_retention_hours(args.vacuum_retention_hours, "--vacuum-retention-hours")
    if getattr(args, "start", None) is not None:
        DayRange(args.start, args.end)
    if getattr(args, "reason", None) is not None:
        check_reason(args.reason)
    check_tags(getattr(args, "tag", None) or [])
    if _select(args):
        Lineage(all_assets).parse(_select(args))


def run(args) -> Outcome:
    """One command. Arguments that need no instance are checked before anything is built."""
    check(args)
    return COMMANDS[args.command](Session(), args)


def main(argv: Sequence[str] | None = None, *, terminal: bool | None = None) -> int:
    """The command. As a process of its own (`terminal`, the default without `argv`: the
    console script, `python -m backfill_platform`) it sends Dagster's and Spark's logs to a
    file, prints its path first and shows progress bars on stderr; a caller passing `argv`
    (tests, scripts) keeps its own stdout and stderr."""
    args = _parser().parse_args(argv)
    status, payload, text = _outcome(args, argv is None if terminal is None else terminal)
    print(json.dumps(payload, indent=2, default=str) if args.json else text)
    return status


def execute(argv: Sequence[str]) -> Outcome:
    """One command in this process, as `main` would run it: the exit status, the `--json`
    payload and the text, all three from the one run (a scenario asserts on the payload and
    keeps the text as its transcript)."""
    return _outcome(_parser().parse_args(argv), terminal=False)


def _outcome(args, terminal: bool) -> Outcome:
    try:
        check(args)
        if terminal:
            with logs_to_file(args.command, log_dir()) as term:
                print(f"log: {shown(term.log)}", file=term.err)
                with observing(RunProgress(term.err, PROGRESS_LABELS, DagsterInstance.get)):
                    return run(args)
        return run(args)
    except BackfillDetached as error:
        payload = {"detached": True, "backfill_id": error.backfill_id, "error": str(error)}
        return 130, payload, str(error)
    except REFUSALS as error:
        return 1, {"refused": True, "error": str(error)}, f"Refused: {error}"


if __name__ == "__main__":
    sys.exit(main())
