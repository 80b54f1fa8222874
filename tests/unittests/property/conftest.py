"""Pytest hooks of the property-based suite: say which budget runs."""

from __future__ import annotations

import pytest

from tests._helpers.property import SLOW


def pytest_report_header(config: pytest.Config) -> str:
    if SLOW:
        return "property suite: slow profile (large budgets, random seeds, soak tests on)"
    return "property suite: default budget (derandomized; HYPOTHESIS_PROFILE=slow for the soak run)"
