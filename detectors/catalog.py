"""The detectors every job gets, one line each, and the registry of their finding types.

Adding a detector is its own module (the detector, its evidence dataclasses and
the `FindingType`s with their triage policy, see `detectors.registry`), its
test, and one line below. The contract suite (tests/contract) then covers it:
the detector properties, its evidence round trip, the completeness of its
policy. Order matters: findings of one record are emitted in this order.
"""

from __future__ import annotations

from gangwatch.detectors.registry import Registry

DETECTORS = (
    "gangwatch.detectors.clocks:ClockDetector",  # first: it learns from raw times, and corrects them for the rest
    "gangwatch.detectors.failstop:FailStopDetector",
    "gangwatch.detectors.hang:HangDetector",
    "gangwatch.detectors.failslow:FailSlowDetector",
    "gangwatch.detectors.slowdown:JobSlowdownDetector",
    "gangwatch.detectors.sdc:SdcDetector",
    "gangwatch.detectors.comm:CommDetector",
    "gangwatch.detectors.hardware:HardwareDetector",
    "gangwatch.detectors.stacks:StackDetector",
    "gangwatch.detectors.flight:FlightDetector",
    "gangwatch.detectors.linkerrors:LinkErrorDetector",
    "gangwatch.detectors.life:JobLifeDetector",
)

REGISTRY = Registry.load(DETECTORS)
DEFAULT_DETECTORS: tuple[type, ...] = REGISTRY.detectors
typed = REGISTRY.typed  # a finding -> its `Typed` view: evidence as its dataclass, and its policy
