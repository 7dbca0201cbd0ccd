"""FX rates (contract 1.2): parsing rate files and point-in-time conversion to USD."""

from __future__ import annotations

from pyspark import StorageLevel
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from backfill_platform.resources.lakehouse import LakehouseResource
from backfill_platform.tables import RAW_FX_RATES

HEADER = "currency,usd_per_unit"
RATE_TYPE = "decimal(18,8)"
# amount DECIMAL(18,2) x rate DECIMAL(18,8) is DECIMAL(37,10): exact, no rounding anywhere.
USD_TYPE = "decimal(38,10)"
REACH_DAYS = 7
# known_currencies' answers by (table path, table id, version), the oldest dropped first.
_KNOWN: dict[tuple[str, str, int], list[str]] = {}
_KNOWN_KEPT = 64
# On a raw/fx_rates commit: the known currencies after it, and the "table id:version" they
# were derived from (`known_after`); "none:-1" when the commit created the table.
KNOWN_AFTER = "known_currencies"
KNOWN_FROM = "known_currencies_from"


class FxRateError(ValueError):
    """An FX input makes a partition impossible to compute correctly."""


def parse_rates(lines: DataFrame) -> DataFrame:
    """Rate lines with typed currency and usd_per_unit; `reject_reason` for unusable lines.

    The header is checked per file by the caller (`fx_problems`); it is not a rate line.
    """
    data = lines.where(~F.col("is_blank"))
    first = F.min("line_number").over(_per_file())
    fields = F.split("line", ",", -1)
    rate_text = fields.getItem(1)
    reason = (
        F.when(F.col("line_bytes").isNotNull(), "invalid_utf8")
        .when(F.size(fields) != 2, "wrong_field_count")
        .when(~F.regexp_like(fields.getItem(0), F.lit("^[A-Z]{3}$")), "invalid_currency")
        .when(~F.regexp_like(rate_text, F.lit(r"^\d+(\.\d{1,8})?$")), "invalid_rate")
        .when(F.expr(f"try_cast(split(line, ',', -1)[1] AS {RATE_TYPE})") <= 0, "invalid_rate")
    )
    return (
        data.withColumn("_first", first)
        .where(F.col("line_number") != F.col("_first"))
        .select(
            F.col("day").alias("rate_date"),
            "file_name",
            "line_number",
            "line",
            F.when(reason.isNull(), fields.getItem(0)).alias("currency"),
            F.when(reason.isNull(), F.expr(f"try_cast(split(line, ',', -1)[1] AS {RATE_TYPE})"))
            .cast(RATE_TYPE)
            .alias("usd_per_unit"),
            reason.alias("reject_reason"),
            "_source_path",
        )
    )


def fx_problems(lines: DataFrame, rates: DataFrame) -> tuple[list[str], list[str], set[str]]:
    """Files whose first non-blank line is not the contract's header, as 'path (line N)',
    (day, currency) pairs delivered with two different valid rates (which one is true?),
    and the currencies with a valid rate in the delivery (`known_after`).

    One Spark query for all three: each is a tiny aggregation over a few KB, and a job costs
    more than its work here. The currencies are the conflict aggregation's own groups, one
    row per rated (day, currency).
    """
    data = lines.where(~F.col("is_blank"))
    headers = data.withColumn("_first", F.min("line_number").over(_per_file())).where(
        (F.col("line_number") == F.col("_first")) & (F.col("line") != HEADER)
    )
    rated = (
        rates.where(F.col("reject_reason").isNull())
        .groupBy("rate_date", "currency")
        .agg(F.countDistinct("usd_per_unit").alias("n"), F.collect_set("file_name").alias("files"))
    )
    header_type = "struct<_source_path:string,line_number:int,line:string>"
    found = (
        headers.select(
            F.lit("header").alias("kind"),
            F.struct("_source_path", "line_number", "line").alias("header"),
            F.lit(None)
            .cast("struct<rate_date:date,currency:string,files:array<string>>")
            .alias("rated"),
        )
        .unionByName(
            rated.select(
                F.when(F.col("n") > 1, "conflict").otherwise("rate").alias("kind"),
                F.lit(None).cast(header_type).alias("header"),
                F.struct("rate_date", "currency", "files").alias("rated"),
            )
        )
        .collect()
    )
    bad = sorted(r["header"] for r in found if r["kind"] == "header")
    conflicting = sorted(r["rated"] for r in found if r["kind"] == "conflict")
    return (
        [f"{h['_source_path']} (line {h['line_number']}: {h['line'][:80]!r})" for h in bad],
        [f"{c['rate_date']} {c['currency']} in {sorted(c['files'])}" for c in conflicting],
        {r["rated"]["currency"] for r in found if r["kind"] != "header"},
    )


def point_in_time_rates(pairs: DataFrame, rates: DataFrame) -> DataFrame:
    """For each (event_date, currency): the rate of the latest rate_date within the reach.

    USD is 1 by definition. A pair with no rate in [event_date - 7, event_date] gets NULL;
    callers must fail the partition rather than guess (`require_rates`).
    """
    valid = rates.where(F.col("reject_reason").isNull()).select(
        "rate_date", "currency", "usd_per_unit"
    )
    candidates = pairs.join(
        F.broadcast(valid),
        (pairs.currency == valid.currency)
        & (valid.rate_date <= pairs.event_date)
        & (valid.rate_date >= F.date_sub(pairs.event_date, REACH_DAYS)),
        "left",
    ).select(pairs.event_date, pairs.currency, valid.rate_date, valid.usd_per_unit)
    latest = candidates.groupBy("event_date", "currency").agg(
        F.max_by("usd_per_unit", "rate_date").alias("usd_per_unit")
    )
    return latest.select(
        "event_date",
        "currency",
        F.when(F.col("currency") == "USD", F.lit(1).cast(RATE_TYPE))
        .otherwise(F.col("usd_per_unit"))
        .cast(RATE_TYPE)
        .alias("usd_per_unit"),
    )


def require_rates(rated_pairs: DataFrame) -> None:
    """Fails with every (day, currency) that has no usable rate, naming them."""
    missing = (
        rated_pairs.where(F.col("usd_per_unit").isNull())
        .select("event_date", "currency")
        .orderBy("event_date", "currency")
        .collect()
    )
    if missing:
        listed = ", ".join(f"{r['event_date']} {r['currency']}" for r in missing[:20])
        raise FxRateError(
            f"No FX rate within {REACH_DAYS} days for {len(missing)} (event_date, currency) "
            f"pair(s): {listed}. The partition is not written; deliver the missing "
            "fx_rates files and re-run it."
        )


def with_usd(orders: DataFrame, rates: DataFrame) -> DataFrame:
    """Orders with `usd_per_unit` and exact `amount_usd`; raises if any order lacks a rate.

    The result is cached: both marts call this on the same staging and FX ranges in one
    run, and Spark matches the second call's plan to the first one's cache, so the second
    mart skips the staging scan and the join. The Spark resource clears caches at run end.
    """
    pairs = orders.select("event_date", "currency").distinct()
    rated = point_in_time_rates(pairs, rates).cache()
    require_rates(rated)
    joined = orders.join(F.broadcast(rated), ["event_date", "currency"], "left")
    return joined.withColumn(
        "amount_usd", (F.col("amount") * F.col("usd_per_unit")).cast(USD_TYPE)
    ).persist(StorageLevel.MEMORY_AND_DISK)


def _per_file():
    return Window.partitionBy("_source_path")


def known_currencies(lakehouse: LakehouseResource) -> list[str]:
    """USD plus every currency with a valid rate anywhere in raw/fx_rates (contract 1.1).

    Read once per version of raw/fx_rates in a process: a run asks three times (staging
    and two reconciliations) and the live stream every batch. The newest commit usually
    records the answer (`known_after`), a read of the log on the driver; otherwise it is a
    Spark job over the table.
    """
    content = lakehouse.content_id(RAW_FX_RATES)
    if content is None:
        return ["USD"]
    key = (lakehouse.table_path(RAW_FX_RATES), *content)
    if key not in _KNOWN:
        known = _recorded_known(lakehouse, *content)
        if known is None:
            rows = (
                lakehouse.read(RAW_FX_RATES, content[1])
                .where(F.col("reject_reason").isNull())
                .select("currency")
                .distinct()
                .collect()
            )
            known = sorted({"USD", *(r["currency"] for r in rows)})
        while len(_KNOWN) >= _KNOWN_KEPT:
            _KNOWN.pop(next(iter(_KNOWN)))
        _KNOWN[key] = known
    return list(_KNOWN[key])


def known_after(
    lakehouse: LakehouseResource,
    before: tuple[str, int] | None,
    delivered: set[str],
    replaces_rows: bool,
) -> dict[str, str]:
    """What a raw/fx_rates write that replaces its days with `delivered`'s currencies records
    on its commit, so that no reader need scan the new version for the known set.

    Replacing days can only drop currencies that were known before the write (at `before`,
    the table's `content_id` read before anything else the run read of it). So when those
    days held no row, or the delivery brings every currency known before, the known set
    after the write is the set before plus the delivery's; otherwise ({}) readers scan the
    table. A reader trusts the record only on the commit right after `before`: anything in
    between (a RESTORE, another writer) makes it a scan again.
    """
    known = set(known_currencies(lakehouse))
    if replaces_rows and not known - {"USD"} <= delivered:
        return {}
    table_id, version = before if before is not None else ("none", -1)
    return {
        KNOWN_AFTER: ",".join(sorted(known | delivered | {"USD"})),
        KNOWN_FROM: f"{table_id}:{version}",
    }


def _recorded_known(lakehouse: LakehouseResource, table_id: str, version: int) -> list[str] | None:
    commit = lakehouse.newest_commit(RAW_FX_RATES)
    if commit is None or commit.version != version:
        return None
    recorded = commit.user_metadata
    derived_from = f"{table_id}:{version - 1}" if version else "none:-1"
    if KNOWN_AFTER not in recorded or recorded.get(KNOWN_FROM) != derived_from:
        return None
    return recorded[KNOWN_AFTER].split(",")
