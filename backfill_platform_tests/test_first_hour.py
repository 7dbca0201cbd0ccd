"""A newcomer's first hour, as the README tells it: the CLI without an activated venv or
DAGSTER_HOME, relative folders, `make deliver-day` and the live path picking the day up, `make
ui`'s logs and shutdown. The demo itself, with and without the stream, is test_readme.py's.

Real processes (make, `python -m backfill_platform`), real Spark, Delta and Dagster.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from datetime import date, timedelta
from pathlib import Path
from urllib.parse import quote

import psutil
import pytest
from pyspark.sql import functions as F

from backfill_platform.automation.landing_sensor import landing_sensor
from backfill_platform.definitions import build_resources
from backfill_platform.sources import postgres_server
from backfill_platform.sources.generate import deliver_next_day, generate_landing
from backfill_platform.tables import RAW_ORDERS
from backfill_platform_tests.harness import spark_resource_for_tests
from backfill_platform_tests.test_automation import Daemon, _instance, _range
from backfill_platform_tests.test_readme import LOG_LINE

REPO = Path(__file__).resolve().parents[1]


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a new shell: no DAGSTER_HOME, data under tmp_path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DAGSTER_", "BACKFILL_"))}
    env.update(
        BACKFILL_LANDING_DIR=str(tmp_path / "landing"),
        BACKFILL_LAKEHOUSE_DIR=str(tmp_path / "lakehouse"),
        **extra,
    )
    return env


@pytest.fixture
def postgres_data():
    """A folder for the demo's PostgreSQL server, removed afterwards."""
    data = postgres_server.scratch_data("first-hour-pg-")
    yield str(data)
    shutil.rmtree(data.parent, ignore_errors=True)


def _cli(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "backfill_platform", *argv],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


# This interpreter as make names its own, relative to the repository: an absolute path
# splits in make's recipes when the clone's path has a space, as a user's make never sees it.
MAKE_PY = os.path.relpath(sys.executable, REPO)


def _make(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess:
    """make in the repository, with this interpreter and nothing to install (the test runs
    from an installed venv)."""
    done = subprocess.run(
        ["make", "--no-print-directory", *argv, "INSTALLED=", "JARS=", f"PY={MAKE_PY}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        timeout=1200,
    )
    # decoded here: text=True would turn a progress bar's carriage returns into newlines
    return subprocess.CompletedProcess(
        done.args, done.returncode, done.stdout.decode(), done.stderr.decode()
    )


DAYS = ["--start", "2024-01-01", "--end", "2024-01-02"]
USER_ERRORS = {
    "unknown asset": (["plan", "--select", "nope/x", *DAYS], {}, "unknown asset 'nope/x'"),
    "reversed range": (
        ["history", "--start", "2024-01-03", "--end", "2024-01-01"],
        {},
        "--start 2024-01-03 is after --end 2024-01-01",
    ),
    "bad setting": (
        ["history", *DAYS],
        {"BACKFILL_START_DATE": "2024-13-01"},
        "BACKFILL_START_DATE='2024-13-01': not a day",
    ),
    "missing DAGSTER_HOME dir": (
        ["rollback", "--reason", "r"],
        {"DAGSTER_HOME": "/nonexistent/home"},
        "DAGSTER_HOME=/nonexistent/home: no such directory",
    ),
}


@pytest.mark.parametrize("argv,extra,says", USER_ERRORS.values(), ids=USER_ERRORS.keys())
def test_a_user_error_is_one_line_and_exit_status_1(tmp_path, argv, extra, says):
    result = _cli(_env(tmp_path, **extra), *argv)
    output = (result.stdout + result.stderr).splitlines()
    assert result.returncode == 1, result.stdout + result.stderr
    assert output == [output[0]] and output[0].startswith("Refused: ") and says in output[0]


def test_cli_without_dagster_home_uses_the_repositorys_and_logs_to_a_file(tmp_path):
    """A new shell: no DAGSTER_HOME, the venv's interpreter run from the repository."""
    result = _cli(
        _env(tmp_path, BACKFILL_START_DATE="2024-01-01"),
        "history",
        "--start",
        "2024-01-01",
        "--end",
        "2024-01-03",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "no commits in range"
    first, *rest = result.stderr.splitlines()
    assert rest == []  # Spark's and Dagster's output went to the file, not here
    log = REPO / LOG_LINE.match(first).group(1)
    assert log.parent == REPO / ".dagster_home" / "backfill-logs" and log.is_file()
    assert (REPO / ".dagster_home" / "dagster.yaml").is_file()


@pytest.mark.slow
def test_relative_folders_on_makes_command_line_reach_the_instance(tmp_path):
    """`make cli` with POSTGRES_DATA and DAGSTER_HOME relative to the repository, given on
    make's command line: the server starts there and the CLI reaches it through the yaml's
    absolute socket path (a relative one was once taken for a host name)."""
    folder = Path(os.path.relpath(tmp_path / "a folder", REPO))
    env = _env(tmp_path, BACKFILL_START_DATE="2024-01-01")
    relative = [f"POSTGRES_DATA={folder / 'postgres'}", f"DAGSTER_HOME={folder / 'home'}"]
    try:
        history = _make(env, "cli", "ARGS=history --start 2024-01-01 --end 2024-01-02", *relative)
        assert history.returncode == 0, history.stdout + history.stderr
        assert history.stdout.splitlines()[-1] == "no commits in range", history.stdout
        yaml = (tmp_path / "a folder" / "home" / "dagster.yaml").read_text()
        sockets = postgres_server.socket_dir(tmp_path / "a folder" / "postgres")
        assert f"host={quote(str(sockets), safe='/')}&" in yaml
    finally:
        _make(env, "postgres-stop", *relative)


@pytest.mark.slow
def test_a_delivered_day_is_requested_by_the_landing_sensor_and_ingested(tmp_path, spark):
    """The live path on `deliver-day`'s output: the landing sensor requests exactly the new
    day, and raw ingestion of it holds every delivered line, late ones included."""
    landing, first, last = tmp_path / "landing", date(2024, 1, 1), date(2024, 1, 5)
    generate_landing(landing, first, last, 30, seed=5, progress=False)
    resources = build_resources(
        str(landing), str(tmp_path / "lakehouse"), spark=spark_resource_for_tests()
    )
    daemon = Daemon(resources, _instance(tmp_path / "home"))
    daemon.tick(landing_sensor)  # the history, taken as seen (not launched here)

    delivery = deliver_next_day(landing)
    new_day = (last + timedelta(days=1)).isoformat()
    requests, _, _ = daemon.tick(landing_sensor)
    assert [_range(r) for r in requests] == [(new_day, new_day)]
    daemon.launch(landing_sensor, requests[0])

    raw = resources["lakehouse"].read(RAW_ORDERS).where(F.col("ingest_date") == F.lit(new_day))
    assert raw.count() == delivery.lines
    assert raw.where(F.col("event_date") < F.col("ingest_date")).count() == delivery.late_lines
    ids = {r["order_id"] for r in raw.select("order_id").where("order_id IS NOT NULL").collect()}
    assert set(delivery.order_ids) <= ids
    assert daemon.tick(landing_sensor)[0] == []  # delivered once, requested once


@pytest.mark.slow
def test_make_ui_keeps_the_printed_logs_sends_no_telemetry_and_stops_whole(
    tmp_path, session_crm, postgres_data
):
    """Dagster's webserver and daemon take DAGSTER_HOME/logs as their telemetry queue and move
    it away on start: the commands' logs live elsewhere, telemetry is off in every process
    `make ui` starts, and a SIGTERM to its process group (started in the background, as a
    script would) leaves no process behind."""
    home = tmp_path / "home"
    home.mkdir()
    env = _env(
        tmp_path,
        DAGSTER_HOME=str(home),
        BACKFILL_START_DATE="2024-01-01",
        BACKFILL_CRM_URL=session_crm.url,
        POSTGRES_DATA=postgres_data,
    )
    env.pop("DAGSTER_DISABLE_TELEMETRY", None)  # the Makefile must set it itself
    history = _cli(env, "history", "--start", "2024-01-01", "--end", "2024-01-02")
    assert history.returncode == 0, history.stdout + history.stderr
    log = Path(LOG_LINE.match(history.stderr.splitlines()[0]).group(1))
    log = log if log.is_absolute() else REPO / log
    assert log.is_file() and log.parent == home / "backfill-logs"

    port = free_port()
    ui = subprocess.Popen(
        ["make", "--no-print-directory", "ui", "INSTALLED=", "JARS=", f"PY={MAKE_PY}",
         f"VENV={Path(MAKE_PY).parents[1]}", f"UI_ARGS=-p {port}"],
        cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True,
        # A script's background job: SIGINT ignored, as `make ui &` gets it.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )  # fmt: skip
    started: list[psutil.Process] = []
    try:
        wait_for_http(f"http://127.0.0.1:{port}/server_info", timeout=240)
        started = psutil.Process(ui.pid).children(recursive=True)
        dagster = [p for p in started if "dagster" in " ".join(p.cmdline())]
        assert len(dagster) >= 3  # dagster dev, its webserver and daemon (and code servers)
        for process in dagster:
            assert process.environ().get("DAGSTER_DISABLE_TELEMETRY") == "1", process.cmdline()
            assert process.environ().get("DAGSTER_EVENT_BATCH_SIZE") == "1000"
        os.killpg(ui.pid, signal.SIGTERM)
        ui.wait(timeout=120)
        _, alive = psutil.wait_procs(started, timeout=90)
        assert alive == [], [" ".join(p.cmdline())[:120] for p in alive]
    finally:
        for process in started:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        if ui.poll() is None:
            os.killpg(ui.pid, signal.SIGKILL)
        _make(env, "postgres-stop")  # started by `make ui`, left running for the next command
    assert log.is_file()  # every log path printed earlier still points at its file
    assert not (home / ".logs_queue").exists()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for_http(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)
