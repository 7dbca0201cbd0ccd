"""docs/settings.md is generated from settings.py: every setting the code reads is on it,
with the default the code uses."""

import re
from pathlib import Path

from backfill_platform import settings


def test_the_settings_page_is_the_generators_output():
    assert settings.SETTINGS_PAGE.read_text() == settings.settings_page(), (
        "docs/settings.md differs from backfill_platform/settings.py: "
        "run `python -m backfill_platform.settings`"
    )


def test_every_envvar_the_code_reads_is_documented_once():
    source = Path(settings.__file__).read_text()
    read = set(re.findall(r'EnvVar\("([A-Z0-9_]+)"\)', source))
    names = [s.name for s in settings.SETTINGS]
    assert len(names) == len(set(names))
    assert read == set(names)
    assert all(s.meaning for s in (*settings.SETTINGS, *settings.OTHER_SETTINGS))
