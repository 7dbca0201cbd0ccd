"""Fixtures for the end-to-end tests: a small generated landing zone and the real services.

Run with `make e2e` (it installs Chromium and PostgreSQL first). Every service binds to
127.0.0.1 on a free port and is killed with its process group on teardown, pass or fail.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path

import pytest

from backfill_platform.sources.crm_process import CrmProcess, start_crm_server
from backfill_platform.sources.generate import generate_landing
from backfill_platform.tables import RAW_CRM_HISTORY, RAW_ORDERS, STAGING_ORDERS, TABLE_NAMES
from backfill_platform_tests.e2e.object_store import S3Server
from backfill_platform_tests.e2e.services import (
    DagsterServices,
    PostgresServer,
    SparkCluster,
    dagster_env,
    free_port,
    live_crm_caller,
    make_dagster_home,
    make_postgres_dir,
    postgres_bin,
)

# Tiny on purpose: three days, a few orders a day (`make e2e` must stay under 12 minutes).
# The first day is also BACKFILL_START_DATE (tests' default), so customer_ltv starts at zero.
FIRST_DAY = date(2024, 1, 1)
LAST_DAY = date(2024, 1, 3)
ORDERS_PER_DAY = 12
SEED = 11
ALL_ASSETS = [name.split("/") for name in TABLE_NAMES]
# The CRM's path: orders to staging, then the CRM history of the customers seen (one run).
CRM_PATH = [key.path for key in (RAW_ORDERS, STAGING_ORDERS, RAW_CRM_HISTORY)]
# Generous: the machine is shared, each run starts a JVM, the backfill daemon ticks every 30 s,
# and `make e2e` runs two deployments at once (the UI journey's 13-day backfill took 217 s
# alone and passed 600 s when another CI job shared the 2 cores).
BACKFILL_TIMEOUT = 900
CRM_TOKEN = "scaled-out-crm-token"
# The live machine's pace: above its reserve of 5/s, so at times the total limit binds too.
LIVE_CALLS_PER_SECOND = 6
# The shared deployment runs as a stream's deployment would: raw/orders has a freshness
# policy of this many seconds (Dagster's shortest), the freshness daemon evaluates every 5 s.
STREAM_FRESHNESS_SECONDS = 60


# The modules that share the session deployment (fixtures `deployment`, `first_backfill`,
# `scaled_out`) run in one pytest-xdist worker, so it starts once; every other module gets a
# worker of its own. (xdist_group markers are not honoured with pytest 9, hence a scheduler.)
SHARED_DEPLOYMENT_MODULES = {
    "test_backfill_services.py",
    "test_cli_deployment.py",
    "test_scaled_out.py",
    "test_stream_freshness.py",
    "test_ui_browser.py",
}


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """With `--dist loadgroup` (`make e2e`): one scope per deployment, not per test."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByDeployment(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "shared-deployment" if Path(module).name in SHARED_DEPLOYMENT_MODULES else module

    return ByDeployment(config, log)


def generated_landing(root: Path) -> Path:
    landing = root / "landing"
    generate_landing(landing, FIRST_DAY, LAST_DAY, ORDERS_PER_DAY, SEED, progress=False)
    return landing


@dataclass
class Deployment:
    """A running webserver + daemon over their own landing zone, lakehouse and DAGSTER_HOME."""

    root: Path
    landing: Path
    lakehouse: Path
    dagster: DagsterServices


def start_deployment(
    root: Path,
    yaml_name: str = "dagster.yaml",
    extra_env: dict[str, str] | None = None,
    code_server: bool = False,
    landing: Path | None = None,
) -> Deployment:
    """Webserver + daemon over a landing zone (generated unless given); `code_server=True`
    runs the code location as its own service first (deploy/workspace-code-server.yaml)."""
    landing, lakehouse = landing or generated_landing(root), root / "lakehouse"
    home = make_dagster_home(root, yaml_name)
    env = dagster_env(home, landing, lakehouse, FIRST_DAY.isoformat(), extra_env or {})
    logs = root / "logs"
    logs.mkdir()
    services = DagsterServices(home=home, port=free_port(), env=env, log_dir=logs)
    try:
        if code_server:
            services.start_code_server()
        services.start_webserver()
        # Sensors are on by default; switch them off (as the UI's toggle does) before the
        # daemon starts, so every write in these tests comes from the backfills under test.
        services.stop_all_sensors()
        services.start_daemon()
    except BaseException:
        services.stop()
        raise
    return Deployment(root, landing, lakehouse, services)


@pytest.fixture(scope="session")
def e2e_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="e2e-"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def deployment(e2e_root) -> Iterator[Deployment]:
    """SQLite storage in DAGSTER_HOME (the default deploy/dagster.yaml), local Spark."""
    deployment = start_deployment(
        e2e_root / "sqlite",
        extra_env={
            "BACKFILL_STREAM_FRESHNESS_SECONDS": str(STREAM_FRESHNESS_SECONDS),
            "FRESHNESS_DAEMON_INTERVAL_SECONDS": "5",
        },
    )
    yield deployment
    deployment.dagster.stop()


@dataclass
class FirstBackfill:
    backfill_id: str
    status: dict
    fingerprints: dict


@pytest.fixture(scope="session")
def first_backfill(deployment, spark) -> FirstBackfill:
    """Every layer over the three days, launched through the webserver, run by the daemon."""
    from backfill_platform.reconcile import fingerprints
    from backfill_platform_tests.e2e.tables import lakehouse_for

    backfill_id = deployment.dagster.launch_backfill(
        ALL_ASSETS, FIRST_DAY.isoformat(), LAST_DAY.isoformat()
    )
    status = deployment.dagster.wait_backfill(backfill_id, BACKFILL_TIMEOUT)
    return FirstBackfill(
        backfill_id, status, fingerprints(lakehouse_for(deployment.lakehouse, spark))
    )


@dataclass
class ScaledOut:
    """One deployment the way a team outgrowing one machine runs it: Dagster's storage in
    PostgreSQL (deploy/dagster-postgres.yaml), Spark on a standalone cluster, and the landing
    zone and lakehouse in an S3 bucket (a real S3-compatible server), so no executor needs
    the driver's disk."""

    deployment: Deployment
    postgres: PostgresServer
    cluster: SparkCluster
    s3: S3Server
    lakehouse_uri: str
    backfills: dict[str, dict]  # id -> final status, in launch order (the last: all days)
    crm: CrmProcess  # the deployment's CRM (limit 20/s), its request log audited
    live: dict  # the other machine's live caller: limiter backend, calls, 429s

    @property
    def runs(self) -> list[dict]:
        return [run for status in self.backfills.values() for run in status["runs"]]


@pytest.fixture(scope="session")
def scaled_out(e2e_root, spark) -> Iterator[ScaledOut]:
    root = e2e_root / "scaled_out"
    root.mkdir()
    data_dir = make_postgres_dir()
    postgres = PostgresServer(data_dir, free_port(), postgres_bin())
    cluster = SparkCluster(root / "spark")
    cluster.root.mkdir()
    s3 = S3Server(root / "s3")
    deployment = None
    # Its own demo CRM at the contract's 20/s with a request log: the runs' CRM limiter is
    # the instance's PostgreSQL (DAGSTER_PG_* below; docs/crm.md), audited by the test.
    crm_data = root / "crm"
    crm_data.mkdir()
    (crm_data / "customers.json").write_text('{"customers": {}}')
    crm = start_crm_server(crm_data, token=CRM_TOKEN, rate=20, log=root / "crm_requests.jsonl")
    try:
        postgres.start()
        s3.start()
        s3.configure(spark)
        # The landing files are delivered to the bucket; the local copy is the oracle's.
        source = generated_landing(root / "source")
        bucket = s3.bucket("scaled-out")
        s3.upload(spark, source, f"{bucket}/landing")
        cluster.start(workers=2)
        extra = {
            **postgres.env(),
            **s3.env(),
            "BACKFILL_LANDING_DIR": f"{bucket}/landing",
            "BACKFILL_LAKEHOUSE_DIR": f"{bucket}/lakehouse",
            "SPARK_MASTER": cluster.master_url,
            "SPARK_CONF_DIR": str(cluster.spark_conf_dir()),
            "BACKFILL_CRM_URL": crm.url,
            "BACKFILL_CRM_TOKEN": CRM_TOKEN,
            "BACKFILL_CRM_RATE_LIMIT": "20",
            "BACKFILL_CRM_LIVE_RESERVE": "0.25",
            "BACKFILL_CRM_LIMITER_BACKEND": "postgres",
        }
        deployment = start_deployment(root, "dagster-postgres.yaml", extra, landing=source)
        # Two backfills, as two days' deliveries: the CRM's path over the first two days
        # (one run), then every asset over all three (two runs: raw, staging and the marts
        # but LTV in one, LTV after it). Each first run calls the CRM for the customers it
        # has not asked yet: two runs share the PostgreSQL window, in three runs on the
        # cluster. The second rebuilds every day, so the tables are a three-day build's.
        # Meanwhile a live path on another machine calls the same CRM through the same
        # PostgreSQL window: the backfills' runs must leave it its reserve.
        backfills = {}
        with live_crm_caller(
            root / "live-machine", deployment.dagster.env, LIVE_CALLS_PER_SECOND
        ) as live:
            for assets, last in ((CRM_PATH, FIRST_DAY + timedelta(days=1)), (ALL_ASSETS, LAST_DAY)):
                backfill_id = deployment.dagster.launch_backfill(
                    assets, FIRST_DAY.isoformat(), last.isoformat()
                )
                # Twice the usual wait: a run on the cluster starts three JVMs.
                backfills[backfill_id] = deployment.dagster.wait_backfill(
                    backfill_id, 2 * BACKFILL_TIMEOUT
                )
        yield ScaledOut(
            deployment, postgres, cluster, s3, f"{bucket}/lakehouse", backfills, crm, live
        )
    finally:
        if deployment is not None:
            deployment.dagster.stop()
        crm.stop()
        cluster.stop()
        s3.stop()
        postgres.stop()
        shutil.rmtree(data_dir.parent, ignore_errors=True)
