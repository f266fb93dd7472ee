"""The detector protocol and the helpers every detector shares.

A detector is a plain object driven by event time:

    findings = det.observe(record)   # one contract record of its job (or node)
    findings = det.advance(now)      # event time moved on: fire timeouts up to `now`
    snapshot = det.state()           # JSON-able; det2 = type(det).from_state(snapshot, topo)

It never reads a clock, a file or a socket; the same records in the same order
give the same findings. Finding ids are derived from what was found, so a
replay or a restarted worker emits the same ids again.

A detector also lists the finding types it emits (`finding_types`, declared
beside it: see `detectors.registry`) and builds its findings through them, and
brings its own saved state of an older job state version up to date
(`upgrade_state`, called by triage/migrate.py, which keeps the versions).
"""

from __future__ import annotations

import copy
import functools
import hashlib
from typing import Any, ClassVar, Protocol

from gangwatch.detectors.runs import observe_each
from gangwatch.detectors.topology import Topology
from gangwatch.schemas import Finding, Record
from gangwatch.schemas.codec import decode_obj


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

    @classmethod
    def upgrade_state(cls, state: dict[str, Any] | None, version: int, job: SavedJob) -> dict[str, Any] | None: ...


class SavedJob:
    """What a detector's `upgrade_state` may read of the whole job state being brought up to date: the job
    record as saved (a wire dict), the job's watermark then, and (built when first asked for) its topology."""

    def __init__(self, job: dict[str, Any], watermark: float) -> None:
        self.job, self.watermark = job, watermark

    @property
    def size(self) -> int:
        """Ranks in the saved job record."""
        return len(self.job["ranks"])

    @functools.cached_property
    def topo(self) -> Topology:
        return Topology.from_job(decode_obj(self.job))


def fill_missing(d: dict[str, Any], defaults: dict[str, Any]) -> None:
    """Add to `d` (a saved state being upgraded) a copy of each default it lacks, in `defaults`' order."""
    for k, v in defaults.items():
        if k not in d:
            d[k] = copy.deepcopy(v)


class DetectorBase:
    """The defaults every detector inherits (`Detector` is what they all implement).

    `observe_run(run)`: the findings of a run of records (`runs.RecordRun`) as (position in the run, findings),
    what `observe` on each of its records in turn gives; a detector with a faster way overrides it and falls
    back to this whenever the shortcut could differ. `finish()`: what it makes of what it still holds when the
    input ends (replay); nothing by default.

    `upgrade_state(state, version, job)`: this detector's part of a job state saved by `version`, in the shape
    of `version + 1` (`state` is a copy: change it in place or return another); `state` is None for a version
    that had no such detector, and so is the answer until the version that added it, which returns its state
    of a job that had it from the start. Unchanged by default. The values it adds are written out in it, not
    taken from today's code, so that it goes on making its version's shape (see triage/migrate.py).
    """

    def observe_run(self, run: Any) -> list[tuple[int, list[Finding]]]:
        return observe_each(self, run)

    def finish(self) -> list[Finding]:
        return []

    @classmethod
    def upgrade_state(cls, state: dict[str, Any] | None, version: int, job: SavedJob) -> dict[str, Any] | None:
        return state


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
