"""The one partitions definition every layer shares: daily, UTC, from BACKFILL_START_DATE.

Raw partitions are ingest days, staging and fct partitions are event days, LTV partitions
are snapshot days; all three are calendar days in UTC, so one definition keeps partition
mappings trivial and lets a backfill run every layer for a range in one run.
"""

from __future__ import annotations

from dagster import DailyPartitionsDefinition

from backfill_platform.settings import START_DATE, setting

daily_partitions = DailyPartitionsDefinition(
    start_date=setting(START_DATE), timezone="UTC", fmt="%Y-%m-%d"
)
