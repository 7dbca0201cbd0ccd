"""Live + backfill: a live writer rebuilds the recent window again and again (new files
keep arriving in it) while a backfill rewrites all of history over the same tables, each in
its own process. At the end: no duplicate keys, no unbuilt day at the window's boundary, and
the marts equal the contract's answer computed from the landing files.
"""

from __future__ import annotations

import json
import time
from datetime import date, timedelta

import pytest
from pyspark.sql import functions as F

from backfill_platform.ranges import DayRange
from backfill_platform.reconcile import reconcile_marts
from backfill_platform.reference import compute_contract_answer
from backfill_platform.resources import LakehouseResource
from backfill_platform.sources.generate import generate_landing
from backfill_platform_tests.harness import order_line, spark_resource_for_tests
from backfill_platform_tests.reliability.procs import reap, spawn

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

FIRST = date(2024, 1, 1)
SIZES = {
    # days of history, live window, orders per day, chunk size, minimum seconds side by side
    "small": {"days": 6, "window": 2, "orders_per_day": 10, "per_run": 3, "seconds": 0},
    "full": {"days": 30, "window": 3, "orders_per_day": 40, "per_run": 7, "seconds": 180},
}
KEYS = {
    "raw/orders": ["ingest_date", "file_name", "line_number"],
    "raw/fx_rates": ["rate_date", "file_name", "line_number"],
    "staging/orders": ["order_id"],
    "staging/orders_rejects": ["ingest_date", "file_name", "line_number"],
    "marts/fct_daily_revenue": ["event_date", "currency"],
    "marts/customer_ltv": ["snapshot_date", "customer_id"],
}
DATE_COLUMN = {t: keys[0] for t, keys in KEYS.items() if t != "staging/orders"}
DATE_COLUMN["staging/orders"] = "event_date"


def test_live_window_and_history_backfill_side_by_side(tmp_path, spark, size, figures):
    cfg = SIZES[size]
    last = FIRST + timedelta(days=cfg["days"] - 1)
    window_start = last - timedelta(days=cfg["window"] - 1)
    landing, lakehouse = tmp_path / "landing", tmp_path / "lake"
    generate_landing(landing, FIRST, last, cfg["orders_per_day"], seed=5, malformed_rate=0.01)
    work = tmp_path / "workers"
    common = {"landing": str(landing), "lakehouse": str(lakehouse)}
    stop, final = work / "stop", work / "final"
    backfill = spawn(
        work,
        "backfill",
        "loop",
        {
            **common,
            "role": "backfill",
            "first": FIRST.isoformat(),
            "last": last.isoformat(),
            "per_run": cfg["per_run"],
            "stop": str(stop),
        },
    )
    live = spawn(
        work,
        "live",
        "loop",
        {
            **common,
            "role": "live",
            "first": window_start.isoformat(),
            "last": last.isoformat(),
            "final": str(final),
        },
    )
    started = time.monotonic()
    arrivals = 0
    try:
        backfill.wait("ready", timeout=900)
        live.wait("ready", timeout=900)
        backfill.go()
        live.go()
        # Side by side until the backfill has finished a pass and the live writer has
        # succeeded twice (and, at full size, for the minimum time); files keep arriving.
        while True:
            passes = [e for e in backfill.events() if e["event"] == "pass"]
            live_ok = [e for e in live.events() if e["event"] == "pass" and e["success"]]
            if passes and len(live_ok) >= 2 and time.monotonic() - started >= cfg["seconds"]:
                break
            backfill.check()
            live.check()
            if len(live_ok) > arrivals:  # a new delivery into the window after each live pass
                arrivals += 1
                folder = landing / "orders" / f"ingest_date={last.isoformat()}"
                (folder / f"arrival-{arrivals:03d}.jsonl").write_text(
                    order_line(f"live-{arrivals}", f"{last}T12:00:00Z", customer_id="c-live") + "\n"
                )
            time.sleep(1)
        stop.touch()
        assert backfill.finish(timeout=900) == 0, backfill.log()
        final.touch()
        assert live.finish(timeout=900) == 0, live.log()
    finally:
        reap([backfill, live])

    lake = LakehouseResource(root_dir=str(lakehouse), spark=spark_resource_for_tests())
    live_passes = [e for e in live.events() if e["event"] == "pass"]
    failed = [e for e in live_passes if not e["success"]]
    stats = {
        "backfill_passes": len([e for e in backfill.events() if e["event"] == "pass"]),
        "live_passes": len(live_passes),
        "live_passes_failed": len(failed),
        "arrivals_during_run": arrivals,
        "rows_checked": 0,
        "duplicate_keys": 0,
        "unbuilt_days": 0,
    }
    for table in KEYS:  # the six tables of orders and FX (the CRM's: test_crm.py)
        df = lake.read(table)
        total = df.count()
        distinct = df.select(*KEYS[table]).distinct().count()
        stats["rows_checked"] += total
        stats["duplicate_keys"] += total - distinct
        # Every day of the range was built by some commit, at the boundary above all.
        days = list(DayRange.of_days(FIRST, last).days())
        stats["unbuilt_days"] += len(days) - len(lake.covered_days(table, days))
    answer = compute_contract_answer(landing, first_date=FIRST, last_date=last)
    staged = lake.read("staging/orders")
    stats["staging_vs_contract"] = [staged.count(), len(answer.staging)]
    stats["rows_lost"] = sum(answer.raw_line_counts.values()) - lake.read("raw/orders").count()
    live_orders = staged.where(F.col("order_id").startswith("live-")).count()
    reconciliation = reconcile_marts(lake, landing, FIRST, last)
    stats.update(
        live_arrivals_landed=live_orders,
        marts_equal_contract=reconciliation.ok,
        failures=int(not reconciliation.ok) + (stats["duplicate_keys"] > 0),
        seconds=round(time.monotonic() - started, 1),
    )
    figures.update(stats)
    print(json.dumps(stats))
    # A live pass may fail only in the marts, and only before the backfill's first pass has
    # built what the window reads from before it (the LTV snapshot, the FX reach).
    first_pass = min(e["t"] for e in backfill.events() if e["event"] in ("pass", "run"))
    for e in failed:
        assert set(e["failed_steps"]) <= {"marts__customer_ltv", "marts__fct_daily_revenue"}, e
        assert e["t"] - e["seconds"] < first_pass or not [
            p for p in backfill.events() if p["event"] == "pass" and p["t"] < e["t"]
        ], e
    assert stats["duplicate_keys"] == 0 and stats["unbuilt_days"] == 0
    assert stats["rows_lost"] == 0 and live_orders == arrivals
    assert stats["staging_vs_contract"][0] == stats["staging_vs_contract"][1]
    assert reconciliation.ok, "\n".join(reconciliation.details)
