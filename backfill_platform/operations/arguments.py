"""Operator arguments, checked before anything is built or touched.

The CLI and the launchpad jobs both call these, so a bad selection, range, reason or
retention is refused the same way everywhere, with an error naming the argument. (Shadow
suffixes are checked where shadow names are built: `tables.check_shadow_suffix`.)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

from dagster import AssetKey

from backfill_platform.lineage import Lineage, UnknownAsset
from backfill_platform.ranges import DayRange, InvalidRange
from backfill_platform.settings import MAX_RANGE_DAYS, setting
from backfill_platform.tables import (  # CORRECTABLE_LAYERS: re-exported for the CLI
    CORRECTABLE_LAYERS as CORRECTABLE_LAYERS,
)
from backfill_platform.tables import InvalidShadowSuffix, UnknownTable, table


class InvalidArgument(ValueError):
    """An operator argument that cannot be acted on; nothing was touched."""


# Every way an operator argument is refused: one line for the operator, never a traceback.
OPERATOR_ERRORS = (InvalidArgument, InvalidRange, InvalidShadowSuffix, UnknownAsset, UnknownTable)


def check_selection(
    lineage: Lineage, names: Iterable[str], layers: Sequence[str] | None = None
) -> list[AssetKey]:
    """Known asset keys (plus the outputs that must run with them), of `layers` if given."""
    names = [name.strip() for name in names if name.strip()]
    if not names:
        raise InvalidArgument("--select: name at least one asset, e.g. marts/fct_daily_revenue")
    keys = lineage.parse(names)
    if layers is not None:
        wrong = [k.to_user_string() for k in keys if table(k).layer not in layers]
        if wrong:
            raise InvalidArgument(
                f"--select {', '.join(wrong)}: this operation takes tables of the "
                f"{' and '.join(layers)} layers; raw tables are rebuilt by re-ingesting "
                "(a plain backfill), never replaced from a shadow"
            )
    return keys


def check_range(first: str, last: str, confirmed: bool = False) -> DayRange:
    """A range inside the partitions; longer than BACKFILL_MAX_RANGE_DAYS only if confirmed."""
    days = DayRange(first, last).check_within_partitions()
    limit = int(setting(MAX_RANGE_DAYS))
    if len(days) > limit and not confirmed:
        raise InvalidRange(
            f"--start/--end {days}: {len(days)} days is more than BACKFILL_MAX_RANGE_DAYS "
            f"({limit}); run `plan` first and pass --yes to confirm a range this large"
        )
    return days


def check_instant(text: str, name: str) -> datetime:
    """An ISO 8601 instant (`2024-01-10T06:00:00Z`) or day (`2024-01-10`, its midnight), UTC
    when it names no offset."""
    try:
        instant = datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidArgument(
            f"{name}: {text!r} is not an instant (2024-01-10T06:00:00Z or 2024-01-10)"
        ) from None
    return instant if instant.tzinfo else instant.replace(tzinfo=UTC)


def check_offsets(text: str, name: str = "--from-offsets") -> dict[int, int]:
    """`0:120,1:98`: Kafka partition -> offset, each partition once."""
    offsets: dict[int, int] = {}
    for item in text.split(","):
        partition, _, offset = item.strip().partition(":")
        if not (partition.isdigit() and offset.isdigit()) or int(partition) in offsets:
            raise InvalidArgument(
                f"{name}: {item.strip()!r} in {text!r} is not partition:offset (e.g. 0:120,1:98),"
                " each partition once"
            )
        offsets[int(partition)] = int(offset)
    return offsets


def check_reason(reason: object) -> str:
    """Any text that says something (Unicode, quotes and newlines are kept as given)."""
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidArgument("--reason: say why (it is recorded in the Delta commit)")
    return reason


def check_retention_hours(hours: object, name: str = "--retention-hours") -> float:
    if (
        isinstance(hours, bool)
        or not isinstance(hours, int | float)
        or not math.isfinite(hours)
        or hours < 0
    ):
        raise InvalidArgument(
            f"{name} {hours!r}: give a finite number of hours >= 0; nothing was touched"
        )
    return float(hours)


def check_tags(texts: Iterable[str]) -> dict[str, str]:
    """`--tag KEY=VALUE` options as run tags (e.g. `dagster/max_retries=0`)."""
    tags = {}
    for text in texts:
        key, sep, value = text.partition("=")
        if not sep or not key.strip():
            raise InvalidArgument(f"--tag {text!r}: give KEY=VALUE, e.g. dagster/max_retries=0")
        tags[key.strip()] = value
    return tags
