"""The detector protocol and the helpers every detector shares.

A detector is a plain object driven by event time:

    findings = det.observe(record)   # one contract record of its job (or node)
    findings = det.advance(now)      # event time moved on: fire timeouts up to `now`
    snapshot = det.state()           # JSON-able; det2 = type(det).from_state(snapshot, topo)

It never reads a clock, a file or a socket; the same records in the same order
give the same findings. Finding ids are derived from what was found, so a
replay or a restarted worker emits the same ids again.

A detector also lists the finding types it emits (`finding_types`, declared
beside it: see `detectors.registry`) and builds its findings through them.
"""

from __future__ import annotations

import hashlib
from typing import Any, ClassVar, Protocol

from gangwatch.detectors.runs import observe_each
from gangwatch.detectors.topology import Topology
from gangwatch.schemas import Finding, Record


class Detector(Protocol):
    """What every per-job detector implements."""

    name: ClassVar[str]
    kinds: ClassVar[frozenset[str]]  # record kinds it wants to observe
    finding_types: ClassVar[tuple[Any, ...]]  # the `registry.FindingType`s it emits

    def observe(self, rec: Record) -> list[Finding]: ...

    def advance(self, now: float) -> list[Finding]: ...

    def set_topology(self, topo: Topology) -> None: ...

    def state(self) -> dict[str, Any]: ...

    @classmethod
    def from_state(cls, state: dict[str, Any], topo: Topology) -> Detector: ...

    def observe_run(self, run: Any) -> list[tuple[int, list[Finding]]]: ...

    def finish(self) -> list[Finding]: ...


class DetectorBase:
    """The defaults every detector inherits (`Detector` is what they all implement).

    `observe_run(run)`: the findings of a run of records (`runs.RecordRun`) as (position in the run, findings),
    what `observe` on each of its records in turn gives; a detector with a faster way overrides it and falls
    back to this whenever the shortcut could differ. `finish()`: what it makes of what it still holds when the
    input ends (replay); nothing by default.
    """

    def observe_run(self, run: Any) -> list[tuple[int, list[Finding]]]:
        return observe_each(self, run)

    def finish(self) -> list[Finding]:
        return []


def stable_id(prefix: str, *parts: object) -> str:
    """A short id that depends only on `parts` (same decision -> same id, across runs)."""
    h = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).hexdigest()
    return f"{prefix}-{h}"


def finding(
    *, ts: float, job: str, type: str, detector: str, key: object, topo: Topology | None = None,
    rank: int | None = None, node: str | None = None, gpu: int | None = None, score: float | None = None,
    evidence: dict[str, Any] | None = None,
) -> Finding:
    """Build a finding with a deterministic id; node and gpu are filled in from the rank if known."""
    if rank is not None and topo is not None:
        node = node if node is not None else topo.node_of(rank)
        gpu = gpu if gpu is not None else topo.gpu_of(rank)
    return Finding(
        id=stable_id("f", job, detector, type, key), ts=round(ts, 6), job=job, type=type, detector=detector,
        rank=rank, node=node, gpu=gpu, score=None if score is None else round(float(score), 4),
        evidence=evidence or {},
    )
