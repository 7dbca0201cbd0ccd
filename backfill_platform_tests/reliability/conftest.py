"""Reliability suites: sizes, and the figures every suite reports (printed and saved as JSON)."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "reliability"
_REPORTED: dict[str, dict[str, Any]] = {}
_FAILED_TESTS: Counter = Counter()


def _suite(module_name: str) -> str:
    return module_name.rsplit(".", 1)[-1].removeprefix("test_")


@pytest.fixture(scope="session")
def size() -> str:
    """RELIABILITY_SIZE: `small` (CI, the default) or `full` (`make reliability`)."""
    value = os.environ.get("RELIABILITY_SIZE", "small")
    if value not in ("small", "full"):
        raise ValueError(f"RELIABILITY_SIZE must be small or full, not {value!r}")
    return value


@pytest.fixture(scope="module")
def figures(request, size):
    """Per-suite figures: tests add to it; written to test-artifacts/reliability/<suite>.json.

    `failed_tests` is counted by pytest itself, so a suite cannot report green by mistake.
    """
    suite = _suite(request.module.__name__)
    data: dict[str, Any] = {"suite": suite, "size": size}
    yield data
    data["failed_tests"] = _FAILED_TESTS[suite]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / f"{suite}.json").write_text(
        json.dumps(data, indent=2, sort_keys=True, default=str)
    )
    _REPORTED[suite] = data


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed:
        _FAILED_TESTS[_suite(item.module.__name__)] += 1
    return report


def pytest_terminal_summary(terminalreporter):
    if not _REPORTED:
        return
    terminalreporter.section("reliability figures")
    for suite, data in sorted(_REPORTED.items()):
        shown = {k: v for k, v in data.items() if not isinstance(v, (dict, list))}
        terminalreporter.write_line(f"{suite}: " + ", ".join(f"{k}={v}" for k, v in shown.items()))
        # Suites with several trials list them under `details` (one dict per trial).
        for detail in data.get("details", []):
            flat = {k: v for k, v in detail.items() if not isinstance(v, (dict, list))}
            terminalreporter.write_line("  " + ", ".join(f"{k}={v}" for k, v in flat.items()))
