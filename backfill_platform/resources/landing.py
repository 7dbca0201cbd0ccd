"""The landing zone (contract section 1): where sources drop immutable daily files."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import date
from pathlib import Path

from dagster import ConfigurableResource
from pydantic import Field

ORDERS = "orders"
FX_RATES = "fx_rates"
DAY_FOLDER = {ORDERS: "ingest_date", FX_RATES: "rate_date"}
SUFFIX = {ORDERS: ".jsonl", FX_RATES: ".csv"}


class LandingZoneResource(ConfigurableResource):
    """Lists a day's delivered files; reading them is Spark's job."""

    landing_dir: str = Field(description="Root of the landing zone (BACKFILL_LANDING_DIR).")

    def day_dir(self, kind: str, day: str) -> Path:
        return Path(self.landing_dir) / kind / f"{DAY_FOLDER[kind]}={day}"

    def files(self, kind: str, days: Iterable[str]) -> list[Path]:
        """Delivered files of `kind` for the given days, sorted; missing days simply have none."""
        found: list[Path] = []
        for day in days:
            folder = self.day_dir(kind, day)
            if folder.is_dir():
                found.extend(
                    p
                    for p in sorted(folder.iterdir())
                    if p.is_file() and p.name.endswith(SUFFIX[kind])
                )
        return found

    def record_count(self, path: Path) -> int:
        """Lines of a landing file that count as records (contract 1.1): a leading UTF-8 BOM
        and one trailing CR per line aside, lines of only spaces and tabs are not records."""
        data = path.read_bytes().removeprefix(b"\xef\xbb\xbf")
        return sum(
            1
            for line in data.split(b"\n")
            if (line[:-1] if line.endswith(b"\r") else line).strip(b" \t")
        )

    def delivered_days(self, kind: str) -> list[str]:
        """Day folders present for `kind` whose name is a real date (others are not deliveries)."""
        root = Path(self.landing_dir) / kind
        prefix = f"{DAY_FOLDER[kind]}="
        if not root.is_dir():
            return []
        return sorted(
            p.name.removeprefix(prefix)
            for p in root.iterdir()
            if p.is_dir()
            and p.name.startswith(prefix)
            and _is_iso_date(p.name.removeprefix(prefix))
        )


def _is_iso_date(text: str) -> bool:
    try:
        return date.fromisoformat(text).isoformat() == text
    except ValueError:
        return False
