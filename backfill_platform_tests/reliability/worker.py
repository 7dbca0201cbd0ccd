"""Child processes for the reliability suites: each is its own Python + Spark JVM, so it can
be SIGKILLed, or race other writers, the way a real Dagster run process would.

    python -m backfill_platform_tests.reliability.worker <command> '<json args>'

Every command writes `ready` once its Spark session is up and waits for its `go` file, so
the JVM start-up stays out of the measured window. Progress goes to a JSON-lines events file.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from datetime import date, timedelta
from pathlib import Path
from typing import Any

os.environ.setdefault("BACKFILL_START_DATE", "2024-01-01")

from dagster import AssetKey, AssetSelection, DagsterInstance
from pyspark.sql import functions as F

from backfill_platform.checks import all_checks
from backfill_platform.definitions import all_assets, build_resources
from backfill_platform.resources import LakehouseResource, SparkSessionResource
from backfill_platform.runner import BackfillFailed, backfill, materialize_range
from backfill_platform.settings import (
    S3_ACCESS_KEY_ID,
    S3_ENDPOINT,
    S3_PATH_STYLE,
    S3_SECRET_ACCESS_KEY,
    bool_setting,
    secret_setting,
    setting,
)
from backfill_platform_tests.spark_jvm import SPAWNED_JIT

DATE_COLUMNS = {
    "raw/orders": "ingest_date",
    "raw/fx_rates": "rate_date",
    "staging/orders": "event_date",
    "staging/orders_rejects": "ingest_date",
    "marts/fct_daily_revenue": "event_date",
    "marts/customer_ltv": "snapshot_date",
}


def worker_spark() -> SparkSessionResource:
    """One core and a small heap: several of these run at once next to the test's own JVM.
    An object store's settings come from the environment, as a deployment's do."""
    return SparkSessionResource(
        master="local[1]",
        shuffle_partitions=1,
        driver_memory="1g",
        extra_conf={"spark.driver.extraJavaOptions": f"{SPAWNED_JIT} -XX:+UseSerialGC"},
        s3_endpoint=setting(S3_ENDPOINT),
        s3_path_style=bool_setting(S3_PATH_STYLE),
        s3_access_key_id=secret_setting(S3_ACCESS_KEY_ID),
        s3_secret_access_key=secret_setting(S3_SECRET_ACCESS_KEY),
    )


class Events:
    def __init__(self, path: str):
        self.path = Path(path)

    def emit(self, event: str, **fields: Any) -> None:
        with self.path.open("a") as handle:
            handle.write(json.dumps({"event": event, "t": time.time(), **fields}, default=str))
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())


def partition_fingerprints(lake: LakehouseResource, table: str) -> dict[str, Any]:
    """{date: [rows, hash of non-audit columns]} plus the Delta versions, or the error."""
    try:
        if not lake.exists(table):
            return {"exists": False, "partitions": {}, "versions": []}
        df = lake.read(table)
        cols = sorted(c for c in df.columns if not c.startswith("_"))
        column = DATE_COLUMNS.get(table, "d")
        rows = (
            df.groupBy(column)
            .agg(
                F.count(F.lit(1)).alias("n"),
                F.sum(F.xxhash64(*cols).cast("decimal(38,0)")).alias("h"),
            )
            .collect()
        )
        versions = [h["version"] for h in lake.history(table)]
        return {
            "exists": True,
            "partitions": {str(r[column]): [r["n"], str(r["h"])] for r in rows},
            "versions": sorted(versions),
        }
    except Exception as error:  # an unreadable table is the finding itself
        return {"exists": True, "error": f"{type(error).__name__}: {error}"[:2000]}


def wait_for(path: str, poll: float = 0.02) -> None:
    while not os.path.exists(path):
        time.sleep(poll)


def boot(args: dict[str, Any]) -> tuple[SparkSessionResource, Events]:
    """Start Spark and warm Delta up (a scratch write, read and history) before `ready`, so
    a kill-target's first real write runs at warm speed and its start-up overlaps others."""
    spark = worker_spark()
    session = spark.get_session()
    scratch = Path(args["events"]).with_suffix(".warmup")
    warm = LakehouseResource(root_dir=str(scratch), spark=spark)
    day = date(2024, 1, 1)
    df = session.createDataFrame([(day, 1)], "d date, v int")
    warm.replace_range("t/warm", df, "d", day, day + timedelta(days=1), {})
    warm.read("t/warm").count()
    events = Events(args["events"])
    events.emit("ready", pid=os.getpid())
    wait_for(args["go"])
    events.emit("go")
    return spark, events


def _selection(names: list[str] | None):
    return AssetSelection.assets(*(AssetKey.from_user_string(n) for n in names)) if names else None


def kill_target(args: dict[str, Any]) -> None:
    """Re-materialize the range again and again, alternating two landing zones, until
    killed (or once, for the final re-run)."""
    spark, events = boot(args)
    landings = [build_resources(p, args["lakehouse"], spark=spark) for p in args["landings"]]
    instance = DagsterInstance.ephemeral()
    # The two landing zones differ, so raw shrinks every other iteration: a deliberate purge
    # for the raw assets' source-preservation guard (assets/preservation.py).
    purge = {"config": {"allow_source_purge": True, "purge_reason": "kill trials alternate"}}
    selected = args.get("selection") or ["raw/orders", "raw/fx_rates"]
    run_config = {"ops": {n.replace("/", "__"): purge for n in selected if n.startswith("raw/")}}
    iteration = args["start_index"]
    while True:
        variant = iteration % 2
        events.emit("start", iteration=iteration, variant=variant)
        result = materialize_range(
            all_assets,
            args["first"],
            args["last"],
            landings[variant],
            instance,
            selection=_selection(args.get("selection")),
            run_config=run_config,
        )
        events.emit("done", iteration=iteration, variant=variant, success=result.success)
        if args.get("once"):
            return
        iteration += 1


def write_ranges(args: dict[str, Any]) -> None:
    """replace_range jobs over [start, end), each started by its own go file (`<go>.<n>`),
    with rows tagged by the job, so the test can tell whose rows every day holds."""
    spark, events = boot(args)
    lake = LakehouseResource(root_dir=args["lakehouse"], spark=spark)
    for n, job in enumerate(args["jobs"]):
        if n:
            wait_for(f"{args['go']}.{n}")
        start, end = date.fromisoformat(job["start"]), date.fromisoformat(job["end"])
        days = [(start + timedelta(days=i)).isoformat() for i in range((end - start).days)]
        rows = [(d, job["tag"], i) for d in days for i in range(job["rows_per_day"])]
        df = spark.get_session().createDataFrame(rows, "d string, writer string, i int")
        df = df.select(F.to_date("d").alias("d"), "writer", "i")
        events.emit("writing", job=n, tag=job["tag"])
        try:
            commit = lake.replace_range(args["table"], df, "d", start, end, {"writer": job["tag"]})
        except Exception as error:  # reported to the test, which judges it
            events.emit("failed", job=n, tag=job["tag"], error=f"{type(error).__name__}: {error}")
            continue
        events.emit("committed", job=n, tag=job["tag"], version=commit.version)


def _failures(instance: DagsterInstance) -> str:
    """The failed steps' errors, then the failed checks, of every run, for the test's report."""
    steps, checks = [], []
    for record in instance.get_run_records():
        for entry in instance.all_logs(record.dagster_run.run_id):
            event = entry.dagster_event
            if event is None:
                continue
            if event.event_type_value == "STEP_FAILURE":
                error = event.step_failure_data.error
                while error.cause is not None:  # the user code's error, not Dagster's wrapper
                    error = error.cause
                steps.append(f"{event.step_key}: {error.message[:1500]}")
            elif event.event_type_value == "ASSET_CHECK_EVALUATION":
                evaluation = event.event_specific_data
                if not evaluation.passed:
                    actual = evaluation.metadata.get("actual")
                    checks.append(f"check failed: {evaluation.check_name}: {actual}"[:300])
    return "\n".join(steps + checks)


class _Stopped(Exception):
    """The test asked the backfill to stop; it does so between two complete runs."""


def _stop_if(path: str, events: Events) -> None:
    events.emit("run")
    if os.path.exists(path):
        raise _Stopped


def run_loop(args: dict[str, Any]) -> None:
    """The live writer (recent window, again and again) or the backfill (history, chunked)."""
    spark, events = boot(args)
    resources = build_resources(args["landing"], args["lakehouse"], spark=spark)
    instance = DagsterInstance.ephemeral()
    passes = 0
    final_seen = False
    while True:
        if args["role"] == "backfill":
            if os.path.exists(args["stop"]):
                return
            started = time.time()
            try:
                runs = backfill(
                    all_assets,
                    args["first"],
                    args["last"],
                    resources,
                    instance,
                    per_run=args["per_run"],
                    on_run=lambda run: _stop_if(args["stop"], events),
                    checks=all_checks if args.get("checks") else (),
                )
            except _Stopped:
                return
            except BackfillFailed as failed:
                raise BackfillFailed(f"{failed}\n{_failures(instance)}") from failed
            passes += 1
            events.emit("pass", passes=passes, runs=len(runs), seconds=time.time() - started)
        else:
            final_seen = os.path.exists(args["final"])
            started = time.time()
            result = materialize_range(
                all_assets, args["first"], args["last"], resources, instance, raise_on_error=False
            )
            passes += 1
            failed = [e.step_key for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
            events.emit(
                "pass",
                passes=passes,
                success=result.success,
                failed_steps=failed,
                final=final_seen,
                seconds=time.time() - started,
            )
            if final_seen and result.success:
                return
            if not result.success:
                time.sleep(1)


COMMANDS = {"kill-target": kill_target, "write-ranges": write_ranges, "loop": run_loop}


def main() -> None:
    command, raw = sys.argv[1], sys.argv[2]
    args = json.loads(raw)
    try:
        COMMANDS[command](args)
    except Exception:
        Events(args["events"]).emit("crash", traceback=traceback.format_exc()[-4000:])
        raise


if __name__ == "__main__":
    main()
