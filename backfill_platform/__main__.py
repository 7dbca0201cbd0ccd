"""`python -m backfill_platform` and the `backfill-platform` console script.

A setting the code location cannot load with (say BACKFILL_START_DATE=2025-13-01) fails
while `cli` is imported, before its `main` runs; it is caught here and printed as one line.
"""

import sys

from backfill_platform.settings import SettingError

try:
    from backfill_platform.cli import main
except SettingError as error:
    _refused: SettingError | None = error
    main = None
else:
    _refused = None


def run() -> int:
    if main is None:
        print(f"Refused: {_refused}")
        return 1
    return main()


if __name__ == "__main__":
    sys.exit(run())
