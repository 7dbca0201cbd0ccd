"""Each check step's seconds, cold and warm, at a small scale (`make bench-check-steps`,
docs/performance.md, "Where the time goes").

`make bench` measures the checks' share at 2.2M landing lines in about 20 minutes; this
answers in about 2 where a check step's time goes, so a change to one check can be measured
before the full bench. It backfills the six tables (no CRM assets) with their checks twice
in one process: once on a new JVM, then into a new lakehouse with the JVM warm. A check that
does nothing (`noop`, on staging/orders) runs beside them: its step is what Dagster's step
itself costs, apart from the check's work.

`--with-crm` backfills every asset, the CRM's included, against the demo CRM on a free port
(5,000 calls/s, as `make bench`). `--rerun` adds a third pass: the warm pass's range again,
into the same lakehouse, as a re-run of days already built is (no CRM call: every customer's
answer is kept).

The staging checks share one step whose queries run at once (checks/staging.py), so the
step's seconds do not say which check costs what: the bench also times each of that step's
queries (the step's `at_once`, wrapped here). `--one-after-another` runs them one after
another (BACKFILL_CHECK_QUERIES_AT_ONCE=false), so each query's seconds are its own and not
shared with the others running beside it.

Spark's event log says what the warm pass's Spark jobs do (Delta's own jobs carry their
operation, others the action's call site): how many, and their seconds.

Prints a table per step, one per staging query and the warm pass's Spark jobs by what they
do; writes `benchmarks/results/check-steps-<time>.json`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from unittest import mock

from dagster import AssetCheckResult, asset_check

from benchmarks.measure import (
    SparkLog,
    answered_calls,
    demo_crm,
    spark_with_event_log,
    write_result,
)

CRM_TABLES = {"raw/crm_customer_history", "staging/customers", "marts/fct_revenue_by_segment"}
CRM_RATE = 5000  # calls/s, the demo CRM's limit and the client's, as in `make bench`


def _noop_check():
    from backfill_platform.partitions import daily_partitions
    from backfill_platform.tables import STAGING_ORDERS

    @asset_check(asset=STAGING_ORDERS, name="noop", partitions_def=daily_partitions)
    def noop() -> AssetCheckResult:
        """Nothing: its step is Dagster's own cost of a check step."""
        return AssetCheckResult(passed=True)

    return noop


def _step_seconds(instance, runs) -> dict[str, dict[str, float]]:
    steps: dict[str, dict[str, float]] = {}
    for run in runs:
        for stat in instance.get_run_step_stats(run.run_id):
            if stat.start_time and stat.end_time:
                row = steps.setdefault(stat.step_key, {"seconds": 0.0, "steps": 0})
                row["seconds"] += stat.end_time - stat.start_time
                row["steps"] += 1
    return steps


@contextmanager
def staging_query_seconds() -> Iterator[dict[str, list[float]]]:
    """Each query of the staging checks' step, by the function it calls: its seconds, one
    entry per step that ran it."""
    from backfill_platform.checks import staging

    seconds: dict[str, list[float]] = {}
    run_at_once = staging.at_once

    def timed(query: Callable[[], Any]) -> Callable[[], Any]:
        name = getattr(query, "func", query).__name__

        def run() -> Any:
            started = time.monotonic()
            try:
                return query()
            finally:
                seconds.setdefault(name, []).append(time.monotonic() - started)

        return run

    with mock.patch.object(staging, "at_once", lambda *qs: run_at_once(*map(timed, qs))):
        yield seconds


def measure(
    days: int,
    orders_per_day: int,
    per_run: int,
    work: Path,
    *,
    with_crm: bool = False,
    rerun: bool = False,
) -> dict:
    from dagster import DagsterInstance

    from backfill_platform.checks import all_checks
    from backfill_platform.definitions import all_assets, build_resources
    from backfill_platform.partitions import daily_partitions
    from backfill_platform.runner import backfill
    from backfill_platform.sources.generate import generate_landing

    def left_out(keys) -> bool:
        return not with_crm and any(k.to_user_string() in CRM_TABLES for k in keys)

    assets = [a for a in all_assets if not left_out(a.keys)]
    checks = [c for c in all_checks if not left_out(s.asset_key for s in c.check_specs)]
    checks.append(_noop_check())
    check_steps = {c.node_def.name for c in checks}
    first = daily_partitions.start.date()
    last = first + timedelta(days=days - 1)
    landing = work / "landing"
    generate_landing(landing, first, last, orders_per_day, 7, progress=False)
    events = work / "spark-events"
    events.mkdir()
    passes = {}
    with ExitStack() as stack:
        server = None
        if with_crm:
            server, _ = stack.enter_context(demo_crm(landing, work, 7, CRM_RATE))
        spark = spark_with_event_log(events)
        stack.callback(lambda: spark.get_session().stop())  # its event log is in `work`
        instances: dict[str, DagsterInstance] = {}
        # One session: the warm pass keeps the JVM; the re-run goes into the warm lakehouse.
        plan = [("cold", "cold"), ("warm", "warm")] + ([("rerun", "warm")] if rerun else [])
        for name, target in plan:
            resources = build_resources(
                str(landing), str(work / f"lakehouse-{target}"), spark=spark
            )
            instance = instances.setdefault(target, DagsterInstance.ephemeral())
            calls_before = len(answered_calls(server))
            window = time.time()
            started = time.monotonic()
            with staging_query_seconds() as queries:
                runs = backfill(
                    assets,
                    first.isoformat(),
                    last.isoformat(),
                    resources,
                    instance,
                    per_run,
                    None,
                    checks,
                )
            seconds = round(time.monotonic() - started, 1)
            steps = _step_seconds(instance, runs)
            spark_log = SparkLog.read(events).between(window, time.time())
            passes[name] = {
                "backfill_seconds": seconds,
                "runs": len(runs),
                "crm_calls": len(answered_calls(server)) - calls_before,
                "asset_steps_seconds": round(
                    sum(r["seconds"] for k, r in steps.items() if k not in check_steps), 1
                ),
                "check_steps_seconds": round(
                    sum(r["seconds"] for k, r in steps.items() if k in check_steps), 1
                ),
                "steps": {
                    k: {
                        "seconds": round(r["seconds"], 2),
                        "steps": r["steps"],
                        "check": k in check_steps,
                    }
                    for k, r in sorted(steps.items(), key=lambda kv: -kv[1]["seconds"])
                },
                "staging_queries": {
                    name: {"seconds": round(sum(s), 2), "steps": len(s)}
                    for name, s in sorted(queries.items(), key=lambda kv: -sum(kv[1]))
                },
                "spark": spark_log.summary(),
                "spark_jobs_by_what": spark_log.jobs_by_description(12),
            }
    return passes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=62)
    parser.add_argument("--orders-per-day", type=int, default=3000)
    parser.add_argument("--per-run", type=int, default=31, help="days per run")
    parser.add_argument(
        "--one-after-another",
        action="store_true",
        help="the staging step's queries one after another, each timed on its own",
    )
    parser.add_argument(
        "--with-crm",
        action="store_true",
        help="every asset, the CRM's included, against the demo CRM",
    )
    parser.add_argument(
        "--rerun", action="store_true", help="a third pass: the warm pass's range again"
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.one_after_another:
        os.environ["BACKFILL_CHECK_QUERIES_AT_ONCE"] = "false"
    with tempfile.TemporaryDirectory(prefix="bench-check-steps-") as work:
        passes = measure(
            args.days,
            args.orders_per_day,
            args.per_run,
            Path(work),
            with_crm=args.with_crm,
            rerun=args.rerun,
        )
    cold, warm = passes["cold"], passes["warm"]
    names = list(passes)
    print(
        f"{args.days} days x {args.orders_per_day} orders, {cold['runs']} runs a pass: "
        + ", ".join(
            f"{name} {p['backfill_seconds']} s (check steps {p['check_steps_seconds']} s, "
            f"asset steps {p['asset_steps_seconds']} s, {p['crm_calls']} CRM calls)"
            for name, p in passes.items()
        )
    )
    print("| step | check | " + " | ".join(f"{n} s" for n in names) + " | steps |")
    print("|---|---|" + "---:|" * (len(names) + 1))
    for key, row in cold["steps"].items():
        seconds = " | ".join(
            f"{p['steps'].get(key, {}).get('seconds', 0):.2f}" for p in passes.values()
        )
        print(f"| {key} | {'yes' if row['check'] else ''} | {seconds} | {row['steps']} |")
    together = "one after another" if args.one_after_another else "at once"
    print(
        f"| staging step query ({together}) | " + " | ".join(f"{n} s" for n in names) + " | steps |"
    )
    print("|---|" + "---:|" * (len(names) + 1))
    for name, row in cold["staging_queries"].items():
        seconds = " | ".join(
            f"{p['staging_queries'].get(name, {}).get('seconds', 0):.2f}" for p in passes.values()
        )
        print(f"| {name} | {seconds} | {row['steps']} |")
    jobs = warm["spark"]
    print(
        f"| warm pass's Spark jobs by what they do ({jobs['jobs']} jobs, busy "
        f"{jobs['busy_s']} s of {warm['backfill_seconds']} s) | jobs | job s |"
    )
    print("|---|---:|---:|")
    for row in warm["spark_jobs_by_what"]:
        print(f"| {row['what']} | {row['jobs']} | {row['job_seconds']:.2f} |")
    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "benchmark": "check-steps",
        "args": vars(args),
        "passes": passes,
    }
    out = write_result("check-steps", result)
    print(f"written {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
