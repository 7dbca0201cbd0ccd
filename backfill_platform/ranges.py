"""The one range type: inclusive daily partition keys <-> half-open dates, from Dagster's API.

Operators and run tags speak in inclusive partition keys (`2025-12-06..2026-01-07`);
Delta predicates and commit metadata speak in half-open dates `[start, end)`. `DayRange`
converts between them through `daily_partitions` (its time windows, key ranges and
subsets), so no module counts days by hand.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime

from dagster import DailyPartitionsDefinition, PartitionKeyRange, TimeWindow

from backfill_platform.partitions import daily_partitions

SEPARATOR = ".."


class InvalidRange(ValueError):
    """A range an operator gave that cannot be a range of daily partitions."""


@dataclass(frozen=True, order=True)
class DayRange:
    """Daily partitions `first..last`, both inclusive (partition keys `YYYY-MM-DD`)."""

    first: str
    last: str

    def __post_init__(self) -> None:
        for name, key in (("start", self.first), ("end", self.last)):
            try:
                date.fromisoformat(key)
            except (TypeError, ValueError):
                raise InvalidRange(f"--{name} {key!r}: not a day (YYYY-MM-DD)") from None
        if self.first > self.last:
            raise InvalidRange(f"--start {self.first} is after --end {self.last}")

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def parse(cls, text: str) -> DayRange:
        """`2025-12-06..2026-01-07` (or a single day)."""
        first, _, last = text.strip().partition(SEPARATOR)
        return cls(first, last or first)

    @classmethod
    def of_dates(cls, start: date, end: date) -> DayRange:
        """The partitions of the half-open date range [start, end)."""
        keys = keys_in_window(start, end)
        if not keys:
            raise InvalidRange(f"[{start}, {end}) holds no daily partition")
        return cls(keys[0], keys[-1])

    @classmethod
    def of_days(cls, first: date, last: date) -> DayRange:
        return cls(first.isoformat(), last.isoformat())

    # -- views ---------------------------------------------------------------------------------
    @property
    def key_range(self) -> PartitionKeyRange:
        return PartitionKeyRange(self.first, self.last)

    @property
    def time_window(self) -> TimeWindow:
        first = daily_partitions.time_window_for_partition_key(self.first)
        last = daily_partitions.time_window_for_partition_key(self.last)
        return TimeWindow(first.start, last.end)

    @property
    def start(self) -> date:
        """First day (inclusive)."""
        return self.time_window.start.date()

    @property
    def end(self) -> date:
        """The day after the last (exclusive): the `[start, end)` of Delta predicates."""
        return self.time_window.end.date()

    @property
    def first_day(self) -> date:
        return date.fromisoformat(self.first)

    @property
    def last_day(self) -> date:
        return date.fromisoformat(self.last)

    def partition_keys(self) -> list[str]:
        first = daily_partitions.start.strftime("%Y-%m-%d")
        if self.first < first:
            raise InvalidRange(f"{self}: starts before the first daily partition {first}")
        return daily_partitions.get_partition_keys_in_range(self.key_range)

    def day_keys(self) -> list[str]:
        """Every day of the range, whether or not the partitions reach it yet: for proofs
        over data, which may hold days past the last partition (the stream writes today's
        messages while the partitions end yesterday or at BACKFILL_END_DATE)."""
        calendar = DailyPartitionsDefinition(
            start_date=self.first,
            end_date=self.time_window.end.strftime("%Y-%m-%d"),
            timezone="UTC",
            fmt="%Y-%m-%d",
        )
        return calendar.get_partition_keys_in_range(self.key_range)

    def days(self) -> list[date]:
        return [date.fromisoformat(k) for k in self.partition_keys()]

    def __len__(self) -> int:
        return len(self.partition_keys())

    def __contains__(self, key: object) -> bool:
        text = key.isoformat() if isinstance(key, date) else str(key)
        return self.first <= text <= self.last

    def __str__(self) -> str:
        return f"{self.first}{SEPARATOR}{self.last}"

    def overlaps(self, other: DayRange) -> bool:
        return self.first <= other.last and other.first <= self.last

    def chunks(self, per_run: int) -> list[DayRange]:
        """Consecutive sub-ranges of at most `per_run` partitions, oldest first."""
        keys = self.partition_keys()
        return [
            DayRange(keys[i], keys[min(i + per_run, len(keys)) - 1])
            for i in range(0, len(keys), max(1, per_run))
        ]

    def chunks_by_size(self, sizes: Mapping[str, int], target: int) -> list[DayRange]:
        """As few consecutive sub-ranges as keep each near `target` (sizes by partition key,
        a key not in `sizes` weighs nothing), cut where the running total crosses an equal
        share, oldest first: a range of small days is one chunk, one of big days several."""
        keys = self.partition_keys()
        total = sum(sizes.get(key, 0) for key in keys)
        count = max(1, math.ceil(total / max(1, target)))
        chunks: list[DayRange] = []
        start, seen = 0, 0
        for i, key in enumerate(keys[:-1]):
            seen += sizes.get(key, 0)
            if len(chunks) < count - 1 and seen >= total * (len(chunks) + 1) / count:
                chunks.append(DayRange(keys[start], key))
                start = i + 1
        return [*chunks, DayRange(keys[start], keys[-1])]

    def check_within_partitions(self) -> DayRange:
        """Refuse a range reaching outside the partitions definition (before its start date
        or after its last complete day)."""
        first = daily_partitions.get_first_partition_key()
        last = daily_partitions.get_last_partition_key()
        if first is None or last is None or self.first < first or self.last > last:
            raise InvalidRange(
                f"{self}: outside the daily partitions {first}..{last} "
                "(BACKFILL_START_DATE..BACKFILL_END_DATE, or yesterday (UTC) when no end is set)"
            )
        return self


def ranges_of(keys: Iterable[str | date]) -> list[DayRange]:
    """Partition keys grouped into maximal runs of consecutive days, oldest first."""
    texts = sorted({k.isoformat() if isinstance(k, date) else k for k in keys})
    if not texts:
        return []
    subset = daily_partitions.empty_subset().with_partition_keys(texts)
    return [
        DayRange(r.start, r.end)
        for r in subset.get_partition_key_ranges(daily_partitions, respect_bounds=False)
    ]


def keys_in_window(start: date, end: date) -> list[str]:
    """Partition keys of the half-open date range [start, end)."""
    window = TimeWindow(
        datetime(start.year, start.month, start.day, tzinfo=UTC),
        datetime(end.year, end.month, end.day, tzinfo=UTC),
    )
    return daily_partitions.get_partition_keys_in_time_window(window)
