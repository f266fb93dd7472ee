"""What to simulate: a `Scenario` (one synchronous training job), its benign `Noise`, its `Fault`s.

Everything here is a frozen value; the simulator is a pure function of it, so a
scenario and its seed pin down the generated stream byte for byte.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gangwatch.producers.fault_kinds import FAULT_HELP

FAULT_KINDS = tuple(FAULT_HELP)
# fault kind -> incident class (contract: incident.class); None: a precursor, no incident is expected
FAULT_CLASS: dict[str, str | None] = {
    "xid79": "fail_stop", "node_loss": "fail_stop",
    "thermal_straggler": "fail_slow", "nic_degradation": "fail_slow", "intermittent_straggler": "fail_slow",
    "dataloader_hang": "hang", "pp_deadlock": "hang",
    "sdc": "sdc",
    "planned_maintenance": "planned",
    "link_errors": None,
    "heterogeneous": None,  # a rank steadily slower than its peers: a difference, nothing broken
    "clock_skew": None,  # a node's clock is off: its records' times, not the node, are wrong
    "late_delivery": None,  # a node's records arrive late (a slow path, a spool flushed in one burst)
}
# kinds that wear the hardware without interrupting the job: no incident to score, so not in the scored suite
PRECURSOR_KINDS = frozenset({"link_errors"})
# differences, not faults: no incident expected, and nobody may be evicted for them; the suite scores that they
# are reported (a `heterogeneous` finding per rank) and that nobody is evicted
BENIGN_KINDS = frozenset({"heterogeneous", "clock_skew", "late_delivery"})
# benign kinds about the monitoring, not the job: the job trains on untouched, only what its records say of the
# node (their times, when they arrive) is off; nobody may be evicted or paged for them
MONITORING_KINDS = frozenset({"clock_skew", "late_delivery"})
LINK_COUNTERS = ("pcie_replay", "nvlink_crc")  # the cumulative NVML error counters `link_errors` drives
# kinds after which the job makes no more step progress (until a restart)
STALL_KINDS = frozenset({"xid79", "node_loss", "dataloader_hang", "pp_deadlock"})
# stall kinds that may strike several ranks at once (same at_s): a hang with several culprits
CO_STALL_KINDS = frozenset({"dataloader_hang", "pp_deadlock"})
# kinds that act on a whole node; the others act on one rank (one GPU)
NODE_KINDS = frozenset({"node_loss", "nic_degradation", "planned_maintenance", "clock_skew", "late_delivery"})
DEFAULT_MAGNITUDE = {
    "thermal_straggler": 0.10,  # compute 10% slower at full throttle
    "intermittent_straggler": 0.15,  # compute 15% slower in the affected steps
    "nic_degradation": 0.30,  # collectives through the node 30% slower
    "heterogeneous": 0.05,  # compute 5% slower than its peers, steadily
}


@dataclass(frozen=True)
class Fault:
    """One injected fault.

    `at_s`: onset, seconds after the scenario start. Give `node` (``"n003"``) and/or
    `rank`; for a per-GPU kind given only a node, ``params["gpu"]`` picks the GPU
    (else one is drawn from the seed). `magnitude` is the slowdown fraction of the
    straggler kinds (0.10 = 10%; 0 means the kind's default).

    Params by kind (all optional):
      thermal_straggler: ramp_s (60: seconds to full throttle), bmc (True: a BMC SEL event)
      intermittent_straggler: prob (0.3: share of steps that are slow)
      nic_degradation: event_every_s (30: cadence of NIC error-counter kernel lines)
      xid79: pid (kernel-log pid), exception_after_s (1.5: the rank's CUDA error, then it exits)
      sdc: anomaly_after_s (60: loss / grad-norm anomaly after onset; None: never)
      planned_maintenance: lead_s (120: ops notice ahead of the stop), note, restart_after_s
        (60: downtime before the job restarts with a spare node; None: no restart), load_s (15)
      link_errors: counter ("pcie_replay" or "nvlink_crc"), rate_per_s (errors per second the GPU's
        cumulative counter gains from the onset, Poisson; 1.0 for PCIe replays, 1000 for NVLink CRC).
        Counters only: the job's timing is not affected.
      heterogeneous: none. The rank computes `magnitude` slower from `at_s` on (usually 0: from the first
        step), steadily: an older GPU, a shared one, a slower path. Nothing is broken: no incident is
        expected, a `heterogeneous` finding is.
      clock_skew: offset_s (30: seconds the node's clock runs ahead from `at_s` on; negative: behind). Every
        record of the node carries its clock's time; the job itself is untouched. No incident is expected, a
        `clock_skew` finding naming the node is.
      late_delivery: lag_s (20: seconds the node's records arrive late from `at_s` on, their times right), or
        flush_s (its records from `at_s` on are held that long, then arrive at once: a spool flushed after a
        broker blip). No incident is expected; a steady lag gets a `telemetry_gap` finding naming the node.

    Several `dataloader_hang` / `pp_deadlock` faults with the same `at_s` are one hang with several culprits.
    """

    kind: str
    at_s: float
    node: str | None = None
    rank: int | None = None
    magnitude: float = 0.0
    params: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; one of {', '.join(FAULT_KINDS)}")
        if self.at_s < 0:
            raise ValueError(f"{self.kind}: at_s must be >= 0")
        if self.node is None and self.rank is None:
            raise ValueError(f"{self.kind}: give a node or a rank")
        if self.magnitude < 0:
            raise ValueError(f"{self.kind}: magnitude must be >= 0")
        if self.kind == "clock_skew" and not float(self.params.get("offset_s", 30.0)):
            raise ValueError("clock_skew: offset_s must not be 0")
        if self.kind == "late_delivery" and (float(self.params.get("lag_s", 20.0)) <= 0
                                             or float(self.params.get("flush_s") or 1.0) <= 0):
            raise ValueError("late_delivery: lag_s and flush_s must be > 0")
        if self.kind == "link_errors":
            if self.params.get("counter", "pcie_replay") not in LINK_COUNTERS:
                raise ValueError(f"link_errors: counter must be one of {LINK_COUNTERS}")
            if float(self.params.get("rate_per_s", 1.0)) <= 0:
                raise ValueError("link_errors: rate_per_s must be > 0")

    @property
    def cls(self) -> str | None:
        return FAULT_CLASS[self.kind]

    @property
    def effective_magnitude(self) -> float:
        return self.magnitude or DEFAULT_MAGNITUDE.get(self.kind, 0.0)


@dataclass(frozen=True)
class Noise:
    """Benign noise a healthy job shows; none of it is a fault.

    - warm-up: the first steps after (re)start are slower, step 0 by `warmup_extra` (2.0 = 3x);
    - checkpoint saves every `ckpt_every_s`: every rank's step grows by about `ckpt_s`;
    - per-rank, per-step gaussian compute jitter (`jitter`, relative);
    - rare job-wide loss / grad-norm spikes (`loss_spike_prob` per step);
    - correctable ECC (`ecc_sbe`) ticking up on a share of GPUs (`ecc_gpu_frac`);
    - `nic_flaps` NIC link flaps (down, then up within `flap_s` seconds) on random nodes;
    - small input waits (`data_wait_mean_s`, exponential);
    - heartbeats late: each rank beats from its own thread a period after its previous beat,
      a little late every time (`hb_delay_s`, exponential mean; the delays add up) and now
      and then held up by a GC pause or a call holding the GIL (`hb_pause_prob` per beat,
      up to `hb_pause_s`, uniform). Delayed, never stopped.

    `enabled=False` (or `Noise.off()`) turns all of it off: perfectly regular steps.
    """

    enabled: bool = True
    warmup_steps: int = 10
    warmup_extra: float = 2.0
    jitter: float = 0.015
    ckpt_every_s: float = 120.0
    ckpt_s: float = 6.0
    loss_spike_prob: float = 0.002
    ecc_gpu_frac: float = 0.02
    nic_flaps: int = 1
    flap_s: tuple[float, float] = (1.5, 6.0)
    data_wait_mean_s: float = 0.004
    hb_delay_s: float = 0.002
    hb_pause_prob: float = 0.01
    hb_pause_s: float = 2.0

    @classmethod
    def off(cls) -> Noise:
        """No benign noise at all (exactly regular steps)."""
        return cls(enabled=False, warmup_steps=0, warmup_extra=0.0, jitter=0.0, ckpt_every_s=0.0, ckpt_s=0.0,
                   loss_spike_prob=0.0, ecc_gpu_frac=0.0, nic_flaps=0, data_wait_mean_s=0.0, hb_delay_s=0.0,
                   hb_pause_prob=0.0)


@dataclass(frozen=True)
class Scenario:
    """One synchronous training job (tp x pp x dp ranks) over `duration_s` seconds.

    Ranks: rank = node_index * gpus_per_node + gpu; tp is innermost, then pp, then dp
    (tp = rank % tp, pp = rank // tp % pp, dp = rank // (tp * pp)). Nodes are named
    n000, n001, ... (wider when there are more than 1,000).

    `stage_skew`: relative extra compute of the last pipeline stage (the first gets
    half of it), so stages have different compute baselines. `nccl_timeout_s`: the
    NCCL watchdog timeout after which stuck ranks report `nccl_timeout`.
    `sweep_after_s`: a stack + flight-recorder sweep this long after a stall (None: no
    sweep). `peer_states`: during a stall the culprit's tensor-parallel peers wait in
    a forward-pass all_reduce and its pipeline peers in p2p recv (as in real jobs);
    False puts every healthy rank in the gradient all_reduce. `abort_on_timeout`: the
    watchdog kills every process a few seconds after the timeout (heartbeats stop).
    `batch`: `write` packs each node's step records of a step into one `batch` message.
    `nodes_per_switch`: the job record names each rank's leaf switch (`switch`, "sw00", "sw01", ...:
    that many consecutive nodes per switch); 0 leaves it out.
    `launch_s`: each (re)start's processes come up at random within this many seconds
    of the `job` record (imports, data loading, communicator set-up: minutes at scale);
    a rank's heartbeats begin when it is up, steps when the last one is.
    `mono`: steps, heartbeats and NVML samples carry their node's monotonic clock (`mono`,
    seconds since the node booted, which a `clock_skew` does not move), as today's clients
    stamp it; False: as older clients, without it.
    `first_node`, `node_width`: where the job's nodes sit in a fleet of many jobs (`fleet.py`).
    """

    name: str
    seed: int
    tp: int
    pp: int
    dp: int
    gpus_per_node: int = 8
    heartbeat_s: float = 5.0
    base_step_s: float = 1.0
    duration_s: float = 300.0
    start_ts: float = 1_767_225_600.0  # 2026-01-01T00:00:00Z
    noise: Noise = field(default_factory=Noise)
    faults: tuple[Fault, ...] = ()
    job: str | None = None  # job id; default: the scenario name
    start_step: int = 0
    launch_s: float = 0.0  # ranks' processes come up spread over this long after the job record
    startup_s: float = 2.0  # the last process up to the first step
    stage_skew: float = 0.06
    gpu_sample_s: float = 10.0
    nccl_timeout_s: float = 60.0
    sweep_after_s: float | None = 20.0
    peer_states: bool = True
    abort_on_timeout: bool = False
    batch: bool = False
    nodes_per_switch: int = 0
    mono: bool = True
    first_node: int = 0  # the job's nodes are n<first_node>, n<first_node + 1>, ... (spares after them)
    node_width: int = 0  # digits of a node's number (0: enough for the job's nodes and spares, at least 3)

    def __post_init__(self) -> None:
        if not isinstance(self.faults, tuple):
            object.__setattr__(self, "faults", tuple(self.faults))
        if not self.noise.enabled and self.noise != Noise.off():
            object.__setattr__(self, "noise", Noise.off())  # enabled=False means no noise at all
        for v, what in ((self.tp, "tp"), (self.pp, "pp"), (self.dp, "dp"), (self.gpus_per_node, "gpus_per_node")):
            if v < 1:
                raise ValueError(f"{what} must be >= 1")
        if self.n_ranks % self.gpus_per_node:
            raise ValueError(f"tp*pp*dp = {self.n_ranks} is not a multiple of gpus_per_node {self.gpus_per_node}")
        if self.heartbeat_s <= 0 or self.base_step_s <= 0 or self.duration_s <= 0 or self.gpu_sample_s <= 0:
            raise ValueError("heartbeat_s, base_step_s, duration_s and gpu_sample_s must be > 0")
        if self.launch_s < 0:
            raise ValueError("launch_s must be >= 0")
        if self.nodes_per_switch < 0:
            raise ValueError("nodes_per_switch must be >= 0")
        for f in self.faults:
            if f.at_s >= self.duration_s:
                raise ValueError(f"{f.kind}: at_s {f.at_s} is past the scenario's duration {self.duration_s}")

    @property
    def n_ranks(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def n_nodes(self) -> int:
        return self.n_ranks // self.gpus_per_node

    @property
    def job_id(self) -> str:
        return self.job or self.name

    @property
    def end_ts(self) -> float:
        return self.start_ts + self.duration_s
