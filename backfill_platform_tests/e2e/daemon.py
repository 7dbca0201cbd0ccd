"""`dagster-daemon` for the test deployments, its backfill daemon ticking every
`INTERVAL_SECONDS` instead of every 30 s.

Why: Dagster 1.13's backfill daemon sleeps `DEFAULT_DAEMON_INTERVAL_SECONDS` (30 s,
dagster/_daemon/controller.py; no setting or environment variable) between iterations, and a
backfill launches its next run only on an iteration. deploy/dagster.yaml lets one backfill
run execute at a time, so a test backfill of N runs idled about 15 s per run, with both cores
free. What the tests assert does not depend on the interval (every wait is for a condition);
production keeps Dagster's 30 s. Private on purpose and in tests only: if Dagster renames the
constant, this stops with a message instead of silently ticking every 30 s again.

    python -m backfill_platform_tests.e2e.daemon run -w workspace.yaml
"""

from __future__ import annotations

import sys

import dagster._daemon.controller as controller
from dagster._daemon.cli import main

INTERVAL_SECONDS = 5

if __name__ == "__main__":
    if not isinstance(getattr(controller, "DEFAULT_DAEMON_INTERVAL_SECONDS", None), int):
        raise SystemExit(
            "dagster._daemon.controller.DEFAULT_DAEMON_INTERVAL_SECONDS is gone from this "
            "Dagster: update backfill_platform_tests/e2e/daemon.py"
        )
    controller.DEFAULT_DAEMON_INTERVAL_SECONDS = INTERVAL_SECONDS
    sys.argv[0] = "dagster-daemon"
    main()
