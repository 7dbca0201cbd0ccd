"""`dagster-daemon` for the test deployments, its backfill daemon ticking every
`INTERVAL_SECONDS` instead of every 30 s, and its workspace reloaded every
`RELOAD_SECONDS` instead of every 60 s.

Why: Dagster 1.13's backfill daemon sleeps `DEFAULT_DAEMON_INTERVAL_SECONDS` (30 s,
dagster/_daemon/controller.py; no setting or environment variable) between iterations, and a
backfill launches its next run only on an iteration. deploy/dagster.yaml lets one backfill
run execute at a time, so a test backfill of N runs idled about 15 s per run, with both cores
free. What the tests assert does not depend on the interval (every wait is for a condition);
production keeps Dagster's 30 s.

Why the reload: over workspace.yaml, each reload (RELOAD_WORKSPACE_INTERVAL, 60 s, same module)
drops the daemon's code server and starts a new process that imports the code location again:
an idle test deployment used 18.2 CPU-s in 180 s, 5.7 with an hourly reload (docs/reliability.md,
"CI time"). A test deployment's code never changes while it runs, and
a test that changes its settings restarts the daemon, so nothing waits for a reload.

Private on purpose and in tests only: if Dagster renames the
constant, this stops with a message instead of silently ticking every 30 s again.

    python -m backfill_platform_tests.e2e.daemon run -w workspace.yaml
"""

from __future__ import annotations

import sys

import dagster._daemon.controller as controller
from dagster._daemon.cli import main

INTERVAL_SECONDS = 5
RELOAD_SECONDS = 3600

if __name__ == "__main__":
    for name, value in (
        ("DEFAULT_DAEMON_INTERVAL_SECONDS", INTERVAL_SECONDS),
        ("RELOAD_WORKSPACE_INTERVAL", RELOAD_SECONDS),
    ):
        if not isinstance(getattr(controller, name, None), int):
            raise SystemExit(
                f"dagster._daemon.controller.{name} is gone from this Dagster: "
                "update backfill_platform_tests/e2e/daemon.py"
            )
        setattr(controller, name, value)
    sys.argv[0] = "dagster-daemon"
    main()
