"""The UI in headless Chromium: lineage graph with groups and assets, and the backfill page."""

from __future__ import annotations

import pytest

from backfill_platform.tables import TABLE_NAMES
from backfill_platform_tests.e2e.browser import chromium, dismiss_community_dialog
from backfill_platform_tests.e2e.services import REPO_ROOT, SENSORS

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ARTIFACTS = REPO_ROOT / "test-artifacts"
GROUPS = ("raw", "staging", "marts")
PAGE_TIMEOUT = 120  # first page load compiles nothing, but the shared machine is slow


def page_text(driver) -> str:
    return driver.find_element("tag name", "body").text


# Shown while the page is not settled yet: the first-visit dialog, statuses still loading.
NOT_SETTLED = ("Join the Dagster community", "fetching statuses", "Refreshing data")


def open_page(driver, url: str, must_show: list[str]) -> str:
    """Load `url`, dismiss the first-visit community dialog, wait for every text in must_show
    and for the page to settle."""
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(url)

    def ready(d) -> bool:
        dismiss_community_dialog(d)
        text = page_text(d)
        return all(s in text for s in must_show) and not any(s in text for s in NOT_SETTLED)

    try:
        WebDriverWait(driver, PAGE_TIMEOUT, poll_frequency=1).until(ready)
    except Exception as error:  # selenium's TimeoutException; keep the page for the report
        driver.save_screenshot(str(ARTIFACTS / "timeout.png"))
        missing = [s for s in must_show if s not in page_text(driver)]
        raise AssertionError(f"{url}: {missing} not shown within {PAGE_TIMEOUT}s") from error
    return page_text(driver)


def test_lineage_and_backfill_pages_render(deployment, first_backfill):
    ARTIFACTS.mkdir(exist_ok=True)
    dagster = deployment.dagster
    location = dagster.graphql(SENSORS)["repositoriesOrError"]["nodes"][0]["location"]["name"]

    with chromium() as driver:
        # Global lineage: the three groups, in the sidebar tree and as graph nodes (with
        # their assets' statuses once "fetching statuses" is gone).
        text = open_page(driver, f"{dagster.url}/asset-groups", ["Global asset lineage", *GROUPS])
        driver.save_screenshot(str(ARTIFACTS / "lineage-global.png"))
        assert all(text.count(group) >= 2 for group in GROUPS), text

        # The staging group's lineage shows its assets with their neighbours upstream (raw)
        # and downstream (marts), each partitioned node with its partition summary.
        text = open_page(
            driver,
            f"{dagster.url}/locations/{location}/asset-groups/staging",
            ["orders", "orders_rejects", "Partitions"],
        )
        driver.save_screenshot(str(ARTIFACTS / "lineage-staging.png"))
        assert "partitions" in text.lower()

        # The backfill page: every asset, three partitions targeted and succeeded each.
        text = open_page(
            driver,
            f"{dagster.url}/runs/b/{first_backfill.backfill_id}",
            ["Succeeded", "2024-01-01", *(t.replace("/", " / ") for t in TABLE_NAMES)],
        )
        driver.save_screenshot(str(ARTIFACTS / "backfill.png"))
        assert text.count("100% completed") == len(TABLE_NAMES), text
