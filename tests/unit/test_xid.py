"""Xid catalog as code: agrees with NVIDIA's catalog (CSV) code by code; verdicts vs evidence."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from gangwatch.detectors.xid import CATALOG, UNKNOWN, XidInfo, is_verdict, lookup

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def catalog_rows(real_data: Path) -> dict[int, dict[str, str]]:
    path = real_data / "xid" / "xid-catalog.csv"
    if not path.is_file():
        pytest.fail(f"Xid catalog {path} missing from the shared test material")
    with path.open(newline="") as f:
        return {int(row["code"]): row for row in csv.DictReader(f)}


def test_table_covers_exactly_the_catalog_codes(catalog_rows: dict[int, dict[str, str]]) -> None:
    assert sorted(catalog_rows) == list(range(1, 163))
    assert sorted(CATALOG) == sorted(catalog_rows)


def test_fatal_flag_name_and_action_agree_with_the_catalog(catalog_rows: dict[int, dict[str, str]]) -> None:
    mismatches = [
        (code, row, lookup(code))
        for code, row in catalog_rows.items()
        if (lookup(code).name, lookup(code).fatal, lookup(code).action)
        != (row["name"], row["severity"] == "FATAL", row["action"])
    ]
    assert mismatches == []


def test_categories_are_known_and_application_codes_are_never_fatal() -> None:
    assert {info.category for info in CATALOG.values()} == {"hardware", "application", "nvlink", "memory", "other"}
    assert not [c for c, info in CATALOG.items() if info.category == "application" and info.fatal]
    assert not [c for c, info in CATALOG.items() if info.category == "hardware" and not info.fatal]


@pytest.mark.parametrize("code", [13, 31, 43, 45])
def test_application_side_codes_are_evidence_not_verdicts(code: int) -> None:
    assert lookup(code).category == "application"
    assert not is_verdict(code)


@pytest.mark.parametrize(
    ("code", "category"),
    [(79, "hardware"), (62, "hardware"), (119, "hardware"), (120, "hardware"), (48, "memory"), (64, "memory"),
     (95, "memory"), (140, "memory"), (74, "nvlink")],
)  # fmt: skip
def test_fatal_hardware_codes_of_the_design_are_verdicts(code: int, category: str) -> None:
    assert lookup(code).category == category
    assert is_verdict(code)


@pytest.mark.parametrize("code", [63, 92, 94])
def test_nonfatal_memory_codes_are_evidence(code: int) -> None:
    # 94 (contained ECC error) is NONFATAL / RESTART_APP in the catalog although our design lists
    # 94/95 together as fatal: the catalog wins, 94 is evidence.
    assert lookup(code).category == "memory"
    assert not is_verdict(code)


def test_xid_79_is_the_bus_drop() -> None:
    assert lookup(79) == XidInfo("ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", True, "hardware", "RESTART_BM")


@pytest.mark.parametrize("code", [0, -1, 163, 9999])
def test_unknown_codes_are_hardware_evidence_without_verdict(code: int) -> None:
    assert lookup(code) is UNKNOWN
    assert UNKNOWN.category == "hardware" and not UNKNOWN.fatal
    assert not is_verdict(code)
