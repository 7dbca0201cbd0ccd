"""The correction playbook's nine steps on a quarter of generated days (docs/playbook.md;
30 days at CI's small size).

Finance finds that revenue_usd joined the previous day's FX rate for a whole quarter. The
released code is deliberately wrong (the rate applied one day late); then, one command each:
freeze, verify the sources (plan), reset the watermark (the plan's partitions), shadow with
the fix, validate, zero-copy cutover, rebuild downstream, report, decommission. Meanwhile the
live path keeps running tick by tick: a new day flows, the frozen days are left alone.
At the end production equals the contract's answer; a consumer reading "as of" the version
the freeze published saw the old numbers until the cutover, and still can.
"""

from __future__ import annotations

import json
import shlex
from datetime import date, timedelta
from typing import Any

import pytest
from dagster import AssetSelection, materialize

import backfill_platform.assets.marts as marts_module
from backfill_platform import cli
from backfill_platform.automation.freeze import active_freezes
from backfill_platform.automation.landing_sensor import landing_sensor
from backfill_platform.automation.window_sensor import rolling_window_sensor
from backfill_platform.definitions import all_assets, build_resources
from backfill_platform.reconcile import reconcile_marts
from backfill_platform.runner import RANGE_END_TAG, RANGE_START_TAG, materialize_range
from backfill_platform.sources.generate import generate_landing
from backfill_platform.tables import CUSTOMER_LTV, FCT_DAILY_REVENUE, RAW_FX_RATES, RAW_ORDERS
from backfill_platform_tests.harness import order_line, point_cli_at, spark_resource_for_tests
from backfill_platform_tests.reliability.conftest import ARTIFACTS
from backfill_platform_tests.sensor_ticks import Daemon, instance_at, requested_range
from backfill_platform_tests.test_operations import buggy_assets, previous_day_fx

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

FIRST = date(2024, 1, 1)
MARTS = "marts/fct_daily_revenue,marts/customer_ltv"
ORDERS_PER_DAY = {"small": 12, "full": 100}
# Days of history: a quarter at full size. What the steps prove (nothing torn, the frozen days
# untouched, zero-copy, production equal to the contract) does not depend on the day count,
# and Dagster's per-partition events of the five builds grow with it, so CI runs a month.
DAYS = {"small": 30, "full": 90}


class Transcript:
    """Each command run in this process by the CLI's own `execute`, its text kept as the
    operator reads it (docs/playbook.md shows this transcript), its payload asserted on."""

    def __init__(self) -> None:
        self.entries: list[str] = []

    def __call__(self, *argv: str) -> tuple[int, Any]:
        in_process = ["--in-process"] if argv[0] in cli.DEPLOYED_COMMANDS else []
        status, payload, text = cli.execute([*argv, *in_process])
        self.entries.append(f"$ bp {shlex.join(argv)}\n{text.rstrip()}")
        return status, json.loads(json.dumps(payload, default=str))

    def markdown(self) -> str:
        return "".join(f"```console\n{entry}\n```\n\n" for entry in self.entries)


def test_nine_step_correction_of_a_quarter(tmp_path, monkeypatch, spark, size, figures):
    home, landing, lakehouse = tmp_path / "home", tmp_path / "landing", tmp_path / "lake"
    days = DAYS[size]
    last_day = FIRST + timedelta(days=days - 1)
    new_day = last_day + timedelta(days=1)  # delivered while the correction is in flight
    instance = instance_at(home)
    point_cli_at(monkeypatch, home, landing, lakehouse)
    monkeypatch.setenv("BACKFILL_LIVE_WINDOW_DAYS", "3")
    generate_landing(landing, FIRST, last_day, ORDERS_PER_DAY[size], seed=34)
    bp = Transcript()
    resources = build_resources(str(landing), str(lakehouse), spark=spark_resource_for_tests())
    lake = resources["lakehouse"]
    first, last = FIRST.isoformat(), last_day.isoformat()
    wrong = (FIRST + timedelta(days=1)).isoformat()

    # The history: raw ingested, then day 1 built by the code before the bug and days 2..N
    # by the release with it (one ranged run each; day 1 had no previous day's rate).
    ingest = AssetSelection.assets(RAW_ORDERS, RAW_FX_RATES)
    materialize_range(all_assets, first, last, resources, instance, selection=ingest)
    built = AssetSelection.all() - ingest
    materialize_range(all_assets, first, first, resources, instance, selection=built)
    with monkeypatch.context() as patch:
        patch.setattr(marts_module, "with_usd", previous_day_fx)
        materialize(
            buggy_assets(),
            selection=built,
            resources=resources,
            instance=instance,
            tags={RANGE_START_TAG: wrong, RANGE_END_TAG: last},
        )
    assert not reconcile_marts(lake, landing, FIRST, last_day).ok
    old = _revenue(lake)

    # 1. Freeze: the marts of days 2..N are under correction; each publishes its "as of".
    status, frozen = bp(
        "freeze", "--select", MARTS, "--start", wrong, "--end", last, "--reason", "FIN-7"
    )
    assert status == 0, frozen
    as_of = {f["asset"]: f["as_of_version"] for f in frozen}
    assert as_of["marts/fct_daily_revenue"] == lake.current_version(FCT_DAILY_REVENUE)

    # 2. Verify the sources, 3. reset the watermark: the plan names every input and the
    # partitions to rewrite, and the code versions before and after.
    status, plan = bp("plan", "--select", MARTS, "--start", wrong, "--end", last)
    assert status == 0 and plan["ok"] and plan["blockers"] == [], plan
    assert all(a["missing_inputs"] == [] for a in plan["assets"])
    fct_plan = next(a for a in plan["assets"] if a["asset"] == "marts/fct_daily_revenue")
    assert len(fct_plan["partitions"]) == days - 1
    assert set(fct_plan["code_version_now"]) == {"fct-daily-revenue-0-fxbug"}

    # The live path meanwhile: day N+1 is delivered; raw takes it, the window (days N-1..N+1)
    # shrinks past the frozen days to day N+1 alone, and day N+1 is built.
    day = new_day.isoformat()
    _deliver(landing, day)
    daemon = Daemon(resources, instance)
    requests, _, _ = daemon.tick(landing_sensor)
    assert [requested_range(r) for r in requests] == [(day, day)]
    daemon.launch(landing_sensor, requests[0])
    requests, skip, _ = daemon.tick(rolling_window_sensor)
    assert [requested_range(r) for r in requests] == [(day, day)], skip
    daemon.launch(rolling_window_sensor, requests[0])
    assert {d for d, _ in _revenue(lake)} == {_iso(FIRST, i) for i in range(days + 1)}
    assert {k: v for k, v in _revenue(lake).items() if k[0] <= last} == old  # left alone

    # 4. Shadow with the fix (the code as released now), beside production.
    status, shadow = bp(
        "shadow", "--select", MARTS, "--start", wrong, "--end", last, "--suffix", "fin7"
    )
    assert status == 0 and shadow["success"], shadow

    # 5. Validate: the shadow differs from production on the days the rate moved.
    status, validation = bp(
        "validate", "--select", MARTS, "--start", wrong, "--end", last, "--suffix", "fin7"
    )
    assert status == 0 and validation["passed"] and validation["reconciliation"]["ok"]
    fct_check = next(t for t in validation["tables"] if t["table"] == "marts/fct_daily_revenue")
    assert fct_check["changed_partitions"] >= days // 2, fct_check
    assert {k: v for k, v in _revenue(lake).items() if k[0] <= last} == old  # still frozen
    assert _revenue(lake, as_of["marts/fct_daily_revenue"]) == old  # what "as of" readers see

    # 6. Zero-copy cutover and 7. the rebuild downstream (LTV of day N+1 read day N's).
    status, done = bp(
        "cutover", "--select", MARTS, "--start", wrong, "--end", last, "--suffix", "fin7",
        "--reason", "FIN-7: revenue_usd used the previous day's FX rate",
    )  # fmt: skip
    assert status == 0, done
    assert {t["mode"] for t in done["tables"]} == {"zero-copy"}
    assert sum(t["data_bytes_written"] for t in done["tables"]) == 0
    assert [(r["assets"], r["first"], r["last"]) for r in done["rebuild_runs"]] == [
        (["marts/customer_ltv"], day, day)
    ]
    assert active_freezes(instance, [FCT_DAILY_REVENUE, CUSTOMER_LTV]) == []
    assert _revenue(lake, as_of["marts/fct_daily_revenue"]) == old

    # 8. The report for finance, from Delta's versions and the validation record.
    status, report = bp("report", done["cutover_id"])
    assert status == 0 and report["validation_id"] == validation["validation_id"], report
    assert report["reason"].startswith("FIN-7") and (report["start"], report["end"]) == (
        wrong,
        last,
    )
    assert {t["cutover_mode"] for t in report["tables"]} == {"zero-copy"}
    totals = {(t["table"], t["measure"]): t for t in report["totals"]}
    assert totals[("marts/fct_daily_revenue", "rows")]["change"] == "0"
    assert totals[("marts/fct_daily_revenue", "revenue_usd")]["change"] != "0"

    # 9. Decommission: the shadow dropped; production keeps reading every partition.
    status, gone = bp("decommission", "--suffix", "fin7", "--retention-hours", "0")
    assert status == 0 and sorted(gone["dropped"]) == [
        "marts/customer_ltv__shadow_fin7",
        "marts/fct_daily_revenue__shadow_fin7",
    ], gone
    assert not list(lakehouse.glob("marts/*__shadow_*"))
    assert reconcile_marts(lake, landing, FIRST, new_day).ok
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "correction-playbook.md").write_text(bp.markdown())
    changed = sum(1 for k, v in _revenue(lake).items() if k[0] <= last and old[k] != v)
    figures.update(
        days=days,
        orders_per_day=ORDERS_PER_DAY[size],
        fct_rows_changed=changed,
        changed_partitions=fct_check["changed_partitions"],
        cutover_modes=sorted({t["mode"] for t in done["tables"]}),
        revenue_usd_change=totals[("marts/fct_daily_revenue", "revenue_usd")]["change"],
    )


def _iso(first: date, offset: int) -> str:
    return (first + timedelta(days=offset)).isoformat()


def _revenue(lake, version: int | None = None) -> dict:
    rows = lake.read(FCT_DAILY_REVENUE, version).collect()
    return {(str(r["event_date"]), r["currency"]): r["revenue_usd"] for r in rows}


def _deliver(landing, day: str) -> None:
    """A day's orders and rates, as the shop's export delivers them."""
    rates = landing / "fx_rates" / f"rate_date={day}"
    rates.mkdir(parents=True)
    rates_csv = "currency,usd_per_unit\nEUR,1.09\nGBP,1.26\nJPY,0.0068\nCHF,1.11\n"
    (rates / "rates.csv").write_text(rates_csv)
    orders = landing / "orders" / f"ingest_date={day}"
    orders.mkdir(parents=True)
    (orders / "part-0000.jsonl").write_text(
        "".join(
            order_line(f"n-{i}", f"{day}T1{i}:00:00Z", currency=c, amount=a) + "\n"
            for i, (c, a) in enumerate([("EUR", "20.00"), ("USD", "12.50"), ("GBP", "9.99")])
        )
    )
