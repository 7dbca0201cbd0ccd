"""The live stream as the UI shows it, for docs/tour.md section 8: `raw/orders`' overview
(the stream's latest batch, its freshness policy) and one stream day's partition (the
runless materialization a batch reported: no run, the batch's id, Delta version, rows and
offsets). Needs `make ui STREAM=on` running with the stream having committed a batch:

    python build-support/stream_screenshots.py --day 2026-01-04 [--url http://127.0.0.1:3000]

Headless Chromium through the e2e tests' browser helper; the pictures go to docs/tour/.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from backfill_platform_tests.e2e.browser import chromium
from backfill_platform_tests.e2e.test_ui_browser import open_page

TOUR = Path(__file__).resolve().parents[1] / "docs" / "tour"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:3000")
    parser.add_argument("--day", required=True, help="a day a stream batch wrote")
    args = parser.parse_args(argv)
    asset = f"{args.url}/assets/raw/orders"
    pages = {
        "stream-raw-orders-overview.png": (asset, ["Freshness policy", "offsets"]),
        "stream-partition-day.png": (
            f"{asset}?view=partitions&partition={args.day}",
            [args.day, "offsets", "writer"],
        ),
    }
    with chromium() as driver:
        for name, (url, must_show) in pages.items():
            open_page(driver, url, must_show)
            driver.save_screenshot(str(TOUR / name))
            print(f"docs/tour/{name}: {url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
