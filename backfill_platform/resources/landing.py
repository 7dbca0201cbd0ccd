"""The landing zone (contract section 1): where sources drop immutable daily files.

A local directory or an object-store prefix (`s3a://bucket/landing`); the latter is listed
and read through Hadoop's FileSystem in the Spark session (`resources/storage.py`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from dagster import ConfigurableResource
from pydantic import Field

from backfill_platform.resources.spark import SparkSessionResource
from backfill_platform.resources.storage import is_uri, join, list_dir, read_bytes

ORDERS = "orders"
FX_RATES = "fx_rates"
DAY_FOLDER = {ORDERS: "ingest_date", FX_RATES: "rate_date"}
SUFFIX = {ORDERS: ".jsonl", FX_RATES: ".csv"}


@dataclass(frozen=True)
class LandingFile:
    """A delivered file: where Spark reads it, its name, size and modification time."""

    path: str
    name: str
    size: int
    modified_ns: int  # since the epoch

    def __str__(self) -> str:
        return self.path


class LandingZoneResource(ConfigurableResource):
    """Lists a day's delivered files; reading them is Spark's job."""

    landing_dir: str = Field(description="Root of the landing zone (BACKFILL_LANDING_DIR).")
    spark: SparkSessionResource = Field(
        description="Lists and reads an object-store landing zone; unused for a local one."
    )

    def day_dir(self, kind: str, day: str) -> str:
        return join(self.landing_dir, kind, f"{DAY_FOLDER[kind]}={day}")

    def files(self, kind: str, days: Iterable[str]) -> list[LandingFile]:
        """Delivered files of `kind` for the given days, sorted; missing days simply have none."""
        found: list[LandingFile] = []
        for day in days:
            found.extend(
                f
                for f in self._list(self.day_dir(kind, day), dirs=False)
                if f.name.endswith(SUFFIX[kind])
            )
        return found

    def read_bytes(self, file: LandingFile) -> bytes:
        # By the root, not the path: Hadoop spells `file:///x` as `file:/x`.
        if is_uri(self.landing_dir):
            return read_bytes(self.spark.get_session(), file.path)
        return Path(file.path).read_bytes()

    def record_count(self, file: LandingFile) -> int:
        """Lines of a landing file that count as records (contract 1.1): a leading UTF-8 BOM
        and one trailing CR per line aside, lines of only spaces and tabs are not records."""
        data = self.read_bytes(file).removeprefix(b"\xef\xbb\xbf")
        return sum(
            1
            for line in data.split(b"\n")
            if (line[:-1] if line.endswith(b"\r") else line).strip(b" \t")
        )

    def delivered_days(self, kind: str) -> list[str]:
        """Day folders present for `kind` whose name is a real date (others are not deliveries)."""
        prefix = f"{DAY_FOLDER[kind]}="
        return sorted(
            f.name.removeprefix(prefix)
            for f in self._list(join(self.landing_dir, kind), dirs=True)
            if f.name.startswith(prefix) and _is_iso_date(f.name.removeprefix(prefix))
        )

    def _list(self, folder: str, dirs: bool) -> list[LandingFile]:
        """Files (or folders) directly in `folder`, sorted by name; none if it is missing."""
        if is_uri(folder):
            return [
                LandingFile(o.path, o.name, o.size, int(o.modified * 1_000_000_000))
                for o in list_dir(self.spark.get_session(), folder)
                if o.is_dir == dirs
            ]
        root = Path(folder)
        if not root.is_dir():
            return []
        found = []
        for p in sorted(root.iterdir()):
            if p.is_dir() if dirs else p.is_file():
                stat = p.stat()
                found.append(LandingFile(str(p), p.name, stat.st_size, stat.st_mtime_ns))
        return found


def _is_iso_date(text: str) -> bool:
    try:
        return date.fromisoformat(text).isoformat() == text
    except ValueError:
        return False
