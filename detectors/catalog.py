"""The detectors every job gets, in order, and the registry of their finding types.

Adding a detector is its own module (the detector with its `upgrade_state`, its evidence dataclasses and the
`FindingType`s with their triage policy, see `detectors.registry`), its tests, and its line here (the import
and its place in `DETECTORS`); its settings dataclass, if it has settings, goes to `detectors/config.py`. The
contract suite (tests/contract, `detectors.contract.check_detector`) then covers it: the detector properties,
its evidence round trip, the completeness of its policy. Order matters: findings of one record are emitted in
this order.
"""
from __future__ import annotations

from gangwatch.detectors.clocks import ClockDetector
from gangwatch.detectors.comm import CommDetector
from gangwatch.detectors.failslow import FailSlowDetector
from gangwatch.detectors.failstop import FailStopDetector
from gangwatch.detectors.flight import FlightDetector
from gangwatch.detectors.hang import HangDetector
from gangwatch.detectors.hardware import HardwareDetector
from gangwatch.detectors.life import JobLifeDetector
from gangwatch.detectors.linkerrors import LinkErrorDetector
from gangwatch.detectors.registry import Registry
from gangwatch.detectors.sdc import SdcDetector
from gangwatch.detectors.slowdown import JobSlowdownDetector
from gangwatch.detectors.stacks import StackDetector

DETECTORS: tuple[type, ...] = (
    ClockDetector,  # first: it learns from raw times, and corrects them for the rest
    FailStopDetector,
    HangDetector,
    FailSlowDetector,
    JobSlowdownDetector,
    SdcDetector,
    CommDetector,
    HardwareDetector,
    StackDetector,
    FlightDetector,
    LinkErrorDetector,
    JobLifeDetector,
)

REGISTRY = Registry.of(DETECTORS)
DEFAULT_DETECTORS: tuple[type, ...] = REGISTRY.detectors
typed = REGISTRY.typed  # a finding -> its `Typed` view: evidence as its dataclass, and its policy
