"""Pytest hooks for the unit tests."""

from __future__ import annotations

import pytest

from tests._helpers.harness import shutdown_pools


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Stop the distributed worker pools before pytest reports, rather than relying on atexit alone."""
    shutdown_pools()
