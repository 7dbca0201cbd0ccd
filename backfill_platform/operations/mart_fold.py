"""The stream's fold into the marts (BACKFILL_STREAM_MARTS): after a batch is staged, the
event days it changed are rebuilt in marts/fct_daily_revenue and marts/customer_ltv within
the batch, with the assets' own transforms and the same atomic partition replace a run
does, and proven by the marts' own check equations. The marts then follow the stream by a
batch, not by the next rolling-window run.

What a run does for those days, the fold does: daily revenue per event day at
point-in-time FX (the event day's rate or the newest of the 7 days before), and LTV rolled
forward from the snapshot before the first changed day through the newest snapshot (snapshot
D is D-1 plus day D, so a late order changes every later snapshot). What it leaves to the
window and the staleness sensor, and says so in the batch's line:
- days a freeze holds on either mart (LTV stops before the first frozen day: later
  snapshots are built on it);
- an LTV roll-forward longer than `max_days` (a weeks-late order would hold the stream up
  for as many snapshots);
- days no rate covers (the run fails the same days; the fold leaves the marts as they are);
- days past the last partition (no run can target them yet).
The segment mart is not folded: a live order needs its customer fetched after it (contract
1.3), and at the bench's 1,000 messages/s that is 15 times the CRM's limit
(`make bench-crm-demand`), so its CRM calls stay with the runs and their share of it.

The marts' check equations are evaluated over the days folded since their last evaluation,
at most once per `MartsFold.check_seconds` (the stream's report interval: as often as
Dagster hears of each mart day) and for whatever is left when the query ends
(`check_folded_days`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date, timedelta
from itertools import groupby

from dagster import AssetKey
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from backfill_platform.checks.reconciliation import fct_vs_staging, ltv_vs_previous_day
from backfill_platform.checks.results import CheckOutcome
from backfill_platform.partitions import daily_partitions, in_partitions
from backfill_platform.ranges import DayRange, ranges_of
from backfill_platform.resources.delta_io_manager import READ_VERSIONS
from backfill_platform.resources.lakehouse import LakehouseResource
from backfill_platform.tables import (
    CUSTOMER_LTV,
    FCT_DAILY_REVENUE,
    RAW_FX_RATES,
    STAGING_ORDERS,
    table,
)
from backfill_platform.transforms.fx import REACH_DAYS, FxRateError, with_usd
from backfill_platform.transforms.revenue import customer_ltv, daily_revenue

MARTS_DAYS = 7  # the longest LTV roll-forward a batch folds (BACKFILL_STREAM_MARTS_DAYS)
ONE_DAY = timedelta(days=1)
# The days of a batch an active freeze holds (a fold skips them), from the caller: the
# staging fold's and the marts' own, each for its tables.
FrozenDays = Callable[[list[str]], set[str]]


@dataclass
class UncheckedDays:
    """The marts' days folded since their checks were last evaluated, and when that was."""

    days: dict[AssetKey, set[str]] = field(default_factory=dict)
    checked_at: float | None = None  # time.monotonic() of the last evaluation

    def due(self, every: float) -> bool:
        return self.checked_at is None or time.monotonic() - self.checked_at >= every


@dataclass(frozen=True)
class MartsFold:
    """Fold each staged batch into the two marts; `frozen` names the days a freeze holds,
    `max_days` bounds the LTV snapshots one batch rebuilds, `check_seconds` how often the
    folded days' checks are evaluated (0: with every batch; see `check_folded_days`)."""

    frozen: FrozenDays | None = None
    max_days: int = MARTS_DAYS
    check_seconds: float = 0.0
    unchecked: UncheckedDays = field(default_factory=UncheckedDays, compare=False)


@dataclass
class MartsFolded:
    """What one fold wrote (table -> {day: Delta version}), its checks' outcomes, what it
    left to the window and why, and its seconds."""

    written: dict[str, dict[str, int]] = field(default_factory=dict)
    outcomes: list[CheckOutcome] = field(default_factory=list)
    left: list[str] = field(default_factory=list)
    seconds: float = 0.0
    parts: dict[str, float] = field(default_factory=dict)  # seconds per write and check

    @contextmanager
    def timing(self, part: str) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            self.parts[part] = self.parts.get(part, 0.0) + time.monotonic() - started

    def describe(self) -> str:
        days = sorted({d for versions in self.written.values() for d in versions})
        text = f"marts {_span(days)} ({self.seconds:.1f} s)"
        failed = [
            f"{o.check_name} {','.join(r.partition for r in o.failed)}"
            for o in self.outcomes
            if o.failed
        ]
        if failed:
            text += f", checks FAIL: {'; '.join(failed)}"
        if self.left:
            text += f"; left to the window: {'; '.join(self.left)}"
        return text


def fold_into_marts(
    lake: LakehouseResource, staged_days: list[str], fold: MartsFold, writer: str
) -> MartsFolded:
    """Rebuild the marts' partitions that staging's `staged_days` change (see the module);
    `writer` is the commits' `writer` metadata."""
    started = time.monotonic()
    done = MartsFolded()
    days = in_partitions(staged_days)
    if len(days) < len(set(staged_days)):
        done.left.append(f"{_span(sorted(set(staged_days) - set(days)))} not partitions yet")
    try:
        if days:
            with done.timing("ltv_find_newest"):
                span, built = _ltv_span(lake, days, fold.max_days)
            # One lookup of the freezes for both marts: the LTV span holds every changed day.
            frozen = fold.frozen(span.partition_keys()) if fold.frozen else set()
            held = sorted(frozen & set(days))
            if held:
                done.left.append(f"{_span(held)} frozen")
            _fold_revenue(lake, [d for d in days if d not in frozen], writer, done)
            _fold_ltv(lake, span, built, frozen, fold, writer, done)
    except FxRateError as error:
        done.left.append(f"no rate: {error}")
    finally:
        lake.session.catalog.clearCache()  # with_usd's cache: a stream has no run end
        for name, versions in done.written.items():
            fold.unchecked.days.setdefault(AssetKey.from_user_string(name), set()).update(versions)
    if fold.unchecked.due(fold.check_seconds):
        check_folded_days(lake, fold, done)
    done.seconds = time.monotonic() - started
    return done


def check_folded_days(lake: LakehouseResource, fold: MartsFold, done: MartsFolded) -> None:
    """Each mart's check equation over the days folded since the last evaluation, on the
    tables as they are after this batch (so an evaluation verifies the newest fold of its
    day), into `done.outcomes`.

    A fold checked with every batch spends about half of its time in the checks (the LTV
    roll-forward's is the larger), so at 1,000 messages/s its batches grow and messages wait
    longer for the marts; the stream checks at most once per report interval instead, which
    is also how often Dagster is told of each mart day, and what is unchecked when the
    stream stops or a catch-up ends is checked then (`operations/stream.py`)."""
    try:
        for key, part, equation in (
            (FCT_DAILY_REVENUE, "fct_check", fct_vs_staging),
            (CUSTOMER_LTV, "ltv_check", ltv_vs_previous_day),
        ):
            for span in ranges_of(fold.unchecked.days.pop(key, set())):
                with done.timing(part):
                    done.outcomes.append(equation(lake, span))
    except FxRateError as error:  # as a run's check step fails on those days
        done.left.append(f"checks: no rate: {error}")
    finally:
        fold.unchecked.checked_at = time.monotonic()
        lake.session.catalog.clearCache()  # the equations' FX joins: a stream has no run end


def _fold_revenue(lake: LakehouseResource, days: list[str], writer: str, done: MartsFolded) -> None:
    for span in ranges_of(days):
        orders = lake.read_partitions(STAGING_ORDERS, span.start, span.end)
        rates = lake.read_partitions(RAW_FX_RATES, span.start - REACH_DAYS * ONE_DAY, span.end)
        frame = daily_revenue(with_usd(orders, rates)).withColumn(
            "_loaded_at", F.current_timestamp()
        )
        with done.timing("fct_write"):
            _replace(
                lake, FCT_DAILY_REVENUE, frame, span, (STAGING_ORDERS, RAW_FX_RATES), writer, done
            )


def _ltv_span(
    lake: LakehouseResource, days: list[str], max_days: int
) -> tuple[DayRange, set[date]]:
    """The snapshots to rebuild, from the first changed day through the newest one (or the
    newest changed day; a snapshot missing in between too), and the built ones near it."""
    first = date.fromisoformat(min(days))
    built = _built_snapshots(lake, first, max_days)
    newest = max(built, default=None)
    last = max(date.fromisoformat(max(days)), newest or first)
    if newest is not None and newest + ONE_DAY < first:
        first = newest + ONE_DAY
    return DayRange.of_days(first, last), built


def _fold_ltv(
    lake: LakehouseResource,
    span: DayRange,
    built: set[date],
    frozen: set[str],
    fold: MartsFold,
    writer: str,
    done: MartsFolded,
) -> None:
    """`span`'s snapshots on the snapshot before, up to the first frozen day."""
    frozen = frozen & set(span.partition_keys())
    if frozen:
        cut = min(frozen)
        done.left.append(f"LTV from {cut} (frozen)")
        if cut == span.first:
            return
        span = DayRange(span.first, (date.fromisoformat(cut) - ONE_DAY).isoformat())
    if len(span) > fold.max_days:
        done.left.append(f"LTV {span} ({len(span)} snapshots > {fold.max_days})")
        return
    before = span.start - ONE_DAY
    base = None  # none before the first partition
    if span.first != daily_partitions.get_first_partition_key():
        if before not in built:  # `built` starts before it: the span starts after `lowest`
            done.left.append(f"LTV {span}: no snapshot of {before}")
            return
        base = lake.read_partitions(CUSTOMER_LTV, before, span.start)
    orders = with_usd(
        lake.read_partitions(STAGING_ORDERS, span.start, span.end),
        lake.read_partitions(RAW_FX_RATES, span.start - REACH_DAYS * ONE_DAY, span.end),
    )
    frame = customer_ltv(orders, base, span.days()).withColumn("_loaded_at", F.current_timestamp())
    inputs = (STAGING_ORDERS, RAW_FX_RATES, CUSTOMER_LTV)
    with done.timing("ltv_write"):
        _replace(lake, CUSTOMER_LTV, frame, span, inputs, writer, done)


def _built_snapshots(lake: LakehouseResource, first: date, max_days: int) -> set[date]:
    """The LTV partitions built from `max_days` before `first` on, from the commits' stamped
    ranges (a day with no customer yet has no row): one read of the log answers both the
    newest snapshot and whether the one before the span exists."""
    bounds = [daily_partitions.get_first_partition_key(), daily_partitions.get_last_partition_key()]
    lowest = max(first - max_days * ONE_DAY, date.fromisoformat(bounds[0]))
    candidates = DayRange.of_days(lowest, date.fromisoformat(bounds[1])).days()
    return lake.covered_days(CUSTOMER_LTV, candidates)


def _replace(
    lake: LakehouseResource,
    key: AssetKey,
    frame: DataFrame,
    span: DayRange,
    inputs: tuple[AssetKey, ...],
    writer: str,
    done: MartsFolded,
) -> None:
    """One atomic replace of `span`, stamped with the versions of what it read."""
    read = {k.to_user_string(): lake.current_version(k) for k in inputs}
    commit = lake.replace_range(
        key,
        frame,
        table(key).partition_column,
        span.start,
        span.end,
        {
            "writer": writer,
            READ_VERSIONS: json.dumps(read),
            "asset_key": key.to_user_string(),
            "code_version": table(key).code_version,
        },
    )
    done.written.setdefault(key.to_user_string(), {}).update(
        dict.fromkeys(span.partition_keys(), commit.version)
    )


def _span(days: list[str]) -> str:
    """The days as runs of consecutive days ("d1..d2, d4"), so a gap never reads as folded;
    days past the last partition included (`ranges_of` keeps partitions only)."""
    if not days:
        return "-"
    ordered = sorted(date.fromisoformat(d) for d in set(days))
    runs = groupby(enumerate(ordered), key=lambda pair: pair[1].toordinal() - pair[0])
    spans = [[day for _, day in run] for _, run in runs]
    return ", ".join(str(run[0]) if len(run) == 1 else f"{run[0]}..{run[-1]}" for run in spans)
