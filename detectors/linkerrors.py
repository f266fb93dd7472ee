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

from array import array
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from gangwatch.detectors.base import DetectorBase, SavedJob
from gangwatch.detectors.config import LinkErrorConfig
from gangwatch.detectors.registry import FindingType, Policy
from gangwatch.detectors.topology import Topology
from gangwatch.schemas import Finding, Gpu, Record
from gangwatch.schemas.evidence import Evidence


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


_COUNTERS = ("pcie_replay", "nvlink_crc")  # the columns of a node's links
_NO_SAMPLE = (0.0, 0, -1, 0, False)  # a counter's fields (see `_NodeLinks`) before its first sample
BadInterval = tuple[int, float, int]  # (age: 0 is the newest interval, start_ts, start_value)


class _NodeLinks:
    """The link counters of one node's GPUs, packed: a row per GPU (those the job record puts on the node, then any
    other as it is first seen), a column per counter of `_COUNTERS`, each field of a counter in a flat `array.array`
    indexed by `row * len(_COUNTERS) + column`, and the bad intervals of each counter's window on the side.

    Why: at 100k ranks a dict per counter, with a list per interval of its window, was most of the core's memory
    (issue 11). Here a counter is 33 bytes, and of its window only the bad intervals are kept: the onset is the
    oldest of them, and a healthy link, nearly every link, has none. Flat arrays rather than one numpy structured
    array: each GPU sample reads and writes its counters' fields one by one, and an `array.array` item is a Python
    number in tens of nanoseconds where a structured-array item takes microseconds.
    """

    __slots__ = ("rows", "ts", "value", "intervals", "clean", "episode", "bad")

    def __init__(self, gpus: Iterable[int] = ()) -> None:
        self.rows: dict[int, int] = {}  # gpu -> row
        # a counter's last sample; the sample intervals in its window (at most `window`; -1: no sample yet); the
        # intervals since its last bad one; whether an episode is on
        self.ts, self.value = array("d"), array("q")
        self.intervals, self.clean, self.episode = array("q"), array("q"), array("b")
        self.bad: dict[int, list[BadInterval]] = {}  # index -> its window's, oldest first
        self.add(gpus)

    def fields(self) -> tuple[array, ...]:
        """The arrays, in the order of `_NO_SAMPLE` and of a counter in `state()`."""
        return self.ts, self.value, self.intervals, self.clean, self.episode

    def add(self, gpus: Iterable[int]) -> None:
        """Rows for these GPUs, no sample yet."""
        new = [gpu for gpu in dict.fromkeys(gpus) if gpu not in self.rows]
        self.rows.update({gpu: r for r, gpu in enumerate(new, start=len(self.rows))})
        for field, empty in zip(self.fields(), _NO_SAMPLE, strict=True):
            field.extend([empty] * (len(new) * len(_COUNTERS)))

    def index(self, gpu: int, c: int) -> int:
        """Where counter `c` of this GPU is in the arrays (a row for the GPU if it has none yet)."""
        r = self.rows.get(gpu)
        if r is None:
            self.add([gpu])
            r = self.rows[gpu]
        return r * len(_COUNTERS) + c

    def state(self) -> dict[str, Any]:
        gpus, n = list(self.rows), len(_COUNTERS)
        links = [[ts, value, intervals, clean, bool(episode)]
                 for ts, value, intervals, clean, episode in zip(*self.fields(), strict=True)]
        return {"gpus": gpus, "links": [links[i:i + n] for i in range(0, len(links), n)],
                "bad": [[gpus[i // n], _COUNTERS[i % n], [list(b) for b in bad]] for i, bad in self.bad.items()]}

    @classmethod
    def from_state(cls, s: dict[str, Any]) -> _NodeLinks:
        node = cls()
        node.rows = {gpu: r for r, gpu in enumerate(s["gpus"])}
        links = [link for row in s["links"] for link in row]
        for k, field in enumerate(node.fields()):
            field.extend(link[k] for link in links)
        node.bad = {node.rows[gpu] * len(_COUNTERS) + _COUNTERS.index(counter): [tuple(b) for b in bad]
                    for gpu, counter, bad in s["bad"]}
        return node


class LinkErrorDetector(DetectorBase):
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
        self.thresholds = (cfg.pcie_replay_per_s, cfg.nvlink_crc_per_s)  # of _COUNTERS
        self.nodes: dict[str, _NodeLinks] = {}

    def set_topology(self, topo: Topology) -> None:
        """A new job record: links of nodes that left the job are forgotten."""
        self.topo = topo
        nodes = set(topo.nodes)
        self.nodes = {k: v for k, v in self.nodes.items() if k in nodes}

    def observe(self, rec: Record) -> list[Finding]:
        out = []
        for c, counter in enumerate(_COUNTERS):
            value = getattr(rec, counter)
            if value is not None:
                node = self.nodes.get(rec.node)
                if node is None:  # rows for the GPUs the job record puts on it
                    gpus = (self.topo.ranks[r].gpu for r in self.topo.node_ranks.get(rec.node, ()))
                    node = self.nodes[rec.node] = _NodeLinks(gpus)
                out += self._sample(rec, node, node.index(rec.gpu, c), c, int(value))
        return out

    def _sample(self, rec: Gpu, node: _NodeLinks, i: int, c: int, value: int) -> list[Finding]:
        """Counter `c` of the GPU sampled by `rec`, at index `i` of its node's arrays, is now `value`."""
        cfg = self.config
        ts, last, intervals = node.ts[i], node.value[i], node.intervals[i]
        if intervals >= 0 and rec.ts <= ts:
            return []  # not newer than the last sample of this GPU
        if intervals < 0 or value < last:  # first sample, or the counter was reset
            node.value[i], node.ts[i], node.intervals[i], node.clean[i], node.episode[i] = value, rec.ts, 0, 0, False
            node.bad.pop(i, None)
            return []
        bad = (value - last) / (rec.ts - ts) >= self.thresholds[c]
        # the window takes the new interval; its oldest leaves once it holds `window`
        intervals = min(intervals, cfg.window - 1) + 1
        if not bad and i not in node.bad and not node.episode[i] and cfg.hits > 0:  # a healthy link: nearly all
            node.value[i], node.ts[i], node.intervals[i] = value, rec.ts, intervals
            node.clean[i] += 1
            return []
        over = [(age + 1, t, v) for age, t, v in node.bad.get(i, ()) if age + 1 < cfg.window]
        if bad:
            over.append((0, ts, last))
        if over:
            node.bad[i] = over
        else:
            node.bad.pop(i, None)
        clean = 0 if bad else node.clean[i] + 1
        episode, found = node.episode[i], []
        if episode:
            episode = clean < cfg.rearm_intervals
        elif len(over) >= cfg.hits:
            episode = True
            found = [self._finding(rec, c, value, over, intervals)]
        node.value[i], node.ts[i], node.intervals[i], node.clean[i], node.episode[i] = \
            value, rec.ts, intervals, clean, episode
        return found

    def _finding(self, rec: Gpu, c: int, value: int, over: list[BadInterval], intervals: int) -> Finding:
        counter, threshold = _COUNTERS[c], self.thresholds[c]
        _, onset_ts, onset_value = over[0]
        errors = value - onset_value
        rate = errors / (rec.ts - onset_ts)
        key = (f"{rec.node}|{rec.gpu}|{counter}", onset_ts)  # as before the links were packed: the same ids
        return LINK_ERRORS.finding(
            ts=rec.ts, job=self.topo.job, detector=f"linkerrors.{counter}", key=key, topo=self.topo,
            rank=self.topo.rank_on(rec.node, rec.gpu), node=rec.node, gpu=rec.gpu, score=round(rate / threshold, 4),
            evidence=LinkErrorRate(counter=counter, rate_per_s=round(rate, 6), threshold_per_s=round(threshold, 6),
                                   errors=errors, intervals_over=len(over), window_intervals=intervals,
                                   onset_ts=round(onset_ts, 6), counter_value=value),
        )

    def advance(self, now: float) -> list[Finding]:
        return []  # rates are measured between samples: nothing happens between them

    def state(self) -> dict[str, Any]:
        return {"config": asdict(self.config), "nodes": {k: v.state() for k, v in self.nodes.items()}}

    @classmethod
    def from_state(cls, state: dict[str, Any], topo: Topology) -> LinkErrorDetector:
        det = cls(topo, LinkErrorConfig(**state["config"]))
        det.nodes = {k: _NodeLinks.from_state(v) for k, v in state["nodes"].items()}
        return det

    @classmethod
    def upgrade_state(cls, state: dict[str, Any] | None, version: int, job: SavedJob) -> dict[str, Any] | None:
        """Its saved state brought up to date (`DetectorBase.upgrade_state`)."""
        if version == 2:
            if state is None:  # added in version 3 (it may also be missing from a state saved as version 2)
                return cls(job.topo).state()
            if "links" in state:  # unpacked, before issue 11 packed the links per node
                state["nodes"] = nodes_from_links(state.pop("links"))
        return state


def nodes_from_links(links: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The `nodes` of `state()` holding what `links`, the counters' shape in saved states up to version 2 (before
    issue 11 packed them per node), holds: a dict per "node|gpu|counter" {ts, value, recent, clean, episode},
    `recent` holding the window's intervals as [start_ts, start_value, bad], oldest first. For triage/migrate.py."""
    nodes: dict[str, _NodeLinks] = {}
    for key, s in links.items():
        name, gpu, counter = key.rsplit("|", 2)
        node = nodes.get(name)
        if node is None:
            node = nodes[name] = _NodeLinks()
        i, recent = node.index(int(gpu), _COUNTERS.index(counter)), s["recent"]
        for field, v in zip(node.fields(), (s["ts"], s["value"], len(recent), s["clean"], s["episode"]), strict=True):
            field[i] = v
        bad = [(len(recent) - 1 - k, t, v) for k, (t, v, b) in enumerate(recent) if b]
        if bad:
            node.bad[i] = bad
    return {name: node.state() for name, node in nodes.items()}
