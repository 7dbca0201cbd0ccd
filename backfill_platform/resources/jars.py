"""Fetch the session's jars once, at install time, so no run waits on the network.

    python -m backfill_platform.resources.jars --fetch-jars   # `make jars` runs this
    python -m backfill_platform.resources.jars --check        # start Spark, write a Delta table

Five sets in `.spark-jars/`: Delta Lake; S3A (hadoop-aws and the AWS SDK modules it
loads), for lakehouses and landing zones on `s3a://`; the project's commit log store for
S3 (`build-support/s3-log-store`) and its local file system without `chmod` processes
(`build-support/local-file-system`), each compiled here with the JDK against those jars; and
Spark's Kafka source for the live stream. The Kafka broker's own jars (demo and tests) go to
`.spark-jars/kafka-broker/`, off the session's classpath (`sources/kafka_broker.py`).

Kept apart from the session resource: this is a build step (Maven, javac, a temporary
directory, a command line); `resources/spark.py` only looks the fetched jars up.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pyspark

from backfill_platform.resources.spark import (
    LOCAL_FS_JAR,
    LOG_STORE_JAR,
    REPO_ROOT,
    SparkSessionResource,
    spark_jars_dir,
)

BUILD_SUPPORT = REPO_ROOT / "build-support"
DELTA_JARS_POM = BUILD_SUPPORT / "delta-jars.pom.xml"
S3_JARS_POM = BUILD_SUPPORT / "s3-jars.pom.xml"
KAFKA_SPARK_POM = BUILD_SUPPORT / "kafka-spark.pom.xml"
KAFKA_BROKER_POM = BUILD_SUPPORT / "kafka-broker.pom.xml"
LOG_STORE_SOURCES = BUILD_SUPPORT / "s3-log-store" / "src"
LOCAL_FS_SOURCES = BUILD_SUPPORT / "local-file-system" / "src"
# Only these groups are kept: everything else they depend on ships with pyspark, and a
# second copy of Jackson, Netty or Parquet on the classpath breaks Spark.
DELTA_GROUPS = "io.delta"
S3_GROUPS = (
    "org.apache.hadoop,software.amazon.awssdk,software.amazon.eventstream,"
    "software.amazon.s3.analyticsaccelerator,org.reactivestreams"
)
# Spark's Kafka connector: the rest of its dependencies (Hadoop, Scala, codecs) ship with pyspark.
KAFKA_SPARK_ARTIFACTS = (
    "spark-sql-kafka-0-10_2.13,spark-token-provider-kafka-0-10_2.13,kafka-clients,commons-pool2"
)
KAFKA_BROKER_DIR = "kafka-broker"


def _maven_copy(pom: Path, groups: str, target: Path, artifacts: str = "") -> None:
    """Resolve `pom` through Maven (which honours the machine's Maven settings); keep the
    jars of `groups` (all groups when empty), and of `artifacts` when given."""
    with tempfile.TemporaryDirectory() as tmp:
        # Maven's output only on failure: quiet as it is, it still writes ANSI resets.
        fetched = subprocess.run(
            [
                "mvn",
                "-q",
                "-B",
                "-f",
                str(pom),
                "dependency:copy-dependencies",
                "-DincludeScope=runtime",
                *([f"-DincludeGroupIds={groups}"] if groups else []),
                *([f"-DincludeArtifactIds={artifacts}"] if artifacts else []),
                f"-DoutputDirectory={tmp}",
            ],
            capture_output=True,
            text=True,
        )
        if fetched.returncode != 0:
            sys.stderr.write(fetched.stdout + fetched.stderr)
            fetched.check_returncode()
        target.mkdir(parents=True, exist_ok=True)
        for jar in Path(tmp).glob("*.jar"):
            shutil.copy2(jar, target / jar.name)


def build_classes(sources: Path, jar_name: str, target: Path) -> Path:
    """Compile the project's Java classes under `sources` into `target/jar_name`, against
    pyspark's Hadoop and the Delta and S3A jars already in `target`."""
    pyspark_jars = Path(pyspark.__file__).parent / "jars"
    classpath = [f"{pyspark_jars}/*", *map(str, target.glob("delta-storage-*.jar"))]
    classpath += map(str, target.glob("hadoop-aws-*.jar"))
    files = sorted(str(p) for p in sources.rglob("*.java"))
    jar = target / jar_name
    with tempfile.TemporaryDirectory() as classes:
        subprocess.run(
            ["javac", "--release", "17", "-d", classes, "-cp", ":".join(classpath), *files],
            check=True,
        )
        with zipfile.ZipFile(jar, "w") as archive:
            for compiled in sorted(Path(classes).rglob("*.class")):
                archive.write(compiled, compiled.relative_to(classes).as_posix())
    return jar


def fetch_jars(target: Path | None = None) -> list[Path]:
    """Every jar the session needs; a set already present is not fetched again."""
    target = target or spark_jars_dir()
    if not any(target.glob("delta-spark*.jar")):
        _maven_copy(DELTA_JARS_POM, DELTA_GROUPS, target)
    if not any(target.glob("hadoop-aws-*.jar")):
        _maven_copy(S3_JARS_POM, S3_GROUPS, target)
    if not any(target.glob("spark-sql-kafka-*.jar")):
        _maven_copy(KAFKA_SPARK_POM, "", target, KAFKA_SPARK_ARTIFACTS)
    if not any((target / KAFKA_BROKER_DIR).glob("kafka_2.13-*.jar")):
        _maven_copy(KAFKA_BROKER_POM, "", target / KAFKA_BROKER_DIR)
    for sources, name in ((LOG_STORE_SOURCES, LOG_STORE_JAR), (LOCAL_FS_SOURCES, LOCAL_FS_JAR)):
        jar = target / name
        newest = max(p.stat().st_mtime for p in sources.rglob("*.java"))
        if not jar.exists() or jar.stat().st_mtime < newest:
            build_classes(sources, name, target)
    return sorted(target.glob("*.jar"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fetch-jars", action="store_true", help="fetch and build the jars")
    parser.add_argument("--check", action="store_true", help="start Spark and write a Delta table")
    args = parser.parse_args(argv)
    if args.fetch_jars:
        jars = fetch_jars()
        print(f"{len(jars)} jars in {jars[0].parent if jars else '(none)'}")
    if args.check:
        spark = SparkSessionResource(master="local[1]").get_session()
        with tempfile.TemporaryDirectory() as tmp:
            spark.range(3).write.format("delta").save(tmp + "/t")
            rows = spark.read.format("delta").load(tmp + "/t").count()
        print(f"spark {spark.version} with Delta: ok ({rows} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
