"""One ranged Dagster run in a fresh process, as the daemon launches it: new Python, new JVM.

The benchmark times this from the outside to show what a run costs when it is not sharing
a warm Spark session: one run per partition, and the live path's rolling-window cycle.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--landing", required=True)
    parser.add_argument("--lakehouse", required=True)
    parser.add_argument("--dagster-home", required=True)
    parser.add_argument("--first", required=True)
    parser.add_argument("--last", required=True)
    parser.add_argument("--layer", choices=("raw", "downstream"), required=True)
    args = parser.parse_args(argv)

    from dagster import AssetSelection, DagsterInstance

    from backfill_platform.automation.live_jobs import DOWNSTREAM_KEYS, RAW_KEYS
    from backfill_platform.definitions import all_assets, build_resources
    from backfill_platform.runner import materialize_range

    keys = RAW_KEYS if args.layer == "raw" else DOWNSTREAM_KEYS
    result = materialize_range(
        all_assets,
        args.first,
        args.last,
        build_resources(args.landing, args.lakehouse),
        DagsterInstance.from_config(args.dagster_home),
        selection=AssetSelection.assets(*keys),
        raise_on_error=False,
    )
    return 0 if result.success else 1


if __name__ == "__main__":
    sys.exit(main())
