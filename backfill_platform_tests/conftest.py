"""One SparkSession for the whole test session; a fresh landing zone, lakehouse and Dagster
instance per test."""

import os

# Partitions are defined at import time from this setting; tests use 2024 dates.
os.environ.setdefault("BACKFILL_START_DATE", "2024-01-01")

import pytest

from backfill_platform_tests.harness import Platform, spark_resource_for_tests


@pytest.fixture(scope="session")
def spark():
    session = spark_resource_for_tests().get_session()
    yield session
    session.stop()


@pytest.fixture
def platform(tmp_path, spark) -> Platform:
    return Platform.create(tmp_path)
