"""The landing zone (contract section 1): where sources drop immutable daily files.

A local directory or an object-store prefix (`s3a://bucket/landing`); the latter is listed
and read through Hadoop's FileSystem in the Spark session (`resources/storage.py`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from datetime import date
from pathlib import Path

from dagster import ConfigurableResource
from pydantic import Field

from backfill_platform.resources.spark import SparkSessionResource
from backfill_platform.resources.storage import (
    StoredObject,
    is_uri,
    join,
    list_dir,
    list_local_dir,
    local_path,
    read_bytes,
    sizes_under,
)

ORDERS = "orders"
FX_RATES = "fx_rates"
DAY_FOLDER = {ORDERS: "ingest_date", FX_RATES: "rate_date"}
SUFFIX = {ORDERS: ".jsonl", FX_RATES: ".csv"}


class LandingZoneResource(ConfigurableResource):
    """Lists a day's delivered files; reading them is Spark's job."""

    landing_dir: str = Field(description="Root of the landing zone (BACKFILL_LANDING_DIR).")
    spark: SparkSessionResource = Field(
        description="Lists and reads an object-store landing zone; unused for a local one."
    )

    def day_dir(self, kind: str, day: str) -> str:
        return join(self.landing_dir, kind, f"{DAY_FOLDER[kind]}={day}")

    def files(self, kind: str, days: Iterable[str]) -> list[StoredObject]:
        """Delivered files of `kind` for the given days, sorted; missing days simply have none."""
        found: list[StoredObject] = []
        for day in days:
            found.extend(
                f
                for f in self._list(self.day_dir(kind, day), dirs=False)
                if f.name.endswith(SUFFIX[kind])
            )
        return found

    def bytes_by_day(self, days: Iterable[str]) -> dict[str, int]:
        """Bytes of both kinds of delivery per day (what sizes a run, runner.plan_work): the
        files `files` lists. On object storage from one recursive listing of each kind's
        prefix: a listing per day and kind there is two requests, 4,384 for three years. A
        local or `file://` zone is listed day by day without the JVM."""
        sizes = dict.fromkeys(days, 0)
        local = local_path(self.landing_dir)
        for kind, suffix in SUFFIX.items():
            prefix = f"{DAY_FOLDER[kind]}="
            if local is not None:
                for day in sizes:
                    sizes[day] += sum(
                        e.size
                        for e in list_local_dir(join(local, kind, prefix + day))
                        if not e.is_dir and e.name.endswith(suffix)
                    )
                continue
            listed = sizes_under(self.spark.get_session(), join(self.landing_dir, kind))
            for relative, size in listed.items():
                day_folder, _, name = relative.partition("/")
                day = day_folder.removeprefix(prefix)
                if (
                    day_folder.startswith(prefix)
                    and day in sizes
                    and "/" not in name
                    and name.endswith(suffix)
                ):
                    sizes[day] += size
        return sizes

    def read_bytes(self, file: StoredObject) -> bytes:
        # By the root, not the path: Hadoop spells `file:///x` as `file:/x`.
        if is_uri(self.landing_dir):
            return read_bytes(self.spark.get_session(), file.path)
        return Path(file.path).read_bytes()

    def record_count(self, file: StoredObject) -> int:
        """Lines of a landing file that count as records (contract 1.1): a leading UTF-8 BOM
        and one trailing CR per line aside, lines of only spaces and tabs are not records."""
        data = self.read_bytes(file).removeprefix(b"\xef\xbb\xbf")
        return sum(
            1
            for line in data.split(b"\n")
            if (line[:-1] if line.endswith(b"\r") else line).strip(b" \t")
        )

    def records_per_file(
        self, kind: str, files: Iterable[StoredObject], only: Collection[tuple[date, str]]
    ) -> dict[tuple[date, str], int]:
        """`record_count` per (day, file name) of those `files` (as `files` lists them) that
        `only` names; the day is the file's day folder."""
        prefix = f"{DAY_FOLDER[kind]}="
        counted = {}
        for file in files:
            folder = file.path.rstrip("/").rsplit("/", 2)[-2]
            key = (date.fromisoformat(folder.removeprefix(prefix)), file.name)
            if key in only:
                counted[key] = self.record_count(file)
        return counted

    def delivered_days(self, kind: str) -> list[str]:
        """Day folders present for `kind` whose name is a real date (others are not deliveries)."""
        prefix = f"{DAY_FOLDER[kind]}="
        return sorted(
            f.name.removeprefix(prefix)
            for f in self._list(join(self.landing_dir, kind), dirs=True)
            if f.name.startswith(prefix) and _is_iso_date(f.name.removeprefix(prefix))
        )

    def _list(self, folder: str, dirs: bool) -> list[StoredObject]:
        """Files (or folders) directly in `folder`, sorted by name; none if it is missing."""
        if is_uri(folder):
            entries = list_dir(self.spark.get_session(), folder)
        else:
            entries = list_local_dir(folder)
        return [e for e in entries if e.is_dir == dirs]


def _is_iso_date(text: str) -> bool:
    try:
        return date.fromisoformat(text).isoformat() == text
    except ValueError:
        return False
