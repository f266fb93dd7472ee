"""Hardware and OS events of a job's nodes: kernel-log `hw` records and NVML `gpu` samples.

Each event gets a severity that tells triage how much it weighs:

- `fatal`     a verdict on its own (fatal hardware Xid, uncorrectable ECC, NIC down for good,
              uncorrected PCIe error): the node is the culprit of a fail-stop.
- `degraded`  the GPU runs but slower or unsafely (thermal/power throttling, pending row
              remap): corroborates a straggler on that GPU.
- `evidence`  application-side Xids (13, 31, 43, 45) and other non-fatal codes: support for
              localizing a hang or crash to the node, never a verdict.
- `precursor` raises the node's risk only (correctable-ECC bursts, a NIC flap that
              recovered, corrected PCIe errors, high temperature, link CRC surges).

Storms: copies of one (node, gpu, source, code) are collected for `storm_window_s`
and reported as one finding with a count; copies keep being absorbed until the
storm has been quiet for `quiet_s`.
"""

from __future__ import annotations

import copy
import re
from array import array
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from gangwatch.detectors.base import DetectorBase, SavedJob
from gangwatch.detectors.config import HardwareConfig
from gangwatch.detectors.registry import FindingType, Policy
from gangwatch.detectors.topology import Topology
from gangwatch.detectors.xid import is_verdict, lookup
from gangwatch.schemas import Finding, Gpu, Hw, Record
from gangwatch.schemas.evidence import Evidence

_THROTTLE_DEGRADED = frozenset({"hw_thermal", "sw_thermal", "hw_slowdown", "hw_power_brake", "power_brake"})
# the link-state words the kernel prints (same phrases as producers/kmsg.py recognises)
_LINK_STATE = re.compile(r"\blink(?: is| status definitely| state changed to)? (up|down)\b", re.IGNORECASE)


@dataclass(frozen=True, slots=True, kw_only=True)
class HwEvent(Evidence):
    """A hardware or OS event (or `count` copies of it within the storm window), graded."""

    severity: str  # fatal, degraded, evidence, precursor
    source: str  # the hw record's source (xid, ecc, nic, pcie, ...) or nvml
    code: int | None  # e.g. the Xid
    name: str  # e.g. the Xid's catalog name, NIC_DOWN, THROTTLE:hw_thermal
    count: int
    message: str  # the raw line, first 500 characters
    # when the event itself was logged (a storm's first line, a link's going down), where the finding came later
    # (its storm window, its flap window passed): the finding's `ts` is when it was judged
    event_ts: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class NicFlap(HwEvent):
    """A NIC link that went down and came back within `nic_flap_s`."""

    down_s: float  # how long it was down


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuCondition(HwEvent):
    """A condition of an NVML sample (throttling, pending row remap, heat, an error-counter surge)."""

    temp_c: float | None
    sm_clock_mhz: float | None


_HW_WEIGHT = {"fatal": 0.95, "degraded": 0.4, "evidence": 0.3}  # precursors point at nobody
_HW_RISK = {"fatal": 1.0, "degraded": 0.3, "evidence": 0.2, "precursor": 0.1}
_LINK_SURGES = frozenset({"PCIE_REPLAY_SURGE", "NVLINK_CRC_SURGE"})


def _explains_slow(f: Finding, ev: HwEvent) -> bool:
    """A GPU that runs slower (thermal or power throttling, a pending row remap, the BMC's thermal event) or
    whose links retry (PCIe / NVLink errors): reason enough for a straggler on its node."""
    return ev.severity == "degraded" or ev.source in ("pcie", "nvlink") or ev.name in _LINK_SURGES


# a fatal event is a verdict and makes the incident a fail-stop; the rest corroborates or only raises risk
HW_FAULT = FindingType("hw_fault", (HwEvent, NicFlap, GpuCondition), Policy(
    incident="fail_stop", opens=lambda f, ev: ev.severity == "fatal", verdict=lambda f, ev: ev.severity == "fatal",
    node_level=True, weight=lambda f, ev: _HW_WEIGHT.get(ev.severity, 0.0),
    risk=lambda f, ev: _HW_RISK.get(ev.severity, 0.1), grade=lambda f, ev: ev.severity, label=lambda f, ev: ev.name,
    explains_slow=_explains_slow))


# NVML error counters whose jump between two samples of a GPU is a condition (named as the counter): (field,
# severity, name); the jump that counts is set in `HardwareConfig` (for ECC_DBE: any)
_COUNTERS = (("ecc_dbe", "fatal", "ECC_DBE"), ("ecc_sbe", "precursor", "ECC_SBE_BURST"),
             ("pcie_replay", "precursor", "PCIE_REPLAY_SURGE"), ("nvlink_crc", "precursor", "NVLINK_CRC_SURGE"))
# a GPU's conditions, in the order its findings are made when several start in one sample
_CONDITIONS = ("throttle", "remap", "temp", *(field for field, _, _ in _COUNTERS))
_COLUMN = {cond: i for i, cond in enumerate(_CONDITIONS)}


class _NodeGpus:
    """What the detector remembers of one node's GPUs, packed: a row per GPU (those the job record puts on the
    node, then any other as it is first seen), each field a flat `array.array` of rows one after the other (row `r`
    of `counters` is `counters[r * len(_COUNTERS):(r + 1) * len(_COUNTERS)]`).

    - `counters`, `known`: the last value of each of `_COUNTERS`, and whether there is one yet (0 or 1);
    - `active`: for each of `_CONDITIONS`, -1 while it is not active, else the samples without it since it was
      last seen (it re-arms at `clean_samples`).

    Why: at 100k ranks a dict of counters and a dict of conditions per GPU were a third of the core's memory
    (issue 11); these rows are under 100 bytes a GPU. Flat arrays rather than numpy ones: each GPU sample reads and
    writes a few items of its row, and an `array.array` item is a Python number in tens of nanoseconds where a
    numpy item, or a row converted to a list, takes several times that.
    """

    __slots__ = ("rows", "counters", "known", "active")

    def __init__(self, gpus: Iterable[int] = ()) -> None:
        self.rows: dict[int, int] = {}  # gpu -> row
        self.counters, self.known, self.active = array("q"), array("b"), array("q")
        self.add(gpus)

    def add(self, gpus: Iterable[int]) -> None:
        """Rows for these GPUs, nothing seen yet."""
        new = [gpu for gpu in dict.fromkeys(gpus) if gpu not in self.rows]
        self.rows.update({gpu: r for r, gpu in enumerate(new, start=len(self.rows))})
        self.counters.extend([0] * (len(new) * len(_COUNTERS)))
        self.known.extend([False] * (len(new) * len(_COUNTERS)))
        self.active.extend([-1] * (len(new) * len(_CONDITIONS)))

    def row(self, gpu: int) -> int:
        r = self.rows.get(gpu)
        if r is None:
            self.add([gpu])
            r = self.rows[gpu]
        return r

    def state(self) -> dict[str, Any]:
        return {"gpus": list(self.rows), "counters": _rows(self.counters, len(_COUNTERS)),
                "known": [list(map(bool, row)) for row in _rows(self.known, len(_COUNTERS))],
                "active": _rows(self.active, len(_CONDITIONS))}

    @classmethod
    def from_state(cls, s: dict[str, Any]) -> _NodeGpus:
        node = cls()
        node.rows = {gpu: r for r, gpu in enumerate(s["gpus"])}
        for field, rows in ((node.counters, s["counters"]), (node.known, s["known"]), (node.active, s["active"])):
            field.extend(v for row in rows for v in row)
        return node


def _rows(field: array, width: int) -> list[list[Any]]:
    return [field[i:i + width].tolist() for i in range(0, len(field), width)]


class HardwareDetector(DetectorBase):
    """Kernel-log events and NVML samples of the nodes of one job."""

    name: ClassVar[str] = "hardware"
    kinds: ClassVar[frozenset[str]] = frozenset({"hw", "gpu"})
    finding_types: ClassVar[tuple[FindingType, ...]] = (HW_FAULT,)

    def __init__(self, topo: Topology, config: HardwareConfig | None = None) -> None:
        self.config = config or HardwareConfig()
        self.topo = topo
        # key "node|gpu|source|code" -> open storm {first, last, count, severity, message, reported}
        self.storms: dict[str, dict[str, Any]] = {}
        self.nic_down: dict[str, dict[str, Any]] = {}  # "node|iface" -> {ts, message}
        self.gpus: dict[str, _NodeGpus] = {}  # node -> its GPUs' last counters and active conditions
        # the jump between two samples that makes each of `_COUNTERS` a condition
        self.surges = (1, self.config.sbe_burst, self.config.pcie_replay_surge, self.config.nvlink_crc_surge)
        self.clock: Any = None  # the job's `clocks.ClockDetector` (JobMonitor hands it over): each node's own time

    def set_topology(self, topo: Topology) -> None:
        """A new job record: the GPUs and NIC states of nodes that left the job are forgotten (a node that comes
        back starts from a baseline sample, as a new one does; its storms end on their own)."""
        self.topo = topo
        nodes = set(topo.nodes)
        self.gpus = {k: v for k, v in self.gpus.items() if k in nodes}
        self.nic_down = {k: v for k, v in self.nic_down.items() if k.split("|", 1)[0] in nodes}

    # --- observe ----------------------------------------------------------------

    def observe(self, rec: Record) -> list[Finding]:
        return self._hw(rec) if rec.kind == "hw" else self._gpu(rec)

    def _hw(self, rec: Hw) -> list[Finding]:
        if rec.source == "nic":
            return self._nic(rec)
        severity, name = self._severity(rec)
        if severity is None:
            return []
        return self._count(rec.ts, rec.node, rec.gpu, rec.source, rec.code, severity, name, rec.message)

    def _severity(self, rec: Hw) -> tuple[str | None, str]:
        msg = rec.message.lower()
        if rec.source == "xid" and rec.code is not None:
            info = lookup(rec.code)
            if is_verdict(rec.code):
                return "fatal", info.name
            if info.category == "other":
                return None, info.name
            return "evidence", info.name
        if rec.source == "ecc":
            fatal = any(w in msg for w in ("dbe", "double bit", "double-bit", "uncorrectable", "uncorrected"))
            return ("fatal" if fatal else "precursor"), "ECC"
        if rec.source == "pcie":
            nonfatal = "non-fatal" in msg or "nonfatal" in msg or "corrected" in msg.replace("uncorrected", "")
            fatal = ("uncorrected" in msg or "fatal" in msg.replace("non-fatal", "").replace("nonfatal", "")) and \
                "non-fatal" not in msg and "nonfatal" not in msg
            return ("fatal" if fatal and not nonfatal else "evidence" if "uncorrected" in msg else "precursor"), \
                "PCIE_AER"
        if rec.source == "nvlink":
            return "evidence", "NVLINK"
        if rec.source == "thermal":
            return "degraded", "THERMAL"
        if rec.source in ("kernel", "bmc"):
            return "evidence", rec.source.upper()
        return None, ""

    def _nic(self, rec: Hw) -> list[Finding]:
        iface = str(rec.extra.get("iface", "")) or _iface(rec.message)
        key = f"{rec.node}|{iface}"
        up = rec.extra.get("link_up")
        if up is None:
            state = _LINK_STATE.search(rec.message)
            if state is None:  # no link-state change (e.g. a NETDEV WATCHDOG transmit timeout): evidence only
                return self._count(rec.ts, rec.node, None, "nic", None, "evidence", "NIC", rec.message)
            up = state.group(1).lower() == "up"
        if not up:
            self.nic_down.setdefault(key, {"ts": rec.ts, "message": rec.message})
            return []
        down = self.nic_down.pop(key, None)
        if down is None:
            return []
        if rec.ts >= down["ts"] + self.config.nic_flap_s:  # an outage, not a flap: reported as NIC_DOWN
            return [] if down.get("reported") else [self._nic_down_finding(key, down)]  # (advance lagged behind)
        return [self._finding(rec.ts, rec.node, None, "nic", None, "precursor", "NIC_FLAP", 1, down["message"],
                              key=(key, down["ts"]), shape=NicFlap, down_s=round(rec.ts - down["ts"], 3))]

    def _gpu(self, rec: Gpu) -> list[Finding]:
        cfg = self.config
        node = self.gpus.get(rec.node)
        if node is None:  # rows for the GPUs the job record puts on it
            gpus = (self.topo.ranks[r].gpu for r in self.topo.node_ranks.get(rec.node, ()))
            node = self.gpus[rec.node] = _NodeGpus(gpus)
        r = node.row(rec.gpu)
        conditions: dict[str, tuple[str, str]] = {}
        throttle = _THROTTLE_DEGRADED.intersection(rec.throttle) if rec.throttle else None
        if throttle:
            conditions["throttle"] = ("degraded", "THROTTLE:" + ",".join(sorted(throttle)))
        if rec.remap_pending:
            conditions["remap"] = ("degraded", "ROW_REMAP_PENDING")
        if rec.temp_c is not None and rec.temp_c >= cfg.temp_precursor_c:
            conditions["temp"] = ("precursor", "HIGH_TEMPERATURE")
        for c, (field, sev, name) in enumerate(_COUNTERS):
            value = getattr(rec, field)
            if value is None:
                continue
            i = r * len(_COUNTERS) + c
            if node.known[i] and value - node.counters[i] >= self.surges[c]:
                conditions[field] = (sev, name)
            node.counters[i], node.known[i] = value, True
        out = []
        row = slice(r * len(_CONDITIONS), (r + 1) * len(_CONDITIONS))
        active = node.active[row]
        if not conditions and max(active) < 0:
            return out  # nothing to report, nothing to re-arm: the common sample
        for cond, (sev, name) in conditions.items():
            if active[_COLUMN[cond]] < 0:
                out.append(self._finding(rec.ts, rec.node, rec.gpu, "nvml", None, sev, name, 1, "",
                                         key=(f"{rec.node}|{rec.gpu}", cond, rec.ts), shape=GpuCondition,
                                         temp_c=rec.temp_c, sm_clock_mhz=rec.sm_clock_mhz))
            active[_COLUMN[cond]] = 0
        for i, cond in enumerate(_CONDITIONS):
            if active[i] >= 0 and cond not in conditions:
                active[i] += 1
                if active[i] >= cfg.clean_samples:
                    active[i] = -1
        node.active[row] = active
        return out

    # --- storms -------------------------------------------------------------------

    def _count(self, ts: float, node: str, gpu: int | None, source: str, code: int | None, severity: str, name: str,
               message: str) -> list[Finding]:
        key = f"{node}|{gpu}|{source}|{code}"
        storm = self.storms.get(key)
        out = []
        if storm is not None and not storm["reported"] and ts >= storm["first"] + self.config.storm_window_s:
            out.append(self._storm_finding(key, storm))  # advance lagged behind: report what the window held
        if storm is None or ts - storm["last"] > self.config.quiet_s:
            self.storms[key] = {"first": ts, "last": ts, "count": 1, "severity": severity, "name": name,
                                "message": message[:500], "reported": False}
        else:
            storm["last"] = max(storm["last"], ts)
            if ts < storm["first"] + self.config.storm_window_s:  # the count is what the window held
                storm["count"] += 1
        return out

    def advance(self, now: float) -> list[Finding]:
        cfg = self.config
        out = []
        for key in sorted(self.storms):
            s = self.storms[key]
            if not s["reported"] and now >= s["first"] + cfg.storm_window_s:
                out.append(self._storm_finding(key, s))
            elif s["reported"] and now - s["last"] > cfg.quiet_s:
                del self.storms[key]
        for key in sorted(self.nic_down):
            down = self.nic_down[key]
            due = down["ts"] + cfg.nic_flap_s
            if now >= due and not down.get("reported") and self._read_past(key.split("|", 1)[0], due):
                out.append(self._nic_down_finding(key, down))
        return out

    def _read_past(self, node: str, t: float) -> bool:
        """Whether the node's own records have been read past `t` (its time, corrected): the link's "up" would
        come on the node's own stream, so its absence means something only once that stream is past the
        deadline. The job's time alone does not tell: a node whose records come late (a clock ahead read in
        event-time order, a spool flushed after a broker blip) would have its flap judged an outage."""
        return self.clock is None or self.clock.node_time(node) >= t

    def finish(self) -> list[Finding]:
        """The input ended (replay of a kernel log): every storm not yet reported is all it will be. A NIC still
        down is left alone: whether it would have come back within `nic_flap_s` is not in the input."""
        return [self._storm_finding(key, s) for key, s in sorted(self.storms.items()) if not s["reported"]]

    def _storm_finding(self, key: str, s: dict[str, Any]) -> Finding:
        s["reported"] = True
        node, gpu, source, code = key.split("|")
        return self._finding(s["first"] + self.config.storm_window_s, node, None if gpu == "None" else int(gpu),
                             source, None if code == "None" else int(code), s["severity"], s["name"], s["count"],
                             s["message"], key=(key, s["first"]), event_ts=round(s["first"], 6))

    def _nic_down_finding(self, key: str, down: dict[str, Any]) -> Finding:
        down["reported"] = True
        return self._finding(down["ts"] + self.config.nic_flap_s, key.split("|")[0], None, "nic", None, "fatal",
                             "NIC_DOWN", 1, down["message"], key=(key, down["ts"]), event_ts=round(down["ts"], 6))

    def _finding(self, ts: float, node: str, gpu: int | None, source: str, code: int | None, severity: str,
                 name: str, count: int, message: str, *, key: object, shape: type[HwEvent] = HwEvent,
                 **more: Any) -> Finding:
        rank = self.topo.rank_on(node, gpu) if gpu is not None else None
        score = {"fatal": 1.0, "degraded": 0.6, "evidence": 0.3, "precursor": 0.1}[severity]
        evidence = shape(severity=severity, source=source, code=code, name=name, count=count, message=message[:500],
                         **more)
        return HW_FAULT.finding(ts=ts, job=self.topo.job, detector=f"hardware.{source}", key=key,
                                topo=self.topo, rank=rank, node=node, gpu=gpu, score=score, evidence=evidence)

    # --- state --------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        return {**copy.deepcopy({"config": asdict(self.config), "storms": self.storms, "nic_down": self.nic_down}),
                "gpus": {k: v.state() for k, v in self.gpus.items()}}  # a snapshot: later records must not change it

    @classmethod
    def from_state(cls, state: dict[str, Any], topo: Topology) -> HardwareDetector:
        det = cls(topo, HardwareConfig(**state["config"]))
        det.storms = copy.deepcopy(state["storms"])
        det.nic_down = copy.deepcopy(state["nic_down"])
        det.gpus = {k: _NodeGpus.from_state(v) for k, v in state["gpus"].items()}
        return det

    @classmethod
    def upgrade_state(cls, state: dict[str, Any] | None, version: int, job: SavedJob) -> dict[str, Any] | None:
        """Its saved state brought up to date (`DetectorBase.upgrade_state`)."""
        if version == 2 and "gpu_last" in state:  # unpacked, before issue 11 packed the GPUs per node
            state["gpus"] = gpus_from_gpu_last(state.pop("gpu_last"))
        return state


def gpus_from_gpu_last(gpu_last: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The `gpus` of `state()` holding what `gpu_last`, the GPUs' shape in saved states up to version 2 (before
    issue 11 packed them per node), holds: a dict per "node|gpu" {"counters": {field: last value},
    "active": {condition: samples without it}}. For triage/migrate.py."""
    gpus: dict[str, _NodeGpus] = {}
    for key, last in gpu_last.items():
        name, gpu = key.rsplit("|", 1)
        node = gpus.get(name)
        if node is None:
            node = gpus[name] = _NodeGpus()
        r = node.row(int(gpu))
        for i, (field, _, _) in enumerate(_COUNTERS, start=r * len(_COUNTERS)):
            if field in last["counters"]:
                node.counters[i], node.known[i] = last["counters"][field], True
        for cond, clean in last["active"].items():
            node.active[r * len(_CONDITIONS) + _COLUMN[cond]] = clean
    return {name: node.state() for name, node in gpus.items()}


def _iface(message: str) -> str:
    """The interface a NIC line is about: the last token before the first `: ` (e.g. `eth0`, `ens1np0`).

    `mlx5_core 0000:17:00.0 ens1np0: Link down` is about `ens1np0`; a line naming no interface
    (`mlx5_core 0000:17:00.0: Link down`) falls back to its PCI address.
    """
    head = message.split(": ", 1)[0].strip().split()
    return head[-1].rstrip(":") if head else ""
