"""What a run's own JVM costs, against a long-lived Spark Connect server the runs share
(`make bench-jvm`, docs/performance.md "A JVM per run").

Every Dagster run of a deployment, every CLI process and every reliability worker starts a
Spark driver JVM of its own, and most of CI's CPU is those JVMs (docs/reliability.md, "CI
time"). This measures the alternative before the platform is built on it: the same small
Delta workload, in the shape of a run (three daily replaces of a raw table, a staging
rebuild, a daily mart, each table's count and history), in fresh processes, `--repeats`
times each way:

- **own JVM**: the process starts its session as a run does (the platform's Spark settings,
  the tests' class-data archive and C1 compiler when built);
- **Spark Connect**: the process is a Connect client of one server started here with the
  same settings (Spark's own `SparkConnectServer`, its jar shipped with pyspark); the
  server's first client, which warms it, is reported apart.

The platform's own runs cannot be measured this way yet: they call Delta's Python API
(`DeltaTable`) and the JVM directly (the zero-copy commit, the local file system), which a
Connect client cannot. Per way: wall seconds and the machine's CPU seconds per process
(busy ticks of /proc/stat, so the server's work is counted too; run it idle). Prints a
table, writes `benchmarks/results/jvm-per-run-<timestamp>.json`.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from benchmarks.measure import load_average, write_result

REPO = Path(__file__).resolve().parents[1]
# The Connect client's own packages (pyspark's `connect` extra), installed by `make bench-jvm`
# apart from the venv: the product needs none of them (377 MB with pyarrow and pandas).
CLIENT_LIBS = REPO / ".connect-client"
DAYS = ("2024-01-01", "2024-01-02", "2024-01-03")


def workload(remote: str | None) -> None:
    """The run-shaped Delta work, in this process: own session, or a client of `remote`."""
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    if remote:
        spark = SparkSession.builder.remote(remote).getOrCreate()
    else:
        from backfill_platform_tests.harness import spark_resource_for_tests

        spark = spark_resource_for_tests().get_session()
    root = tempfile.mkdtemp(prefix="bench-jvm-")
    lines = spark.createDataFrame(
        [
            (
                f'{{"order_id": "o{i}", "amount": 1.5, "event_time": "{DAYS[i % 3]}T10:00:00Z"}}',
                DAYS[i % 3],
            )
            for i in range(300)
        ],
        "value string, ingest_date string",
    )
    schema = "order_id string, amount decimal(18,2), event_time string"
    parsed = lines.select(F.from_json("value", schema).alias("r"), "ingest_date")
    parsed = parsed.select("r.*", "ingest_date")
    for day in DAYS:  # one atomic replace per day, as a run's raw step
        parsed.where(F.col("ingest_date") == day).write.format("delta").mode("overwrite").option(
            "replaceWhere", f"ingest_date = '{day}'"
        ).partitionBy("ingest_date").save(f"{root}/raw")
    raw = spark.read.format("delta").load(f"{root}/raw")
    raw.groupBy("order_id").agg(
        F.max("event_time").alias("event_time"),
        F.sum("amount").alias("amount"),
        F.first("ingest_date").alias("ingest_date"),
    ).write.format("delta").mode("overwrite").partitionBy("ingest_date").save(f"{root}/staging")
    staged = spark.read.format("delta").load(f"{root}/staging")
    staged.groupBy("ingest_date").agg(F.sum("amount").alias("revenue")).write.format("delta").mode(
        "overwrite"
    ).save(f"{root}/daily")
    for name in ("raw", "staging", "daily"):
        assert spark.read.format("delta").load(f"{root}/{name}").count() > 0, name
        spark.sql(f"DESCRIBE HISTORY delta.`{root}/{name}`").collect()
    revenue = sum(r["revenue"] for r in spark.read.format("delta").load(f"{root}/daily").collect())
    assert revenue == 450, revenue


def _busy_seconds() -> float:
    """The machine's busy CPU seconds since boot (all cores), from /proc/stat."""
    with open("/proc/stat") as stat:
        ticks = [int(x) for x in stat.readline().split()[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def _spark_env() -> dict[str, str]:
    from backfill_platform_tests import spark_jvm

    spawned = spark_jvm.submit_args(spawned=True)
    return {
        **os.environ,
        "SPARK_CONF_DIR": spark_jvm.empty_conf_dir(),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_SUBMIT_ARGS": spawned,
        "PYTHONPATH": str(REPO),
    }


def _one(remote: str | None) -> dict[str, float]:
    env = _spark_env()
    argv = [sys.executable, "-m", "benchmarks.jvm_per_run", "--workload"]
    if remote:
        env["PYTHONPATH"] = f"{CLIENT_LIBS}:{REPO}"
        argv.append(remote)
    before, started = _busy_seconds(), time.monotonic()
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.monotonic() - started
    time.sleep(2)  # a JVM's last ticks land after its process has gone
    if done.returncode:
        raise SystemExit(f"the workload failed ({'connect' if remote else 'own JVM'}):\n"
                         f"{done.stderr[-3000:]}")  # fmt: skip
    return {"wall": round(wall, 1), "cpu": round(_busy_seconds() - before, 1)}


def _connect_server(port: int, log: Path) -> subprocess.Popen:
    """Spark's Connect server with the platform's session settings, on 127.0.0.1:`port`."""
    from pyspark import find_spark_home

    from backfill_platform_tests.harness import spark_resource_for_tests

    conf = spark_resource_for_tests().spark_config()
    master = conf.pop("spark.master")
    home = find_spark_home._find_spark_home()
    argv = [f"{home}/bin/spark-submit", "--master", master, "--name", "bench-jvm-connect"]
    argv += ["--class", "org.apache.spark.sql.connect.service.SparkConnectServer"]
    env = _spark_env()
    for key, value in [*conf.items(), ("spark.connect.grpc.binding.port", str(port))]:
        argv += ["--conf", f"{key}={value}"]
    # the archive and JIT settings a spawned test JVM gets, and the tests' Spark settings
    argv += shlex.split(env.pop("PYSPARK_SUBMIT_ARGS").removesuffix("pyspark-shell"))
    argv.append("spark-internal")
    return subprocess.Popen(
        argv, env={**env, "SPARK_HOME": home}, stdout=log.open("w"), stderr=subprocess.STDOUT
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workload", nargs="?", const="", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.workload is not None:
        workload(args.workload or None)
        return 0
    if not CLIENT_LIBS.is_dir():
        raise SystemExit(f"{CLIENT_LIBS} is missing: run `make bench-jvm`, which installs it")

    from backfill_platform_tests.e2e.services import free_port, wait_for

    result: dict = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "args": vars(args),
        "load_before": load_average(),
    }
    own = [_one(None) for _ in range(args.repeats)]
    print(f"own JVM: {own}", flush=True)
    port = free_port()
    work = Path(tempfile.mkdtemp(prefix="bench-jvm-"))
    before = _busy_seconds()
    server = _connect_server(port, work / "connect-server.log")
    try:
        wait_for("the Connect server", lambda: _listening(port, server), timeout=180)
        server_start = round(_busy_seconds() - before, 1)
        first = _one(f"sc://127.0.0.1:{port}")
        connect = [_one(f"sc://127.0.0.1:{port}") for _ in range(args.repeats)]
    finally:
        server.terminate()
        server.wait(timeout=60)
    print(f"Spark Connect: first {first}, then {connect}", flush=True)
    result.update(
        own_jvm=own, connect_server_start_cpu=server_start, connect_first=first,
        connect=connect, load_after=load_average(),
    )  # fmt: skip
    out = write_result("jvm-per-run", result)
    print("\n| way | processes | wall s (median) | machine CPU s (median, min-max) |")
    print("|---|---:|---:|---|")
    for way, runs in (("own JVM", own), ("Spark Connect, warm server", connect)):
        cpu = [r["cpu"] for r in runs]
        print(
            f"| {way} | {len(runs)} | {statistics.median(r['wall'] for r in runs):.1f} | "
            f"{statistics.median(cpu):.1f} ({min(cpu):.1f}-{max(cpu):.1f}) |"
        )
    print(
        f"\nthe server's start: {server_start} CPU s; its first client: {first['cpu']} CPU s\n"
        f"written {out} (load {result['load_before']} -> {result['load_after']})"
    )
    return 0


def _listening(port: int, server: subprocess.Popen) -> bool:
    import socket

    if server.poll() is not None:
        raise SystemExit(f"the Connect server exited ({server.returncode}): see its log")
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


if __name__ == "__main__":
    raise SystemExit(main())
