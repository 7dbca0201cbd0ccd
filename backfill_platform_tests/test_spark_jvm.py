"""The tests' JVM options survive Spark's launcher in a clone whose path has a space."""

import os
import shlex
import subprocess

import pytest

from backfill_platform_tests import spark_jvm

# spark-submit's own steps up to the java command: Spark's environment script, then the
# launcher, which prints the command it would run, NUL-separated.
LAUNCH_COMMAND = '. "$SPARK_HOME/bin/load-spark-env.sh" && exec java -cp "$SPARK_HOME/jars/*" \
org.apache.spark.launcher.Main org.apache.spark.deploy.SparkSubmit "$@"'


def java_command(submit_args: str) -> list[str]:
    """The driver JVM's command line Spark builds from `PYSPARK_SUBMIT_ARGS`, split as pyspark
    splits it."""
    done = subprocess.run(
        ["bash", "-c", LAUNCH_COMMAND, "launch", *shlex.split(submit_args)],
        env={
            **os.environ,
            "SPARK_HOME": str(spark_jvm.SPARK_HOME),
            "SPARK_CONF_DIR": spark_jvm.empty_conf_dir(),
        },
        capture_output=True,
        check=True,
    )
    return [a.decode() for a in done.stdout.split(b"\0") if a]


def test_the_archive_path_with_a_space_reaches_the_jvm_as_one_argument(tmp_path, monkeypatch):
    """A path split at its space made the JVM take the rest as its main class, so the archive
    was never built and `make test` failed in such a clone."""
    archive = tmp_path / "backfill platform" / "spark-tests.jsa"
    archive.parent.mkdir()
    archive.touch()
    monkeypatch.setattr(spark_jvm, "ARCHIVE", archive)
    assert f"-XX:SharedArchiveFile={archive}" in java_command(spark_jvm.submit_args())

    dumped = archive.with_name("dumped.jsa")
    command = java_command(spark_jvm.submit_args(spark_jvm.dump_options(dumped), spawned=True))
    assert f"-XX:ArchiveClassesAtExit={dumped}" in command


@pytest.mark.parametrize("spawned", [False, True])
def test_the_test_settings_reach_the_jvm(spawned):
    command = java_command(spark_jvm.submit_args(spawned=spawned))
    jit = spark_jvm.SPAWNED_JIT if spawned else spark_jvm.TEST_PROCESS_JVM
    assert set(jit.split()) <= set(command)
