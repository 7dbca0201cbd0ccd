"""The demo's Dagster instance on a PostgreSQL server of its own (`make postgres-start`), and
`runner.recording_instance`, which makes a process's runs write their events through one
pooled connection, batched, as every run of the code location does for itself (the
lakehouse resource's set-up): a real server from Debian's package on a Unix socket, real
Dagster runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterInstance, DailyPartitionsDefinition, asset

from backfill_platform.resources import LakehouseResource, SparkSessionResource
from backfill_platform.runner import (
    EVENT_BATCH_ENV,
    EVENT_BATCH_SIZE,
    materialize_range,
    recording_instance,
)
from backfill_platform.sources import postgres_server
from backfill_platform_tests.sensor_ticks import instance_at

DAYS = DailyPartitionsDefinition(start_date="2024-01-01")
PARTITIONS = 60


@asset(partitions_def=DAYS, key=AssetKey(["calibration", "events"]))
def events() -> None:
    return None


@asset(partitions_def=DAYS, key=AssetKey(["calibration", "lakehouse_events"]))
def lakehouse_events(lakehouse: LakehouseResource) -> None:
    """Any asset of the code location: it sets the lakehouse up (no Spark is started)."""
    return None


@pytest.fixture(scope="module")
def server():
    """A started server in a new temporary folder, removed afterwards."""
    data = postgres_server.scratch_data("demo-pg-")
    assert postgres_server.start(data) is True
    try:
        yield data
    finally:
        postgres_server.stop(data)
        shutil.rmtree(data.parent, ignore_errors=True)


@pytest.fixture(autouse=True)
def event_batch_unset(monkeypatch):
    """Each test starts with the batch size unset and leaves the process as it found it:
    `recording_instance` sets it for the rest of its process, and monkeypatch undoes only what
    it changed (`setenv` remembers the value before, an unset one too; `delenv` of an unset
    variable remembers nothing)."""
    monkeypatch.setenv(EVENT_BATCH_ENV, str(EVENT_BATCH_SIZE))
    monkeypatch.delenv(EVENT_BATCH_ENV)


def _query(data: Path, sql: str):
    """The first value of `sql`'s first row, on a connection of its own to the server."""
    connection = postgres_server.connect(data, "dagster")
    with closing(connection), connection.cursor() as cursor:
        cursor.execute(sql)
        return cursor.fetchone()[0]


def _sessions(data: Path) -> int:
    """Connections opened to the instance's database so far (the server's own count)."""
    return _query(data, "SELECT sessions FROM pg_stat_database WHERE datname = 'dagster'")


def _instance(data: Path, home: Path) -> DagsterInstance:
    postgres_server.write_dagster_yaml(home, data)
    return DagsterInstance.from_config(str(home))


def _range_run(instance: DagsterInstance, data: Path, assets=(events,), resources=None) -> int:
    """One ranged run over PARTITIONS days; the connections it opened."""
    keys = DAYS.get_partition_keys()[:PARTITIONS]
    before = _sessions(data)
    result = materialize_range(list(assets), keys[0], keys[-1], resources or {}, instance)
    assert result.success
    return _sessions(data) - before - 1  # not _query's own


def test_started_once_and_the_yaml_keeps_deploy_settings(server, tmp_path):
    assert postgres_server.start(server) is False  # running: left as it is
    yaml = postgres_server.write_dagster_yaml(tmp_path / "home", server).read_text()
    assert f"host={server}&port=5432" in yaml and "password" not in yaml
    deploy = (Path(__file__).parents[1] / "deploy" / "dagster.yaml").read_text()
    assert yaml.endswith(deploy)  # queue, pools and retries exactly as deployed
    assert _query(server, "SHOW listen_addresses") == ""  # the socket in its folder only
    assert _query(server, "SHOW synchronous_commit") == "off"


def test_a_recording_instance_writes_a_run_through_one_pooled_connection(server, tmp_path):
    """The same 60-partition run: Dagster's default opens connections per statement, the
    recording instance a handful; every planned and materialized partition is recorded."""
    plain = _instance(server, tmp_path / "plain")
    opened_plain = _range_run(plain, server)

    tuned = recording_instance(_instance(server, tmp_path / "tuned"))
    assert os.environ[EVENT_BATCH_ENV] == "1000"
    opened_tuned = _range_run(tuned, server)

    assert opened_plain > 2 * PARTITIONS, opened_plain
    assert opened_tuned <= 6, opened_tuned
    partitions = tuned.get_materialized_partitions(events.key)
    assert partitions == set(DAYS.get_partition_keys()[:PARTITIONS])
    record = tuned.get_latest_materialization_event(events.key)
    assert record.dagster_event.partition == DAYS.get_partition_keys()[PARTITIONS - 1]


def test_a_pooled_instance_outlives_a_server_restart(server, tmp_path):
    """PostgreSQL restarted between two runs (an upgrade, a failover) leaves the pooled
    connection dead: the next run reconnects, as Dagster's connection per statement did,
    instead of failing on its first statement."""
    tuned = recording_instance(_instance(server, tmp_path / "home"))
    _range_run(tuned, server)
    assert postgres_server.stop(server) is True
    assert postgres_server.start(server) is True
    _range_run(tuned, server)  # succeeds (it asserts so)


def test_a_run_of_the_code_location_pools_its_own_instance(server, tmp_path):
    """A run the daemon launches gets its instance from DAGSTER_HOME, untuned: the lakehouse
    resource's set-up tunes it, so the run's step writes its events through the pool (the
    run's creation, before any resource, still opens its connections: the daemon's, for a
    run it launches). A SQLite instance's run leaves the process's environment alone."""
    lakehouse = {
        "lakehouse": LakehouseResource(
            root_dir=str(tmp_path / "lake"), spark=SparkSessionResource()
        )
    }
    sqlite = instance_at(tmp_path / "sqlite")  # deploy/dagster.yaml: SQLite
    keys = DAYS.get_partition_keys()[:PARTITIONS]
    assert materialize_range([lakehouse_events], keys[0], keys[-1], lakehouse, sqlite).success
    assert EVENT_BATCH_ENV not in os.environ

    # Two instances as a run worker makes them: the same run without and with the resource.
    without = _range_run(_instance(server, tmp_path / "without"), server)
    plain = _instance(server, tmp_path / "plain")
    opened = _range_run(plain, server, [lakehouse_events], lakehouse)

    # Each of the step's 60 materializations and its other events took a connection before.
    assert opened <= without - 2 * PARTITIONS, (opened, without)
    assert os.environ[EVENT_BATCH_ENV] == "1000"
    assert plain.get_materialized_partitions(lakehouse_events.key) == set(keys)


def test_a_private_folder_relative_and_spaced_runs_the_virtualenvs_server(tmp_path, monkeypatch):
    """A clone inside a folder only its owner may enter (root's home, `mktemp -d`), with a
    space in its path, given as a relative path: the server starts there, from the
    virtualenv's binaries, its files stay the caller's, and the yaml's address works from
    any working directory."""
    private = tmp_path / "private folder"
    private.mkdir(mode=0o700)
    monkeypatch.chdir(private)
    data = Path("data/postgres")
    home = Path(".dagster_home")
    assert postgres_server.main(["start", "--data", str(data), "--dagster-home", str(home)]) == 0
    try:
        pid = int((private / data / "cluster" / "postmaster.pid").read_text().split()[0])
        binary = Path(os.readlink(f"/proc/{pid}/exe"))
        assert binary.is_relative_to(Path(sys.prefix)), binary  # the venv's, not Debian's
        assert not binary.is_relative_to("/usr/lib/postgresql")
        assert (private / data / "cluster").stat().st_uid == os.geteuid()
        assert (private.stat().st_mode & 0o777) == 0o700  # nothing opened up
        monkeypatch.chdir("/")
        instance = DagsterInstance.from_config(str(private / home))
        assert instance.get_runs() == []  # the storage answers through the absolute socket
    finally:
        postgres_server.stop(private / data)


def test_the_cli_refuses_in_one_line_when_the_server_is_down(tmp_path):
    """After a reboot the demo's server is not running: the CLI says so and how to start it
    (after Dagster's own connection retries), not a traceback."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text(
        "storage:\n  postgres:\n"
        f'    postgres_url: "{postgres_server.instance_url(tmp_path / "no-server")}"\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DAGSTER_", "BACKFILL_"))}
    env.update(DAGSTER_HOME=str(home), BACKFILL_LAKEHOUSE_DIR=str(tmp_path / "lakehouse"))
    result = subprocess.run(
        [sys.executable, "-m", "backfill_platform", "unfreeze", "--reason", "r"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    (refused,) = result.stdout.splitlines()  # stderr: the log file's line
    assert refused.startswith(f"Refused: DAGSTER_HOME={home}: its PostgreSQL storage does not")
    assert "make postgres-start" in refused
    assert result.stderr.startswith("log: ") and len(result.stderr.splitlines()) == 1
