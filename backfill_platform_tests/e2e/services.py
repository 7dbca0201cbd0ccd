"""Real services for the end-to-end tests: dagster-webserver + dagster-daemon, PostgreSQL and
a Spark standalone cluster, each on 127.0.0.1 on a free port, in its own process group.

Every wait is bounded and fails with the service's log tail; every process group is killed
(SIGTERM, then SIGKILL) on teardown, together with any descendant that left the group.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from backfill_platform.sources import postgres_server
from backfill_platform_tests.spark_jvm import SPARK_HOME, SPAWNED_JIT

REPO_ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # the venv's bin: dagster-webserver, dagster-daemon, spark-class


class ServiceTimeout(AssertionError):
    """A bounded wait ran out; the message says what was awaited and shows the log tail."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(
    what: str, check: Callable[[], Any], timeout: float, interval: float = 1.0, logs=()
) -> Any:
    """Poll `check` until it returns something truthy; raise ServiceTimeout naming `what`."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except (OSError, urllib.error.URLError, ValueError, KeyError) as error:
            last_error = error
        time.sleep(interval)
    tails = "\n".join(f"--- {p} ---\n{log_tail(p)}" for p in logs)
    raise ServiceTimeout(
        f"timed out after {timeout:.0f}s waiting for {what} ({last_error})\n{tails}"
    )


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass
class Service:
    """One started command in its own session (process group), logging to a file."""

    name: str
    process: subprocess.Popen
    log: Path
    # Kept as psutil handles, not pids: a handle refuses to signal a process that reused its
    # pid (pids wrap at 32,768 here, and CI starts thousands of processes).
    descendants: dict[int, psutil.Process] = field(default_factory=dict)

    def alive(self) -> bool:
        return self.process.poll() is None

    def remember_descendants(self) -> None:
        try:
            children = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.Error:
            return
        self.descendants.update({c.pid: c for c in children})

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM the process group, wait, SIGKILL it and any descendant that escaped it."""
        self.remember_descendants()
        _signal_group(self.process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=grace)
        _signal_group(self.process.pid, signal.SIGKILL)
        for process in self.descendants.values():
            with contextlib.suppress(psutil.Error):
                process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


_STARTED: list[Service] = []


@atexit.register
def _stop_leftovers() -> None:
    """Last line of defence: a fixture teardown that never ran (Ctrl-C) still ends them."""
    for service in reversed(_STARTED):
        if service.alive():
            service.stop(grace=5)


def start(name: str, args: list[str], log_dir: Path, env: Mapping[str, str], cwd: Path) -> Service:
    log = Path(log_dir) / f"{name}.log"
    handle = open(log, "ab")  # noqa: SIM115 - the child owns the descriptor for its lifetime
    process = subprocess.Popen(
        args,
        cwd=cwd,
        env=dict(env),
        stdout=handle,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    handle.close()
    service = Service(name, process, log)
    _STARTED.append(service)
    return service


def stop_all(services: Iterable[Service]) -> None:
    """Stop every service, even if stopping one of them fails."""
    errors = []
    for service in reversed(list(services)):
        try:
            service.stop()
        except (OSError, subprocess.SubprocessError, psutil.Error) as error:
            errors.append(f"{service.name}: {error}")
    if errors:
        raise RuntimeError("; ".join(errors))


# -- Dagster ---------------------------------------------------------------------------------
LAUNCH_BACKFILL = """
mutation LaunchPartitionBackfill($backfillParams: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $backfillParams) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message stack }
    ... on Error { message }
  }
}
"""

CANCEL_BACKFILL = """
mutation CancelBackfill($backfillId: String!) {
  cancelPartitionBackfill(backfillId: $backfillId) {
    __typename
    ... on CancelBackfillSuccess { backfillId }
    ... on PythonError { message stack }
    ... on Error { message }
  }
}
"""

BACKFILL_STATUS = """
query BackfillStatus($backfillId: String!) {
  partitionBackfillOrError(backfillId: $backfillId) {
    __typename
    ... on PartitionBackfill {
      id
      status
      numPartitions
      error { message }
      runs(limit: 100) { runId status }
    }
    ... on PythonError { message stack }
    ... on Error { message }
  }
}
"""

SENSORS = """
query Sensors {
  repositoriesOrError {
    __typename
    ... on RepositoryConnection {
      nodes { name location { name } sensors { name sensorState { id status } } }
    }
    ... on PythonError { message stack }
  }
}
"""

STOP_SENSOR = """
mutation StopSensor($id: String!) {
  stopSensor(id: $id) {
    __typename
    ... on StopSensorMutationResult { instigationState { status } }
    ... on PythonError { message stack }
    ... on Error { message }
  }
}
"""

RUN_EVENTS = """
query RunEvents($runId: ID!) {
  logsForRun(runId: $runId, limit: 1000) {
    __typename
    ... on EventConnection { events { __typename } }
  }
}
"""

FINISHED_BACKFILL = {"COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED"}


class GraphQLError(AssertionError):
    pass


# The code location's name in both workspaces (workspace.yaml loads the module itself;
# deploy/workspace-code-server.yaml points at a code server started under this name).
LOCATION_NAME = "backfill_platform.definitions"


@dataclass
class DagsterServices:
    """dagster-webserver and dagster-daemon over one DAGSTER_HOME and one workspace.

    By default the workspace is workspace.yaml: webserver and daemon each load the code
    location in a code server of their own (their child, in their process group), and runs
    execute in the daemon's. `start_code_server` runs the code location as its own service
    instead (deploy/workspace-code-server.yaml), so runs live outside the daemon.
    """

    home: Path
    port: int
    env: dict[str, str]
    log_dir: Path
    services: list[Service] = field(default_factory=list)
    workspace: Path = REPO_ROOT / "workspace.yaml"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def logs(self) -> list[Path]:
        return [s.log for s in self.services]

    # -- lifecycle ----------------------------------------------------------------------
    def start_code_server(self, timeout: float = 240) -> None:
        """`dagster code-server start` on a free loopback port, in its own process group;
        webserver and daemon started afterwards reach it through
        deploy/workspace-code-server.yaml (DAGSTER_CODE_SERVER_HOST/PORT)."""
        port = free_port()
        self.env = {
            **self.env,
            "DAGSTER_CODE_SERVER_HOST": "127.0.0.1",
            "DAGSTER_CODE_SERVER_PORT": str(port),
        }
        self.workspace = REPO_ROOT / "deploy" / "workspace-code-server.yaml"
        service = start(
            "dagster-code-server",
            [
                str(BIN / "dagster"),
                "code-server",
                "start",
                "-m",
                LOCATION_NAME,
                "-h",
                "127.0.0.1",
                "-p",
                str(port),
                "--location-name",
                LOCATION_NAME,
            ],
            self.log_dir,
            self.env,
            REPO_ROOT,
        )
        self.services.append(service)

        def serving() -> bool:
            if not service.alive():
                raise ServiceTimeout(f"dagster code-server exited:\n{log_tail(service.log)}")
            check = subprocess.run(
                [str(BIN / "dagster"), "api", "grpc-health-check", "-p", str(port)],
                capture_output=True,
                timeout=60,
                check=False,
            )
            return check.returncode == 0

        wait_for("the code server to serve", serving, timeout, interval=2, logs=self.logs)

    def service(self, name: str) -> Service:
        """The running service called `name` (the newest, if it was restarted)."""
        for service in reversed(self.services):
            if service.name == name:
                return service
        raise KeyError(name)

    def kill_service(self, name: str) -> set[int]:
        """SIGKILL a service's whole process group at once (no SIGTERM first: a crash), reap
        it and drop it from the running services. Returns the pids that were in its tree."""
        service = self.service(name)
        service.remember_descendants()
        pids = {service.process.pid, *service.descendants}
        _signal_group(service.process.pid, signal.SIGKILL)
        for pid in service.descendants:  # any that left the group
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()
        service.process.wait(timeout=30)
        self.services.remove(service)
        return pids

    def start_webserver(self, timeout: float = 240) -> None:
        workspace = str(self.workspace)
        self.services.append(
            start(
                "dagster-webserver",
                [
                    str(BIN / "dagster-webserver"),
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(self.port),
                    "-w",
                    workspace,
                ],
                self.log_dir,
                self.env,
                REPO_ROOT,
            )
        )
        wait_for(
            "dagster-webserver to serve the code location",
            self._location_loaded,
            timeout,
            interval=2,
            logs=self.logs,
        )

    def _location_loaded(self) -> bool:
        if not all(s.alive() for s in self.services):
            raise ServiceTimeout(f"a service exited early:\n{log_tail(self.services[-1].log)}")
        data = self.graphql(SENSORS)["repositoriesOrError"]
        return data["__typename"] == "RepositoryConnection" and bool(data["nodes"])

    def start_daemon(self, timeout: float = 240) -> None:
        """Start dagster-daemon and wait until *it* heartbeats (after a restart, the dead
        daemon's last heartbeats still look healthy for a while)."""
        workspace = str(self.workspace)
        started_at = time.time()
        self.services.append(
            start(
                "dagster-daemon",
                # dagster-daemon, its backfill daemon ticking every 5 s (e2e/daemon.py)
                [
                    sys.executable,
                    "-m",
                    "backfill_platform_tests.e2e.daemon",
                    "run",
                    "-w",
                    workspace,
                ],
                self.log_dir,
                self.env,
                REPO_ROOT,
            )
        )
        wait_for(
            "dagster-daemon heartbeats (backfill and run-queue daemons)",
            lambda: self._daemons_healthy(since=started_at),
            timeout,
            interval=2,
            logs=self.logs,
        )

    def _daemons_healthy(self, since: float = 0.0) -> bool:
        if not self.services[-1].alive():
            raise ServiceTimeout(f"dagster-daemon exited:\n{log_tail(self.services[-1].log)}")
        data = self.graphql(
            "{ instance { daemonHealth { allDaemonStatuses"
            " { daemonType healthy required lastHeartbeatTime } } } }"
        )
        statuses = data["instance"]["daemonHealth"]["allDaemonStatuses"]
        fresh = {
            s["daemonType"]
            for s in statuses
            if s["healthy"] and (s["lastHeartbeatTime"] or 0) >= since
        }
        return {"BACKFILL", "QUEUED_RUN_COORDINATOR"} <= fresh

    def stop(self) -> None:
        for service in self.services:
            service.remember_descendants()
        stop_all(self.services)

    def restart(self, env: Mapping[str, str]) -> None:
        """Stop webserver and daemon and start them again with `env` added: a setting the
        code location reads when it loads (e.g. the chunk size) needs new processes."""
        self.stop()
        self.services.clear()
        self.env = {**self.env, **env}
        self.start_webserver()
        self.start_daemon()

    # -- GraphQL --------------------------------------------------------------------------
    def graphql(self, query: str, variables: Mapping[str, Any] | None = None) -> dict[str, Any]:
        body = json.dumps({"query": query, "variables": dict(variables or {})}).encode()
        request = urllib.request.Request(
            f"{self.url}/graphql", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            payload = json.loads(response.read())
        if payload.get("errors"):
            raise GraphQLError(f"GraphQL errors: {payload['errors']}")
        return payload["data"]

    def stop_all_sensors(self) -> list[str]:
        """Toggle every sensor off, as the UI's switch does, so only our backfills write."""
        stopped = []
        data = self.graphql(SENSORS)["repositoriesOrError"]
        for repo in data["nodes"]:
            for sensor in repo["sensors"]:
                result = self.graphql(STOP_SENSOR, {"id": sensor["sensorState"]["id"]})[
                    "stopSensor"
                ]
                if result["__typename"] != "StopSensorMutationResult":
                    raise GraphQLError(f"stopSensor {sensor['name']}: {result}")
                assert result["instigationState"]["status"] == "STOPPED", result
                stopped.append(sensor["name"])
        return stopped

    def launch_backfill(self, asset_paths: list[list[str]], first: str, last: str) -> str:
        """Launch an asset backfill of every given asset over the partitions first..last.

        The UI's "Launch backfill" dialog sends `assetSelection` + `partitionNames`, which
        Dagster applies to the root assets and widens downstream through the partition
        mappings (the lineage window: docs/lineage.md); `partitionsByAssets` pins each
        asset to exactly the range.
        """
        params = {
            "partitionsByAssets": [
                {"assetKey": {"path": p}, "partitions": {"range": {"start": first, "end": last}}}
                for p in asset_paths
            ],
            "fromFailure": False,
            "tags": [],
            "title": "e2e backfill",
        }
        result = self.graphql(LAUNCH_BACKFILL, {"backfillParams": params})[
            "launchPartitionBackfill"
        ]
        if result["__typename"] != "LaunchBackfillSuccess":
            raise GraphQLError(f"launchPartitionBackfill failed: {result}")
        return result["backfillId"]

    def cancel_backfill(self, backfill_id: str) -> None:
        result = self.graphql(CANCEL_BACKFILL, {"backfillId": backfill_id})[
            "cancelPartitionBackfill"
        ]
        if result["__typename"] != "CancelBackfillSuccess":
            raise GraphQLError(f"cancelPartitionBackfill failed: {result}")

    def cancel_backfill_until_it_ends(self, backfill_id: str, timeout: float) -> tuple[dict, int]:
        """Cancel, then wait for the backfill to finish; returns its status and how many times
        the cancel had to be sent again.

        Dagster's cancel and its backfill daemon both read the backfill, change it and write it
        back whole, without a lock (dagster-io/dagster#7094): a daemon iteration that read the
        backfill just before the cancel writes it back as REQUESTED, and the cancel is lost. The
        backfill then runs to the end. A user who sees it running presses cancel again; so does
        this, each time the backfill reads REQUESTED after a cancel was accepted.
        """
        self.cancel_backfill(backfill_id)
        sent_again = 0

        def finished():
            nonlocal sent_again
            self._check_alive()
            backfill = self.backfill(backfill_id)
            if backfill["status"] == "REQUESTED" and sent_again < 10:
                sent_again += 1
                self.cancel_backfill(backfill_id)
                return None
            return backfill if backfill["status"] in FINISHED_BACKFILL else None

        status = wait_for(
            f"backfill {backfill_id} to finish after its cancel",
            finished,
            timeout,
            interval=0.5,
            logs=self.logs,
        )
        return status, sent_again

    def backfill(self, backfill_id: str) -> dict[str, Any]:
        result = self.graphql(BACKFILL_STATUS, {"backfillId": backfill_id})[
            "partitionBackfillOrError"
        ]
        if result["__typename"] != "PartitionBackfill":
            raise GraphQLError(f"partitionBackfillOrError: {result}")
        return result

    def wait_backfill(self, backfill_id: str, timeout: float) -> dict[str, Any]:
        def finished():
            self._check_alive()
            backfill = self.backfill(backfill_id)
            return backfill if backfill["status"] in FINISHED_BACKFILL else None

        return wait_for(
            f"backfill {backfill_id} to finish", finished, timeout, interval=3, logs=self.logs
        )

    def run_event_types(self, run_id: str) -> list[str]:
        data = self.graphql(RUN_EVENTS, {"runId": run_id})["logsForRun"]
        return [e["__typename"] for e in data.get("events", [])]

    def _check_alive(self) -> None:
        for service in self.services:
            if not service.alive():
                raise ServiceTimeout(f"{service.name} exited:\n{log_tail(service.log)}")


def dagster_env(
    home: Path, landing: Path, lakehouse: Path, start_date: str, extra: Mapping[str, str] = ()
) -> dict[str, str]:
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "BACKFILL_LANDING_DIR": str(landing),
        "BACKFILL_LAKEHOUSE_DIR": str(lakehouse),
        "BACKFILL_START_DATE": start_date,
        "BACKFILL_SPARK_DRIVER_MEMORY": "1g",
        "BACKFILL_SPARK_SHUFFLE_PARTITIONS": "2",
        "SPARK_MASTER": "local[2]",
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": str(REPO_ROOT),
        "DAGSTER_DISABLE_TELEMETRY": "1",
        **dict(extra),
    }
    return env


def cli_env(deployment) -> dict[str, str]:
    return {**deployment.dagster.env, "DAGSTER_URL": deployment.dagster.url}


def run_cli(
    deployment, *argv: str, refusal_fails: bool = True, timeout: float = 900
) -> tuple[subprocess.CompletedProcess, dict]:
    """The console command as an operator runs it (`--json`), pointed at the deployment's
    webserver; a refusal fails the test with the webserver's log tail."""
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "backfill_platform", *argv, "--json"],
        cwd=REPO_ROOT,
        env=cli_env(deployment),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    try:
        payload = json.loads(result.stdout)
    except ValueError:
        pytest.fail(f"no JSON from {argv}: {result.stdout}\n{result.stderr}")
    if refusal_fails and payload.get("refused"):
        logs = "\n".join(log_tail(p, 60) for p in deployment.dagster.logs[:1])
        pytest.fail(f"{argv} refused: {payload['error']}\nwebserver:\n{logs}")
    print(f"{' '.join(argv)}: {time.monotonic() - started:.0f} s, exit {result.returncode}")
    return result, payload


def make_dagster_home(root: Path, yaml_name: str) -> Path:
    """A fresh DAGSTER_HOME holding deploy/<yaml_name> as its dagster.yaml."""
    home = root / "dagster_home"
    home.mkdir(parents=True)
    shutil.copy(REPO_ROOT / "deploy" / yaml_name, home / "dagster.yaml")
    return home


# -- PostgreSQL ------------------------------------------------------------------------------
def postgres_bin() -> Path:
    """The virtualenv's PostgreSQL (the wheel the demo's instance runs on)."""
    return postgres_server.server_bin()


@dataclass
class PostgresServer:
    data_dir: Path
    port: int
    bin_dir: Path
    user: str = "dagster"
    password: str = "dagster"
    database: str = "dagster"

    def _cmd(self, args: list[str]) -> list[str]:
        return postgres_server.as_server(args)  # as root, in a user namespace

    def start(self, timeout: float = 120) -> None:
        pwfile = self.data_dir.parent / "pwfile"
        pwfile.write_text(self.password + "\n")
        subprocess.run(
            self._cmd(
                [
                    str(self.bin_dir / "initdb"),
                    "-D",
                    str(self.data_dir),
                    "-U",
                    self.user,
                    "--pwfile",
                    str(pwfile),
                    "-A",
                    "scram-sha-256",
                    "-E",
                    "UTF8",
                    "--no-sync",
                ]
            ),
            check=True,
            capture_output=True,
            timeout=timeout,
        )
        self._pg_ctl_start(timeout)
        wait_for("postgres to accept connections", self._accepts, timeout, interval=1)
        with closing(self.connect(database="postgres")) as conn, conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE {self.database}")

    def _pg_ctl_start(self, timeout: float) -> None:
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.data_dir} -c fsync=off"
            " -c max_connections=100"
        )
        subprocess.run(
            self._cmd(
                [
                    str(self.bin_dir / "pg_ctl"),
                    "-D",
                    str(self.data_dir),
                    "-o",
                    options,
                    "-l",
                    str(self.data_dir.parent / "postgres.log"),
                    "-w",
                    "-t",
                    str(int(timeout)),
                    "start",
                ]
            ),
            check=True,
            capture_output=True,
            timeout=timeout + 10,
        )

    def start_again(self, timeout: float = 120) -> None:
        """Start the stopped server on its existing data directory and port."""
        self._pg_ctl_start(timeout)
        wait_for("postgres to accept connections", self._accepts, timeout, interval=1)

    def running(self) -> bool:
        status = subprocess.run(
            self._cmd([str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir), "status"]),
            capture_output=True,
            timeout=60,
            check=False,
        )
        return status.returncode == 0

    def _accepts(self) -> bool:
        with closing(self.connect(database="postgres")):
            return True

    def connect(self, database: str | None = None):
        """An autocommit connection; close it with contextlib.closing (psycopg2's own
        context manager only ends a transaction)."""
        import psycopg2

        conn = psycopg2.connect(
            host="127.0.0.1",
            port=self.port,
            user=self.user,
            password=self.password,
            dbname=database or self.database,
            connect_timeout=5,
        )
        conn.autocommit = True
        return conn

    def stop(self) -> None:
        subprocess.run(
            [
                *self._cmd(
                    [str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir), "-m", "immediate"]
                ),
                "stop",
            ],
            capture_output=True,
            timeout=60,
            check=False,
        )

    def env(self) -> dict[str, str]:
        return {
            "DAGSTER_PG_HOST": "127.0.0.1",
            "DAGSTER_PG_PORT": str(self.port),
            "DAGSTER_PG_USERNAME": self.user,
            "DAGSTER_PG_PASSWORD": self.password,
            "DAGSTER_PG_DB": self.database,
        }


def make_postgres_dir() -> Path:
    """A data directory for a test's server, in a new temporary folder."""
    return Path(tempfile.mkdtemp(prefix="e2e-pg-")) / "data"


# -- Spark standalone cluster ----------------------------------------------------------------
@dataclass
class SparkCluster:
    """A master and two one-core workers from the installed pyspark, on loopback."""

    root: Path
    port: int = field(default_factory=free_port)
    ui_port: int = field(default_factory=free_port)
    services: list[Service] = field(default_factory=list)

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            # Given, spark-class does not run pyspark's find-spark-home, which splits an
            # interpreter path holding a space.
            "SPARK_HOME": str(SPARK_HOME),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(self.root),
            "SPARK_WORKER_DIR": str(self.root / "work"),
            "SPARK_NO_DAEMONIZE": "1",
            "PYSPARK_PYTHON": sys.executable,
        }

    def start(self, workers: int = 2, timeout: float = 180) -> None:
        spark_class = str(BIN / "spark-class")
        self.services.append(
            start(
                "spark-master",
                [
                    spark_class,
                    "org.apache.spark.deploy.master.Master",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--webui-port",
                    str(self.ui_port),
                ],
                self.root,
                self.env(),
                self.root,
            )
        )
        wait_for("the Spark master", self.status, timeout, interval=2, logs=self.logs)
        for i in range(workers):
            self.services.append(
                start(
                    f"spark-worker-{i}",
                    [
                        spark_class,
                        "org.apache.spark.deploy.worker.Worker",
                        "--host",
                        "127.0.0.1",
                        "--cores",
                        "1",
                        "--memory",
                        "1g",
                        "--webui-port",
                        str(free_port()),
                        "--work-dir",
                        str(self.root / "work"),
                        self.master_url,
                    ],
                    self.root,
                    self.env(),
                    self.root,
                )
            )
        wait_for(
            f"{workers} Spark workers to register",
            lambda: len(self.alive_workers()) >= workers,
            timeout,
            interval=2,
            logs=self.logs,
        )

    @property
    def logs(self) -> list[Path]:
        return [s.log for s in self.services]

    def status(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=10) as r:
            return json.loads(r.read())

    def alive_workers(self) -> list[dict[str, Any]]:
        return [w for w in self.status().get("workers", []) if w.get("state") == "ALIVE"]

    def spark_conf_dir(self) -> Path:
        """SPARK_CONF_DIR for the runs: executor size and loopback driver, as for any cluster;
        and, as for every JVM a test spawns, executors that compile with C1 alone
        (`spark_jvm.SPAWNED_JIT`: each lives for one run of a few hundred rows)."""
        conf = self.root / "conf"
        conf.mkdir(exist_ok=True)
        (conf / "spark-defaults.conf").write_text(
            "spark.executor.memory 512m\n"
            "spark.executor.cores 1\n"
            "spark.cores.max 2\n"
            f"spark.executor.extraJavaOptions {SPAWNED_JIT}\n"
            "spark.driver.host 127.0.0.1\n"
            "spark.driver.bindAddress 127.0.0.1\n"
        )
        return conf

    def stop(self) -> None:
        stop_all(self.services)


# The live path of another machine: builds its CRM client from settings like a run, then
# calls `per_second` new customers each second as kind "live" until the file `stop` appears
# in its working directory; prints its calls and 429s.
_LIVE_CALLER = """
import json, pathlib, sys, time
from dagster import build_resources
from backfill_platform.definitions import build_crm
per_second = int(sys.argv[1])
crm = build_crm("lakehouse")
calls = throttled = 0
with build_resources({"crm": crm}) as resources:
    print("ready", flush=True)
    while not pathlib.Path("stop").exists():
        tick = time.monotonic()
        ids = [f"live-{calls + n}" for n in range(per_second)]
        answers, stats = resources.crm.fetch(ids, kind="live", run_id="live-caller")
        calls, throttled = calls + len(answers), throttled + stats.throttled_429
        time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
print(json.dumps({"backend": crm.limiter_backend, "calls": calls, "429": throttled}))
"""


@contextlib.contextmanager
def live_crm_caller(
    workdir: Path, env: Mapping[str, str], per_second: int
) -> Iterable[dict[str, Any]]:
    """A second machine's live CRM calls while the block runs (its own working directory,
    no limiter file shared with anyone); yields the dict its report is put into."""
    workdir.mkdir(parents=True)
    settings = {k: v for k, v in env.items() if k != "BACKFILL_CRM_LIMITER"}
    process = subprocess.Popen(
        [sys.executable, "-c", _LIVE_CALLER, str(per_second)],
        cwd=workdir,
        env={**settings, "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )
    report: dict[str, Any] = {}
    try:
        assert process.stdout.readline().strip() == "ready", "the live CRM caller did not start"
        yield report
        (workdir / "stop").touch()
        out, _ = process.communicate(timeout=60)
        assert process.returncode == 0, out
        report.update(json.loads(out.strip().splitlines()[-1]))
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
