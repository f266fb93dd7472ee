"""Which pytest-xdist worker runs which contract test: all the tests of one detector on one worker.

Nearly all of the contract suite's time is driving detectors over the scenarios, and every property of a
detector and scenario compares with the same in-order run (`harness.traced`, cached per process). Spread test
by test over CI's four workers (`./gw test -n 4 --dist loadgroup`), each worker computed most of those runs
again (~0.8 s of CPU each, 96 of them), and started its own hash-seed child that computed all of them once more.
Grouped by detector, each run is computed on one worker only, and so is each detector's hash-seed child
(test_detectors.py's `_OtherProcesses`). Grouped by scenario instead, the tests that read every scenario of a
detector (it finds something somewhere, its finding types, the digests) would compute them on every worker.

tests/conftest.py's scheduler asks `group_of` for each test id (it sees ids only, no marks or parameters); a
test not named here is a group of its own, as usual. This module imports nothing, so that the xdist controller,
which never collects, reads it cheaply; test_detectors.py's `test_every_per_detector_test_is_grouped` keeps the
names here in step with the tests.
"""

from __future__ import annotations

# Per file: the tests parametrized by detector first (their id starts with the detector's name, "[hang-xid79]",
# "[hang]"), nearly all of which read the detector's in-order runs.
PER_DETECTOR: dict[str, frozenset[str]] = {
    "tests/contract/test_detectors.py": frozenset({
        "test_every_detector_finds_something", "test_detector_protocol", "test_deterministic",
        "test_findings_are_contract_records", "test_state_round_trip", "test_input_not_mutated",
        "test_missing_optional_fields", "test_out_of_order_within_lateness", "test_no_wall_clock",
        "test_unknown_ranks_and_topology_changes", "test_deterministic_across_processes",
    }),
    "tests/contract/test_findings.py": frozenset({
        "test_every_detector_declares_its_finding_types", "test_findings_are_of_types_their_detector_declares",
        "test_emitted_evidence_round_trips_through_its_dataclass",
    }),
}


def group_of(nodeid: str) -> str | None:
    """`contract-<detector>` for a per-detector test, None for any other (detector names have no "-")."""
    path, _, test = nodeid.partition("::")
    name, _, params = test.partition("[")
    if not params or name not in PER_DETECTOR.get(path, ()):
        return None
    return "contract-" + params.rstrip("]").split("-", 1)[0]
