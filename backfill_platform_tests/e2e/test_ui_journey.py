"""A user's journey in the UI, clicked in headless Chromium against the real webserver and
daemon: select all assets, Materialize, a 3-day range, Preview, Launch; the backfill targets
each asset only where those days can change it, completes, and the asset pages show one
check verdict per day, with a crafted landing fault failing its check on that day only.

Screenshots of every step go to test-artifacts/journey/ (docs/tour.md shows them).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import date, timedelta
from pathlib import Path

import pytest

from backfill_platform.sources.generate import generate_landing
from backfill_platform.tables import (
    CUSTOMER_LTV,
    FCT_DAILY_REVENUE,
    STAGING_ORDERS,
    TABLE_NAMES,
)
from backfill_platform_tests.e2e.browser import chromium, click
from backfill_platform_tests.e2e.conftest import (
    ALL_ASSETS,
    BACKFILL_TIMEOUT,
    ORDERS_PER_DAY,
    SEED,
    start_deployment,
)
from backfill_platform_tests.e2e.services import run_cli
from backfill_platform_tests.e2e.tables import assert_ltv_committed_oldest_first, lakehouse_for
from backfill_platform_tests.e2e.test_ui_browser import ARTIFACTS, open_page

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SHOTS = ARTIFACTS / "journey"
HISTORY = (date(2024, 1, 1), date(2024, 1, 3))  # built first, through the API
CHOSEN = (date(2024, 1, 4), date(2024, 1, 6))  # the days the user picks in the dialog
GUEST_DAY = "2024-01-05"  # every order of that day lands without a customer_id
# BACKFILL_END_DATE: over 100 partitions, as in any deployment of the contract's range.
# Below 100, Dagster also checks customer_ltv's previous-day edge for staleness, and a ranged
# step that rebuilds D-1 and D calls D stale (docs/lineage.md, "Staleness of the cumulative LTV").
PARTITIONS_END = date(2024, 4, 15)
LATE_ARRIVAL_DAYS = 10  # assets/common.LATE_ARRIVAL_LINEAGE_DAYS
FX_REACH_DAYS = 7  # transforms/fx.REACH_DAYS
NULL_SPIKE = "null_rate_within_trailing_bounds"
DRIFT = "drift_vs_previous_version"
FCT_RECONCILIATION = "matches_staging_orders"
# customer_id_skew also warns on every day at 12 orders a day (top key share > 10%).
BLOCKING_STAGING = ("order_id_unique", "required_columns_not_null", "accounts_for_every_raw_row")
SHADOW_TWINS = 6  # shadow/<table> of the staging and marts assets (assets/shadow.py)

CHECK_STATUSES = """
query CheckStatuses($assetKey: AssetKeyInput!) {
  assetNodeOrError(assetKey: $assetKey) {
    ... on AssetNode {
      assetChecksOrError {
        ... on AssetChecks {
          checks {
            name
            partitionStatuses {
              __typename
              ... on AssetCheckTimePartitionStatuses { ranges { startKey endKey status } }
            }
          }
        }
      }
    }
  }
}
"""

STALE = """
query Stale($assetKey: AssetKeyInput!, $partitions: [String!]) {
  assetNodeOrError(assetKey: $assetKey) {
    ... on AssetNode { staleStatusByPartition(partitions: $partitions) }
  }
}
"""

LATEST_BACKFILLS = """
query Backfills {
  partitionBackfillsOrError(limit: 5) {
    ... on PartitionBackfills { results { id status timestamp } }
  }
}
"""


def _days(first: date, last: date) -> list[str]:
    return [(first + timedelta(n)).isoformat() for n in range((last - first).days + 1)]


def _landing_with_a_guest_day(root: Path) -> Path:
    landing = root / "landing"
    generate_landing(landing, HISTORY[0], CHOSEN[1], ORDERS_PER_DAY, SEED, progress=False)
    for path in (landing / "orders" / f"ingest_date={GUEST_DAY}").iterdir():
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        for record in lines:
            record.pop("customer_id", None)
        path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return landing


@pytest.fixture(scope="module")
def journey(e2e_root) -> Iterator:
    root = e2e_root / "journey"
    root.mkdir()
    deployment = start_deployment(
        root,
        landing=_landing_with_a_guest_day(root),
        extra_env={"BACKFILL_END_DATE": PARTITIONS_END.isoformat()},
    )
    try:
        history = deployment.dagster.launch_backfill(
            ALL_ASSETS, HISTORY[0].isoformat(), HISTORY[1].isoformat()
        )
        deployment.dagster.wait_backfill(history, BACKFILL_TIMEOUT)
        yield deployment
    finally:
        deployment.dagster.stop()


def _click(driver, text: str) -> None:
    click(driver, f"//*[self::button or self::a][contains(normalize-space(), '{text}')]")


def _wait_text(driver, text: str, timeout: float = 60) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, timeout, poll_frequency=1).until(
        lambda d: text in d.find_element("tag name", "body").text
    )


TARGETED = """
query Targeted($id: String!, $key: AssetKeyInput!) {
  partitionBackfillOrError(backfillId: $id) {
    ... on PartitionBackfill {
      partitionsTargetedForAssetKey(assetKey: $key) { ranges { start end } }
    }
  }
}
"""


BACKFILL_RUNS = """
query BackfillRuns($id: String!) {
  runsOrError(filter: {tags: [{key: "dagster/backfill", value: $id}]}) {
    ... on Runs { results { runId status } }
  }
}
"""


def _targeted(dagster, backfill_id: str) -> dict[str, tuple[str, str]]:
    """Per asset, the first and last partition Dagster's backfill targets."""
    found = {}
    for name in TABLE_NAMES:
        data = dagster.graphql(TARGETED, {"id": backfill_id, "key": {"path": name.split("/")}})
        ranges = data["partitionBackfillOrError"]["partitionsTargetedForAssetKey"]["ranges"]
        found[name] = (min(r["start"] for r in ranges), max(r["end"] for r in ranges))
    return found


def _expected_reach(name: str) -> tuple[str, str]:
    """What days D..D+2 can change, per asset (docs/lineage.md)."""
    first, last = CHOSEN
    if name in ("raw/orders", "raw/fx_rates"):
        return first.isoformat(), last.isoformat()
    # Staging (and what is built per staging day: the CRM history and customers): an ingest
    # day holds late events of the 10 days before it, clipped at the first partition.
    since = max(first - timedelta(LATE_ARRIVAL_DAYS), HISTORY[0]).isoformat()
    if not name.startswith("marts/"):
        return since, last.isoformat()
    # The marts: also FX of day X prices days X..X+7. Dagster does not widen through
    # customer_ltv's previous-day dependency; later snapshots are the staleness audit's.
    return since, (last + timedelta(FX_REACH_DAYS)).isoformat()


def test_a_backfill_launched_in_the_ui_targets_what_the_days_change_and_checks_each_day(
    journey, spark
):
    SHOTS.mkdir(parents=True, exist_ok=True)
    dagster = journey.dagster
    lake = lakehouse_for(journey.lakehouse, spark)
    ltv_before = max(c["version"] for c in lake.history(CUSTOMER_LTV))
    from selenium.webdriver.common.keys import Keys

    with chromium() as driver:
        # 1. Select all assets, Materialize, type the 3-day range, preview.
        open_page(driver, f"{dagster.url}/asset-groups", ["Global asset lineage", "Materialize"])
        driver.save_screenshot(str(SHOTS / "1-lineage.png"))
        # No filter: the button counts the shadow twins too, but a backfill of production
        # days targets none of them (their edges from production map no partitions).
        _wait_text(driver, f"Materialize all ({len(TABLE_NAMES) + SHADOW_TWINS})")
        _click(driver, "Materialize all")
        _wait_text(driver, "Partition selection")
        _click_each(driver, "//*[contains(text(),'Show all partitions')]")
        box_css = "[role=dialog] input[type=text]"
        click(driver, box_css, by="css selector")
        box = driver.find_element("css selector", box_css)
        box.send_keys(Keys.CONTROL, "a")
        box.send_keys(f"[{CHOSEN[0].isoformat()}...{CHOSEN[1].isoformat()}]", Keys.TAB)
        _wait_text(driver, "3 partitions")
        driver.save_screenshot(str(SHOTS / "2-materialize-dialog.png"))
        _click(driver, "Preview")
        _wait_text(driver, "Partitions to launch")
        preview = driver.find_element("tag name", "body").text
        driver.save_screenshot(str(SHOTS / "3-backfill-preview.png"))
        # The preview ends within the lineage window, never at the last partition.
        assert f"...{PARTITIONS_END.isoformat()}" not in preview, preview
        _click(driver, "OK")

        # 2. Launch; the backfill runs under the daemon and completes.
        before = {b["id"] for b in _backfills(dagster)}
        _click(driver, "Launch backfill")
        backfill_id = _wait_new_backfill(dagster, before)
        targeted = _targeted(dagster, backfill_id)
        assert targeted == {name: _expected_reach(name) for name in TABLE_NAMES}, targeted
        status = dagster.wait_backfill(backfill_id, BACKFILL_TIMEOUT)
        assert status["status"] in ("COMPLETED", "COMPLETED_SUCCESS"), status
        runs = dagster.graphql(BACKFILL_RUNS, {"id": backfill_id})["runsOrError"]["results"]
        assert runs and {r["status"] for r in runs} == {"SUCCESS"}, runs  # no run failed
        # Without LTV's wait on staging, the daemon built the days past staging's range
        # (01-07..01-13) from the old 01-06 snapshot before rebuilding 01-01..01-06.
        assert_ltv_committed_oldest_first(
            lake, ltv_before, _expected_reach(CUSTOMER_LTV.to_user_string())
        )
        open_page(driver, f"{dagster.url}/runs/b/{backfill_id}", ["Succeeded", "marts / "])
        driver.save_screenshot(str(SHOTS / "4-backfill-done.png"))

        # 3. One verdict per day on the asset pages; the guest day fails its NULL-rate check
        # and only that day.
        open_page(
            driver,
            f"{dagster.url}/assets/{FCT_DAILY_REVENUE.to_user_string()}?view=checks",
            [FCT_RECONCILIATION],
        )
        _show_partitions(driver, FCT_RECONCILIATION)
        driver.save_screenshot(str(SHOTS / "5-fct-checks.png"))
        open_page(
            driver,
            f"{dagster.url}/assets/{STAGING_ORDERS.to_user_string()}?view=checks",
            [NULL_SPIKE],
        )
        _show_partitions(driver, NULL_SPIKE)  # which day failed
        driver.save_screenshot(str(SHOTS / "6-staging-checks.png"))

    built = _days(HISTORY[0], CHOSEN[1])
    for check, ranges in _check_ranges(dagster, FCT_DAILY_REVENUE).items():
        verdicts = _days_with(ranges, "SUCCEEDED") | _days_with(ranges, "FAILED")
        assert verdicts >= set(built), (check, ranges)  # a verdict for every day built
        if check != DRIFT:  # drift warns, rightly, on 01-03: late events arrived on 01-04
            assert _days_with(ranges, "SUCCEEDED") >= set(built), (check, ranges)
    staging = _check_ranges(dagster, STAGING_ORDERS)
    assert _days_with(staging[NULL_SPIKE], "FAILED") == {GUEST_DAY}, staging[NULL_SPIKE]
    for check in BLOCKING_STAGING:  # valid data: every blocking check passed that day
        assert GUEST_DAY in _days_with(staging[check], "SUCCEEDED"), (check, staging[check])

    # 4. The asset pages agree: nothing the backfill built is reported stale.
    for key in (STAGING_ORDERS, FCT_DAILY_REVENUE, CUSTOMER_LTV):
        stale = dagster.graphql(STALE, {"assetKey": {"path": key.path}, "partitions": built})
        statuses = stale["assetNodeOrError"]["staleStatusByPartition"]
        assert set(statuses) == {"FRESH"}, (
            key.to_user_string(),
            dict(zip(built, statuses, strict=True)),
        )


def _click_each(driver, xpath: str) -> None:
    """Click every element `xpath` finds, in order, while it is still there (none: nothing
    to do)."""
    for i in range(len(driver.find_elements("xpath", xpath))):
        if len(driver.find_elements("xpath", xpath)) > i:
            click(driver, f"({xpath})[{i + 1}]")


def _show_partitions(driver, check: str) -> None:
    """Select `check` in the asset's Checks tab and open its per-partition view."""
    item = f"(//*[normalize-space()='{check}'])[1]"
    if driver.find_elements("xpath", item):
        click(driver, item)
    _click_each(driver, "//button[normalize-space()='Partitions']")
    _wait_text(driver, "Passed (")


def _backfills(dagster) -> list[dict]:
    return dagster.graphql(LATEST_BACKFILLS)["partitionBackfillsOrError"]["results"]


def _wait_new_backfill(dagster, before: set[str]) -> str:
    from backfill_platform_tests.e2e.services import wait_for

    def launched():
        new = [b["id"] for b in _backfills(dagster) if b["id"] not in before]
        return new[0] if new else None

    return wait_for("the UI's backfill to be recorded", launched, 60, interval=1)


def _check_ranges(dagster, key) -> dict[str, list[dict]]:
    node = dagster.graphql(CHECK_STATUSES, {"assetKey": {"path": key.path}})["assetNodeOrError"]
    checks = node["assetChecksOrError"]["checks"]
    return {
        c["name"]: (c["partitionStatuses"] or {}).get("ranges", [])
        for c in checks
        if c["partitionStatuses"] is not None
    }


def _days_with(ranges: list[dict], status: str) -> set[str]:
    days = set()
    for r in ranges:
        if r["status"] == status:
            days.update(_days(date.fromisoformat(r["startKey"]), date.fromisoformat(r["endKey"])))
    return days


def test_a_shadow_from_the_cli_is_a_backfill_of_shadow_assets_in_the_ui(journey):
    """`backfill-platform shadow` against the running deployment: one asset backfill of the
    `shadow/...` twins, queued and run by the daemon, on the Backfills page; production's
    latest materialization does not move."""
    from dagster import DagsterInstance

    dagster = journey.dagster
    instance = DagsterInstance.from_config(str(dagster.home))
    before = instance.get_latest_materialization_event(FCT_DAILY_REVENUE)
    first, last = CHOSEN[0].isoformat(), CHOSEN[1].isoformat()
    done, payload = run_cli(
        journey, "shadow", "--select", FCT_DAILY_REVENUE.to_user_string(),
        "--start", first, "--end", last, "--suffix", "tour",
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout, done.stderr[-3000:])
    backfill_id = payload["backfill_id"]
    backfills = {b["id"]: b for b in _backfills(dagster)}
    assert backfills[backfill_id]["status"] in ("COMPLETED", "COMPLETED_SUCCESS")
    targets = [
        "/".join(s["assetKey"]["path"])
        for s in dagster.graphql(SHADOW_TARGETS, {"id": backfill_id})["partitionBackfillOrError"][
            "assetBackfillData"
        ]["assetBackfillStatuses"]
    ]
    assert targets and all(t.startswith("shadow/") for t in targets), targets
    after = instance.get_latest_materialization_event(FCT_DAILY_REVENUE)
    # Production was not rebuilt: its latest materialization is the UI backfill's.
    assert (after.run_id, after.timestamp) == (before.run_id, before.timestamp)
    with chromium() as driver:
        open_page(driver, f"{dagster.url}/runs/b/{backfill_id}", ["Succeeded", "shadow / "])
        driver.save_screenshot(str(SHOTS / "7-shadow-backfill.png"))


SHADOW_TARGETS = """
query($id: String!) { partitionBackfillOrError(backfillId: $id) {
  ... on PartitionBackfill { assetBackfillData { assetBackfillStatuses {
    ... on AssetPartitionsStatusCounts { assetKey { path } }
  } } } } }
"""
