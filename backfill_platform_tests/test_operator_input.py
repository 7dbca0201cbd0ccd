"""Hostile shadow suffixes: refused with exit status 1 and no traceback, nothing touched.

The lakehouse holds one production table and one shadow of it; a sibling directory
`victim/` lies beside the lakehouse. Every case compares a checksum of the whole tree
(lakehouse, sibling, landing) before and after the command.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from datetime import date
from pathlib import Path

import pytest

from backfill_platform.definitions import build_resources
from backfill_platform.operations.decommission import decommission
from backfill_platform.operations.shadow import shadow_lakehouse
from backfill_platform.resources.maintenance import TableDropRefused, drop_shadows
from backfill_platform.tables import FCT_DAILY_REVENUE, InvalidShadowSuffix, shadow_name
from backfill_platform_tests.harness import spark_resource_for_tests

HOSTILE_SUFFIXES = [
    "fx/../..",
    "fx/../../../victim",
    "../victim",
    "fx/..",
    "",
    "fx x",
    "fx.bak",
    "fx\n",
    "é",
    "x" * 41,
]


def tree_checksum(root: Path) -> str:
    """Every file's relative path, mode and bytes, and every directory, under `root`."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        digest.update(str(path.relative_to(root)).encode())
        if path.is_symlink():
            digest.update(b"link:" + os.readlink(path).encode())
        elif path.is_file():
            digest.update(path.read_bytes())
        else:
            digest.update(b"dir")
    return digest.hexdigest()


@pytest.fixture
def lakehouse_with_shadow(tmp_path, spark):
    landing, lakehouse, victim = tmp_path / "landing", tmp_path / "lakehouse", tmp_path / "victim"
    landing.mkdir()
    (victim / "keep").mkdir(parents=True)
    (victim / "keep" / "precious.txt").write_text("not the lakehouse's to delete\n")
    resources = build_resources(str(landing), str(lakehouse), spark=spark_resource_for_tests())
    lake = resources["lakehouse"]
    rows = spark.createDataFrame(
        [(date(2024, 1, 1), "EUR", 1)], "event_date date, currency string, orders long"
    )
    meta = {"code_version": "test"}
    lake.replace_range(
        FCT_DAILY_REVENUE, rows, "event_date", date(2024, 1, 1), date(2024, 1, 2), meta
    )
    shadow = shadow_lakehouse(lake, "fx", [FCT_DAILY_REVENUE])
    shadow.replace_range(
        FCT_DAILY_REVENUE, rows, "event_date", date(2024, 1, 1), date(2024, 1, 2), meta
    )
    assert (lakehouse / "marts" / "fct_daily_revenue__shadow_fx" / "_delta_log").is_dir()
    home = tmp_path / "dagster_home"
    home.mkdir()
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "BACKFILL_LANDING_DIR": str(landing),
        "BACKFILL_LAKEHOUSE_DIR": str(lakehouse),
    }
    return tmp_path, lake, env


def cli(env: dict, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "backfill_platform", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


RANGE = ["--select", "marts/fct_daily_revenue", "--start", "2024-01-01", "--end", "2024-01-01"]
COMMANDS = {
    "decommission": ["decommission", "--retention-hours", "0"],
    "validate": ["validate", *RANGE],
    "cutover": ["cutover", *RANGE, "--reason", "r", "--force"],
    "shadow": ["shadow", *RANGE],
}


@pytest.mark.parametrize(
    "command,suffix",
    [
        ("decommission", "fx/../.."),
        ("decommission", "fx/../../../victim"),
        ("validate", "fx/../../../victim"),
        ("cutover", "fx/../.."),
        ("shadow", "fx/../../../victim"),
    ],
)
def test_cli_refuses_traversal_suffix_and_touches_nothing(lakehouse_with_shadow, command, suffix):
    root, _, env = lakehouse_with_shadow
    before = tree_checksum(root)
    result = cli(env, *COMMANDS[command], "--suffix", suffix)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert f"--suffix {suffix!r}" in result.stdout
    assert tree_checksum(root) == before
    assert (root / "victim" / "keep" / "precious.txt").is_file()


@pytest.mark.parametrize("suffix", HOSTILE_SUFFIXES)
def test_every_path_that_builds_a_shadow_name_refuses_the_suffix(lakehouse_with_shadow, suffix):
    root, lake, _ = lakehouse_with_shadow
    before = tree_checksum(root)
    with pytest.raises(InvalidShadowSuffix, match="--suffix"):
        shadow_name("marts/fct_daily_revenue", suffix)
    with pytest.raises(InvalidShadowSuffix):
        decommission(lake, suffix, retention_hours=0)
    with pytest.raises(InvalidShadowSuffix):
        drop_shadows(lake, suffix)
    with pytest.raises(InvalidShadowSuffix):
        shadow_lakehouse(lake, suffix, [FCT_DAILY_REVENUE])
    assert tree_checksum(root) == before


def test_a_shadow_symlinked_outside_its_layer_is_refused(lakehouse_with_shadow):
    """A valid name whose directory resolves elsewhere (here: a Delta table outside the
    lakehouse) is not ours to delete."""
    root, lake, _ = lakehouse_with_shadow
    outside = root / "victim" / "table"
    (outside / "_delta_log").mkdir(parents=True)
    production = root / "lakehouse" / "marts" / "fct_daily_revenue" / "_delta_log"
    for entry in production.iterdir():
        if entry.is_file():
            (outside / "_delta_log" / entry.name).write_bytes(entry.read_bytes())
    (root / "lakehouse" / "staging").mkdir(exist_ok=True)
    (root / "lakehouse" / "staging" / "orders__shadow_fx").symlink_to(outside)
    before = tree_checksum(root)
    with pytest.raises(TableDropRefused, match="nothing was deleted"):
        drop_shadows(lake, "fx")
    assert tree_checksum(root) == before


def test_decommission_refuses_bad_retention_and_drops_a_real_shadow(lakehouse_with_shadow):
    root, lake, env = lakehouse_with_shadow
    before = tree_checksum(root)
    for hours in ("nan", "-1", "inf"):
        result = cli(env, "decommission", "--suffix", "fx", "--retention-hours", hours)
        assert result.returncode == 1, result.stdout + result.stderr
        assert "Traceback" not in result.stderr and "--retention-hours" in result.stdout
        assert tree_checksum(root) == before
    result = cli(env, "decommission", "--suffix", "fx", "--retention-hours", "0")
    assert result.returncode == 0, result.stdout + result.stderr
    assert not (root / "lakehouse" / "marts" / "fct_daily_revenue__shadow_fx").exists()
    assert lake.exists(FCT_DAILY_REVENUE)
    assert (root / "victim" / "keep" / "precious.txt").is_file()
