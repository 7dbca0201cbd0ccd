"""Fetch Delta's jars once, at install time, so no run waits on the network.

    python -m backfill_platform.resources.jars --fetch-jars   # `make jars` runs this
    python -m backfill_platform.resources.jars --check        # start Spark, write a Delta table

Kept apart from the session resource: this is a build step (Maven, a temporary directory,
a command line); `resources/spark.py` only looks the fetched jars up.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from backfill_platform.resources.spark import REPO_ROOT, SparkSessionResource, spark_jars_dir

DELTA_JARS_POM = REPO_ROOT / "build-support" / "delta-jars.pom.xml"


def fetch_delta_jars(target: Path | None = None) -> list[Path]:
    """Resolve the Delta jars through Maven (which honours the machine's Maven settings).

    Only `io.delta` artifacts are kept: everything else they depend on ships with pyspark,
    and a second copy of Jackson or Parquet on the classpath breaks Spark.
    """
    target = target or spark_jars_dir()
    if any(target.glob("delta-spark*.jar")):
        return sorted(target.glob("*.jar"))
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [
                "mvn",
                "-q",
                "-B",
                "-f",
                str(DELTA_JARS_POM),
                "dependency:copy-dependencies",
                "-DincludeScope=runtime",
                "-DincludeGroupIds=io.delta",
                f"-DoutputDirectory={tmp}",
            ],
            check=True,
        )
        target.mkdir(parents=True, exist_ok=True)
        for jar in Path(tmp).glob("*.jar"):
            shutil.copy2(jar, target / jar.name)
    return sorted(target.glob("*.jar"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fetch-jars", action="store_true", help="download the Delta jars")
    parser.add_argument("--check", action="store_true", help="start Spark and write a Delta table")
    args = parser.parse_args(argv)
    if args.fetch_jars:
        for jar in fetch_delta_jars():
            print(jar)
    if args.check:
        spark = SparkSessionResource(master="local[1]").get_session()
        with tempfile.TemporaryDirectory() as tmp:
            spark.range(3).write.format("delta").save(tmp + "/t")
            rows = spark.read.format("delta").load(tmp + "/t").count()
        print(f"spark {spark.version} with Delta: ok ({rows} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
