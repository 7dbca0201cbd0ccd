"""`python -m backfill_platform` is the `backfill-platform` command."""

import sys

from backfill_platform.cli import main

sys.exit(main())
