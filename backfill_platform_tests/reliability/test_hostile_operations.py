"""Hostile operator input: every bad argument to the playbook is refused with one line naming
the argument (exit status 1, no traceback), and leaves every table, every shadow and every
file outside the lakehouse exactly as it was (a checksum of the whole tree before and after).

One small production lakehouse with a shadow of the marts serves every case; the CLI runs
in process (the same `main()` the console script calls), the plan job through Dagster.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
from pathlib import Path

import pytest
from dagster import DagsterInstance

from backfill_platform import cli
from backfill_platform.definitions import all_assets, build_resources
from backfill_platform.lineage import Lineage
from backfill_platform.operations.launchpad import preflight_plan_job
from backfill_platform.operations.shadow import run_shadow
from backfill_platform.tables import CUSTOMER_LTV, FCT_DAILY_REVENUE
from backfill_platform_tests.harness import Platform, order_line, spark_resource_for_tests

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

FIRST, LAST = "2024-01-01", "2024-01-04"
MARTS = "marts/fct_daily_revenue,marts/customer_ltv"
RANGE = ["--start", FIRST, "--end", LAST]
TRAVERSALS = ["fx/../..", "fx/../../../victim", "../victim", "fx/..", "..", "/tmp", "fx\\..\\x"]
# Strings an operator might paste that must be refused as suffixes.
ODD_SUFFIXES = ["", " ", "fx x", "fx.bak", "fx\n", "fx;rm -rf /", "é", "fx\x00", "x" * 41]

CASES: list[tuple[str, list[str], str]] = [
    # (what, argv, text the refusal must contain)
    *[
        (f"{cmd} suffix {s!r}", [cmd, *extra, "--suffix", s], "--suffix")
        for s in TRAVERSALS + ODD_SUFFIXES
        for cmd, extra in (
            ("decommission", ["--retention-hours", "0"]),
            ("validate", ["--select", MARTS, *RANGE]),
            ("cutover", ["--select", MARTS, *RANGE, "--reason", "r", "--force"]),
            ("shadow", ["--select", MARTS, *RANGE]),
        )
    ],
    *[
        (f"{cmd} unknown asset", [cmd, "--select", sel, *RANGE, *extra], "--select")
        for sel in ("marts/nope", "marts/fct_daily_revenue/../raw", "../../etc", ",", "raw")
        for cmd, extra in (
            ("plan", []),
            ("shadow", ["--suffix", "fx"]),
            ("validate", ["--suffix", "fx"]),
            ("cutover", ["--suffix", "fx", "--reason", "r", "--force"]),
            ("history", []),
            ("freeze", ["--reason", "r"]),
        )
        if not (cmd == "history" and sel == ",")  # history without a selection: every table
    ],
    *[
        (f"{cmd} raw table", [cmd, "--select", "raw/orders", *RANGE, *extra], "--select raw/orders")
        for cmd, extra in (
            ("shadow", ["--suffix", "fx"]),
            ("validate", ["--suffix", "fx"]),
            ("cutover", ["--suffix", "fx", "--reason", "r", "--force"]),
        )
    ],
    *[
        (
            f"{cmd} range {start}..{end}",
            [cmd, "--select", MARTS, "--start", start, "--end", end, *extra],
            needle,
        )
        for start, end, needle in (
            ("2024-01-04", "2024-01-01", "after --end"),
            ("2024-01-01", "2024-13-01", "--end"),
            ("yesterday", "2024-01-02", "--start"),
            ("2023-12-01", "2024-01-02", "outside the daily partitions"),
            ("2024-01-01", "2999-01-01", "outside the daily partitions"),
            ("2024-01-01", "2025-06-30", "BACKFILL_MAX_RANGE_DAYS"),
        )
        for cmd, extra in (
            ("shadow", ["--suffix", "fx"]),
            ("cutover", ["--suffix", "fx", "--reason", "r", "--force"]),
            ("freeze", ["--reason", "r"]),
        )
    ],
    *[
        (
            "decommission retention " + h,
            ["decommission", "--suffix", "fx", f"--retention-hours={h}"],
            "--retention-hours",
        )
        for h in ("-1", "nan", "inf", "-inf", "-0.5", "1e309")
    ],
    *[
        (f"{cmd} empty reason", [cmd, *extra, "--reason", reason], "--reason")
        for reason in ("", "   ", "\n\t")
        for cmd, extra in (
            ("cutover", ["--select", MARTS, *RANGE, "--suffix", "fx", "--force"]),
            ("rollback", []),
            ("freeze", ["--select", MARTS, *RANGE]),
            ("unfreeze", []),
        )
    ],
    (
        "decommission of a suffix with no shadow",
        ["decommission", "--suffix", "nothere", "--retention-hours", "0"],
        "no shadow tables",
    ),
    (
        "cutover of a shadow never validated",
        ["cutover", "--select", MARTS, *RANGE, "--suffix", "fx", "--reason", "r"],
        "never validated",
    ),
    ("unfreeze with no freeze", ["unfreeze", "--reason", "r"], "no active freeze"),
    (
        "unfreeze of an unknown freeze",
        ["unfreeze", "--id", "nope", "--select", MARTS, "--reason", "r"],
        "no active freeze nope",
    ),
    (
        "rollback of an unknown cutover",
        ["rollback", "--cutover-id", "nope", "--reason", "r"],
        "nope",
    ),
]
UNICODE_REASON = "INC-42: « FX » fix\nsecond line with \"quotes\", 'single', tab\t, emoji 🚀, 中文"


def tree_checksum(*roots: Path) -> str:
    digest = hashlib.sha256()
    for root in roots:
        for path in sorted(root.rglob("*")):
            digest.update(str(path).encode())
            if path.is_symlink():
                digest.update(b"link:" + os.readlink(path).encode())
            elif path.is_file():
                digest.update(path.read_bytes())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def production(tmp_path_factory, spark):
    """Production marts over four days and a shadow of them with suffix `fx`."""
    root = tmp_path_factory.mktemp("hostile_ops")
    platform = Platform.create(root)
    for day in range(1, 5):
        key = f"2024-01-0{day}"
        platform.write_rates(key, {"EUR": "1.10"})
        platform.write_orders(
            key, [order_line(f"o{day}", f"{key}T10:00:00Z", currency="EUR", customer_id="c1")]
        )
    platform.backfill(FIRST, LAST, per_run=4)
    lineage = Lineage(all_assets)
    shadow = run_shadow(
        all_assets,
        platform.resources,
        platform.instance,
        [FCT_DAILY_REVENUE, CUSTOMER_LTV],
        FIRST,
        LAST,
        "fx",
        lineage=lineage,
    )
    assert shadow.success
    victim = root / "victim" / "keep"
    victim.mkdir(parents=True)
    (victim / "precious.txt").write_text("outside the lakehouse\n")
    home = root / "dagster_home"
    home.mkdir()
    return platform, root, home


def run_cli(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        in_process = ["--in-process"] if argv[0] in cli.DEPLOYED_COMMANDS else []
        status = cli.main([*argv, *in_process])
    return status, out.getvalue()


def test_every_hostile_operator_argument_is_refused_and_touches_nothing(
    production, monkeypatch, figures
):
    platform, root, home = production
    for name, value in {
        "DAGSTER_HOME": home,
        "BACKFILL_LANDING_DIR": platform.landing,
        "BACKFILL_LAKEHOUSE_DIR": platform.lakehouse,
    }.items():
        monkeypatch.setenv(name, str(value))
    watched = (platform.lakehouse, platform.landing, root / "victim")
    before = tree_checksum(*watched)
    not_refused, changed = [], []
    for what, argv, needle in CASES:
        status, text = run_cli(argv)
        if status != 1 or needle not in text or "Traceback" in text:
            not_refused.append((what, status, text[-300:]))
        if tree_checksum(*watched) != before:
            changed.append(what)
            break
    figures["operator_inputs_tried"] = len(CASES)
    figures["operator_inputs_refused"] = len(CASES) - len(not_refused)
    figures["files_changed_by_a_refusal"] = len(changed)
    assert not not_refused and not changed, (not_refused, changed)
    assert (root / "victim" / "keep" / "precious.txt").read_text() == "outside the lakehouse\n"


def test_the_plan_job_refuses_hostile_config_before_planning(production, figures):
    platform, root, _ = production
    watched = (platform.lakehouse, platform.landing, root / "victim")
    before = tree_checksum(*watched)
    configs = [
        ({"select": ["marts/nope"], "start": FIRST, "end": LAST}, "unknown asset"),
        ({"select": [], "start": FIRST, "end": LAST}, "--select"),
        ({"select": ["marts/fct_daily_revenue"], "start": LAST, "end": FIRST}, "after --end"),
        ({"select": ["marts/fct_daily_revenue"], "start": "2023-01-01", "end": FIRST}, "outside"),
    ]
    for config, needle in configs:
        result = preflight_plan_job.execute_in_process(
            run_config={"ops": {"preflight_plan": {"config": config}}},
            resources=platform.resources,
            instance=DagsterInstance.ephemeral(),
            raise_on_error=False,
        )
        failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
        assert not result.success and needle in failure.step_failure_data.error.message, config
    assert tree_checksum(*watched) == before
    figures["plan_job_configs_refused"] = len(configs)


def test_any_unicode_reason_is_stored_intact_in_the_commit(production, monkeypatch, figures):
    platform, _, home = production
    for name, value in {
        "DAGSTER_HOME": home,
        "BACKFILL_LANDING_DIR": platform.landing,
        "BACKFILL_LAKEHOUSE_DIR": platform.lakehouse,
    }.items():
        monkeypatch.setenv(name, str(value))
    status, text = run_cli(
        [
            "cutover",
            "--select",
            MARTS,
            *RANGE,
            "--suffix",
            "fx",
            "--force",
            "--no-rebuild",
            "--reason",
            UNICODE_REASON,
            "--json",
        ]
    )
    assert status == 0, text
    lake = build_resources(
        str(platform.landing), str(platform.lakehouse), spark=spark_resource_for_tests()
    )["lakehouse"]
    commit = lake.history("marts/fct_daily_revenue", limit=1)[0]["metadata"]
    assert commit["operation"] == "cutover" and commit["reason"] == UNICODE_REASON
    status, text = run_cli(["history", "--select", "marts/fct_daily_revenue", *RANGE, "--json"])
    assert status == 0 and json.loads(text)[0]["reason"] == UNICODE_REASON
    status, text = run_cli(["rollback", "--reason", UNICODE_REASON[::-1], "--json"])
    assert status == 0, text
    assert (
        lake.history("marts/fct_daily_revenue", limit=1)[0]["metadata"]["reason"]
        == (UNICODE_REASON[::-1])
    )
    figures["unicode_reasons_round_tripped"] = 2
