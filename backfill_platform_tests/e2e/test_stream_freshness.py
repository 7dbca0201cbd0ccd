"""The live stream's freshness as the deployment shows it: `raw/orders` carries Dagster's
freshness policy (BACKFILL_STREAM_FRESHNESS_SECONDS, the shared deployment sets 60 s), the
daemon's freshness daemon evaluates it, and the stream's runless batch materializations
(`report_batch`, the stream's own reporting) are what keep it passing."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from dagster import DagsterInstance

from backfill_platform.operations.stream import BatchReport
from backfill_platform.operations.stream_events import report_batch
from backfill_platform_tests.e2e.browser import chromium, dismiss_community_dialog
from backfill_platform_tests.e2e.conftest import STREAM_FRESHNESS_SECONDS
from backfill_platform_tests.e2e.services import wait_for
from backfill_platform_tests.e2e.test_ui_browser import ARTIFACTS, open_page

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

FRESHNESS = """
query ($keys: [AssetKeyInput!]) {
  assetNodes(assetKeys: $keys) {
    assetKey { path }
    freshnessStatusInfo { freshnessStatus freshnessStatusMetadata { lastMaterializedTimestamp } }
    internalFreshnessPolicy {
      ... on TimeWindowFreshnessPolicy { failWindowSeconds warnWindowSeconds }
    }
  }
}
"""
# The UI's names for the freshness daemon's PASS and FAIL.
PASSING, FAILING = "HEALTHY", "DEGRADED"


def freshness(deployment) -> dict[str, dict]:
    nodes = deployment.dagster.graphql(
        FRESHNESS, {"keys": [{"path": ["raw", "orders"]}, {"path": ["staging", "orders"]}]}
    )["assetNodes"]
    return {"/".join(n["assetKey"]["path"]): n for n in nodes}


def status(deployment) -> str | None:
    info = freshness(deployment)["raw/orders"]["freshnessStatusInfo"]
    return info and info["freshnessStatus"]


def stream_batch(instance: DagsterInstance, batch_id: int, day: str) -> float:
    """One committed stream batch, reported as the stream reports it; its time."""
    reported = time.time()
    report_batch(
        instance,
        "orders",
        BatchReport(batch_id, 3, 0, {0: (batch_id * 3, batch_id * 3 + 3)}, {day: 3}, 7, 0.1),
    )
    return reported


def test_raw_orders_fails_its_freshness_when_the_stream_stops_committing(deployment):
    nodes = freshness(deployment)
    assert nodes["raw/orders"]["internalFreshnessPolicy"] == {
        "failWindowSeconds": STREAM_FRESHNESS_SECONDS,
        "warnWindowSeconds": None,  # half of 60 s is under Dagster's minimum window
    }
    # Only the stream's table: staging follows through the rolling window's runs.
    assert nodes["staging/orders"]["internalFreshnessPolicy"] is None
    assert nodes["staging/orders"]["freshnessStatusInfo"] is None

    # Yesterday: inside the partitions, outside the days the other e2e tests build.
    day = (datetime.now(UTC).date() - timedelta(days=1)).isoformat()
    logs = deployment.dagster.logs

    def passing() -> bool:
        return status(deployment) == PASSING

    def failing() -> bool:
        return status(deployment) == FAILING

    with DagsterInstance.from_config(str(deployment.dagster.home)) as instance:
        first = stream_batch(instance, 1, day)
        wait_for("raw/orders fresh after a stream batch", passing, 120, 2, logs)
        shown = freshness(deployment)["raw/orders"]["freshnessStatusInfo"]
        assert shown["freshnessStatusMetadata"]["lastMaterializedTimestamp"] >= first - 1

        # The stream commits nothing more: failing once the window has passed, not before.
        wait_for("raw/orders failing", failing, STREAM_FRESHNESS_SECONDS + 120, 2, logs)
        assert time.time() - first >= STREAM_FRESHNESS_SECONDS

        # What a user sees on the asset's page (screenshot in test-artifacts/).
        ARTIFACTS.mkdir(exist_ok=True)
        with chromium() as driver:
            open_page(
                driver,
                f"{deployment.dagster.url}/assets/raw/orders",
                ["Freshness policy", "Failed", "Fails if more than a minute since last"],
            )
            dismiss_community_dialog(driver)  # when it came after the page settled
            driver.save_screenshot(str(ARTIFACTS / "stream-freshness-failed.png"))

        # The stream commits again (restarted by its supervisor, say): passing again, with no
        # run and no check execution in between.
        stream_batch(instance, 2, day)
        wait_for("raw/orders fresh again", passing, 120, 2, logs)
