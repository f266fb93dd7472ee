"""Link error rates: PCIe replays or NVLink CRC errors that keep climbing on one GPU.

NVML's `pcie_replay` and `nvlink_crc` counters are cumulative (since the driver
loaded), so what matters is their rate: the counter's increase over the time
between two samples of the same GPU. A link that retries now and then is
normal; one whose rate stays at or above its threshold (`pcie_replay_per_s`,
`nvlink_crc_per_s`) in `hits` of its last `window` sample intervals is
degrading: one `link_errors` finding per (node, GPU, counter) episode, which
ends after `rearm_intervals` intervals below the threshold. A burst between two
samples is not persistence (the hardware detector reports a large jump as a
precursor already).

The finding names the GPU (and its rank) and says since when: the start of the
oldest interval over the threshold still in the window. A counter that goes down
(driver reload, GPU reset) starts over from its new value; a sample that is not
newer than the last one of its GPU is ignored.

Triage (the policy below): a degrading link opens no incident on its own; it
corroborates one on its node (a straggler, a hang, a crash) like a degraded GPU,
and raises the node's risk; a straggler on its node in the same window is
decided without the full hysteresis hold (`explains_slow`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from gangwatch.detectors.registry import FindingType, Policy
from gangwatch.detectors.topology import Topology
from gangwatch.schemas import Finding, Gpu, Record
from gangwatch.schemas.evidence import Evidence


@dataclass(frozen=True)
class LinkErrorConfig:
    pcie_replay_per_s: float = 8 / 60  # PCIe replays per second that make an interval bad (8 a minute)
    nvlink_crc_per_s: float = 100.0  # NVLink CRC errors per second, summed over the GPU's links
    hits: int = 3  # bad intervals ...
    window: int = 5  # ... among the last this many of the GPU's sample intervals
    rearm_intervals: int = 10  # consecutive good intervals that end an episode


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkErrorRate(Evidence):
    """One GPU's link error counter rising at `rate_per_s` since `onset_ts`."""

    counter: str  # pcie_replay | nvlink_crc
    rate_per_s: float  # errors per second since the onset
    threshold_per_s: float
    errors: int  # the counter's increase since the onset
    intervals_over: int  # bad intervals among the last `window_intervals`
    window_intervals: int
    onset_ts: float  # start of the oldest bad interval in the window
    counter_value: int  # the counter now


LINK_ERRORS = FindingType("link_errors", LinkErrorRate, Policy(
    node_level=True, weight=0.4, risk=0.3, onset="onset_ts", grade="degraded",
    label=lambda f, ev: f"{ev.counter.upper()}_RATE", explains_slow=True))


class LinkErrorDetector:
    """PCIe-replay and NVLink-CRC error rates of the GPUs of one job's nodes."""

    name: ClassVar[str] = "linkerrors"
    kinds: ClassVar[frozenset[str]] = frozenset({"gpu"})
    finding_types: ClassVar[tuple[FindingType, ...]] = (LINK_ERRORS,)

    def __init__(self, topo: Topology, config: LinkErrorConfig | None = None) -> None:
        self.config = config or LinkErrorConfig()
        cfg = self.config
        if not 1 <= cfg.hits <= cfg.window:
            raise ValueError("need 1 <= hits <= window")
        self.topo = topo
        self.thresholds = {"pcie_replay": cfg.pcie_replay_per_s, "nvlink_crc": cfg.nvlink_crc_per_s}
        # "node|gpu|counter" -> {ts, value, recent: [[start_ts, start_value, bad], ...] (oldest first), clean, episode}
        self.links: dict[str, dict[str, Any]] = {}

    def set_topology(self, topo: Topology) -> None:
        """A new job record: links of nodes that left the job are forgotten."""
        self.topo = topo
        nodes = set(topo.nodes)
        self.links = {k: v for k, v in self.links.items() if k.split("|", 1)[0] in nodes}

    def observe(self, rec: Record) -> list[Finding]:
        out = []
        for counter, threshold in self.thresholds.items():
            value = getattr(rec, counter)
            if value is not None:
                out += self._sample(rec, counter, int(value), threshold)
        return out

    def _sample(self, rec: Gpu, counter: str, value: int, threshold: float) -> list[Finding]:
        key = f"{rec.node}|{rec.gpu}|{counter}"
        s = self.links.get(key)
        if s is not None and rec.ts <= s["ts"]:
            return []  # not newer than the last sample of this GPU
        if s is None or value < s["value"]:  # first sample, or the counter was reset
            self.links[key] = {"ts": rec.ts, "value": value, "recent": [], "clean": 0, "episode": False}
            return []
        bad = (value - s["value"]) / (rec.ts - s["ts"]) >= threshold
        s["recent"] = [*s["recent"][-(self.config.window - 1):], [s["ts"], s["value"], bad]]
        s["ts"], s["value"] = rec.ts, value
        s["clean"] = 0 if bad else s["clean"] + 1
        if s["episode"]:
            s["episode"] = s["clean"] < self.config.rearm_intervals
            return []
        over = sum(1 for *_, b in s["recent"] if b)
        if over < self.config.hits:
            return []
        s["episode"] = True
        onset_ts, onset_value, _ = next(r for r in s["recent"] if r[2])
        errors = value - onset_value
        rate = errors / (rec.ts - onset_ts)
        return [LINK_ERRORS.finding(
            ts=rec.ts, job=self.topo.job, detector=f"linkerrors.{counter}", key=(key, onset_ts), topo=self.topo,
            rank=self.topo.rank_on(rec.node, rec.gpu), node=rec.node, gpu=rec.gpu, score=round(rate / threshold, 4),
            evidence=LinkErrorRate(counter=counter, rate_per_s=round(rate, 6), threshold_per_s=round(threshold, 6),
                                   errors=errors, intervals_over=over, window_intervals=len(s["recent"]),
                                   onset_ts=round(onset_ts, 6), counter_value=value),
        )]

    def advance(self, now: float) -> list[Finding]:
        return []  # rates are measured between samples: nothing happens between them

    def state(self) -> dict[str, Any]:
        return {"config": asdict(self.config),
                "links": {k: {**v, "recent": [list(r) for r in v["recent"]]} for k, v in self.links.items()}}

    @classmethod
    def from_state(cls, state: dict[str, Any], topo: Topology) -> LinkErrorDetector:
        det = cls(topo, LinkErrorConfig(**state["config"]))
        det.links = {k: {**v, "recent": [list(r) for r in v["recent"]]} for k, v in state["links"].items()}
        return det
