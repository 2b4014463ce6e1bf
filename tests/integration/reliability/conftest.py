"""Fault tests: real broker, Redis, worker and load-driver processes (slow: `make test-slow`)."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/reliability/" in str(item.fspath):
            item.add_marker(pytest.mark.slow)
