"""Faults of the storage and of a cutover, with real Spark, Delta and Dagster runs.

- The lakehouse disk fills up during a commit (a small tmpfs mounted for the test): the
  commit does not happen, every table reads at its previous version, the run's error names
  the table and the cause, and the next run after space is freed succeeds.
- A cutover is killed (SIGKILL of the CLI process) between its two tables: a reader polling
  the marts meanwhile never sees a partition half old and half new in one table; a
  rollback then restores the table that was cut over, and a second cutover completes.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import date
from decimal import Decimal
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from backfill_platform import cli
from backfill_platform.operations.shadow import shadow_lakehouse
from backfill_platform.reconcile import fingerprints, reconcile_marts
from backfill_platform.tables import CUSTOMER_LTV, FCT_DAILY_REVENUE, TABLE_NAMES, table
from backfill_platform_tests.harness import Platform, order_line

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

FIRST, LAST = "2024-01-01", "2024-01-04"
DAYS = [f"2024-01-0{d}" for d in range(1, 5)]
SIZES = {"small": {"orders_per_day": 150, "cutover_trials": 1}}
SIZES["full"] = {"orders_per_day": 1500, "cutover_trials": 3}


def deliver(platform: Platform, orders_per_day: int) -> None:
    for day in DAYS:
        platform.write_rates(day, {"EUR": "1.10", "GBP": "1.25"})
        platform.write_orders(
            day,
            [
                order_line(
                    f"{day}-{n}",
                    f"{day}T{n % 24:02d}:00:00Z",
                    customer_id=f"c{n % 37}",
                    currency=("EUR", "GBP", "USD")[n % 3],
                    amount=f"{10 + n % 90}.25",
                )
                for n in range(orders_per_day)
            ],
        )


@pytest.fixture
def small_disk(tmp_path):
    """A 48 MB tmpfs as the lakehouse directory (the machine's disk is never filled)."""
    mount = tmp_path / "lakehouse"
    mount.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({result.stderr.strip()}): needs root")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(mount: Path, leave_bytes: int) -> Path:
    filler = mount / "filler"
    stats = os.statvfs(mount)
    free = stats.f_bavail * stats.f_frsize
    with open(filler, "wb") as handle:
        handle.write(b"\0" * max(0, free - leave_bytes))
    return filler


def test_disk_full_during_a_commit_leaves_every_table_at_its_version(
    tmp_path, small_disk, spark, size, figures
):
    started = time.monotonic()
    platform = Platform.create(tmp_path)  # its lakehouse directory is the tmpfs
    assert platform.lakehouse == small_disk
    deliver(platform, SIZES[size]["orders_per_day"])
    platform.backfill(FIRST, LAST, per_run=4)
    lake = platform.resources["lakehouse"]
    versions = {t: lake.current_version(t) for t in TABLE_NAMES}
    before = fingerprints(lake)

    filler = fill(small_disk, leave_bytes=0)
    result = platform.materialize(FIRST, LAST, raise_on_error=False)
    assert not result.success
    failures = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    message = error_text(failures[0].step_failure_data.error)
    failed_table = failures[0].step_key.replace("__", "/")
    assert "No space left on device" in message and failed_table in message, message
    assert "nothing was committed" in message and "unchanged at version" in message
    assert {t: lake.current_version(t) for t in TABLE_NAMES} == versions
    assert fingerprints(lake) == before  # every table reads as before, row for row

    filler.unlink()
    assert platform.materialize(FIRST, LAST).success
    assert fingerprints(lake) == before  # same input, same tables
    assert reconcile_marts(lake, platform.landing, date(2024, 1, 1), date(2024, 1, 4)).ok
    figures["disk_full_trials"] = 1
    figures["disk_full_error"] = next(x for x in message.splitlines() if "No space" in x)[:240]
    figures["rows_checked"] = figures.get("rows_checked", 0) + sum(
        int(n) for n, _ in before.values()
    )
    figures["rows_lost"] = 0
    figures["seconds_disk_full"] = round(time.monotonic() - started, 1)


def error_text(error) -> str:
    """A Dagster error's message with the messages of its causes."""
    parts = []
    while error is not None:
        parts.append(error.message)
        error = error.cause
    return "\n".join(parts)


def partition_sums(lake, key, version=None) -> dict[str, Decimal]:
    column = table(key).partition_column
    measure = table(key).measures[-1]
    return {
        str(r[0]): r[1]
        for r in lake.read(key, version).groupBy(column).agg(F.sum(measure)).collect()
    }


def run_cli(*argv: str) -> int:
    """The CLI in this process (its `main()`), output discarded."""
    with contextlib.redirect_stdout(io.StringIO()):
        return cli.main(list(argv))


def test_a_cutover_killed_between_tables_is_never_torn_and_can_be_rolled_back(
    tmp_path, spark, size, figures, monkeypatch
):
    started = time.monotonic()
    platform = Platform.create(tmp_path)
    home = tmp_path / "dagster_home"
    home.mkdir()
    deliver(platform, SIZES[size]["orders_per_day"])
    platform.backfill(FIRST, LAST, per_run=4)
    lake = platform.resources["lakehouse"]
    marts = [CUSTOMER_LTV, FCT_DAILY_REVENUE]  # the cutover's order (dependency order)
    settings = {
        "DAGSTER_HOME": str(home),
        "BACKFILL_LANDING_DIR": str(platform.landing),
        "BACKFILL_LAKEHOUSE_DIR": str(platform.lakehouse),
    }
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    env = {**os.environ, **settings}
    cutover_args = [
        "cutover",
        "--select",
        "marts/fct_daily_revenue,marts/customer_ltv",
        "--start",
        FIRST,
        "--end",
        LAST,
        "--force",
        "--no-rebuild",
    ]
    interrupted = torn = 0
    for trial in range(SIZES[size]["cutover_trials"]):
        # The correction: every measure of the shadow is the production value times two.
        suffix = f"fix{trial}"
        shadow = shadow_lakehouse(lake, suffix, marts)
        for key in marts:
            column, measure = table(key).partition_column, table(key).measures[-1]
            production = lake.read(key)
            kind = dict(production.dtypes)[measure]
            rows = production.withColumn(measure, (F.col(measure) * 2).cast(kind))
            shadow.replace_range(
                key, rows, column, date(2024, 1, 1), date(2024, 1, 5), {"code_version": "x2"}
            )
        old = {k: partition_sums(lake, k) for k in marts}
        new = {k: {d: v * 2 for d, v in old[k].items()} for k in marts}
        old_versions = {k: lake.current_version(k) for k in marts}

        seen, stop = [], threading.Event()

        def read_until_stopped(stop=stop, seen=seen, old=old, new=new):
            while not stop.is_set():
                for key in marts:
                    for day, total in partition_sums(lake, key).items():
                        seen.append(total in (old[key][day], new[key][day]))

        reader = threading.Thread(target=read_until_stopped)
        reader.start()
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "backfill_platform",
                "cutover",
                "--select",
                "marts/fct_daily_revenue,marts/customer_ltv",
                "--start",
                FIRST,
                "--end",
                LAST,
                "--suffix",
                suffix,
                "--reason",
                "trial",
                "--force",
                "--no-rebuild",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        first_log = Path(lake.table_path(marts[0])) / "_delta_log"
        next_commit = first_log / f"{old_versions[marts[0]] + 1:020d}.json"
        deadline = time.monotonic() + 300
        while not next_commit.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=60)
        stop.set()
        reader.join()
        torn += seen.count(False)
        assert seen and all(seen), f"a reader saw a partition half old, half new ({trial})"

        now = {k: lake.current_version(k) for k in marts}
        assert now[marts[0]] == old_versions[marts[0]] + 1, "the kill came before any commit"
        if now[marts[1]] == old_versions[marts[1]]:
            interrupted += 1
            assert partition_sums(lake, marts[0]) == new[marts[0]]
            assert partition_sums(lake, marts[1]) == old[marts[1]]
        # Roll the interrupted cutover back: every table as before it.
        assert run_cli("rollback", "--reason", "interrupted") == 0
        assert {k: partition_sums(lake, k) for k in marts} == old
        # Then the same cutover, run to the end: both tables carry the correction.
        assert run_cli(*cutover_args, "--suffix", suffix, "--reason", "again") == 0
        assert {k: partition_sums(lake, k) for k in marts} == new
        # Back to production's state for the next trial.
        assert run_cli("rollback", "--reason", "reset") == 0
    assert interrupted >= 1, "no kill landed between the two tables"
    figures["cutover_trials"] = SIZES[size]["cutover_trials"]
    figures["cutovers_interrupted_between_tables"] = interrupted
    figures["torn_partitions"] = torn
    figures["trials"] = figures.get("disk_full_trials", 0) + SIZES[size]["cutover_trials"]
    figures["seconds_cutover"] = round(time.monotonic() - started, 1)
