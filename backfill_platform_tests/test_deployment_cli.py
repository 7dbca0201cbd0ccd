"""The deployment path's refusals that need no deployment: nothing listening at DAGSTER_URL,
bad --tag. (Launching and following a real backfill: e2e/test_cli_deployment.py.)"""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from backfill_platform import cli
from backfill_platform_tests.e2e.services import free_port

RANGE = ["--start", "2024-01-02", "--end", "2024-01-03"]


def run_cli(*argv: str) -> tuple[int, dict]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = cli.main([*argv, "--json"])
    return status, json.loads(out.getvalue())


@pytest.fixture
def nothing_listening(tmp_path, monkeypatch) -> str:
    home = tmp_path / "dagster_home"
    home.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    url = f"http://127.0.0.1:{free_port()}"  # bound and released: nothing listens there
    monkeypatch.setenv("DAGSTER_URL", url)
    return url


@pytest.mark.parametrize(
    "argv",
    [
        ["backfill", "--select", "raw/orders", *RANGE],
        ["shadow", "--select", "marts/fct_daily_revenue", *RANGE, "--suffix", "fx"],
        ["retry", "abc123"],
        ["cancel", "abc123"],
    ],
)
def test_an_unreachable_deployment_is_refused_naming_the_url(nothing_listening, argv):
    status, payload = run_cli(*argv)
    assert status == 1 and payload["refused"], payload
    error = payload["error"]
    assert nothing_listening in error and "DAGSTER_URL" in error
    assert "make ui" in error and "--in-process" in error


@pytest.mark.parametrize("tag", ["novalue", "=x", ""])
def test_a_malformed_tag_is_refused_before_anything_runs(nothing_listening, tag):
    status, payload = run_cli("backfill", "--select", "raw/orders", *RANGE, "--tag", tag)
    assert status == 1 and "--tag" in payload["error"], payload
