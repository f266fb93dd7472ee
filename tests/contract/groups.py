"""Which pytest-xdist worker runs which contract test: all the tests parametrized by detector on one worker.

Nearly all of the contract suite's time is driving detectors over the scenarios: each detector's in-order run
(`harness.traced`), and every detector driven together over a changed copy of each scenario (test_detectors.py's
`together`, `stripped_run`, `unclocked`, `jittered`, `with_strangers`), all cached per process, and the hash-seed
child that computes the digests once more. Spread test by test over CI's workers (`./gw test -n 4 --dist
loadgroup`), each worker would compute most of those runs again; in one group, each is computed once in the
session (about 4 minutes of one worker's CPU, beside the live-job lanes' 15).

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


GROUP = "contract-detectors"


def group_of(nodeid: str) -> str | None:
    """`GROUP` for a test parametrized by detector, None for any other (detector names have no "-")."""
    path, _, test = nodeid.partition("::")
    name, _, params = test.partition("[")
    if not params or name not in PER_DETECTOR.get(path, ()):
        return None
    return GROUP
