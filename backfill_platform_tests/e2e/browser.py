"""Headless Chromium (Debian's package) driven through chromedriver by Selenium.

No browser is downloaded: the binary and driver are Debian's `chromium` and
`chromium-driver`, which `make e2e` installs. The flags keep Chromium off the network
(the machine has loopback only) and away from any profile but a fresh temporary one.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# Dagster's first-visit dialog ("Join the Dagster community") opens over the page at some
# moment after a fresh profile's first load, sometimes after the page has settled.
COMMUNITY_DIALOG_SKIP = "//button[normalize-space()='Skip']"

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1600,1000",
)


@contextmanager
def chromium() -> Iterator:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    for binary in (CHROMIUM, CHROMEDRIVER):
        if not binary.exists():
            raise FileNotFoundError(
                f"{binary} not found; `make e2e` installs Debian's chromium and chromium-driver"
            )
    profile = tempfile.mkdtemp(prefix="e2e-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(120)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def dismiss_community_dialog(driver) -> None:
    """Close the community dialog if it is open (its Skip button)."""
    for button in driver.find_elements("xpath", COMMUNITY_DIALOG_SKIP):
        button.click()


def click(driver, xpath: str, timeout: float = 30, by: str = "xpath") -> None:
    """Click the element (`by`: Selenium's locator kind), closing the community dialog first
    if it opened over the page; a click another overlay still intercepts after `timeout`
    fails as Selenium reports it."""
    from selenium.common.exceptions import ElementClickInterceptedException

    deadline = time.monotonic() + timeout
    while True:
        dismiss_community_dialog(driver)
        try:
            driver.find_element(by, xpath).click()
            return
        except ElementClickInterceptedException:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)
