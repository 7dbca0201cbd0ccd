"""How every JVM the tests start is launched: interpreted query evaluation and a class-data
sharing (CDS) archive of the classes Spark and Delta load at start-up.

The tests start hundreds of driver JVMs (each Dagster run of a test deployment, each CLI
process, each reliability worker). Loading and verifying Spark's classes is most of a JVM's
start: with the archive (`make test` builds it once, `python -m
backfill_platform_tests.spark_jvm`) a session's start took 15-20 s instead of 31-46 s on a
loaded 2-core machine. Java 17's CDS refuses a class path holding a non-empty directory, and
pyspark puts `SPARK_CONF_DIR` on it, so the settings of `spark-conf/spark-defaults.conf` go to
spark-submit as `--conf` (`PYSPARK_SUBMIT_ARGS`) and `SPARK_CONF_DIR` is an empty directory.
An archive that does not match the JVM or its class path is ignored silently (`-Xlog:disable`:
the JVM's warnings would go to stdout, which the CLI's `--json` owns); the run is only slower.
The product sets none of this; deployments keep Spark's defaults.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import pyspark

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULTS = Path(__file__).resolve().parent / "spark-conf" / "spark-defaults.conf"
CDS_DIR = REPO_ROOT / ".spark-jars" / "cds"
ARCHIVE = CDS_DIR / "spark-tests.jsa"
EMPTY_CONF_DIR = CDS_DIR / "conf"  # on the JVM's class path: must stay empty
SPARK_HOME = Path(pyspark.__file__).parent  # Spark's home as pip installs it


def test_settings() -> list[tuple[str, str]]:
    pairs = []
    for line in DEFAULTS.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, value = line.split(None, 1)
            pairs.append((key, value.strip()))
    return pairs


# The JVMs the tests spawn (Dagster runs, CLI processes, workers, the stream) live a minute
# or a few and do little work each: C1 alone compiles what they run at a fraction of C2's
# cost. A CLI backfill of 3 days x 12 orders took 44-49 CPU-s of the machine with it against
# 74-80 with tiered C2 (wall 39-42 s against 45-48 s); of 20 days x 100 orders, 62 against
# 102 (wall 52 s against 62 s). A test process's own JVM lives for its whole session and
# keeps C2: one two-minute test there took 172 s with C1 alone against 122-135 s.
# C1 alone shrinks the JVM's default code cache to 48 MB (240 MB when tiered), which a
# month's demo with the stream (`make demo STREAM=on` in test_readme.py) filled: compilation
# stopped, then the JVM died when it could not place a new call adapter, and the run failed
# with "py4j.reflection does not exist in the JVM". The cache is reserved address space,
# committed as it fills, so the tiered size costs nothing until it is used.
SPAWNED_JIT = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"

# A test process's own JVM keeps C2 but compiles only what stays hot: Spark's and Delta's
# driver code is vast and each path runs a few hundred times in a session, and C2 spent
# about 40 % of that JVM's CPU in its first five minutes (`jcmd PerfCounter.print`,
# java.ci.totalTime). With thresholds scaled by 4 and the parallel collector (no concurrent
# G1 threads; the other test worker keeps both cores busy anyway), test_crm.py and
# test_platform.py on 2 workers took 540 and 580 CPU-s against 645 to 745 with the defaults
# (wall 304 and 322 s against 347 to 396 s); either flag alone gained less, C1 alone cost
# more (746 CPU-s). docs/reliability.md, "CI time".
TEST_PROCESS_JVM = "-XX:CompileThresholdScaling=4 -XX:+UseParallelGC"


def submit_args(java_options: str | None = None, spawned: bool = False) -> str:
    """`PYSPARK_SUBMIT_ARGS`: the test settings, the archive when there is one and the JIT
    settings of a test process's JVM (`TEST_PROCESS_JVM`), or with `spawned` those of the
    short-lived JVMs a test starts (`SPAWNED_JIT`); `java_options` replaces the archive and
    the test process's settings."""
    args = [f"--conf {shlex.quote(f'{k}={v}')}" for k, v in test_settings()]
    if java_options is None:
        archive = (
            f"-XX:SharedArchiveFile={shlex.quote(str(ARCHIVE))} -Xlog:disable"
            if ARCHIVE.exists()
            else ""
        )
        java_options = f"{archive} {SPAWNED_JIT if spawned else TEST_PROCESS_JVM}".strip()
    elif spawned:
        java_options = f"{java_options} {SPAWNED_JIT}"
    if java_options:
        args.append(f"--driver-java-options {shlex.quote(java_options)}")
    return " ".join([*args, "pyspark-shell"])


def empty_conf_dir() -> str:
    EMPTY_CONF_DIR.mkdir(parents=True, exist_ok=True)
    return str(EMPTY_CONF_DIR)


WORKLOAD = """
import tempfile
from delta.tables import DeltaTable
from pyspark.sql import Observation, functions as F
from backfill_platform_tests.harness import spark_resource_for_tests

spark = spark_resource_for_tests().get_session()
root = tempfile.mkdtemp()
lines = spark.createDataFrame(
    [('{"order_id": "o1", "amount": 1.5, "event_time": "2024-01-01T10:00:00Z"}', "2024-01-01")],
    "value string, ingest_date string",
)
parsed = lines.withColumn(
    "r", F.from_json("value", "order_id string, amount decimal(18,2), event_time string")
).select("r.*", "ingest_date")
seen = Observation("rows")
parsed.observe(seen, F.count(F.lit(1)).alias("n")).write.format("delta").partitionBy(
    "ingest_date"
).save(root + "/t")
parsed.write.format("delta").mode("overwrite").option(
    "replaceWhere", "ingest_date = '2024-01-01'"
).save(root + "/t")
table = DeltaTable.forPath(spark, root + "/t")
table.alias("t").merge(parsed.alias("s"), "t.order_id = s.order_id").whenMatchedUpdateAll(
).whenNotMatchedInsertAll().execute()
table.history().collect()
df = spark.read.format("delta").load(root + "/t")
df.groupBy("ingest_date").agg(F.sum("amount")).join(df, "ingest_date").collect()
spark.stop()
"""


def dump_options(archive: Path) -> str:
    """The JVM options that write the archive at `archive` as the JVM exits (quoted: Spark's
    launcher splits the options at spaces, the clone's path may hold one)."""
    return f"-XX:ArchiveClassesAtExit={shlex.quote(str(archive))} -Xlog:cds=off,cds+dynamic=off"


def build_archive() -> Path:
    """Run a small Spark + Delta workload with `-XX:ArchiveClassesAtExit`, then move the
    archive into place (a half-written archive is never seen by a test JVM). The workload's
    JVM compiles with C1 alone, as a spawned one: the archive holds classes, not compiled
    code, and the build took 35.5-35.8 s instead of 40.2 s (2026-11-29, idle)."""
    CDS_DIR.mkdir(parents=True, exist_ok=True)
    EMPTY_CONF_DIR.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CDS_DIR) as work:
        dumped = Path(work) / "spark-tests.jsa"
        env = {
            **os.environ,
            "SPARK_CONF_DIR": str(EMPTY_CONF_DIR),
            "PYSPARK_SUBMIT_ARGS": submit_args(dump_options(dumped), spawned=True),
            "PYTHONPATH": str(REPO_ROOT),
        }
        # Pipes, not DEVNULL: reading them to their end waits for the JVM too, which writes
        # the archive as it exits, after the Python process has.
        done = subprocess.run(
            [sys.executable, "-c", WORKLOAD], env=env, cwd=REPO_ROOT, capture_output=True
        )
        if done.returncode or not dumped.exists():
            raise SystemExit(
                f"no class-data archive written (exit {done.returncode}):\n{done.stderr[-3000:]}"
            )
        dumped.replace(ARCHIVE)
    return ARCHIVE


if __name__ == "__main__":
    print(f"class-data archive for the tests' JVMs: {build_archive()}")
