"""Shared test fixtures: where the real test material lives; GPU tests skip without a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import DATA


@pytest.fixture(scope="session")
def real_data() -> Path:
    """The real test material in `tests/data/` (its README says what each file is and where it comes from)."""
    if not DATA.is_dir():
        pytest.fail(f"real test material not found at {DATA}")
    return DATA


def _gpu_missing() -> str | None:
    """Why no NVIDIA GPU can be used here, or None when NVML finds one."""
    from gangwatch.producers.nvml import NvmlUnavailable, RealNvml

    try:
        nvml = RealNvml()
        if not nvml.count():
            return "NVML sees no GPU"
    except NvmlUnavailable as e:
        return str(e)
    return None


def pytest_collection_modifyitems(config, items):
    gpu_items = [i for i in items if i.get_closest_marker("gpu")]
    if not gpu_items:
        return
    why = _gpu_missing()
    if why:
        for item in gpu_items:
            item.add_marker(pytest.mark.skip(reason=f"needs a real NVIDIA GPU: {why}"))
