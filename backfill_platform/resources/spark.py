"""One SparkSession per process, with Delta Lake on the classpath from pre-fetched jars.

Runs use the in-process executor, so every step of a run shares this session: a ranged
run pays the JVM start-up once. The Delta jars are fetched once by `make install`
(`resources/jars.py`), so no run waits on the network.
"""

from __future__ import annotations

import os
from pathlib import Path

from dagster import ConfigurableResource, InitResourceContext
from pydantic import Field
from pyspark.sql import SparkSession

REPO_ROOT = Path(__file__).resolve().parents[2]


def spark_jars_dir() -> Path:
    return Path(os.environ.get("BACKFILL_SPARK_JARS_DIR", REPO_ROOT / ".spark-jars"))


def delta_jars() -> list[str]:
    jars = sorted(str(p) for p in spark_jars_dir().glob("*.jar"))
    if not any("delta-spark" in Path(j).name for j in jars):
        raise RuntimeError(
            f"Delta Lake jars are missing from {spark_jars_dir()}; run `make install` "
            "(or `python -m backfill_platform.resources.jars --fetch-jars`)."
        )
    return jars


class SparkSessionResource(ConfigurableResource):
    """Typed Spark settings; `get_session()` returns the process's session, creating it once."""

    master: str = Field(default="local[*]", description="Spark master URL (SPARK_MASTER).")
    app_name: str = "backfill_platform"
    shuffle_partitions: int = Field(
        default=4, description="Few partitions: daily partitions are small, tasks cost overhead."
    )
    driver_memory: str = "3g"
    ui_enabled: bool = False
    extra_conf: dict[str, str] = Field(default_factory=dict)

    def get_session(self) -> SparkSession:
        active = SparkSession.getActiveSession()
        if active is not None:
            return active
        builder = SparkSession.builder.master(self.master).appName(self.app_name)
        for key, value in self._conf().items():
            builder = builder.config(key, value)
        session = builder.getOrCreate()
        session.sparkContext.setLogLevel("WARN")
        return session

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        """Drop what the run cached: the session outlives the run (in-process backfills run
        chunk after chunk in one session), so caches left behind would pile up in memory."""
        active = SparkSession.getActiveSession()
        if active is not None:
            active.catalog.clearCache()

    def _conf(self) -> dict[str, str]:
        conf = {
            "spark.jars": ",".join(delta_jars()),
            "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
            "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
            "spark.sql.session.timeZone": "UTC",
            "spark.sql.shuffle.partitions": str(self.shuffle_partitions),
            "spark.sql.adaptive.enabled": "true",
            "spark.sql.adaptive.skewJoin.enabled": "true",
            "spark.default.parallelism": str(max(2, self.shuffle_partitions)),
            # Delta rebuilds table state with this many tasks; its default (50) dominates
            # the cost of every small commit on a laptop-sized cluster.
            "spark.databricks.delta.snapshotPartitions": "2",
            "spark.driver.memory": self.driver_memory,
            "spark.ui.enabled": str(self.ui_enabled).lower(),
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.sources.partitionOverwriteMode": "static",
            "spark.databricks.delta.schema.autoMerge.enabled": "false",
            # A run that rewrites a range to the same empty state still leaves its commit,
            # so the log says which run last built every partition.
            "spark.databricks.delta.skipRecordingEmptyCommits": "false",
        }
        conf.update(self.extra_conf)
        return conf
