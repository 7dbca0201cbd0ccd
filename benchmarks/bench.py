"""`make bench`: backfill throughput against a bare Spark job and one run per partition.

Everything runs on ONE generated landing zone, side by side in one session: the floor (a
bare Spark job), the platform's chunked backfill through Dagster from an empty lakehouse,
the same backfill again, a sample of one-run-per-partition (warm session and a new process
per run), the live path's rolling-window cycle, and full backfills at other sizes for a
linear cost model. Writes benchmarks/results/<timestamp>.json and .png and prints a
markdown table. Numbers on a shared machine are inflated: the load average is recorded.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import traceback
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

from benchmarks import dagster_events
from benchmarks.anchor_same_tables import SAME_TABLE_COLUMNS
from benchmarks.measure import (
    MemorySampler,
    SparkLog,
    answered_calls,
    demo_crm,
    event_log_conf,
    load_average,
    machine_info,
    spark_with_event_log,
    stopwatch,
)

REPO = Path(__file__).resolve().parents[1]
FCT_COLUMNS = ["event_date", "currency", "orders", "paid_orders", "revenue_local", "revenue_usd"]
LTV_COLUMNS = [
    "snapshot_date",
    "customer_id",
    "lifetime_paid_orders",
    "lifetime_revenue_usd",
    "first_order_date",
]
TARGETS = {
    "platform_over_floor": ("<=", 1.5),
    # Anchors written without the platform's transforms (a slow transform cannot hide in
    # them as in the floor); the bench's platform line is the backfill without its checks.
    "platform_over_plain_spark": ("<=", 1.5),
    # The platform as users run it (every asset, the CRM's included): every run also
    # evaluates its assets' checks.
    "platform_with_checks_over_plain_spark": ("<=", 2.5),
    # The fair denominator: a plain job building the same six tables (raw, FX,
    # staging, rejects, both marts) without checks or an orchestrator. Like for like, so the
    # numerator is the platform building those six tables with their checks: the CRM assets'
    # calls (a quarter of the full backfill, waiting on HTTP) have no counterpart in the job.
    # The full backfill's ratio (CRM included) stays in the ratios.
    "platform_anchor_marts_with_checks_over_same_tables": ("<=", 1.25),
    "platform_anchor_marts_over_same_tables": ("<=", 1.10),
    "platform_over_duckdb": ("<=", 3.0),
    # Chunking's worth: one run per partition at least 50x the chunked backfill (a new
    # process per run, as the deployment's run launcher does, when measured; else the warm
    # session).
    "per_partition_over_chunked": (">=", 50.0),
    # What the backfill's runs cost beyond their data, at the default chunking.
    "fixed_cost_per_backfill_seconds": ("<=", 10.0),
    # Within 5 % both ways: a re-run much faster than the first run would mean the
    # first paid for something the re-run skipped (JVM warm-up, table creation), not
    # idempotence. Measured without the CRM assets, whose first backfill calls the CRM once
    # per customer and whose re-run, by contract, calls it zero times.
    "rerun_over_first": ("within", 0.05),
    "rolling_window_seconds": ("<", 60.0),
    # The price of safety, per run and per backfill: what one more run costs beyond
    # its data; the Spark jobs of one live cycle (the new day's raw run, then the window's
    # downstream run; counted from Spark's event log, so None when the session keeps none);
    # what the asset checks add to the backfill; Dagster's per-partition events (priced on
    # the instances' storage, --dagster-storage) as a share of the backfill with checks.
    "fixed_cost_per_run_seconds": ("<=", 3.0),
    # A run the deployment launches has a process and a JVM of its own: its first Spark job
    # starts at most 5 s after the process does (the slowest new-process run; not measured,
    # so not met, with --no-cold).
    "deployment_first_spark_job_seconds": ("<=", 5.0),
    # The checks' own steps over the backfill without them (checks_steps_share).
    "checks_steps_share": ("<=", 0.10),
    "live_cycle_spark_jobs": ("<=", 20),
    "checks_added_share": ("<=", 0.15),
    "dagster_event_log_share": ("<=", 0.10),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--start", type=date.fromisoformat, default=date(2024, 1, 1))
    parser.add_argument("--days", type=int, default=184, help="partitions in the range")
    parser.add_argument("--orders-per-day", type=int, default=6000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--per-run", type=int, default=None, help="default: the setting")
    parser.add_argument("--sample", type=int, default=3, help="one-run-per-partition days")
    parser.add_argument("--cold-sample", type=int, default=1, help="same, new process per run")
    parser.add_argument(
        "--no-cold", action="store_true", help="skip the new-process-per-run measurements"
    )
    parser.add_argument(
        "--no-warm-up",
        action="store_true",
        help="skip the untimed warm-up backfill: the first timed phase then pays the JVM's "
        "warm-up (the smoke test's micro scale, whose timings mean nothing anyway)",
    )
    parser.add_argument("--window-repeats", type=int, default=2, help="warm window cycles")
    parser.add_argument(
        "--scaling",
        default="0.5x1,1x0.25",
        help="extra full backfills as DAYSxORDERS factors of the main scale; '' for none",
    )
    parser.add_argument(
        "--crm-rate",
        type=int,
        default=5000,
        help="the demo CRM's rate limit (and the client's) during the benchmark; the time "
        "at the default 20/s is computed from the calls. At 500/s (backfill share 375/s) the "
        "~30,000 customers of the default scale alone took 80 s of every full backfill",
    )
    parser.add_argument(
        "--dagster-storage",
        choices=("local-postgres", "sqlite"),
        default="local-postgres",
        help="the instances' storage: a PostgreSQL server of the bench's own, written through "
        "runner.recording_instance as `make demo` writes (default), or SQLite files "
        "(deploy/dagster.yaml)",
    )
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--keep-work", action="store_true", help="keep generated data")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, bench_class: type[Bench] | None = None) -> int:
    args = parse_args(argv)
    bench_class = bench_class or Bench
    os.environ["BACKFILL_START_DATE"] = args.start.isoformat()
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.out / f"work-{stamp}"
    work.mkdir()
    log_path = work / "bench.log"
    print(f"benchmark {stamp}: Spark and Dagster logs go to {log_path}", flush=True)
    # After BACKFILL_START_DATE is set: the partitions are defined when the package loads.
    from backfill_platform.console import RunProgress
    from backfill_platform.runner import observing

    bench = bench_class(args, work, stamp)
    bench.progress = RunProgress(sys.stdout)  # a bar per backfill: partitions, runs, ETA
    try:
        with _stderr_to(log_path), observing(bench.progress):
            result = bench.run()
    except Exception:
        # Keep what was measured before the failure; the traceback says where it stopped.
        partial = {
            "error": traceback.format_exc(),
            "seconds": bench.seconds,
            "memory": bench.memory,
        }
        (args.out / f"{stamp}.partial.json").write_text(json.dumps(partial, indent=2, default=str))
        raise
    finally:
        if not args.keep_work:
            kept = args.out / f"{stamp}.log"
            shutil.copy(log_path, kept)
            shutil.rmtree(work, ignore_errors=True)
    json_path = args.out / f"{stamp}.json"
    json_path.write_text(json.dumps(result, indent=2, default=str))
    print(bench.render(result, args.out / f"{stamp}.png"))
    print(f"\nwrote {json_path}")
    return 0 if result["checks"]["all_ok"] else 1


class Bench:
    uses_crm = True  # every backfill here builds the CRM assets: run the demo CRM

    def __init__(self, args: argparse.Namespace, work: Path, stamp: str):
        self.args = args
        self.work = work
        self.stamp = stamp
        self.seconds: dict[str, Any] = {}
        self.memory: dict[str, dict[str, float]] = {}
        self.events = work / "spark-events"
        self.cold = not args.no_cold and args.cold_sample > 0
        self.cold_starts: list[dict[str, Any]] = []  # each new-process run's start (_cold_run)
        self.progress = None  # the RunProgress `main` shows; its bars carry the phase's name
        self.postgres: Path | None = None  # the local server's data (--dagster-storage)

    # -- set-up ---------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        from backfill_platform.partitions import daily_partitions
        from backfill_platform.settings import PARTITIONS_PER_RUN, setting

        args = self.args
        if daily_partitions.start.date() != args.start:
            raise SystemExit(
                f"partitions start at {daily_partitions.start.date()}, the benchmark at "
                f"{args.start}: set BACKFILL_START_DATE={args.start} before importing"
            )
        load_start = load_average()
        self.per_run = args.per_run or int(setting(PARTITIONS_PER_RUN))
        self.days = [args.start + timedelta(days=i) for i in range(args.days)]
        self.new_day = self.days[-1] + timedelta(days=1)
        self.landing = self.work / "landing"
        _say(f"generating {args.days} days x {args.orders_per_day} orders/day (+1 new day)")
        with stopwatch(self.seconds, "generate"):
            summary = self._generate(self.landing, args.days + 1, args.orders_per_day)

        with contextlib.ExitStack() as stack:
            self.crm_summary = {}
            if self.uses_crm:
                self.crm, self.crm_summary = stack.enter_context(
                    demo_crm(self.landing, self.work, self.args.seed, self.args.crm_rate)
                )
            if args.dagster_storage == "local-postgres":
                self._start_postgres()
                stack.callback(self._stop_postgres)
            self.events.mkdir()
            with stopwatch(self.seconds, "session_start"):
                self.spark_resource = self._spark_resource()
                self.spark = self.spark_resource.get_session()
                self.spark.range(10).count()
            # The context's conf, not the session's: a session that was already running (the
            # tests') takes the event-log setting into its session conf but never writes a log.
            context_conf = self.spark.sparkContext.getConf()
            self.spark_log_enabled = context_conf.get("spark.eventLog.enabled", "false") == "true"
            with MemorySampler() as sampler:
                self.sampler = sampler
                result = self._measure(summary)
        result["load_average"] = {"start": load_start, "end": load_average()}
        return result

    def render(self, result: dict[str, Any], chart_path: Path) -> str:
        """The markdown table to print; writes the chart."""
        from benchmarks.report import chart, markdown

        chart(result, chart_path)
        return markdown(result) + f"\n\nchart: {chart_path}"

    def _generate(self, landing: Path, days: int, orders_per_day: int) -> dict:
        from backfill_platform.sources.generate import generate_landing

        last = self.args.start + timedelta(days=days - 1)
        return generate_landing(
            landing, self.args.start, last, orders_per_day, self.args.seed, progress=False
        )

    def _spark_resource(self):
        return spark_with_event_log(self.events)

    def _start_postgres(self) -> None:
        """The instances' PostgreSQL server, in a folder of its own its user can reach when
        the bench runs as root (a test's --out is private to root)."""
        from backfill_platform.sources import postgres_server

        self.postgres = postgres_server.scratch_data("bench-postgres-")
        postgres_server.start(self.postgres)

    def _stop_postgres(self) -> None:
        from backfill_platform.sources import postgres_server

        postgres_server.stop(self.postgres)
        shutil.rmtree(self.postgres.parent, ignore_errors=True)

    def _dagster_home(self, name: str) -> Path:
        """A new instance's DAGSTER_HOME: a database of the bench's PostgreSQL server, or
        SQLite files (deploy/dagster.yaml)."""
        from backfill_platform.sources import postgres_server

        home = self.work / name / "dagster_home"
        home.mkdir(parents=True)
        if self.postgres is None:
            shutil.copy(REPO / "deploy" / "dagster.yaml", home / "dagster.yaml")
        else:
            postgres_server.write_dagster_yaml(home, self.postgres, database=name)
        return home

    def _platform(self, name: str):
        """A fresh lakehouse and Dagster instance, written to as `make demo` writes."""
        from dagster import DagsterInstance

        from backfill_platform.definitions import build_resources
        from backfill_platform.runner import recording_instance

        home = self._dagster_home(name)
        lakehouse = self.work / name / "lakehouse"
        resources = build_resources(str(self.landing), str(lakehouse), spark=self.spark_resource)
        instance = recording_instance(DagsterInstance.from_config(str(home)))
        return resources, instance, home, lakehouse

    def _warm_up(self) -> None:
        """Both contenders share one JVM: run each once over a few days first, so neither
        timed phase pays for class loading and JIT compilation of the code paths (the
        first Delta write of a session costs seconds that no later one does)."""
        from backfill_platform.checks import all_checks
        from backfill_platform.definitions import all_assets
        from backfill_platform.runner import backfill
        from benchmarks.floor import run_floor

        with self._phase("warm_up"):
            warm_days = self.days[: min(3, len(self.days))]
            run_floor(self.spark, self.landing, warm_days, self.work / "warm_up" / "floor")
            warm_resources, warm_instance, _, _ = self._platform("warm_up")
            backfill(
                all_assets,
                warm_days[0].isoformat(),
                warm_days[-1].isoformat(),
                warm_resources,
                warm_instance,
                per_run=self.per_run,
                checks=all_checks,  # the checks' code paths too: a timed phase runs them
            )

    @contextlib.contextmanager
    def _phase(self, name: str):
        _say(f"{name} ...")
        if self.progress is not None:
            self.progress.labels["backfill"] = name
        self.sampler.reset()
        with stopwatch(self.seconds, name):
            yield
        self.memory[name] = self.sampler.peaks_mb()
        _say(f"{name}: {self.seconds[name]} s")

    def _timed_backfill(self, runs: dict, name: str, assets, resources, instance, checks=()):
        """One phase: the whole range backfilled at the bench's chunking, its runs kept in
        `runs[name]`."""
        from backfill_platform.runner import backfill

        first, last = self.days[0].isoformat(), self.days[-1].isoformat()
        with self._phase(name):
            runs[name] = backfill(
                assets, first, last, resources, instance, per_run=self.per_run, checks=checks
            )

    # -- the measurements -----------------------------------------------------------------
    def _measure(self, summary: dict) -> dict[str, Any]:
        from backfill_platform.checks import all_checks
        from backfill_platform.definitions import all_assets
        from backfill_platform.reconcile import fingerprints
        from backfill_platform.runner import backfill
        from benchmarks.anchor_duckdb import write_duckdb_marts
        from benchmarks.anchor_same_tables import run_same_tables
        from benchmarks.anchor_spark import run_anchor_spark
        from benchmarks.floor import run_floor

        n = len(self.days)
        if not self.args.no_warm_up:
            self._warm_up()

        with self._phase("floor_1"):
            run_floor(self.spark, self.landing, self.days, self.work / "floor")

        resources, instance, home, lakehouse = self._platform("main")
        lake = resources["lakehouse"]
        runs: dict[str, list] = {}
        calls_before = len(answered_calls(self.crm))
        self._timed_backfill(runs, "platform", all_assets, resources, instance)
        platform_calls = answered_calls(self.crm)[calls_before:]
        before = fingerprints(lake)
        raw_rows = int(before["raw/orders"][0])
        self._timed_backfill(runs, "rerun", all_assets, resources, instance)
        rerun_calls = len(answered_calls(self.crm)) - calls_before - len(platform_calls)
        crm = self._crm_report(platform_calls, rerun_calls, instance)
        rerun_same = fingerprints(lake) == before

        # Like for like with the anchors: the same backfill without the CRM assets (the
        # anchors call no CRM), from an empty lakehouse, so no ratio hides the demo CRM.
        anchor_assets = without_crm(all_assets)
        anchor_resources, anchor_instance, _, _ = self._platform("anchor_marts")
        self._timed_backfill(
            runs, "platform_anchor_marts", anchor_assets, anchor_resources, anchor_instance
        )
        anchor_marts_same = same_marts(anchor_resources["lakehouse"], lake)
        anchor_before = fingerprints(anchor_resources["lakehouse"])
        self._timed_backfill(
            runs, "rerun_anchor_marts", anchor_assets, anchor_resources, anchor_instance
        )
        anchor_rerun_same = fingerprints(anchor_resources["lakehouse"]) == anchor_before

        # The platform as users run it: the same backfill from an empty lakehouse, every run
        # also evaluating the checks of the assets it writes (a code location's runs do).
        checked_resources, checked_instance, _, _ = self._platform("with_checks")
        self._timed_backfill(
            runs,
            "platform_with_checks",
            all_assets,
            checked_resources,
            checked_instance,
            all_checks,
        )
        evaluations = check_evaluations(checked_instance, runs["platform_with_checks"])
        checked_same = same_marts(checked_resources["lakehouse"], lake)

        # Like for like with the same-tables job: its six tables, each run with their checks.
        anchor_checks = checks_of(anchor_assets, all_checks)
        anchor_checked_resources, anchor_checked_instance, _, _ = self._platform(
            "anchor_marts_with_checks"
        )
        self._timed_backfill(
            runs,
            "platform_anchor_marts_with_checks",
            anchor_assets,
            anchor_checked_resources,
            anchor_checked_instance,
            anchor_checks,
        )
        anchor_evaluations = check_evaluations(
            anchor_checked_instance, runs["platform_anchor_marts_with_checks"]
        )
        anchor_checked_same = same_marts(anchor_checked_resources["lakehouse"], lake)

        with self._phase("floor_2"):
            run_floor(self.spark, self.landing, self.days, self.work / "floor")
        floor_same = self._equals_platform(lake, self.work / "floor")

        # The anchors: a plain Spark job and DuckDB, both without the platform's code.
        with self._phase("plain_spark"):
            run_anchor_spark(
                self.spark, self.landing, self.days[0], self.days[-1], self.work / "plain_spark"
            )
        with self._phase("duckdb"):
            write_duckdb_marts(
                self.landing, self.days[0], self.days[-1], self.work / "duckdb", os.cpu_count()
            )
        anchors_same = {
            name: self._equals_platform(lake, self.work / name)
            for name in ("plain_spark", "duckdb")
        }
        for name, same in anchors_same.items():
            if not same:
                _say(f"MISMATCH: the {name} anchor's marts differ from the platform's")
        with self._phase("same_tables"):
            run_same_tables(
                self.spark, self.landing, self.days[0], self.days[-1], self.work / "same_tables"
            )
        same_tables_diff = self._same_tables_differ(
            anchor_resources["lakehouse"], self.work / "same_tables"
        )
        if same_tables_diff:
            _say(f"MISMATCH: the same-tables job's tables differ: {', '.join(same_tables_diff)}")

        # One run per partition: consecutive days in the middle, warm session, then cold.
        sample = self.days[n // 2 : n // 2 + self.args.sample]
        with self._phase("per_partition_sample_warm"):
            runs["per_partition"] = backfill(
                all_assets,
                sample[0].isoformat(),
                sample[-1].isoformat(),
                resources,
                instance,
                per_run=1,
            )
        cold = self.days[n // 2 - self.args.cold_sample : n // 2] if self.cold else []
        cold_ok = True
        if cold:
            with self._phase("per_partition_sample_cold"):
                cold_ok = all(
                    self._cold_run(lakehouse, home, day.isoformat(), day.isoformat(), layer)
                    for day in cold
                    for layer in ("raw", "downstream")
                )

        # The live path: one new landing day, then the rolling window over the last N days.
        window_days = int(os.environ.get("BACKFILL_LIVE_WINDOW_DAYS", "3"))
        window_first = (self.new_day - timedelta(days=window_days - 1)).isoformat()
        new_day = self.new_day.isoformat()
        window_ok = True
        if self.cold:
            with self._phase("rolling_window"):
                window_ok = self._cold_run(lakehouse, home, new_day, new_day, "raw")
                window_ok &= self._cold_run(lakehouse, home, window_first, new_day, "downstream")
        warm = []
        for i in range(self.args.window_repeats):
            with self._phase(f"rolling_window_warm_{i + 1}"):
                window_ok &= self._warm_window(resources, instance, window_first, new_day)
            warm.append(self.seconds[f"rolling_window_warm_{i + 1}"])
        files = files_per_partition(lake)
        # Dagster's event log: the events each backfill wrote, priced on the same storage.
        _say(f"pricing Dagster's event log on {self.args.dagster_storage} ...")
        instances = {
            "platform": instance,
            "rerun": instance,
            "platform_anchor_marts": anchor_instance,
            "rerun_anchor_marts": anchor_instance,
            "platform_with_checks": checked_instance,
            "platform_anchor_marts_with_checks": anchor_checked_instance,
        }
        dagster = dagster_events.summary(
            {
                name: dagster_events.events_of(inst, [r.run_id for r in runs[name]])
                for name, inst in instances.items()
            },
            {
                **dagster_events.price(self._dagster_home("dagster_events_price")),
                "storage": self.args.dagster_storage,
            },
        )

        scaling = self._scaling(n, raw_rows, runs)
        spark_log = SparkLog.read(self.events if self.spark_log_enabled else None)
        spans = self.seconds.pop("_spans")
        phases = {
            name: {
                **spark_log.between(*spans[name]).summary(),
                "top_stages": spark_log.between(*spans[name]).top_stages(),
            }
            for name in (
                "floor_1",
                "platform",
                "rerun",
                "platform_anchor_marts",
                "platform_with_checks",
                "platform_anchor_marts_with_checks",
                "rerun_anchor_marts",
                "floor_2",
                "plain_spark",
                "same_tables",
                "per_partition_sample_warm",
            )
        }
        steps = step_breakdown(instance, runs["platform"], spark_log)
        steps_with_checks = step_breakdown(
            checked_instance, runs["platform_with_checks"], spark_log
        )

        check_steps = check_steps_seconds(steps, steps_with_checks)
        floor = min(self.seconds["floor_1"], self.seconds["floor_2"])
        platform, rerun = self.seconds["platform"], self.seconds["rerun"]
        with_checks = self.seconds["platform_with_checks"]
        anchor_marts = self.seconds["platform_anchor_marts"]
        anchor_checked = self.seconds["platform_anchor_marts_with_checks"]
        anchor_rerun = self.seconds["rerun_anchor_marts"]
        per_part_warm = self.seconds["per_partition_sample_warm"] / len(sample) * n
        per_part_cold = (
            self.seconds["per_partition_sample_cold"] / len(cold) * n if cold else per_part_warm
        )
        warm_window = round(sum(warm) / len(warm), 2) if warm else None
        # The sample re-runs days the backfills built, as the re-run does (no CRM call).
        per_run_overhead = run_overhead(
            self.seconds["per_partition_sample_warm"],
            len(runs["per_partition"]),
            len(sample),
            rerun,
            len(runs["rerun"]),
            n,
        )
        plain_spark, duckdb = self.seconds["plain_spark"], self.seconds["duckdb"]
        same_tables = self.seconds["same_tables"]
        seconds = {
            "floor": floor,
            "plain_spark": plain_spark,
            "same_tables": same_tables,
            "duckdb": duckdb,
            "platform": platform,
            "platform_with_checks": with_checks,
            "platform_anchor_marts": anchor_marts,
            "platform_anchor_marts_with_checks": anchor_checked,
            "rerun": rerun,
            "rerun_anchor_marts": anchor_rerun,
            "per_partition_extrapolated": round(per_part_cold, 1),
            "per_partition_extrapolated_warm_session": round(per_part_warm, 1),
            "rolling_window": self.seconds.get("rolling_window", warm_window),
            "rolling_window_warm_session": warm_window,
            "per_run_overhead": per_run_overhead,
            "fixed_cost_per_backfill": round(per_run_overhead * len(runs["platform"]), 1)
            if per_run_overhead is not None
            else None,
            "detail": dict(self.seconds),
        }
        ratios = {
            "platform_over_floor": round(platform / floor, 2),
            "platform_over_plain_spark": round(platform / plain_spark, 2),
            "platform_with_checks_over_plain_spark": round(with_checks / plain_spark, 2),
            "platform_with_checks_over_platform": round(with_checks / platform, 2),
            "platform_anchor_marts_over_plain_spark": round(anchor_marts / plain_spark, 2),
            "platform_with_checks_over_same_tables": round(with_checks / same_tables, 2),
            # Like for like: the same six tables, no CRM assets, without and with checks.
            "platform_anchor_marts_over_same_tables": round(anchor_marts / same_tables, 2),
            "platform_anchor_marts_with_checks_over_same_tables": round(
                anchor_checked / same_tables, 2
            ),
            "platform_anchor_marts_with_checks_over_plain_spark": round(
                anchor_checked / plain_spark, 2
            ),
            # What the checks add to the six tables' backfill (the target's share is the
            # full backfill's, CRM included, as the target was first set).
            "checks_added_share_anchor_marts": round(anchor_checked / anchor_marts - 1, 3),
            # The checks' own steps over the backfill without them: what the checks cost,
            # free of the two backfills' run-to-run difference (their asset steps differed
            # by 13.6 s on an idle machine on 2026-11-30, docs/performance.md).
            "checks_steps_share": round(check_steps / platform, 3),
            "same_tables_over_plain_spark": round(same_tables / plain_spark, 2),
            "platform_over_duckdb": round(platform / duckdb, 2),
            "per_partition_over_chunked": round(per_part_cold / platform, 1),
            "per_partition_warm_over_chunked": round(per_part_warm / platform, 1),
            "rerun_over_first": round(anchor_rerun / anchor_marts, 3),
            "rerun_over_first_with_crm": round(rerun / platform, 3),
        }
        all_runs = [r for rs in runs.values() for r in rs]
        checks = {
            "all_runs_succeeded": all(r.success for r in all_runs) and cold_ok and window_ok,
            "rerun_rows_unchanged": rerun_same,
            "anchor_marts_rerun_rows_unchanged": anchor_rerun_same,
            "with_checks_equals_platform": checked_same,
            "anchor_marts_equals_platform": anchor_marts_same,
            "anchor_marts_with_checks_equals_platform": anchor_checked_same,
            "check_evaluations": evaluations,
            "anchor_marts_check_evaluations": anchor_evaluations,
            "floor_equals_platform": floor_same,
            "plain_spark_equals_platform": anchors_same["plain_spark"],
            "duckdb_equals_platform": anchors_same["duckdb"],
            "same_tables_equals_platform": not same_tables_diff,
            "active_files_per_partition_max": max(f["active_max"] for f in files.values()),
            "crm_rerun_zero_calls": crm["rerun_calls"] == 0,
            "crm_no_429": crm["server_429s"] == 0,
        }
        checks["all_ok"] = bool(
            checks["all_runs_succeeded"]
            and rerun_same
            and anchor_rerun_same
            and checked_same
            and anchor_marts_same
            and evaluations["evaluated"] > 0
            and evaluations["failed_error"] == 0
            and anchor_checked_same
            and anchor_evaluations["evaluated"] > 0
            and anchor_evaluations["failed_error"] == 0
            and floor_same
            and all(anchors_same.values())
            and not same_tables_diff
            and scaling["ok"]
            and checks["crm_rerun_zero_calls"]
            and checks["crm_no_429"]
        )
        cycle = spans.get("rolling_window_warm_1")
        events_seconds = dagster["phases"]["platform_with_checks"]["estimated_seconds"]
        measured = {
            **ratios,
            "rolling_window_seconds": seconds["rolling_window"],
            "fixed_cost_per_backfill_seconds": seconds["fixed_cost_per_backfill"],
            "fixed_cost_per_run_seconds": per_run_overhead,
            "live_cycle_spark_jobs": spark_log.between(*cycle).summary()["jobs"]
            if cycle and self.spark_log_enabled
            else None,
            "checks_added_share": round(with_checks / platform - 1, 3),
            "dagster_event_log_share": round(events_seconds / with_checks, 3),
            "deployment_first_spark_job_seconds": _slowest(
                [start["first_spark_job_seconds"] for start in self.cold_starts]
            ),
        }
        return {
            "timestamp": self.stamp,
            "scale": {
                "start": self.days[0].isoformat(),
                "end": self.days[-1].isoformat(),
                "partitions": n,
                "orders_per_day": self.args.orders_per_day,
                "seed": self.args.seed,
                "generated_orders": summary.get("orders"),
                "raw_rows": raw_rows,
                "partitions_per_run": self.per_run,
                "platform_runs": len(runs["platform"]),
                "per_partition_sample": [sample[0].isoformat(), sample[-1].isoformat()],
                "per_partition_cold_sample": [cold[0].isoformat(), cold[-1].isoformat()]
                if cold
                else None,
                "new_process_per_run_measured": bool(cold),
                "window_days": window_days,
            },
            "seconds": seconds,
            "new_process_runs": self.cold_starts,
            "ratios": ratios,
            "targets": {
                k: {
                    "target": f"1 ± {v}" if op == "within" else f"{op} {v}",
                    "measured": measured[k],
                    "met": _meets(measured[k], op, v),
                }
                for k, (op, v) in TARGETS.items()
            },
            "rows_per_second": {
                "floor": round(raw_rows / floor),
                "plain_spark": round(raw_rows / plain_spark),
                "same_tables": round(raw_rows / same_tables),
                "duckdb": round(raw_rows / duckdb),
                "platform": round(raw_rows / platform),
                "platform_with_checks": round(raw_rows / with_checks),
                "platform_anchor_marts": round(raw_rows / anchor_marts),
                "platform_anchor_marts_with_checks": round(raw_rows / anchor_checked),
                "rerun": round(raw_rows / rerun),
                "rerun_anchor_marts": round(raw_rows / anchor_rerun),
            },
            "memory_peak_mb": self.memory,
            "checks": checks,
            "files_per_partition": files,
            "spark_phases": phases,
            "platform_steps": steps,
            "platform_with_checks_steps": steps_with_checks,
            "scaling": scaling,
            "crm": crm,
            "dagster_events": dagster,
            "machine": machine_info(self.spark),
        }

    def _crm_report(self, calls: list[dict], rerun_calls: int, instance) -> dict[str, Any]:
        """CRM calls of the full backfill vs its distinct customers, the re-run's calls, and
        what the rate limit costs: measured limiter waits at --crm-rate, computed at 20/s."""
        from backfill_platform.resources.crm import backfill_share
        from backfill_platform.sources.crm_server import peak_per_second
        from backfill_platform.tables import RAW_CRM_HISTORY

        waits = [
            float(m.value)
            for record in instance.fetch_materializations(RAW_CRM_HISTORY, limit=10_000).records
            for k, m in record.asset_materialization.metadata.items()
            if k == "crm_rate_limit_wait_seconds"
        ]
        default_share = backfill_share(20, 0.25)
        return {
            "generated": self.crm_summary,
            "platform_calls": len(calls),
            "distinct_customers_called": len({e.get("customer_id") for e in calls}),
            "rerun_calls": rerun_calls,
            "server_429s": self.crm.metrics()["rejected_429"],
            "rate_limit": self.args.crm_rate,
            "backfill_share": backfill_share(self.args.crm_rate, 0.25),
            "peak_per_second": peak_per_second([e["t"] for e in calls]),
            "limiter_wait_seconds": round(sum(waits), 2),
            "seconds_at_default_limit": round(len(calls) / default_share, 1),
        }

    def _cold_run(self, lakehouse: Path, home: Path, first: str, last: str, layer: str) -> bool:
        """One run in a new process, as the deployment's run launcher starts one. Its Spark
        event log says when its session came up and its first Spark job started, counted from
        the process's launch (`self.cold_starts`)."""
        events = self.work / "cold-spark-logs" / str(len(self.cold_starts))
        events.mkdir(parents=True)
        inherited = os.environ.get("PYSPARK_SUBMIT_ARGS", "pyspark-shell")
        logged = " ".join(
            f"--conf {shlex.quote(f'{k}={v}')}" for k, v in event_log_conf(events).items()
        )
        command = [
            sys.executable,
            "-m",
            "benchmarks.one_run",
            "--landing",
            str(self.landing),
            "--lakehouse",
            str(lakehouse),
            "--dagster-home",
            str(home),
            "--first",
            first,
            "--last",
            last,
            "--layer",
            layer,
        ]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO), *sys.path]),
            "PYSPARK_SUBMIT_ARGS": f"{inherited.removesuffix('pyspark-shell')}{logged} "
            "pyspark-shell",
        }
        with open(self.work / "cold-runs.log", "a") as log:
            launched = time.time()
            done = subprocess.run(command, cwd=REPO, env=env, stdout=log, stderr=log, check=False)
        spark_log = SparkLog.read(events)
        first_job = min((job.submitted_ms for job in spark_log.jobs), default=None)
        self.cold_starts.append(
            {
                "run": f"{layer} {first}..{last}",
                "session_up_seconds": _since(launched, spark_log.started_ms),
                "first_spark_job_seconds": _since(launched, first_job),
            }
        )
        return done.returncode == 0

    def _warm_window(self, resources, instance, first: str, last: str) -> bool:
        from dagster import AssetSelection

        from backfill_platform.automation.live_jobs import DOWNSTREAM_KEYS, RAW_KEYS
        from backfill_platform.definitions import all_assets
        from backfill_platform.runner import materialize_range

        ok = True
        for keys, span in ((RAW_KEYS, (last, last)), (DOWNSTREAM_KEYS, (first, last))):
            result = materialize_range(
                all_assets,
                *span,
                resources,
                instance,
                selection=AssetSelection.assets(*keys),
                raise_on_error=False,
            )
            ok &= result.success
        return ok

    def _equals_platform(self, lake, out_dir: Path) -> bool:
        """Both marts under out_dir (Parquet) hold the platform's rows: count and a hash sum,
        after casting to the platform's column types (engines pick other decimal scales)."""
        same = True
        for name, cols in MARTS:
            platform = lake.read(f"marts/{name}")
            types = {f.name: f.dataType for f in platform.schema.fields}
            ours = self.spark.read.parquet(str(out_dir / name))
            same &= _digest(ours, cols, types) == _digest(platform, cols, types)
        return same

    def _same_tables_differ(self, lake, out_dir: Path) -> list[str]:
        """The same-tables job's tables (Delta, under out_dir) whose count or hash over the
        contract's columns differs from the platform's; empty when all six are equal."""
        differ = []
        for table, (_, cols) in SAME_TABLE_COLUMNS.items():
            platform = lake.read(table)
            types = {f.name: f.dataType for f in platform.schema.fields}
            ours = self.spark.read.format("delta").load(str(out_dir / table))
            if _digest(ours, cols, types) != _digest(platform, cols, types):
                differ.append(table)
        return differ

    def _scaling(self, n: int, raw_rows: int, runs: dict) -> dict[str, Any]:
        """Full backfills at other sizes; cost = runs x a + partitions x b + Mrows x c."""
        from backfill_platform.definitions import all_assets
        from backfill_platform.reconcile import table_counts
        from backfill_platform.runner import backfill

        points = [
            {
                "label": "main",
                "partitions": n,
                "orders_per_day": self.args.orders_per_day,
                "runs": len(runs["platform"]),
                "raw_rows": raw_rows,
                "seconds": self.seconds["platform"],
            },
            {
                "label": "one run per partition (warm)",
                "partitions": self.args.sample,
                "orders_per_day": self.args.orders_per_day,
                "runs": len(runs["per_partition"]),
                "raw_rows": round(raw_rows / n * self.args.sample),
                "seconds": self.seconds["per_partition_sample_warm"],
            },
        ]
        ok = True
        for i, spec in enumerate(s for s in self.args.scaling.split(",") if s.strip()):
            day_factor, order_factor = (float(x) for x in spec.lower().split("x"))
            days = max(2, round(n * day_factor))
            orders = max(1, round(self.args.orders_per_day * order_factor))
            name = f"scale{i}"
            landing = self.landing
            if orders != self.args.orders_per_day:
                landing = self.work / name / "landing"
                self._generate(landing, days, orders)
            resources, instance, _, _ = self._platform(name)
            resources = _with_landing(resources, landing)
            last = (self.args.start + timedelta(days=days - 1)).isoformat()
            with self._phase(name):
                done = backfill(
                    all_assets,
                    self.args.start.isoformat(),
                    last,
                    resources,
                    instance,
                    per_run=self.per_run,
                )
            ok &= all(r.success for r in done)
            points.append(
                {
                    "label": f"{days} days x {orders}/day",
                    "partitions": days,
                    "orders_per_day": orders,
                    "runs": len(done),
                    "raw_rows": table_counts(resources["lakehouse"])["raw/orders"],
                    "seconds": self.seconds[name],
                }
            )
        return {"points": points, "fit": linear_fit(points), "ok": ok}


MARTS = (("fct_daily_revenue", FCT_COLUMNS), ("customer_ltv", LTV_COLUMNS))


def without_crm(assets: list) -> list:
    """The assets the anchors compute too: every asset but the three CRM ones."""
    from backfill_platform.tables import (
        FCT_REVENUE_BY_SEGMENT,
        RAW_CRM_HISTORY,
        STAGING_CUSTOMERS,
    )

    crm_keys = {RAW_CRM_HISTORY, STAGING_CUSTOMERS, FCT_REVENUE_BY_SEGMENT}
    return [a for a in assets if not set(a.keys) & crm_keys]


def checks_of(assets: list, checks: list) -> list:
    """The checks whose every target is one of `assets` (a run evaluates those)."""
    keys = {key for a in assets for key in a.keys}
    return [c for c in checks if all(k.asset_key in keys for k in c.check_keys)]


def same_marts(lake, other) -> bool:
    """Both lakehouses hold the same two marts: count and hash sum of each."""
    return all(
        _digest(lake.read(f"marts/{name}"), cols) == _digest(other.read(f"marts/{name}"), cols)
        for name, cols in MARTS
    )


def _digest(df, cols: list[str], types: dict | None = None) -> tuple[int, int]:
    """Row count and a sum of xxhash64 over `cols`, cast to `types` first when given."""
    from pyspark.sql import functions as F

    types = types or {f.name: f.dataType for f in df.schema.fields}
    row = (
        df.select(*(F.col(c).cast(types[c]) for c in cols))
        .agg(
            F.count(F.lit(1)).alias("n"),
            F.sum(F.xxhash64(*cols).cast("decimal(38,0)")).alias("h"),
        )
        .first()
    )
    return row["n"], row["h"]


def check_evaluations(instance, runs) -> dict[str, int]:
    """The asset check evaluations the runs recorded: how many, and how many failed by
    severity (a failed blocking check fails its run; WARN checks may fail at any scale)."""
    from dagster import AssetCheckSeverity, DagsterEventType

    counts = {"evaluated": 0, "passed": 0, "failed_error": 0, "failed_warn": 0, "checks": 0}
    names = set()
    for run in runs:
        for record in instance.all_logs(
            run.run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION
        ):
            evaluation = record.dagster_event.event_specific_data
            names.add(evaluation.asset_check_key)
            counts["evaluated"] += 1
            if evaluation.passed:
                counts["passed"] += 1
            elif evaluation.severity == AssetCheckSeverity.ERROR:
                counts["failed_error"] += 1
            else:
                counts["failed_warn"] += 1
    counts["checks"] = len(names)
    return counts


def _with_landing(resources: dict, landing: Path) -> dict:
    from backfill_platform.resources import LandingZoneResource

    return {
        **resources,
        "landing": LandingZoneResource(landing_dir=str(landing), spark=resources["spark"]),
    }


def run_overhead(
    sample_s: float, sample_runs: int, sample_days: int, chunked_s: float, runs: int, days: int
) -> float | None:
    """Seconds one more run costs, whatever its data: the one-run-per-partition sample against
    the same days' share of the chunked backfill, over the runs it added. Needs no scaling
    points (the fit below does, and is optional)."""
    share = sample_days / days
    added = sample_runs - share * runs
    return round((sample_s - share * chunked_s) / added, 2) if added > 0 else None


def linear_fit(points: list[dict]) -> dict[str, float] | None:
    """Least squares: seconds = a*runs + b*partitions + c*(raw rows / 1e6)."""
    import numpy as np

    if len(points) < 3:
        return None
    x = np.array([[p["runs"], p["partitions"], p["raw_rows"] / 1e6] for p in points], float)
    y = np.array([p["seconds"] for p in points], float)
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    predicted = x @ coef
    total = ((y - y.mean()) ** 2).sum()
    return {
        "seconds_per_run": round(float(coef[0]), 3),
        "seconds_per_partition": round(float(coef[1]), 3),
        "seconds_per_million_rows": round(float(coef[2]), 2),
        "r2": round(float(1 - ((y - predicted) ** 2).sum() / total), 3) if total else None,
    }


def check_steps_seconds(
    steps: dict[str, dict[str, float]], steps_with_checks: dict[str, dict[str, float]]
) -> float:
    """Seconds of the steps the checks add: those of the backfill with checks that the one
    without has not (every check is defined apart from its asset, so it is a step of its
    own)."""
    added = [row["seconds"] for key, row in steps_with_checks.items() if key not in steps]
    return round(sum(added), 2)


def step_breakdown(instance, runs, spark_log: SparkLog) -> dict[str, dict[str, float]]:
    """Per Dagster step over the platform backfill: wall seconds and Spark's share of them."""
    steps: dict[str, dict[str, float]] = {}
    run_wall = 0.0
    for run in runs:
        record = instance.get_run_record_by_id(run.run_id)
        if record and record.start_time and record.end_time:
            run_wall += record.end_time - record.start_time
        for stat in instance.get_run_step_stats(run.run_id):
            if not (stat.start_time and stat.end_time):
                continue
            row = steps.setdefault(stat.step_key, {"seconds": 0.0, "spark_busy_s": 0.0, "jobs": 0})
            row["seconds"] += stat.end_time - stat.start_time
            inside = spark_log.between(stat.start_time, stat.end_time).summary()
            row["spark_busy_s"] += inside["busy_s"]
            row["jobs"] += inside["jobs"]
    in_steps = sum(s["seconds"] for s in steps.values())
    result = {k: {m: round(v, 2) for m, v in row.items()} for k, row in sorted(steps.items())}
    result["(run overhead outside steps)"] = {
        "seconds": round(run_wall - in_steps, 2),
        "spark_busy_s": 0.0,
        "jobs": 0,
    }
    return result


def files_per_partition(lake) -> dict[str, dict[str, float]]:
    """Live data files per date partition (Delta snapshot) and Parquet files on disk."""
    from backfill_platform.tables import TABLE_NAMES

    result = {}
    for name in TABLE_NAMES:
        if not lake.exists(name):
            continue
        active = {p: f.files for p, f in lake.partition_files(name).items()}
        stored: dict[str | None, int] = {}
        for stored_file in lake.stored_files(name):
            stored[stored_file.partition] = stored.get(stored_file.partition, 0) + 1
        on_disk = list(stored.values())
        result[name] = {
            "partitions": len(active),
            "active_max": max(active.values(), default=0),
            "active_mean": round(sum(active.values()) / max(1, len(active)), 2),
            "on_disk_max": max(on_disk, default=0),
        }
    return result


def _slowest(seconds: list[float | None]) -> float | None:
    """The largest, or None when there is none or one run's is unknown."""
    return max(seconds) if seconds and None not in seconds else None


def _since(launched: float, epoch_ms: int | None) -> float | None:
    return round(epoch_ms / 1000 - launched, 2) if epoch_ms is not None else None


def _meets(value: float | None, op: str, bound: float) -> bool:
    if value is None:  # not measurable in this run (e.g. one run per partition throughout)
        return False
    if op == "within":
        return abs(value - 1) <= bound
    return {"<=": value <= bound, ">=": value >= bound, "<": value < bound}[op]


def _say(text: str) -> None:
    print(f"[{datetime.now(UTC):%H:%M:%S}] {text}", flush=True)


@contextlib.contextmanager
def _stderr_to(path: Path):
    """Route fd 2 (Dagster's console logs, the JVM's warnings) to a file; stdout stays clean."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "ab") as target:
        os.dup2(target.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


if __name__ == "__main__":
    started = time.monotonic()
    code = main()
    print(f"benchmark wall time {time.monotonic() - started:.0f} s")
    sys.exit(code)
