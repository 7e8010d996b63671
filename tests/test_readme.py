"""The README documents every setting the code reads from the environment."""

from __future__ import annotations

import re

from tests.support.processes import REPO_ROOT

ENV_READ = re.compile(r'env_(?:str|bool|int|float|list)\(\s*"([A-Z][A-Z0-9_]+)"')


def test_every_environment_variable_is_in_the_readme() -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    names = set()
    for package in ("meridian", "fleet", "console", "ops", "routing", "workers", "sim"):
        for path in (REPO_ROOT / package).rglob("*.py"):
            names.update(ENV_READ.findall(path.read_text()))
    assert len(names) > 30  # the scan itself works
    missing = sorted(name for name in names if f"`{name}`" not in readme)
    assert missing == []
