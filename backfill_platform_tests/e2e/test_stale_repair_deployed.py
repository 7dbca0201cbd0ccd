"""`stale --repair` through a deployment: a late order of an early day arrives in a later
delivery, and the repair rebuilds staging and daily revenue of that day and every LTV
snapshot after it, as one Dagster backfill the daemon cuts into 4-day runs. LTV's runs must
commit oldest first: without LTV's wait on staging the daemon built a newer chunk before an
older one (12-30..01-01 before 12-26..12-29; docs/lineage.md, "Order of the LTV chunks").

The history the repair starts from is built in the test process (the runner, one ranged run
per asset over the ten days, into the deployment's lakehouse): the audit and the repair read
the Delta log, not who wrote it, and the deployment then pays only for what is under test
(the late delivery's ingest and the repair's runs), not for a UI backfill first.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import date

import pytest
from dagster import DagsterInstance

from backfill_platform.definitions import all_assets, build_resources
from backfill_platform.runner import backfill
from backfill_platform.sources.generate import generate_landing
from backfill_platform.tables import CUSTOMER_LTV
from backfill_platform_tests.e2e.conftest import ORDERS_PER_DAY, SEED, Deployment, start_deployment
from backfill_platform_tests.e2e.services import run_cli
from backfill_platform_tests.e2e.tables import assert_ltv_committed_oldest_first, lakehouse_for
from backfill_platform_tests.harness import spark_resource_for_tests

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

HISTORY = (date(2024, 1, 1), date(2024, 1, 10))
LATE_EVENT_DAY = "2024-01-02"  # an order of this day arrives in a later delivery
# Nine days late: still within staging's late-arrival lineage (10 days), so rebuilding
# staging of 01-02 reads it.
LATE_DELIVERY = "2024-01-11"
# Runs of 4 days: the repair's 9 LTV days (01-02..01-10) are three runs, so the order they
# commit in is tested across two chunk boundaries (with the default 92 they would be one run).
PARTITIONS_PER_RUN = 4


@pytest.fixture(scope="module")
def history(e2e_root, spark) -> Iterator[Deployment]:
    """A deployment cutting runs of 4 days over a lakehouse holding every asset of the ten
    days, built in process before the services start."""
    root = e2e_root / "stale-repair"
    root.mkdir()
    landing = root / "landing"
    generate_landing(landing, *HISTORY, ORDERS_PER_DAY, SEED, progress=False)
    resources = build_resources(str(landing), str(root / "lakehouse"), spark_resource_for_tests())
    backfill(
        all_assets,
        HISTORY[0].isoformat(),
        HISTORY[1].isoformat(),
        resources,
        DagsterInstance.ephemeral(),
    )
    deployment = start_deployment(
        root,
        landing=landing,
        extra_env={"BACKFILL_PARTITIONS_PER_RUN": str(PARTITIONS_PER_RUN)},
    )
    try:
        yield deployment
    finally:
        deployment.dagster.stop()


def test_the_cli_repair_of_a_late_order_rebuilds_ltv_oldest_first_on_the_deployment(history, spark):
    audit, report = run_cli(history, "stale")
    assert audit.returncode == 0, report  # the history left nothing stale
    delivery = history.landing / "orders" / f"ingest_date={LATE_DELIVERY}"
    delivery.mkdir()
    late = {
        "order_id": "o-late-0001",
        "customer_id": "c-000001",
        "event_time": f"{LATE_EVENT_DAY}T12:00:00Z",
        "updated_at": f"{LATE_EVENT_DAY}T12:00:00Z",
        "status": "placed",
        "currency": "EUR",
        "amount": 100.0,
    }
    (delivery / "late-9999.jsonl").write_text(json.dumps(late) + "\n")
    ingest, _ = run_cli(
        history, "backfill", "--select", "raw/orders",
        "--start", LATE_DELIVERY, "--end", LATE_DELIVERY,
    )  # fmt: skip
    assert ingest.returncode == 0, ingest.stderr[-3000:]

    audit, report = run_cli(history, "stale")
    assert audit.returncode == 1, report
    assert report["stale_days"] == {LATE_EVENT_DAY: 1}, report
    ltv_through = report["customer_ltv_through"]
    assert ltv_through == HISTORY[1].isoformat(), report
    assert report["repair_plan"] == [
        f"staging+fct {LATE_EVENT_DAY}..{LATE_EVENT_DAY}",
        f"customer_ltv {LATE_EVENT_DAY}..{ltv_through}",
    ], report
    lake = lakehouse_for(history.lakehouse, spark)
    ltv_before = max(c["version"] for c in lake.history(CUSTOMER_LTV))

    repair, payload = run_cli(history, "stale", "--repair")
    assert repair.returncode == 0, (repair.stdout, repair.stderr[-3000:])
    assert payload.get("backfill_id"), payload  # one backfill on the deployment
    ranges = assert_ltv_committed_oldest_first(lake, ltv_before, (LATE_EVENT_DAY, ltv_through))
    assert len(ranges) >= 3, ranges  # several chunks, or the order proves nothing

    audit, report = run_cli(history, "stale")
    assert audit.returncode == 0, report  # one repair is enough
