"""The hostile-input suite: every test here feeds the product input made to break it."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/hostile/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.hostile)
