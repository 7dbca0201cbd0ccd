"""The one partitions definition every layer shares: daily, UTC, from BACKFILL_START_DATE to
BACKFILL_END_DATE (inclusive; unset: yesterday, so the partitions grow by a day every day).

Raw partitions are ingest days, staging and fct partitions are event days, LTV partitions
are snapshot days; all three are calendar days in UTC, so one definition keeps partition
mappings trivial and lets a backfill run every layer for a range in one run.

An explicit end is for a fixed data set (the demo: `make demo` and `make ui` set it to the
landing zone's newest day, so the UI shows the demo's days and no empty ones after them).
`BACKFILL_END_DATE=today` makes the current UTC day a partition while it is written
(Dagster's `end_offset=1`): for a deployment whose live stream reports today's messages as
they commit (docs/live-stream.md, "Days past the partitions are held").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, date, datetime, timedelta
from typing import Any

from dagster import DailyPartitionsDefinition, TimeWindow

from backfill_platform.settings import END_DATE, START_DATE, SettingError, day_setting, setting

TODAY = "today"  # BACKFILL_END_DATE=today: the partitions run through the current UTC day


def _definition(
    first: date | None, last: date | None, through_today: bool = False
) -> DailyPartitionsDefinition:
    if first is None:
        raise SettingError("BACKFILL_START_DATE is empty: set the first daily partition")
    if last is not None and last < first:
        raise SettingError(
            f"BACKFILL_END_DATE={last} is before BACKFILL_START_DATE={first}: no partitions"
        )
    # Dagster's end_date is exclusive; the setting names the last partition.
    end = (last + timedelta(days=1)).isoformat() if last else None
    return DailyPartitionsDefinition(
        start_date=first.isoformat(),
        end_date=end,
        timezone="UTC",
        fmt="%Y-%m-%d",
        end_offset=1 if through_today else 0,
    )


def _from_settings() -> DailyPartitionsDefinition:
    end = setting(END_DATE).strip()
    if end.lower() == TODAY:
        return _definition(day_setting(START_DATE), None, through_today=True)
    try:
        last = day_setting(END_DATE)
    except SettingError:
        raise SettingError(
            f"BACKFILL_END_DATE={end!r}: not a day (YYYY-MM-DD) or {TODAY}"
        ) from None
    return _definition(day_setting(START_DATE), last)


daily_partitions = _from_settings()


def in_partitions(keys: Iterable[str | None]) -> list[str]:
    """The keys that are daily partitions now. A stream batch reports every day it wrote,
    today's among them while the partitions end yesterday (or at BACKFILL_END_DATE): such a
    day is in the instance's records, but no run can target it yet."""
    first = daily_partitions.get_first_partition_key()
    last = daily_partitions.get_last_partition_key()
    return [k for k in keys if k and first and last and first <= k <= last]


def commit_partition_keys(metadata: Mapping[str, Any]) -> list[str]:
    """The daily partitions a commit wrote: its stamped half-open [partition_start, partition_end).

    Commits without a stamped range (RESTORE, VACUUM, OPTIMIZE) wrote none.
    """
    start, end = metadata.get("partition_start"), metadata.get("partition_end")
    if not start or not end:
        return []
    window = TimeWindow(
        datetime.fromisoformat(start).replace(tzinfo=UTC),
        datetime.fromisoformat(end).replace(tzinfo=UTC),
    )
    return daily_partitions.get_partition_keys_in_time_window(window)
