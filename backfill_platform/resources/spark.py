"""The Spark session: typed settings, Delta on the classpath, one session per process.

Runs use the in-process executor, so every step of a run shares the session and the runs
of a chunked backfill reuse it: the JVM starts once. dagster-pyspark's LazyPySparkResource
creates the session (lazily, one handle per run); this resource gives it typed settings,
Delta's jars and extensions, and clears caches at run end without stopping the session
(docs/spark-resource.md says why it wraps rather than subclasses). The jars are fetched
once by `make install` (`resources/jars.py`), so no run waits on the network.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from dagster import ConfigurableResource, EnvVar, InitResourceContext
from dagster_pyspark import LazyPySparkResource
from pydantic import Field, PrivateAttr
from pyspark.errors import PySparkRuntimeError
from pyspark.sql import SparkSession

REPO_ROOT = Path(__file__).resolve().parents[2]
# The driver's log4j2 configuration: warnings and errors, without start-up chatter.
LOG4J2_CONFIG = Path(__file__).resolve().with_name("log4j2.properties")
# Delta's commit protocol on S3 across machines (build-support/s3-log-store,
# docs/object-storage.md).
LOG_STORE_JAR = "backfill-s3-log-store.jar"
S3_LOG_STORE = "backfill_platform.S3ConditionalLogStore"
# Hadoop's local file system without a `chmod` process per file and folder it creates
# (build-support/local-file-system, docs/performance.md).
LOCAL_FS_JAR = "backfill-local-fs.jar"
LOCAL_FS = "backfill_platform.NioLocalFileSystem"
DRIVER_CLASS_PATH = "spark.driver.extraClassPath"


def spark_jars_dir() -> Path:
    return Path(os.environ.get("BACKFILL_SPARK_JARS_DIR", REPO_ROOT / ".spark-jars"))


class SparkJarsMissing(RuntimeError):
    """Delta Lake's jars are not where the session looks for them (`make install` fetches)."""


def delta_jars() -> list[str]:
    jars = sorted(str(p) for p in spark_jars_dir().glob("*.jar"))
    if not any("delta-spark" in Path(j).name for j in jars):
        raise SparkJarsMissing(
            f"Delta Lake jars are missing from {spark_jars_dir()}; run `make install` "
            "(or `python -m backfill_platform.resources.jars --fetch-jars`)."
        )
    return jars


# Spark keeps the status of its last 1,000 SQL queries (each with its physical plan's text),
# jobs and stages for its UI, and keeps them with the UI off too, when nothing reads them. In
# a long-lived driver that is the heap's growth: the stream's JVM went from 119 MB after its
# first simulated day to 184 MB after its eighth (`make soak-stream`, heap after a full GC),
# its 1,000 executions' plans 88 MB of it. With the UI off, a few of each are kept.
STATUS_STORE_WITHOUT_UI = {
    "spark.sql.ui.retainedExecutions": "20",
    "spark.ui.retainedJobs": "50",
    "spark.ui.retainedStages": "50",
}


class SparkSessionResource(ConfigurableResource):
    """Typed Spark settings; `get_session()` returns the process's session, creating it once.

    The session is never stopped here: a chunked backfill runs chunk after chunk in one
    process and every run after the first reuses it.
    """

    master: str = Field(default="local[*]", description="Spark master URL (SPARK_MASTER).")
    app_name: str = "backfill_platform"
    shuffle_partitions: int = Field(
        default=4, description="Few partitions: daily partitions are small, tasks cost overhead."
    )
    driver_memory: str = "3g"
    ui_enabled: bool = False
    codegen_cache_entries: int = Field(
        default=1000,
        description="Compiled query classes Spark keeps (spark.sql.codegen.cache.maxEntries): "
        "a run's queries repeat from run to run; a stream's carry each batch's own literals.",
    )
    s3_endpoint: str = Field(
        default="", description="S3 endpoint URL; empty: AWS for the region (BACKFILL_S3_ENDPOINT)."
    )
    s3_region: str = Field(default="us-east-1", description="S3 region (BACKFILL_S3_REGION).")
    s3_path_style: bool = Field(
        default=False, description="Path-style bucket addressing (BACKFILL_S3_PATH_STYLE)."
    )
    s3_access_key_id: str = Field(
        default="",
        description="Empty: the AWS default credential chain (BACKFILL_S3_ACCESS_KEY_ID).",
    )
    s3_secret_access_key: str = Field(
        default="", description="Read from BACKFILL_S3_SECRET_ACCESS_KEY; never printed."
    )
    extra_conf: dict[str, str] = Field(default_factory=dict)
    _pyspark: LazyPySparkResource | None = PrivateAttr(default=None)

    def get_session(self) -> SparkSession:
        """The process's session, created with `spark_config()` if there is none yet.

        One dagster-pyspark handle per resource instance, and Dagster makes one instance per
        run: an existing session gets this resource's runtime SQL settings again (Spark's
        getOrCreate), static ones (jars, memory, master) stay as the first run set them.
        No session (none yet, a stopped one) means a new handle. A new thread of the run (a
        check's queries run at once, `checks.results.at_once`) has no active session of its
        own but shares the handle's: building a handle there again cost 15-60 ms a thread,
        the settings sent to the JVM one by one, for the same session.
        """
        try:
            live = SparkSession.active()  # this thread's session, else the process's default
        except PySparkRuntimeError:  # NO_ACTIVE_OR_DEFAULT_SESSION: none yet, or stopped
            live = None
        if self._pyspark is not None and live is self._pyspark.spark_session:
            return live
        self._pyspark = self.pyspark_resource()
        if live is None:
            self._pyspark.spark_session.sparkContext.setLogLevel("WARN")
        return self._pyspark.spark_session

    def pyspark_resource(self) -> LazyPySparkResource:
        """These settings as dagster-pyspark's resource, for code written against it."""
        return LazyPySparkResource(spark_config=self.spark_config())

    @contextmanager
    def temporary_conf(self, settings: Mapping[str, str | None]) -> Iterator[SparkSession]:
        """Runtime settings for the block only (None: unset), then put back as they were.

        Every run in the process shares the session, so a setting one operation needs
        (VACUUM below Delta's retention check, RESTORE's commit metadata) must not outlive
        it, error or not.
        """
        with session_conf(self.get_session(), settings) as session:
            yield session

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        """Drop what the run cached: the session outlives the run (in-process backfills run
        chunk after chunk in one session), so caches left behind would pile up in memory."""
        active = SparkSession.getActiveSession()
        if active is not None:
            active.catalog.clearCache()

    def spark_config(self) -> dict[str, str]:
        """Every setting the session is created with; `extra_conf` overrides the others."""
        conf = {
            "spark.master": self.master,
            "spark.app.name": self.app_name,
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
            # A run keeps the ranges it writes in memory for its later steps (lakehouse.py
            # `KeptRange`); encoding them costs more than it saves: 276k staging rows took
            # 0.7 s more to write compressed, 0.2 s more uncompressed (33 MB).
            "spark.sql.inMemoryColumnarStorage.compressed": "false",
            # Spark keeps 100 compiled query classes; a run's queries need several hundred,
            # most the same in every run (the checks', Delta's own), so at 100 each run
            # compiled them again: 16 one-day runs compiled 3,200 classes, 640 with 1,000
            # kept (docs/performance.md). Each kept class holds its source in the heap, so
            # the long-lived stream keeps Spark's 100 (`STREAM_CODEGEN_CACHE_ENTRIES`).
            "spark.sql.codegen.cache.maxEntries": str(self.codegen_cache_entries),
            "spark.driver.memory": self.driver_memory,
            # Read when the driver JVM starts (pyspark passes the conf to spark-submit);
            # `defaultJavaOptions` leaves `extraJavaOptions` to deployments.
            "spark.driver.defaultJavaOptions": (
                f"-Dlog4j2.configurationFile={LOG4J2_CONFIG.as_uri()}"
            ),
            "spark.ui.enabled": str(self.ui_enabled).lower(),
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.sources.partitionOverwriteMode": "static",
            "spark.databricks.delta.schema.autoMerge.enabled": "false",
            # A run that rewrites a range to the same empty state still leaves its commit,
            # so the log says which run last built every partition.
            "spark.databricks.delta.skipRecordingEmptyCommits": "false",
            # Every table the platform creates records its changes: the drift check reads a
            # run's commit from it instead of rebuilding the version before (checks/drift.py).
            # A replace of whole partitions writes no extra files for it.
            "spark.databricks.delta.properties.defaults.enableChangeDataFeed": "true",
        }
        if not self.ui_enabled:
            conf.update(STATUS_STORE_WITHOUT_UI)
        conf.update(self.s3_config())
        local_fs = self.local_fs_config()
        conf.update(local_fs)
        conf.update(self.extra_conf)
        if DRIVER_CLASS_PATH in local_fs and DRIVER_CLASS_PATH in self.extra_conf:
            conf[DRIVER_CLASS_PATH] = (
                f"{local_fs[DRIVER_CLASS_PATH]}:{self.extra_conf[DRIVER_CLASS_PATH]}"
            )
        return conf

    def local_fs_config(self) -> dict[str, str]:
        """`file://` paths through `NioLocalFileSystem` in a local session, whose tasks run
        in the driver: a run writing a table's 1,096 daily partitions spawned 2,343 `chmod`
        processes with Hadoop's own. Its jar goes on the driver's class path, where Hadoop
        looks from the JVM's start (spark-submit reads files before `spark.jars` are
        loaded); in every session, so the tests' class-data archive matches any driver. A
        cluster's executors keep Hadoop's file system. Nothing is set without the jar."""
        jar = spark_jars_dir() / LOCAL_FS_JAR
        if not jar.exists():
            return {}
        conf = {DRIVER_CLASS_PATH: str(jar)}
        if self.master.startswith("local"):
            conf["spark.hadoop.fs.file.impl"] = LOCAL_FS
        return conf

    def s3_config(self) -> dict[str, str]:
        """S3A settings for `s3a://` roots, and the commit log store that makes concurrent
        writers on several machines safe there (Delta's default S3 store is single-driver).

        Credentials go to Hadoop's configuration only when set; otherwise S3A's default
        chain (AWS_* variables, profile, instance role) applies. Spark redacts
        `*.secret.key` in its UI and logs (`spark.redaction.regex`).
        """
        conf = {
            "spark.delta.logStore.s3a.impl": S3_LOG_STORE,
            "spark.hadoop.fs.s3a.create.conditional.enabled": "true",
            "spark.hadoop.fs.s3a.endpoint.region": self.s3_region,
            "spark.hadoop.fs.s3a.path.style.access": str(self.s3_path_style).lower(),
        }
        if self.s3_endpoint:
            conf["spark.hadoop.fs.s3a.endpoint"] = self.s3_endpoint
            conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(
                self.s3_endpoint.startswith("https:")
            ).lower()
        access_key, secret_key = map(_value, (self.s3_access_key_id, self.s3_secret_access_key))
        if access_key:
            conf["spark.hadoop.fs.s3a.access.key"] = access_key
            conf["spark.hadoop.fs.s3a.secret.key"] = secret_key
            conf["spark.hadoop.fs.s3a.aws.credentials.provider"] = (
                "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
            )
        return conf


def _value(text: str) -> str:
    """An `EnvVar` field's value: Dagster resolves it for runs, but the CLI and sensors use
    the resource as built, with the EnvVar still in place (it refuses `str()`)."""
    return (text.get_value() or "") if isinstance(text, EnvVar) else text


@contextmanager
def session_conf(
    session: SparkSession, settings: Mapping[str, str | None]
) -> Iterator[SparkSession]:
    """`temporary_conf` on a session already at hand (code below the resource, such as the
    zero-copy commit, gets a session, not the resource)."""
    previous = {key: session.conf.get(key, None) for key in settings}
    try:
        _set_conf(session, settings)
        yield session
    finally:
        _set_conf(session, previous)


def _set_conf(session: SparkSession, settings: Mapping[str, str | None]) -> None:
    for key, value in settings.items():
        if value is None:
            session.conf.unset(key)
        else:
            session.conf.set(key, value)
