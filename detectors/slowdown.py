"""Job-wide slowdown: nobody is guilty when everybody is slow.

`JobSlowdownDetector`: is the whole job slower than usual? Per step, the job's
step time is the median `step_s` over ranks; the baseline is the median of
the last `history` normal steps (warm-up excluded). A step time at or above
`factor` x baseline for `min_steps` steps is one `job_slowdown` finding per
episode, naming no rank and no node: nobody is guilty when everybody is slow.
`baseline_s()` is the current baseline (for a hang detector's stall threshold).
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np
from gangwatch.detectors.config import BufferConfig, SlowdownConfig
from gangwatch.detectors.floats import finite_or_none, median
from gangwatch.detectors.registry import FindingType, Policy
from gangwatch.detectors.step_buffer import Closed, StepBuffer
from gangwatch.detectors.step_scorer import StepScorer
from gangwatch.detectors.topology import Topology
from gangwatch.schemas import Finding
from gangwatch.schemas.evidence import Evidence


@dataclass(frozen=True, slots=True, kw_only=True)
class SlowdownEvidence(Evidence):
    """The job's step time (median over ranks) `ratio` x its baseline for `steps` steps."""

    step_s: float | None
    baseline_s: float | None
    ratio: float
    steps: int  # consecutive slow steps so far
    step: int
    first_step: int | None  # the first slow step of the episode


# everybody is slow: no incident, no node, nobody's risk; it joins an open incident as context
JOB_SLOWDOWN = FindingType("job_slowdown", SlowdownEvidence, Policy())


class JobSlowdownDetector(StepScorer):
    """The whole job is slower than its own recent past; nobody in particular is to blame."""

    name: ClassVar[str] = "slowdown"
    finding_types: ClassVar[tuple[FindingType, ...]] = (JOB_SLOWDOWN,)

    def __init__(self, topo: Topology, config: SlowdownConfig | None = None) -> None:
        self.config = config or SlowdownConfig()
        self.topo = topo
        self.healthy: deque[float] = deque(maxlen=self.config.history)
        self.recent: deque[float] = deque(maxlen=self.config.history)
        self._reset(topo)

    def _reset(self, topo: Topology) -> None:
        if topo.size != self.topo.size:  # another job shape: its step time is another baseline
            self.healthy.clear()
            self.recent.clear()
        self.topo = topo
        self.buf = StepBuffer(topo.size, {"step_s": "f"}, self.config.buffer)
        self.epoch = self.warm = 0  # warm: warm-up steps seen since the last (re)start
        self.slow_run = self.normal_run = 0
        self.first_slow: int | None = None
        self.in_episode = False

    def set_topology(self, topo: Topology) -> None:
        """New `job` record: restart warm-up; keep the baseline when the job kept its size."""
        self._reset(topo)

    def baseline_s(self) -> float | None:
        """The job's normal step time in seconds (median of recent normal steps), or None while unknown."""
        if len(self.healthy) < self.config.min_history:
            return None
        return median(np.fromiter(self.healthy, dtype=np.float64))

    # --- feeding ---

    def _score(self, closed: list[Closed]) -> list[Finding]:
        return [f for c in closed for f in self._score_step(c)]

    def _score_step(self, c: Closed) -> list[Finding]:
        cfg = self.config
        if c.epoch != self.epoch:  # rewound: warm up again
            self.epoch, self.warm, self.slow_run, self.normal_run = c.epoch, 0, 0, 0
        v = c.vals["step_s"]
        v = v[np.isfinite(v)]
        if v.size == 0:
            return []
        if self.warm < cfg.warmup_steps:
            self.warm += 1
            return []
        job_s = median(v)
        base = self.baseline_s()
        self.recent.append(job_s)
        if base is None or base <= 0:
            self.healthy.append(job_s)
            return []
        ratio = job_s / base
        out: list[Finding] = []
        if ratio >= cfg.factor:
            self.normal_run = 0
            self.slow_run += 1
            if self.slow_run == 1:
                self.first_slow = c.step
            if not self.in_episode and self.slow_run >= cfg.min_steps:
                self.in_episode = True
                out.append(JOB_SLOWDOWN.finding(
                    ts=c.ts, job=self.topo.job, detector="slowdown.step_time",
                    key=("slowdown", self.first_slow), score=ratio,
                    evidence=SlowdownEvidence(step_s=finite_or_none(job_s), baseline_s=finite_or_none(base),
                                              ratio=round(ratio, 4), steps=self.slow_run, step=c.step,
                                              first_step=self.first_slow),
                ))
            if self.slow_run >= cfg.rebaseline_steps:  # the new normal
                self.healthy = deque(self.recent, maxlen=cfg.history)
                self.slow_run = 0
        else:
            self.slow_run = 0
            self.normal_run += 1
            self.healthy.append(job_s)
            if self.in_episode and self.normal_run >= cfg.rearm_steps:
                self.in_episode = False
        return out

    # --- state ---

    _SCALARS = ("epoch", "warm", "slow_run", "normal_run", "first_slow", "in_episode")

    def state(self) -> dict[str, Any]:
        return {"config": asdict(self.config), "buffer": self.buf.state(), "healthy": list(self.healthy),
                "recent": list(self.recent), **{k: getattr(self, k) for k in self._SCALARS}}

    @classmethod
    def from_state(cls, state: dict[str, Any], topo: Topology) -> JobSlowdownDetector:
        conf = dict(state["config"])
        det = cls(topo, SlowdownConfig(**{**conf, "buffer": BufferConfig(**conf["buffer"])}))
        if state["buffer"]["size"] != topo.size:
            return det
        det.buf.load(state["buffer"])
        det.healthy.extend(state["healthy"])
        det.recent.extend(state["recent"])
        for k in cls._SCALARS:
            setattr(det, k, state[k])
        return det
