"""Hostile landing input: every kind of bad delivery lands as rejects with a precise reason, or
fails its own partition with an error naming the file (or day and currency) — never a crash of
the whole run, never a silently dropped line.

The whole catalogue goes through one landing zone and four Dagster runs: one ranged run over
every reject kind, a re-run after a file is added to an already-ingested day, and the two
kinds that must fail their partition (a rate file with a bad header, an FX gap beyond reach).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import date

import pytest
from dagster import DagsterEvent

from backfill_platform.reconcile import reconcile_marts
from backfill_platform.reference import compute_contract_answer
from backfill_platform_tests.harness import Platform, order_line
from backfill_platform_tests.test_contract_rules import REJECTS

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

FIRST, LAST = date(2024, 1, 1), date(2024, 1, 8)
SIZES = {"small": {"huge_line_bytes": 1 << 20, "skewed_lines": 3000}}
SIZES["full"] = {"huge_line_bytes": 8 << 20, "skewed_lines": 60000}
VALID = None  # expected outcome of a line that must reach staging
DUPLICATE = "duplicate order lines across days"


@dataclass
class Kind:
    """One kind of hostile input: the file(s) it writes and each line's expected outcome."""

    name: str
    day: str  # ingest_date folder name (may be a non-date on purpose)
    file: str
    data: bytes
    expect: dict[int, str | None]  # line number -> reject reason, or VALID


def _t(day: int, hour: int = 10) -> str:
    return f"2024-01-{day:02d}T{hour:02d}:00:00Z"


def _o(order_id: str, day: int, **fields) -> str:
    fields.setdefault("currency", "EUR")
    fields.setdefault("customer_id", f"c-{order_id}")
    return order_line(order_id, _t(day), **fields)


def _lines(*lines: str | bytes, end: bytes = b"\n") -> bytes:
    return b"".join((x if isinstance(x, bytes) else x.encode()) + end for x in lines)


def _record(oid: str, day: int, **changes) -> dict:
    return {**json.loads(_o(oid, day)), **changes}


def catalogue(size: str) -> list[Kind]:
    cfg = SIZES[size]
    day = "ingest_date=2024-01-{:02d}".format
    good = _o("ok-1", 2)
    kinds = [
        Kind(
            "invalid UTF-8",
            day(2),
            "utf8.jsonl",
            _lines(_o("utf8-bad", 2).replace("EUR", "EU\xff").encode("latin-1"), _o("utf8-ok", 2)),
            {1: "invalid_utf8", 2: VALID},
        ),
        Kind(
            "truncated last line",
            day(2),
            "truncated.jsonl",
            _lines(_o("trunc-ok", 2)) + _o("trunc-cut", 2)[:40].encode(),
            {1: VALID, 2: "invalid_json"},
        ),
        Kind(
            "huge line",
            day(3),
            "huge.jsonl",
            _lines(_o("huge", 3, note="x" * cfg["huge_line_bytes"]), _o("after-huge", 3)),
            {1: VALID, 2: VALID},
        ),
        Kind(
            "byte order mark",
            day(3),
            "bom.jsonl",
            b"\xef\xbb\xbf" + _lines(_o("bom-1", 3), _o("bom-2", 3)),
            {1: VALID, 2: VALID},
        ),
        Kind(
            "CRLF line ends",
            day(3),
            "crlf.jsonl",
            _lines(_o("crlf-1", 3), _o("crlf-2", 3), end=b"\r\n"),
            {1: VALID, 2: VALID},
        ),
        Kind(
            "JSON arrays and other non-objects",
            day(3),
            "arrays.jsonl",
            _lines(f"[{good}]", "42", '"text"', "null", "true"),
            dict.fromkeys(range(1, 6), "not_an_object"),
        ),
        Kind(
            "nested objects where scalars belong",
            day(4),
            "nested.jsonl",
            _lines(
                json.dumps(_record("n1", 4, status={"v": "paid"})),
                json.dumps(_record("n2", 4, amount={"value": "1.00"})),
                json.dumps(_record("n3", 4, customer_id={"id": "c"})),
                json.dumps(_record("n4", 4, order_id={"id": "n4"})),
                json.dumps(_record("n5", 4, event_time={"utc": _t(4)})),
            ),
            {
                1: "wrong_type:status",
                2: "wrong_type:amount",
                3: "wrong_type:customer_id",
                4: "wrong_type:order_id",
                5: "wrong_type:event_time",
            },
        ),
        Kind(
            "numbers as strings and the reverse",
            day(4),
            "types.jsonl",
            _lines(
                _o("str-amount", 4, amount="12.50"),
                _o("num-amount", 4, amount=12.5),
                json.dumps(_record("n", 4, order_id=17)),
                json.dumps(_record("num-time", 4, event_time=1704362400)),
                json.dumps(_record("num-status", 4, status=1)),
                json.dumps(_record("num-currency", 4, currency=978)),
            ),
            {
                1: VALID,
                2: VALID,
                3: "wrong_type:order_id",
                4: "wrong_type:event_time",
                5: "wrong_type:status",
                6: "wrong_type:currency",
            },
        ),
        Kind(
            "NaN and Infinity",
            day(4),
            "nan.jsonl",
            _lines(
                *(
                    _o(f"nan-{i}", 4, amount=1).replace('"amount": 1', f'"amount": {v}')
                    for i, v in enumerate(["NaN", "Infinity", "-Infinity"])
                )
            ),
            dict.fromkeys(range(1, 4), "invalid_json"),
        ),
        Kind(
            "exponents in amount",
            day(5),
            "exponent.jsonl",
            _lines(
                _o("exp-1", 5, amount=1).replace('"amount": 1', '"amount": 1e2'),
                _o("exp-2", 5, amount=1).replace('"amount": 1', '"amount": 1.5E1'),
                _o("exp-3", 5, amount="1e2"),
            ),
            dict.fromkeys(range(1, 4), "invalid_amount"),
        ),
        Kind(
            "overlong decimals",
            day(5),
            "decimals.jsonl",
            _lines(
                _o("dec-1", 5, amount="1.505"),
                _o("dec-2", 5, amount=1).replace('"amount": 1', '"amount": 1.505'),
                _o("dec-3", 5, amount=1).replace('"amount": 1', '"amount": 0.1234567890123456789'),
                _o("dec-ok", 5, amount="1.500"),
                _o("dec-big", 5, amount="12345678901234567"),
            ),
            {
                1: "too_many_decimals",
                2: "too_many_decimals",
                3: "too_many_decimals",
                4: VALID,
                5: "amount_out_of_range",
            },
        ),
        Kind(
            "timestamps without offset, impossible dates",
            day(5),
            "timestamps.jsonl",
            _lines(
                json.dumps(_record("ts-1", 5, event_time="2024-01-05T10:00:00")),
                json.dumps(_record("ts-2", 5, event_time="2024-02-30T10:00:00Z")),
                json.dumps(_record("ts-3", 5, event_time="2024-01-05 10:00:00Z")),
                json.dumps(_record("ts-4", 5, updated_at="2024-01-05T24:30:00Z")),
                json.dumps(_record("ts-5", 5, event_time="2024-01-05T10:00:00+25:00")),
            ),
            {
                1: "invalid_timestamp:event_time",
                2: "invalid_timestamp:event_time",
                3: "invalid_timestamp:event_time",
                4: "invalid_timestamp:updated_at",
                5: "invalid_timestamp:event_time",
            },
        ),
        Kind("empty file", day(5), "empty.jsonl", b"", {}),
        Kind("only blank lines", day(5), "blank.jsonl", b"\n   \n\t\n\r\n", {}),
        Kind(
            "unknown currency",
            day(6),
            "currency.jsonl",
            _lines(_o("cur-1", 6, currency="XYZ"), _o("cur-2", 6, currency="eur")),
            dict.fromkeys(range(1, 3), "unknown_currency"),
        ),
        Kind(
            DUPLICATE,
            day(6),
            "dup.jsonl",
            _lines(good, good),
            {1: VALID, 2: VALID},
        ),
        Kind(
            "missing and null fields, empty order_id",
            day(6),
            "missing.jsonl",
            _lines(
                json.dumps({k: v for k, v in _record("m1", 6).items() if k != "currency"}),
                json.dumps(_record("m2", 6, status=None)),
                json.dumps(_record("", 6)),
                "{}",
            ),
            {
                1: "missing_field:currency",
                2: "missing_field:status",
                3: "empty_order_id",
                4: "missing_field:order_id",
            },
        ),
        Kind(
            "not JSON: garbage, duplicate keys, control characters",
            day(6),
            "garbage.jsonl",
            _lines(
                "{bad",
                '{"order_id":"a","order_id":"b"}',
                _o("ctl", 6).replace("ctl", "c\x00l"),
                "\x1b[31m not json",
            ),
            dict.fromkeys(range(1, 5), "invalid_json"),
        ),
        Kind(
            "negative amounts",
            day(7),
            "negative.jsonl",
            _lines(
                _o("neg-1", 7, amount=-5),
                _o("neg-2", 7, amount="-0.01"),
                _o("zero", 7, amount="-0.00"),
            ),
            {1: "negative_amount", 2: "negative_amount", 3: "invalid_amount"},
        ),
        Kind(
            "extremely skewed day",
            day(7),
            "skewed.jsonl",
            _lines(
                *(
                    _o(f"skew-{i:06d}", 7, customer_id=f"hot-{i % 3}", amount="1.00")
                    for i in range(cfg["skewed_lines"])
                )
            ),
            dict.fromkeys(range(1, cfg["skewed_lines"] + 1), VALID),
        ),
        Kind(
            "landing folders with non-date names",
            "ingest_date=2024-13-45",
            "x.jsonl",
            _lines(_o("nodate-1", 3)),
            {},  # not a delivery: ignored by the platform and the oracle alike
        ),
        Kind("landing folder without a date", "latest", "x.jsonl", _lines(_o("nodate-2", 3)), {}),
        Kind("non-jsonl file in a day folder", day(3), "notes.txt", b"hello\n", {}),
        Kind(
            "contract-rule rejects (test_contract_rules.REJECTS)",
            day(8),
            "rules.jsonl",
            _lines(*(line for _, line, _ in REJECTS)),
            {i: reason for i, (_, _, reason) in enumerate(REJECTS, start=1)},
        ),
    ]
    # The other copy of `good`: the same line delivered again four days later.
    kinds.append(Kind(DUPLICATE, day(2), "dup.jsonl", _lines(good), {1: VALID}))
    return kinds


def _write_kinds(platform: Platform, kinds: list[Kind]) -> None:
    for k in kinds:
        folder = platform.landing / "orders" / k.day
        folder.mkdir(parents=True, exist_ok=True)
        (folder / k.file).write_bytes(k.data)


def _outcomes(platform: Platform) -> dict[tuple[str, str, int], str | None]:
    """(ingest_date, file, line) -> reject reason or VALID, read from the lakehouse."""
    raw = {
        (str(r["ingest_date"]), r["file_name"], r["line_number"]): VALID
        for r in platform.table("raw/orders")
        .select("ingest_date", "file_name", "line_number")
        .collect()
    }
    for r in platform.table("staging/orders_rejects").collect():
        raw[(str(r["ingest_date"]), r["file_name"], r["line_number"])] = r["reason"]
    return raw


def _failure_message(result) -> str:
    failures: list[DagsterEvent] = [
        e for e in result.all_events if e.event_type_value == "STEP_FAILURE"
    ]
    assert len(failures) == 1, [e.step_key for e in failures]
    return failures[0].step_failure_data.error.message


def _account(platform: Platform, answer, stats: dict) -> None:
    """Every non-blank landing line is a raw row, and every raw row is a reject or a
    version counted in exactly one staged order: landing = rejects + staged versions."""
    landing_lines = sum(answer.raw_line_counts.values())
    raw_rows = platform.table("raw/orders").count()
    rejects = platform.table("staging/orders_rejects").count()
    versions = platform.table("staging/orders").agg({"raw_versions": "sum"}).first()[0] or 0
    staged = platform.table("staging/orders").count()
    stats["landing_lines"] = landing_lines
    stats["rows_checked"] += raw_rows + rejects + staged
    stats["rows_lost"] = landing_lines - (rejects + versions)
    assert raw_rows == landing_lines
    assert rejects + versions == landing_lines, (landing_lines, rejects, versions)
    assert staged == len(answer.staging)


def test_every_hostile_line_is_quarantined_with_a_reason_or_fails_its_partition(
    platform, size, figures
):
    started = time.monotonic()
    stats = {"rows_checked": 0, "dagster_runs": 0, "partitions_failed_as_expected": 0}
    for d in range(1, 9):
        platform.write_rates(f"2024-01-{d:02d}", {"EUR": "1.10000000", "GBP": "1.25"})
    platform.write_rates("2024-01-01", {"EUR": "1.10000000", "GBP": "1.25", "JPY": "0.0067"})
    kinds = catalogue(size)
    _write_kinds(platform, kinds)

    # Run 1: every reject kind in one ranged run.
    result = platform.materialize(FIRST.isoformat(), LAST.isoformat(), raise_on_error=False)
    stats["dagster_runs"] += 1
    assert result.success, _failure_message(result)
    got = _outcomes(platform)
    for k in kinds:
        if not k.day.startswith("ingest_date=2024-01-"):
            continue  # not a delivery; checked below
        ingest = k.day.removeprefix("ingest_date=")
        file_outcomes = {n: r for (d, f, n), r in got.items() if (d, f) == (ingest, k.file)}
        assert file_outcomes == k.expect, k.name
    answer = compute_contract_answer(platform.landing, first_date=FIRST, last_date=LAST)
    oracle = {(str(r.ingest_date), r.file_name, r.line_number): r.reason for r in answer.rejects}
    assert oracle == {key: reason for key, reason in got.items() if reason is not VALID}
    assert any("2024-13-45" in p for p in answer.ignored_paths)
    assert not platform.rows("raw/orders", "order_id LIKE 'nodate%'")
    dup = platform.rows("staging/orders", "order_id = 'ok-1'")
    assert len(dup) == 1 and dup[0]["raw_versions"] == 3
    _account(platform, answer, stats)
    reconciliation = reconcile_marts(platform.resources["lakehouse"], platform.landing, FIRST, LAST)
    assert reconciliation.ok, reconciliation.details

    # Run 2: a file added to an already-ingested day is picked up by re-running the range.
    before = platform.table("raw/orders").where("ingest_date = '2024-01-03'").count()
    added = Kind(
        "file added to an already-ingested day",
        "ingest_date=2024-01-03",
        "added-later.jsonl",
        _lines(_o("added-1", 3), _o("added-2", 2, status="placed"), "{oops"),
        {1: VALID, 2: VALID, 3: "invalid_json"},
    )
    _write_kinds(platform, [added])
    kinds.append(added)
    # Its second line is a late version of a day-2 order, so the re-run starts at day 2.
    result = platform.materialize("2024-01-02", LAST.isoformat(), raise_on_error=False)
    stats["dagster_runs"] += 1
    assert result.success, _failure_message(result)
    got = _outcomes(platform)
    assert {n: r for (d, f, n), r in got.items() if f == "added-later.jsonl"} == added.expect
    assert platform.table("raw/orders").where("ingest_date = '2024-01-03'").count() == before + 3
    answer = compute_contract_answer(platform.landing, first_date=FIRST, last_date=LAST)
    _account(platform, answer, stats)
    reconciliation = reconcile_marts(platform.resources["lakehouse"], platform.landing, FIRST, LAST)
    assert reconciliation.ok, reconciliation.details

    # Run 3: a rate file with a bad header fails its raw/fx_rates partition, naming the file.
    bad = platform.write_bytes(
        "fx_rates", "rate_date=2024-01-09", "rates.csv", b"currency;usd_per_unit\nEUR;1.1\n"
    )
    kinds.append(Kind("CSV rates with a bad header", "rate_date=2024-01-09", bad.name, b"", {}))
    version = platform.version("raw/fx_rates")
    result = platform.materialize("2024-01-09", selection=["raw/fx_rates"], raise_on_error=False)
    stats["dagster_runs"] += 1
    message = _failure_message(result)
    assert not result.success and str(bad) in message and "line 1" in message, message
    assert platform.version("raw/fx_rates") == version
    stats["partitions_failed_as_expected"] += 1
    bad.unlink()  # the contract's answer (and the oracle) refuse the whole zone with it

    # Run 4: an order whose currency has no rate within 7 days fails its fct partition,
    # naming day and currency; staging still lands it, the mart is left as it was.
    platform.write_orders("2024-01-10", [_o("fx-gap", 10, currency="JPY", amount="100")])
    kinds.append(Kind("FX day missing beyond the reach", "ingest_date=2024-01-10", "", b"", {}))
    version = platform.version("marts/fct_daily_revenue")
    result = platform.materialize(
        "2024-01-10",
        selection=[
            "raw/orders",
            "staging/orders",
            "staging/orders_rejects",
            "marts/fct_daily_revenue",
        ],
        raise_on_error=False,
    )
    stats["dagster_runs"] += 1
    message = _failure_message(result)
    assert "2024-01-10 JPY" in message, message
    assert platform.version("marts/fct_daily_revenue") == version
    assert platform.rows("staging/orders", "order_id = 'fx-gap'")
    stats["partitions_failed_as_expected"] += 1
    answer = compute_contract_answer(platform.landing)
    assert answer.fx_errors == [(date(2024, 1, 10), "JPY")]

    stats.update(
        input_kinds=len({k.name for k in kinds}),
        files=len(kinds),
        reject_reasons=len({r.reason for r in answer.rejects}),
        rejects=len(answer.rejects),
        run_crashes=0,
        failures=0,
        seconds=round(time.monotonic() - started, 1),
    )
    figures.update(stats)
    print(json.dumps(stats))
    assert stats["input_kinds"] >= 20
