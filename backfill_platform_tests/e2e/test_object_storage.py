"""The lakehouse and landing zone on S3-compatible object storage (a real versitygw server on
127.0.0.1): concurrent writers that share nothing but the store, and the correction playbook.

The writer tests run each writer as its own process with its own JVM and no lock directory
in common, as writers on different machines would be (`s3_writer.py`). Every commit a writer
reports is looked up by its token in the table's Delta history afterwards: a commit that
reported success and is not there was lost.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from datetime import date, timedelta
from pathlib import Path

import pytest
from dagster import DagsterInstance

from backfill_platform.definitions import all_assets, build_resources
from backfill_platform.reconcile import fingerprints, reconcile_marts
from backfill_platform.resources import LakehouseResource, LandingZoneResource
from backfill_platform.resources.lakehouse import CONFLICT_ATTEMPTS
from backfill_platform.resources.landing import FX_RATES, ORDERS
from backfill_platform.runner import backfill
from backfill_platform.tables import TABLE_NAMES
from backfill_platform_tests.e2e.conftest import FIRST_DAY, LAST_DAY, generated_landing
from backfill_platform_tests.e2e.object_store import S3Server
from backfill_platform_tests.e2e.s3_writer import ROWS_PER_DAY
from backfill_platform_tests.e2e.services import REPO_ROOT
from backfill_platform_tests.harness import contest, spark_resource_for_tests
from backfill_platform_tests.test_operations import run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ARTIFACTS = REPO_ROOT / "test-artifacts" / "object-storage"
MARTS = "marts/fct_daily_revenue,marts/customer_ltv"


@pytest.fixture(scope="module")
def s3(tmp_path_factory, spark) -> S3Server:
    server = S3Server(tmp_path_factory.mktemp("s3"))
    server.start()
    server.configure(spark)
    yield server
    server.stop()


def days(first: date, count: int) -> list[str]:
    return [(first + timedelta(days=i)).isoformat() for i in range(count)]


def race(s3: S3Server, tmp: Path, root: str, plan: dict[int, list[str]], **options) -> list[dict]:
    """Start one writer process per entry of `plan` (writer -> its days), let them all
    commit at once, and return what each reported."""
    go = tmp / "go"
    env = {**os.environ, **s3.env(), "PYTHONPATH": str(REPO_ROOT)}
    extra = [f"--{k.replace('_', '-')}={v}" for k, v in options.items()]
    procs = []
    for writer, writer_days in plan.items():
        out = tmp / f"writer-{writer}.json"
        args = [sys.executable, "-m", "backfill_platform_tests.e2e.s3_writer", "--root", root]
        args += ["--table", "raw/race", "--writer", str(writer), "--days", ",".join(writer_days)]
        args += ["--go", str(go), "--out", str(out), *extra]
        log = open(tmp / f"writer-{writer}.log", "wb")  # noqa: SIM115 - closed below
        writer_proc = subprocess.Popen(
            args, env=env, stdout=log, stderr=log, start_new_session=True
        )
        procs.append((out, log, writer_proc))
    try:
        deadline = time.monotonic() + 300
        while not all(Path(str(out) + ".ready").exists() for out, _, _ in procs):
            assert all(p.poll() is None for _, _, p in procs), _logs(tmp)
            assert time.monotonic() < deadline, "writers did not start in 300 s\n" + _logs(tmp)
            time.sleep(0.2)
        go.write_text("go")
        reports = []
        for out, log, proc in procs:
            assert proc.wait(timeout=600) == 0, _logs(tmp)
            log.close()
            reports.append(json.loads(out.read_text()))
        return reports
    finally:  # a writer (and its JVM) left by a failed wait would race on after the test
        for _, log, proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            log.close()


def _logs(tmp: Path) -> str:
    return "\n".join(
        f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
        for p in sorted(tmp.glob("writer-*.log"))
    )


def outcome(spark, root: str, reports: list[dict]) -> dict:
    """What the table kept against what the writers said they committed."""
    lake = LakehouseResource(root_dir=root, spark=spark_resource_for_tests())
    history = lake.history("raw/race")
    kept = {h["metadata"].get("commit_token") for h in history}
    reported = [c["token"] for r in reports for c in r["commits"]]
    # Delta reported these committed, and the platform's after-write check did not find them.
    lost_on_verify = [x for r in reports for x in r["lost"]]
    rows = lake.read("raw/race").groupBy("day", "writer").count().collect()
    writers = contest(history)
    return {
        "versions": len(history),
        # Commits Delta placed after a version someone else took first (it read version
        # `read_version` and committed later than the next one): the race happened.
        "commits_past_a_conflict": writers["concurrent"],
        "reported_commits": len(reported),
        "lost_commits": len([t for t in reported if t not in kept]) + len(lost_on_verify),
        "lost_on_verify": len(lost_on_verify),
        "rows": sum(r["count"] for r in rows),
        "rows_by_day": {
            str(r["day"]): (r["writer"], r["count"]) for r in sorted(rows, key=lambda r: r["day"])
        },
        "failures": [f for r in reports for f in r["failures"]],
        "platform_retries": sum(r["retries"] for r in reports),
        # The same retries as each winning commit recorded them (a write that gave up
        # committed nothing, so its retries are in the writers' counts alone).
        "retries_in_history": writers["conflicts_retried"],
    }


def record(name: str, figures: dict) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / f"{name}.json").write_text(json.dumps(figures, indent=2, sort_keys=True))
    print(f"\n{name}: {json.dumps(figures, sort_keys=True)[:600]}")


# Days each writer of the disjoint race commits, one commit a day. The race is for the
# versions, from the table's creation on, not for the days: three rounds of four contenders
# collide as six did, at half the commits.
DISJOINT_DAYS = 3


def test_four_writers_on_disjoint_days_lose_no_commit(s3, spark, tmp_path):
    """Four processes, three days each, all racing for the same versions from the first
    commit (the table's creation) on: every reported commit is in the history, once."""
    root = s3.bucket("disjoint") + "/lake"
    n = DISJOINT_DAYS
    plan = {w: days(date(2024, 1, 1) + timedelta(days=n * w), n) for w in range(4)}
    result = outcome(spark, root, race(s3, tmp_path, root, plan))
    record("disjoint_writers_conditional_log_store", result)
    assert result["failures"] == [] and result["lost_on_verify"] == 0, result
    assert result["reported_commits"] == 4 * n and result["lost_commits"] == 0, result
    assert result["versions"] == 4 * n, result
    # The writers did collide: commits landed past versions another writer had taken.
    assert result["commits_past_a_conflict"] + result["platform_retries"] > 0, result
    assert result["retries_in_history"] == result["platform_retries"], result
    assert result["rows"] == 4 * n * ROWS_PER_DAY, result
    owner = {d: w for w, ds in plan.items() for d in ds}
    assert {d: w for d, (w, _) in result["rows_by_day"].items()} == owner


def test_two_writers_of_the_same_days_leave_one_winner_per_day(s3, spark, tmp_path):
    """Both replace the same three days twice: Delta finds the overlapping replaces in
    conflict, the platform retries the loser, and each day ends with exactly one writer's
    rows, never both, never half. A write that gives up says so and committed nothing."""
    root = s3.bucket("overlap") + "/lake"
    same = days(date(2024, 2, 1), 3)
    reports = race(s3, tmp_path, root, {0: same, 1: same}, rounds=2)
    result = outcome(spark, root, reports)
    record("overlapping_writers_conditional_log_store", result)
    assert result["lost_commits"] == 0, result
    # The race happened: the loser's replace conflicted and was run again.
    assert result["platform_retries"] + len(result["failures"]) > 0, result
    assert set(result["rows_by_day"]) == set(same), result
    assert all(count == ROWS_PER_DAY for _, count in result["rows_by_day"].values()), result
    assert result["versions"] == result["reported_commits"], result
    assert result["reported_commits"] + len(result["failures"]) == 12, result
    gave_up = len(result["failures"]) * (CONFLICT_ATTEMPTS - 1)
    assert result["retries_in_history"] + gave_up == result["platform_retries"], result
    for failure in result["failures"]:
        assert "conflicted with concurrent writers" in failure["error"], failure
        assert "committed nothing" in failure["error"], failure


@pytest.mark.hazard
def test_delta_default_s3_log_store_loses_commits_the_project_store_keeps(s3, spark, tmp_path):
    """The same race as the disjoint test with Delta's own S3 log store (single driver):
    writers that share no JVM both "create" version N and one commit vanishes while its
    writer reports success; a writer whose cached state no longer matches the log may also
    fail outright. This is what the conditional-write store prevents."""
    results = []
    for attempt in range(3):
        root = s3.bucket(f"default-store-{attempt}") + "/lake"
        plan = {w: days(date(2024, 3, 1) + timedelta(days=6 * w), 6) for w in range(4)}
        work = tmp_path / str(attempt)
        work.mkdir()
        reports = race(s3, work, root, plan, log_store="delta-default")
        results.append(outcome(spark, root, reports))
        if results[-1]["lost_commits"]:
            break
    record("disjoint_writers_delta_default_log_store", results[-1] | {"attempts": len(results)})
    lost = results[-1]
    # Every write is accounted for: reported committed, caught by the platform's after-write
    # check (`lost_on_verify`), or failed (the overwritten log broke a writer's snapshot).
    accounted = lost["reported_commits"] + lost["lost_on_verify"] + len(lost["failures"])
    assert accounted == 24, lost
    # A commit Delta reported as done is not in the table: the default store lost it.
    assert lost["lost_commits"] > 0, results
    assert lost["versions"] < 24 and lost["rows"] < 24 * ROWS_PER_DAY, lost


# -- the playbook on s3a -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def lake_on_s3(s3, spark, tmp_path_factory):
    """Every asset over the e2e days, in-process, on a lakehouse and landing zone in a bucket;
    the same backfill on local disk, for the row-for-row comparison and the wall times."""
    work = tmp_path_factory.mktemp("s3-pipeline")
    landing = generated_landing(work)
    bucket = s3.bucket("lakehouse")
    s3.upload(spark, landing, bucket + "/landing")
    timings, prints = {}, {}
    # One machine: an s3a:// root needs an explicit limiter (a per-machine file is refused).
    with pytest.MonkeyPatch.context() as limiter:
        limiter.setenv("BACKFILL_CRM_LIMITER", str(work / "crm_rate_limit.sqlite"))
        for where, (landing_dir, lakehouse_dir) in {
            "local": (str(landing), str(work / "lakehouse")),
            "s3a": (bucket + "/landing", bucket + "/lakehouse"),
        }.items():
            resources = build_resources(
                landing_dir, lakehouse_dir, spark=spark_resource_for_tests()
            )
            started = time.monotonic()
            runs = backfill(
                all_assets,
                FIRST_DAY.isoformat(),
                LAST_DAY.isoformat(),
                resources,
                DagsterInstance.ephemeral(),
            )
            timings[where] = round(time.monotonic() - started, 1)  # raises if a run failed
            assert runs, where
            prints[where] = fingerprints(resources["lakehouse"])
    record("pipeline_wall_time", {"seconds": timings, "days": 3})
    return work, landing, bucket, prints


def test_pipeline_on_s3a_equals_the_local_build(lake_on_s3, s3):
    work, _landing, _bucket, prints = lake_on_s3
    local, remote = dict(prints["local"]), dict(prints["s3a"])
    # The CRM history keeps each answer with its fetch time: equal rows, not equal bytes.
    local.pop("raw/crm_customer_history", None)
    remote.pop("raw/crm_customer_history", None)
    assert set(remote) >= set(TABLE_NAMES) - {"raw/crm_customer_history"}
    assert remote == local
    # The tables are objects in the bucket (the gateway's directory), nothing on local disk.
    stored = s3.objects("lakehouse")
    assert any(k.startswith("lakehouse/marts/fct_daily_revenue/_delta_log/") for k in stored)
    assert not (work / "s3a:").exists()


def test_landing_sizes_on_s3a_come_from_one_listing_and_equal_the_local_ones(lake_on_s3):
    """The run sizing's landing bytes per day from a recursive listing of the bucket's
    prefix: the same as the local landing zone's, and as the files each day lists."""
    _work, landing, bucket, _ = lake_on_s3
    spark = spark_resource_for_tests()
    remote = LandingZoneResource(landing_dir=bucket + "/landing", spark=spark)
    local = LandingZoneResource(landing_dir=str(landing), spark=spark)
    days = [(FIRST_DAY + timedelta(days=n)).isoformat() for n in range(-1, 5)]
    sizes = remote.bytes_by_day(days)
    assert sizes == local.bytes_by_day(days)
    assert sizes == {
        day: sum(f.size for kind in (ORDERS, FX_RATES) for f in remote.files(kind, [day]))
        for day in days
    }
    assert sizes[FIRST_DAY.isoformat()] > 0 and sizes[days[0]] == 0


def test_shadow_cutover_rollback_decommission_on_s3a(lake_on_s3, s3, spark, tmp_path, monkeypatch):
    _work, landing, bucket, _ = lake_on_s3
    home = tmp_path / "dagster_home"
    home.mkdir()
    for name, value in {
        "DAGSTER_HOME": str(home),
        "BACKFILL_LANDING_DIR": bucket + "/landing",
        "BACKFILL_LAKEHOUSE_DIR": bucket + "/lakehouse",
        "BACKFILL_CRM_LIMITER": str(tmp_path / "crm_rate_limit.sqlite"),
        **s3.env(),
    }.items():
        monkeypatch.setenv(name, value)
    lake = LakehouseResource(root_dir=bucket + "/lakehouse", spark=spark_resource_for_tests())
    first, last = FIRST_DAY.isoformat(), LAST_DAY.isoformat()
    versions = {t: lake.current_version(t) for t in MARTS.split(",")}

    def rows(table: str) -> list[str]:
        return sorted(map(str, lake.read(table).collect()))

    before = {t: rows(t) for t in MARTS.split(",")}
    status, shadow = run_cli(
        "shadow", "--select", MARTS, "--start", first, "--end", last, "--suffix", "s3fix"
    )
    assert status == 0 and shadow["success"], shadow
    assert {t: lake.current_version(t) for t in MARTS.split(",")} == versions
    assert any("fct_daily_revenue__shadow_s3fix/_delta_log/" in k for k in s3.objects("lakehouse"))

    status, validation = run_cli(
        "validate", "--select", MARTS, "--start", first, "--end", last, "--suffix", "s3fix"
    )
    assert status == 0 and validation["passed"] and validation["reconciliation"]["ok"], validation

    status, done = run_cli(
        "cutover",
        "--select",
        MARTS,
        "--start",
        first,
        "--end",
        last,
        "--suffix",
        "s3fix",
        "--reason",
        "object storage drill",
    )
    assert status == 0, done
    # No hard links on an object store: the copying cutover, saying why.
    assert {(t["mode"], t["copy_reason"]) for t in done["tables"]} == {
        ("copy", "the lakehouse is on an object store, which has no hard links")
    }
    commit = lake.history("marts/fct_daily_revenue", limit=1)[0]["metadata"]
    assert commit["operation"] == "cutover" and commit["reason"] == "object storage drill"
    assert commit["cutover_mode"] == "copy"
    assert reconcile_marts(lake, landing, FIRST_DAY, LAST_DAY).ok

    status, undone = run_cli("rollback", "--reason", "drill over")
    assert status == 0, undone
    assert {t: rows(t) for t in MARTS.split(",")} == before

    # A hostile suffix is refused before anything is touched, in the bucket too.
    objects = s3.objects("lakehouse")
    assert run_cli("decommission", "--suffix", "s3fix/../..", "--retention-hours", "0")[0] == 1
    assert s3.objects("lakehouse") == objects

    status, gone = run_cli("decommission", "--suffix", "s3fix", "--retention-hours", "0")
    assert status == 0, gone
    assert sorted(gone["dropped"]) == sorted(f"{t}__shadow_s3fix" for t in MARTS.split(","))
    left = s3.objects("lakehouse")
    assert not [k for k in left if "__shadow_" in k]
    assert any(k.startswith("lakehouse/marts/customer_ltv/") for k in left)
    assert {t: rows(t) for t in MARTS.split(",")} == before

    # The secret key reached Hadoop's configuration only: no log, event or metadata has it.
    leaked = [
        p for p in home.rglob("*") if p.is_file() and s3.secret_key.encode() in p.read_bytes()
    ]
    assert leaked == []
