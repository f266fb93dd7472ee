"""Shared test fixtures: where the real test material lives."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import SHARED_DATA


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real test material (`../shared/data` beside the repository), read in place."""
    if not SHARED_DATA.is_dir():
        pytest.fail(f"real test material not found at {SHARED_DATA}: it lives beside the repository as ../shared/data")
    return SHARED_DATA
