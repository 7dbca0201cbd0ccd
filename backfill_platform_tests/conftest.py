"""One SparkSession for the whole test session; a fresh landing zone, lakehouse and Dagster
instance per test."""

import os

from backfill_platform_tests.spark_jvm import empty_conf_dir, submit_args

# Partitions are defined at import time from this setting; tests use 2024 dates.
os.environ.setdefault("BACKFILL_START_DATE", "2024-01-01")
# Every JVM the tests start (theirs, and the Dagster runs, CLI processes and workers they
# spawn): interpreted query evaluation and the class-data archive (spark_jvm.py says why).
# A deployment test may point SPARK_CONF_DIR at its own.
os.environ.setdefault("SPARK_CONF_DIR", empty_conf_dir())
os.environ.setdefault("PYSPARK_SUBMIT_ARGS", submit_args())
# Run under `make test`, the README's commands a test runs would otherwise be sub-makes, which
# print "Entering directory" lines a newcomer's `make demo` never shows.
os.environ.pop("MAKELEVEL", None)
os.environ.pop("MAKEFLAGS", None)
os.environ.pop("MFLAGS", None)

import json

import pytest

from backfill_platform.sources.crm_process import start_crm_server
from backfill_platform_tests.harness import Platform, spark_resource_for_tests

# pytest-xdist hands out test files (`make e2e`: deployment groups) one per worker to
# start, then one as a worker is about to free up. By default it orders them by their number
# of tests; `make test`, `make reliability` and `make e2e` pass --no-loadscope-reorder so they
# go in this order instead, the longest first, and the short files fill the end: a long file
# handed out last runs alone while the other worker sits idle (`make test` ended on
# test_bench.py alone for 87 s on 2026-11-29; `make reliability` in xdist's order handed out
# its 316 s stream-beside-a-backfill trial among the last). Seconds per file (per phase, only
# the order within a phase matters) from a clean-clone CI run's --durations on 2026-12-03;
# `test_cli_deployment.py` stands for the e2e files that share one deployment, the largest
# group, so it goes first. Files not named here (well under a minute each) follow in name
# order.
LONGEST_FIRST = (
    "test_service_faults.py",  # reliability 662 s (3 trials)
    "test_cli_deployment.py",  # e2e shared deployment ~1,300 s with the scaled-out one
    "test_stream_deployed_backfill.py",  # e2e 549 s
    "test_stream.py",  # ~500 s
    "test_ui_journey.py",  # e2e 475 s
    "test_readme.py",  # 443 s, the README's commands one after the other
    "test_bench.py",  # `make bench-smoke` (marked bench) 415 s
    "test_stale_repair_deployed.py",  # e2e 412 s
    "test_live_backfill.py",  # reliability 340 s
    "test_stream_backfill.py",  # reliability 316 s
    "test_stream_kill.py",  # reliability 266 s
    "test_crm.py",  # ~250 s
    "test_object_storage.py",  # e2e ~250 s
    "test_operations.py",  # ~240 s
    "test_kill.py",  # reliability 222 s
    "test_correction_playbook.py",  # reliability 222 s
    "test_stream_fold.py",  # 202 s
    "test_storage_faults.py",  # reliability ~180 s
    "test_first_hour.py",  # ~130 s
    "test_contract_answer.py",  # 106 s
    "test_platform.py",  # ~100 s
    "test_hostile.py",  # reliability ~95 s
    "test_automation.py",  # 84 s
    "test_properties.py",  # reliability ~80 s
    "test_lakehouse.py",  # 78 s
    "test_concurrency.py",  # reliability 76 s
    "test_operator_input.py",  # 73 s
    "test_checks.py",  # ~70 s
    "test_hostile_operations.py",  # reliability ~70 s
)


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


# Every backfill calls the CRM: the session's demo CRM knows no one (every customer 404)
# and admits far more than tests need; CRM tests start their own servers.
SESSION_CRM_TOKEN = "session-crm-token"


@pytest.fixture(scope="session", autouse=True)
def session_crm(tmp_path_factory):
    data = tmp_path_factory.mktemp("session_crm")
    (data / "customers.json").write_text(json.dumps({"customers": {}}))
    server = start_crm_server(data, token=SESSION_CRM_TOKEN, rate=1000)
    saved = {k: os.environ.get(k) for k in ("BACKFILL_CRM_URL", "BACKFILL_CRM_TOKEN")}
    os.environ.setdefault("BACKFILL_CRM_RATE_LIMIT", "1000")
    os.environ["BACKFILL_CRM_URL"] = server.url
    os.environ["BACKFILL_CRM_TOKEN"] = SESSION_CRM_TOKEN
    yield server
    server.stop()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def spark():
    session = spark_resource_for_tests().get_session()
    yield session
    session.stop()


@pytest.fixture(scope="session", autouse=True)
def spawned_jvms_compile_with_c1(spark):
    """This process's JVM first, with the default JIT; then every JVM it spawns gets C1
    alone (spark_jvm.SPAWNED_JIT says why), unless the caller set its own arguments."""
    if os.environ["PYSPARK_SUBMIT_ARGS"] == submit_args():
        os.environ["PYSPARK_SUBMIT_ARGS"] = submit_args(spawned=True)


@pytest.fixture
def platform(tmp_path, spark) -> Platform:
    return Platform.create(tmp_path)
