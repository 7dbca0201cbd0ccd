"""The one partitions definition every layer shares: daily, UTC, from BACKFILL_START_DATE.

Raw partitions are ingest days, staging and fct partitions are event days, LTV partitions
are snapshot days; all three are calendar days in UTC, so one definition keeps partition
mappings trivial and lets a backfill run every layer for a range in one run.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from dagster import DailyPartitionsDefinition, TimeWindow

from backfill_platform.settings import START_DATE, setting

daily_partitions = DailyPartitionsDefinition(
    start_date=setting(START_DATE), timezone="UTC", fmt="%Y-%m-%d"
)


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
