"""`backfill-platform`: backfills as managed operations, against the Dagster instance the UI shows.

    plan          blast radius, missing inputs, sizes, code versions, conflicting runs
    shadow        the selection over a range into shadow tables (refused if the plan is blocked)
    validate      shadow vs production per partition + reconciliation, recorded in the UI
    cutover       production's range replaced by the shadow's in one commit per table,
                  then the downstream partitions rebuilt through the normal path
    rollback      every table of a cutover restored to its version before it
    decommission  drop a shadow and VACUUM old files once the retention window has passed
    history       per-partition commit log: run, code version, operation, reason
    stale         partitions built before late rows arrived (exit 1 if any); --repair rebuilds them

Settings come from the environment (README); runs and events go to DAGSTER_HOME's instance.
Every command prints human-readable text, or JSON with --json; exit status 1 on refusal.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from dagster import DagsterInstance

from backfill_platform.automation.stale_repair import run_repair
from backfill_platform.automation.staleness import REPAIR_COMMAND, detect
from backfill_platform.lineage import Lineage
from backfill_platform.operations.cutover import CutoverRefused, cutover
from backfill_platform.operations.decommission import (
    DecommissionRefused,
    check_retention_hours,
    decommission,
)
from backfill_platform.operations.history import partition_history
from backfill_platform.operations.jobs import PLAN_MARKER, preflight_plan_job
from backfill_platform.operations.rebuild import as_dicts, rebuild_downstream
from backfill_platform.operations.rollback import RollbackRefused, rollback
from backfill_platform.operations.shadow import run_shadow
from backfill_platform.operations.validate import validate_shadow
from backfill_platform.resources.lakehouse import TableDropRefused
from backfill_platform.settings import SHADOW_RETENTION_HOURS, setting
from backfill_platform.tables import TABLE_NAMES, check_shadow_suffix

REFUSALS = (CutoverRefused, RollbackRefused, DecommissionRefused, TableDropRefused, ValueError)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="backfill-platform",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[1:]),
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help_text: str, ranged: bool = True, suffix: bool = False):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--json", action="store_true", help="print JSON")
        if ranged:
            p.add_argument(
                "--select",
                required=name not in ("history",),
                help="comma-separated asset keys, e.g. marts/fct_daily_revenue,marts/customer_ltv",
            )
            p.add_argument("--start", required=True, help="first partition (YYYY-MM-DD)")
            p.add_argument("--end", required=True, help="last partition (YYYY-MM-DD), inclusive")
        if suffix:
            p.add_argument("--suffix", required=True, help="shadow name: <table>__shadow_<suffix>")
        return p

    command("plan", "preflight plan")
    p = command("shadow", "shadow backfill", suffix=True)
    p.add_argument("--override-plan", action="store_true", help="run although the plan is blocked")
    p.add_argument("--per-run", type=int, default=None, help="partitions per run")
    p = command("validate", "compare shadow and production", suffix=True)
    p.add_argument("--no-reconcile", action="store_true", help="skip the contract reconciliation")
    p.add_argument("--sample", type=int, default=5, help="changed rows to show per table")
    p = command("cutover", "replace production's range by the shadow's", suffix=True)
    p.add_argument("--reason", required=True, help="why (recorded in the Delta commit)")
    p.add_argument("--force", action="store_true", help="cut over without a passed validation")
    p.add_argument("--no-rebuild", action="store_true", help="do not rebuild downstream")
    p = command("rollback", "restore the tables of a cutover", ranged=False)
    p.add_argument("--cutover-id", default=None, help="default: the newest cutover")
    p.add_argument("--reason", required=True, help="why (recorded in the Delta commit)")
    p.add_argument("--force", action="store_true", help="also undo unrelated later commits")
    p = command("decommission", "drop a shadow and vacuum", ranged=False, suffix=True)
    p.add_argument(
        "--retention-hours",
        type=float,
        default=None,
        help="window after the cutover (default BACKFILL_SHADOW_RETENTION_HOURS, 168)",
    )
    command("history", "per-partition commit log")
    p = command("stale", "partitions built before late rows arrived", ranged=False)
    p.add_argument("--repair", action="store_true", help="run the targeted backfill in process")
    return parser


class Session:
    """Resources and instance from the environment, built once per command."""

    def __init__(self):
        from backfill_platform.definitions import all_assets, build_resources

        self.assets = all_assets
        self.resources = build_resources()
        self.instance = DagsterInstance.get()
        self.lineage = Lineage(all_assets)

    @property
    def lake(self):
        return self.resources["lakehouse"]

    def plan(self, select: list[str], start: str, end: str) -> dict:
        """The plan through its Dagster job, so the run and its markdown show in the UI."""
        result = preflight_plan_job.execute_in_process(
            run_config={
                "ops": {
                    "preflight_plan": {"config": {"select": select, "start": start, "end": end}}
                }
            },
            instance=self.instance,
            resources=self.resources,
        )
        observation = result.asset_observations_for_node("preflight_plan")[0]
        return {"run_id": result.run_id, **observation.metadata["plan_json"].value} | {
            "markdown": observation.metadata[PLAN_MARKER].value
        }


def _select(args) -> list[str]:
    return [s for s in (args.select or "").split(",") if s.strip()]


def run(args) -> tuple[int, Any, str]:
    """(exit status, JSON payload, text) of one command."""
    if getattr(args, "suffix", None) is not None:
        check_shadow_suffix(args.suffix)  # before anything is built or touched
    if getattr(args, "retention_hours", None) is not None:
        check_retention_hours(args.retention_hours)
    s = Session()
    if args.command == "plan":
        plan = s.plan(_select(args), args.start, args.end)
        return (0 if plan["ok"] else 1), plan, plan["markdown"] + f"\n\n(run {plan['run_id']})"

    if args.command == "shadow":
        plan = s.plan(_select(args), args.start, args.end)
        if not plan["ok"] and not args.override_plan:
            text = plan["markdown"] + "\n\nRefused: the plan is blocked (--override-plan to run)."
            return 1, {"refused": True, "plan": plan}, text
        result = run_shadow(
            s.assets,
            s.resources,
            s.instance,
            s.lineage.parse(_select(args)),
            args.start,
            args.end,
            args.suffix,
            lineage=s.lineage,
            per_run=args.per_run,
        )
        lines = [f"shadow {result.suffix}: {'ok' if result.success else 'FAILED'}"]
        lines += [f"  {t} -> {st}" for t, st in result.tables.items()]
        lines += [f"  seeded {t} with production {r}" for t, r in result.seeded.items()]
        lines += [f"  run {r}" for r in result.run_ids]
        return (0 if result.success else 1), result.to_dict(), "\n".join(lines)

    if args.command == "validate":
        v = validate_shadow(
            s.lake,
            s.resources["landing"].landing_dir,
            s.instance,
            s.lineage.parse(_select(args)),
            args.start,
            args.end,
            args.suffix,
            lineage=s.lineage,
            reconcile=not args.no_reconcile,
            sample=args.sample,
        )
        return (0 if v.passed else 1), v.to_dict(), v.markdown()

    if args.command == "cutover":
        keys = s.lineage.parse(_select(args))
        c = cutover(
            s.lake,
            s.instance,
            keys,
            args.start,
            args.end,
            args.suffix,
            args.reason,
            args.force,
            lineage=s.lineage,
        )
        runs = (
            []
            if args.no_rebuild
            else rebuild_downstream(
                s.assets,
                s.resources,
                s.instance,
                keys,
                args.start,
                args.end,
                c.cutover_id,
                lineage=s.lineage,
            )
        )
        lines = [f"cutover {c.cutover_id} {c.start}..{c.end} (validation {c.validation_id})"]
        lines += [
            f"  {t.table}: v{t.version_before} -> v{t.version_after} from {t.shadow_table} "
            f"v{t.shadow_version} ({t.rows_replaced} rows replaced by {t.rows_written})"
            for t in c.tables
        ]
        lines += [
            f"  rebuilt {','.join(r.assets)} {r.first}..{r.last}: "
            f"{'ok' if r.success else 'FAILED'} (run {r.run_id})"
            for r in runs
        ] or ["  nothing downstream to rebuild"]
        ok = all(r.success for r in runs)
        return (0 if ok else 1), {**c.to_dict(), "rebuild_runs": as_dicts(runs)}, "\n".join(lines)

    if args.command == "rollback":
        r = rollback(s.lake, s.instance, args.reason, args.cutover_id, force=args.force)
        lines = [f"rolled back cutover {r.cutover_id}"]
        for t in r.tables:
            lines.append(f"  {t.table}: restored to v{t.restored_to} (commit v{t.restore_version})")
            lines += [f"    undone {u}" for u in t.undone_commits]
        return 0, r.to_dict(), "\n".join(lines)

    if args.command == "decommission":
        hours = (
            args.retention_hours
            if args.retention_hours is not None
            else float(setting(SHADOW_RETENTION_HOURS))
        )
        d = decommission(s.lake, args.suffix, hours)
        text = f"dropped {', '.join(d.dropped)}; vacuumed {', '.join(d.vacuumed) or 'nothing'} "
        text += f"(retention {d.retention_hours:g} h)"
        return 0, d.to_dict(), text

    if args.command == "history":
        keys = s.lineage.parse(_select(args)) if _select(args) else s.lineage.parse(TABLE_NAMES)
        entries = partition_history(s.lake, keys, args.start, args.end)
        lines = [
            f"{e['table']:<26} {e['partition']:<10} v{e['version']:<4} {e['timestamp']} "
            f"{e['operation']:<14} run={(e['run_id'] or '-')[:8]} code={e['code_version'] or '-'}"
            + (f" reason={e['reason']!r}" if e["reason"] else "")
            for e in entries
        ]
        return 0, entries, "\n".join(lines) or "no commits in range"

    if args.command == "stale":
        return _stale(s, args.repair)
    raise AssertionError(args.command)


def _stale(s: Session, repair: bool) -> tuple[int, Any, str]:
    """The staleness report; exit 1 while stale partitions remain unrepaired."""
    report = detect(s.lake)
    payload: dict[str, Any] = report.metadata()
    lines = [report.summary()] + [f"  {step.describe()}" for step in report.plan()]
    if not report.stale:
        return 0, payload, "\n".join(lines)
    if not repair:
        lines.append(f"Run `{REPAIR_COMMAND}` to rebuild them in this order.")
        return 1, payload, "\n".join(lines)
    runs = run_repair(report.plan(), s.assets, s.resources, s.instance)
    payload["repair_runs"] = [asdict(r) for r in runs.runs]
    payload["repair_not_run"] = [f"{','.join(spec.assets)} {spec.days}" for spec in runs.not_run]
    lines += [
        f"  repaired {','.join(r.assets)} {r.first_key}..{r.last_key}: "
        f"{'ok' if r.success else 'FAILED'} (run {r.run_id})"
        for r in runs.runs
    ]
    if not runs.success:
        lines.append(f"  {len(runs.not_run)} later run(s) not started; fix and run again")
    return (0 if runs.success else 1), payload, "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        status, payload, text = run(args)
    except REFUSALS as error:
        status, payload, text = 1, {"refused": True, "error": str(error)}, f"Refused: {error}"
    print(json.dumps(payload, indent=2, default=str) if args.json else text)
    return status


if __name__ == "__main__":
    sys.exit(main())
