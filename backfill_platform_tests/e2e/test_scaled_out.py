"""The same code location scaled out: Dagster's storage in PostgreSQL, Spark on a cluster,
the landing zone and the lakehouse on object storage.

One deployment serves every test here (a run on the cluster costs a driver and two executor
JVMs): the instance uses deploy/dagster-postgres.yaml against a real PostgreSQL server,
every run connects to a Spark standalone master with two one-core workers, and reads and
writes `s3a://` on a real S3-compatible server (versitygw), all on 127.0.0.1.
"""

from __future__ import annotations

from collections import Counter
from contextlib import closing

import pytest
import yaml

from backfill_platform.reconcile import fingerprints, reconcile_marts
from backfill_platform.sources.crm_server import peak_per_second
from backfill_platform_tests.e2e.conftest import FIRST_DAY, LAST_DAY
from backfill_platform_tests.e2e.services import REPO_ROOT
from backfill_platform_tests.e2e.tables import lakehouse_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_backfill_with_run_event_and_schedule_storage_in_postgres(scaled_out, spark):
    for status in scaled_out.backfills.values():
        assert status["status"] == "COMPLETED_SUCCESS", scaled_out.backfills
    run_ids = {r["runId"] for r in scaled_out.runs}
    with closing(scaled_out.postgres.connect()) as conn, conn.cursor() as cur:
        cur.execute("SELECT run_id, status FROM runs")
        runs = dict(cur.fetchall())
        cur.execute("SELECT key, status FROM bulk_actions")
        backfills = dict(cur.fetchall())
        cur.execute(
            "SELECT count(*) FROM event_logs WHERE dagster_event_type = 'ASSET_MATERIALIZATION'"
        )
        (materializations,) = cur.fetchone()
        cur.execute("SELECT count(*) FROM instigators")
        (instigators,) = cur.fetchone()
    # Run storage: the backfills and their runs; event storage: one materialization per
    # asset per run; schedule storage: the sensors the test switched off through the API.
    assert run_ids and run_ids <= set(runs), (run_ids, runs)
    assert all(runs[r] == "SUCCESS" for r in run_ids), runs
    assert set(scaled_out.backfills) <= set(backfills), backfills
    assert materializations >= 6, materializations
    assert instigators >= 3, instigators
    # Nothing went to SQLite: DAGSTER_HOME holds no run or event database.
    home = scaled_out.deployment.dagster.home
    assert not list(home.rglob("*.db")), list(home.rglob("*.db"))

    lake = lakehouse_for(scaled_out.lakehouse_uri, spark)
    result = reconcile_marts(lake, scaled_out.deployment.landing, FIRST_DAY, LAST_DAY)
    assert result.ok, "\n".join(result.details)


def test_the_runs_crm_calls_held_the_limit_through_the_instances_postgres(scaled_out):
    """Two runs of the deployment's backfills and a live path on another machine (its own
    working directory, no limiter file) called one CRM at 20/s, all taking their slots from
    the instance's PostgreSQL: the CRM's own log shows every call answered, none 429, at
    most 20 in any second, and the backfills at most their share of 15, also while the live
    path called."""
    for status in scaled_out.backfills.values():
        assert status["status"] == "COMPLETED_SUCCESS", scaled_out.backfills
    logged = scaled_out.crm.requests()
    backfill = [e for e in logged if e["kind"] == "backfill"]
    live = [e["t"] for e in logged if e["kind"] == "live"]
    runs = Counter(e["run"] for e in backfill)
    while_live = [e["t"] for e in backfill if min(live) <= e["t"] <= max(live)]
    statuses = Counter(e["status"] for e in logged)
    audit = {
        "calls": len(logged),
        "statuses": dict(statuses),
        "backfill_calls_by_run": dict(runs),
        "live_calls": len(live),
        "peak": peak_per_second([e["t"] for e in logged]),
        "backfill_peak": peak_per_second([e["t"] for e in backfill]),
        "backfill_peak_while_live": peak_per_second(while_live),
        "live_caller": scaled_out.live,
    }
    print(f"scaled-out CRM: {audit}")
    assert statuses.get(429, 0) == 0 and set(statuses) == {404}, audit
    assert scaled_out.live["backend"] == "postgres" and scaled_out.live["429"] == 0, audit
    assert len(runs) >= 2 and "" not in runs, audit  # two runs called, one per backfill
    assert len(while_live) == len(backfill), audit  # the live path called all along
    assert audit["peak"] <= 20, audit
    assert audit["backfill_peak"] <= 15, audit
    with closing(scaled_out.postgres.connect()) as conn, conn.cursor() as cur:
        cur.execute("SELECT to_regclass('backfill_crm_rate_limit') IS NOT NULL")
        assert cur.fetchone() == (True,)
    root = scaled_out.deployment.root
    assert not list(root.rglob("crm_rate_limit*.sqlite")), list(root.rglob("*.sqlite"))


def test_postgres_yaml_differs_from_the_default_only_in_storage():
    default = yaml.safe_load((REPO_ROOT / "deploy" / "dagster.yaml").read_text())
    postgres = yaml.safe_load((REPO_ROOT / "deploy" / "dagster-postgres.yaml").read_text())
    assert set(postgres.pop("storage")) == {"postgres"}
    assert postgres == default


def test_cluster_backfill_on_s3a_gives_the_same_tables_as_local_mode(
    scaled_out, first_backfill, spark
):
    """Same landing zone (same generator seed), same assets: identical tables either way,
    one built by executors on the workers from and to a bucket, one on local disk."""
    status = scaled_out.cluster.status()
    apps = status["completedapps"] + status["activeapps"]
    ours = {a["id"] for a in apps if a["name"] == "backfill_platform"}
    # One Spark application per Dagster run, and its tasks ran in executors on the workers.
    assert len(ours) >= len(scaled_out.runs), apps
    executor_logs = list((scaled_out.cluster.root / "work").glob("app-*/*/stderr"))
    assert {log.parts[-3] for log in executor_logs} >= ours, executor_logs
    assert any("Finished task" in log.read_text(errors="replace") for log in executor_logs)
    assert len(scaled_out.cluster.alive_workers()) == 2

    # Everything the runs wrote is in the bucket (the gateway's own directory); the
    # deployment was given only s3a:// roots, and nothing went to a local lakehouse.
    objects = scaled_out.s3.objects("scaled-out")
    for table in ("raw/orders", "staging/orders", "marts/customer_ltv"):
        assert any(o.startswith(f"lakehouse/{table}/_delta_log/") for o in objects), table
    assert not scaled_out.deployment.lakehouse.exists()

    on_cluster = fingerprints(lakehouse_for(scaled_out.lakehouse_uri, spark))
    local = dict(first_backfill.fingerprints)
    # The CRM history keeps each answer with its fetch time: equal rows, not equal bytes.
    on_cluster.pop("raw/crm_customer_history", None)
    local.pop("raw/crm_customer_history", None)
    assert on_cluster == local
