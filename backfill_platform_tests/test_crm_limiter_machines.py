"""The CRM rate limit across machines: the window in the Dagster instance's PostgreSQL.

Three processes play three machines: each has its own working directory and lakehouse, no
BACKFILL_CRM_LIMITER, and builds its CrmResource from settings (`build_crm`) as a run
would. With DAGSTER_PG_* set they share the window in a real PostgreSQL (Debian's server,
initdb + pg_ctl on a loopback port, as the e2e tests start it); without, each keeps its own
SQLite file and the demo CRM sees the limit exceeded: the test can fail. Nothing is mocked.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from contextlib import closing
from pathlib import Path

import pytest

from backfill_platform.definitions import crm_limiter_choice
from backfill_platform.resources.crm import CrmError, CrmResource
from backfill_platform.settings import SettingError
from backfill_platform.sources.crm_process import start_crm_server
from backfill_platform.sources.crm_server import peak_per_second
from backfill_platform_tests.e2e.services import (
    PostgresServer,
    free_port,
    make_postgres_dir,
    postgres_bin,
)

pytestmark = pytest.mark.slow

TOKEN = "crm-machines-token-5b2c"
ROOT = Path(__file__).resolve().parents[1]
LIMIT, RESERVE, BACKFILL_SHARE = 20, 0.25, 15
LIMITER_SETTINGS = (
    "BACKFILL_CRM_LIMITER",
    "BACKFILL_CRM_LIMITER_BACKEND",
    "DAGSTER_PG_HOST",
    "DAGSTER_PG_PORT",
    "DAGSTER_PG_USERNAME",
    "DAGSTER_PG_PASSWORD",
    "DAGSTER_PG_DB",
)

# A "machine": builds the CRM client from settings like a run, says ready, waits for "go"
# on stdin (so the three start together), calls, and reports what it used.
_MACHINE = """
import json, sys
from dagster import build_resources
from backfill_platform.definitions import build_crm
kind, count = sys.argv[1], int(sys.argv[2])
crm = build_crm("lakehouse")
with build_resources({"crm": crm}) as resources:
    print("ready", flush=True)
    sys.stdin.readline()
    answers, stats = resources.crm.fetch([f"{kind}-{n}" for n in range(count)], kind=kind)
print(json.dumps({"backend": crm.limiter_backend, "path": crm.limiter_path,
                  "answers": len(answers), "429": stats.throttled_429}), flush=True)
"""


@pytest.fixture(scope="module")
def postgres():
    data_dir = make_postgres_dir()
    server = PostgresServer(data_dir, free_port(), postgres_bin())
    started = time.monotonic()
    try:
        server.start()
        print(f"PostgreSQL started in {time.monotonic() - started:.1f} s")
        yield server
    finally:
        server.stop()
        shutil.rmtree(data_dir.parent, ignore_errors=True)


def _crm_data(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "customers.json").write_text(json.dumps({"customers": {}}))
    return folder


def _machines(tmp_path: Path, url: str, extra: dict[str, str], callers, during=None):
    """Start one process per (kind, count) in its own directory, release them together,
    run `during()` meanwhile if given, and return their reports."""
    env = {k: v for k, v in os.environ.items() if k not in LIMITER_SETTINGS}
    env.update(
        {
            "PYTHONPATH": str(ROOT),
            "BACKFILL_CRM_URL": url,
            "BACKFILL_CRM_TOKEN": TOKEN,
            "BACKFILL_CRM_RATE_LIMIT": str(LIMIT),
            "BACKFILL_CRM_LIVE_RESERVE": str(RESERVE),
            "BACKFILL_CRM_CONCURRENCY": "4",
            **extra,
        }
    )
    processes = []
    for n, (kind, count) in enumerate(callers):
        home = tmp_path / f"machine-{n}"
        home.mkdir()
        processes.append(
            subprocess.Popen(
                [sys.executable, "-c", _MACHINE, kind, str(count)],
                cwd=home,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        )
    try:
        for process in processes:
            assert process.stdout.readline().strip() == "ready"
        for process in processes:
            process.stdin.write("go\n")
            process.stdin.flush()
        if during is not None:
            during()
        reports = []
        for process in processes:
            out, _ = process.communicate(timeout=180)
            assert process.returncode == 0, out
            reports.append(json.loads(out.strip().splitlines()[-1]))
        return reports
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()


CALLERS = [("backfill", 30), ("backfill", 30), ("live", 20)]


def _audit(logged: list[dict]) -> dict:
    everyone = [e["t"] for e in logged]
    backfills = [e["t"] for e in logged if e["kind"] == "backfill"]
    live = [e["t"] for e in logged if e["kind"] == "live"]
    during = [t for t in backfills if min(live) <= t <= max(live)]
    return {
        "requests": len(logged),
        "429s": sum(1 for e in logged if e["status"] == 429),
        "peak": peak_per_second(everyone),
        "backfill_peak": peak_per_second(backfills),
        "backfill_peak_while_live": peak_per_second(during),
        "seconds": round(max(everyone) - min(everyone), 1),
    }


def test_three_machines_share_the_limit_in_the_instances_postgres(postgres, tmp_path):
    log = tmp_path / "requests.jsonl"
    with start_crm_server(_crm_data(tmp_path / "crm"), token=TOKEN, rate=LIMIT, log=log) as crm:
        reports = _machines(tmp_path, crm.url, postgres.env(), CALLERS)
        logged = crm.requests()
    audit = _audit(logged)
    print(f"PostgreSQL limiter, 3 machines: {audit}")
    assert {r["backend"] for r in reports} == {"postgres"}
    assert Counter(e["status"] for e in logged) == {404: 80}
    assert audit["429s"] == 0 and [r["429"] for r in reports] == [0, 0, 0]
    assert audit["peak"] <= LIMIT
    assert audit["backfill_peak"] <= BACKFILL_SHARE
    assert audit["backfill_peak_while_live"] <= BACKFILL_SHARE
    # The window is a table of the instance's database, the stamps the server's clock.
    with closing(postgres.connect()) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM backfill_crm_rate_limit WHERE finished IS NULL")
        assert cur.fetchone() == (0,)


def test_three_machines_with_their_own_sqlite_files_exceed_the_limit(tmp_path):
    """The control: the same three callers, each with the SQLite default in its own
    directory (three machines without a shared limiter), send more than the limit."""
    log = tmp_path / "requests.jsonl"
    with start_crm_server(_crm_data(tmp_path / "crm"), token=TOKEN, rate=LIMIT, log=log) as crm:
        reports = _machines(tmp_path, crm.url, {}, CALLERS)
        logged = crm.requests()
    audit = _audit(logged)
    offered = peak_per_second([e["t"] for e in logged])  # 429s included: what was sent
    print(f"SQLite per machine: {audit}; peak sent per second {offered}")
    assert {r["backend"] for r in reports} == {"sqlite"}
    assert len({r["path"] for r in reports}) == 3
    assert audit["429s"] > 0 and offered > LIMIT


def test_postgres_restarting_mid_calls_makes_them_wait_never_exceed(postgres, tmp_path):
    log = tmp_path / "requests.jsonl"
    outage = {}

    def restart() -> None:
        time.sleep(1.5)
        outage["from"] = time.time()
        postgres.stop()  # -m immediate: the server dies, crash recovery on start
        time.sleep(1.0)
        # The outage ends when the server starts, not when start_again sees it ready: pg_ctl
        # polls, and the callers waiting for the database are admitted in the meantime.
        outage["to"] = time.time()
        postgres.start_again()

    with start_crm_server(_crm_data(tmp_path / "crm"), token=TOKEN, rate=LIMIT, log=log) as crm:
        callers = [("backfill", 30), ("backfill", 30)]
        reports = _machines(tmp_path, crm.url, postgres.env(), callers, during=restart)
        logged = crm.requests()
    times = sorted(e["t"] for e in logged)
    inside = [t for t in times if outage["from"] + 0.1 < t < outage["to"]]
    print(
        f"PostgreSQL down {outage['to'] - outage['from']:.1f} s: {len(logged)} requests, "
        f"{len(inside)} during the outage, peak {peak_per_second(times)}/s"
    )
    assert [r["answers"] for r in reports] == [30, 30]
    assert Counter(e["status"] for e in logged) == {404: 60}
    assert peak_per_second(times) <= BACKFILL_SHARE
    # No call was admitted while the limiter's database was down (those in flight finish).
    assert len(inside) <= 8, inside


def test_an_unreachable_postgres_fails_the_call_cleanly_without_the_password(tmp_path, monkeypatch):
    secret = "pg-secret-41d7"
    for name, value in {
        "DAGSTER_PG_HOST": "127.0.0.1",
        "DAGSTER_PG_PORT": str(free_port()),  # nothing listens there
        "DAGSTER_PG_USERNAME": "dagster",
        "DAGSTER_PG_PASSWORD": secret,
        "DAGSTER_PG_DB": "dagster",
    }.items():
        monkeypatch.setenv(name, value)
    with start_crm_server(_crm_data(tmp_path / "crm"), token=TOKEN, rate=LIMIT) as crm:
        client = CrmResource(
            url=crm.url, token=TOKEN, limiter_backend="postgres", limiter_unavailable_seconds=1
        )
        with pytest.raises(CrmError, match="rate limiter's PostgreSQL") as failed:
            client.fetch(["a", "b"])
        assert crm.metrics()["requests"] == 0
    assert secret not in str(failed.value) and "DAGSTER_PG_" in str(failed.value)


def test_which_limiter_a_deployment_gets(monkeypatch, tmp_path):
    for name in LIMITER_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    local = str(tmp_path / "lake")
    assert crm_limiter_choice(local) == ("sqlite", str(tmp_path / "crm_rate_limit.sqlite"))
    # A file:// root is one machine's disk, like a plain path.
    expected = ("sqlite", str(tmp_path / "crm_rate_limit.sqlite"))
    assert crm_limiter_choice((tmp_path / "lake").as_uri()) == expected
    # An object-store root without a shared limiter: refused in one line naming the settings.
    with pytest.raises(SettingError, match=r"DAGSTER_PG_.*BACKFILL_CRM_LIMITER") as refused:
        crm_limiter_choice("s3a://bucket/lake")
    assert "\n" not in str(refused.value)
    monkeypatch.setenv("BACKFILL_CRM_LIMITER", "/shared/limiter.sqlite")
    assert crm_limiter_choice("s3a://bucket/lake") == ("sqlite", "/shared/limiter.sqlite")
    monkeypatch.setenv("DAGSTER_PG_HOST", "db.internal")
    assert crm_limiter_choice("s3a://bucket/lake")[0] == "sqlite"  # an explicit file wins
    monkeypatch.delenv("BACKFILL_CRM_LIMITER")
    assert crm_limiter_choice("s3a://bucket/lake") == ("postgres", "")
    assert crm_limiter_choice(local) == ("postgres", "")
    monkeypatch.setenv("BACKFILL_CRM_LIMITER_BACKEND", "sqlite")
    assert crm_limiter_choice(local)[0] == "sqlite"
    monkeypatch.setenv("BACKFILL_CRM_LIMITER_BACKEND", "postgres")
    monkeypatch.delenv("DAGSTER_PG_HOST")
    with pytest.raises(SettingError, match="DAGSTER_PG_HOST is empty"):
        crm_limiter_choice(local)
