"""Typed records of wire contract v1 (see docs: contract.md).

One frozen dataclass per kind. Field annotations are the contract: the codec
(`schemas.codec`) compiles its validators from them and the JSON Schema export
(`schemas.jsonschema`) is generated from them, so the three never drift apart.

Conventions:
- `str | None = None` marks an optional field; a field without a default is required.
- `Annotated[..., Meta(...)]` adds constraints: allowed values, string length,
  whether NaN/Inf is allowed (never, unless said), minimum value.
- Unknown fields of an incoming message are kept in `extra` and written back on encode.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any

from gangwatch.schemas.classes import CLASSES

VERSION = 1


@dataclass(frozen=True, slots=True)
class Meta:
    """Constraints on one field, beyond its Python type."""

    enum: tuple[str, ...] | None = None
    max_len: int = 256  # strings: characters; lists: items
    allow_nonfinite: bool = False  # floats: accept NaN / +-Inf (encoded as "NaN", "Infinity", "-Infinity")
    minimum: float | None = None


ID = Annotated[str, Meta(max_len=256)]
TEXT = Annotated[str, Meta(max_len=65_536)]
SECONDS = Annotated[float, Meta(minimum=0.0)]
RANK = Annotated[int, Meta(minimum=0)]
NUMBER = Annotated[float, Meta(allow_nonfinite=True)]

HW_SOURCES = ("xid", "ecc", "nic", "kernel", "bmc", "pcie", "nvlink", "thermal")
FRAMEWORK_TYPES = ("nccl_timeout", "nccl_error", "barrier_timeout", "exception", "oom", "exit")
STACK_FORMATS = ("py-spy", "frames")
FLIGHT_STATES = ("scheduled", "started", "completed")
LIFECYCLE_EVENTS = ("start", "pause", "resume", "stop", "end", "restart")
RECOVERY_PHASES = ("accepted", "replaced", "ckpt_loaded", "comm_ready", "resumed", "failed",
                   # answers of active diagnosis: a `replay` action's groups passed or failed; a `dual_run`'s digests
                   "replay_result", "dual_run_result")
REPLAY_OUTCOMES = ("pass", "fail")
ACTION_TYPES = (
    "replace", "evict_group", "rollback", "isolate", "dual_run", "degrade",
    "restart_in_process", "requeue", "collect_stacks", "escalate",
    "replay",  # run the job's step from its last checkpoint on the machine groups in `extra.groups`
    "readmit",  # a suspect cleared (a dual run found its digests equal): return the node to service
)
# the actions that take nodes out of the job (the blast-radius guard and the evaluator count these)
EVICTING_ACTIONS = frozenset({"replace", "evict_group", "isolate", "requeue"})
# actions a controller carries out by stopping the job and starting it again (on other nodes, or from a checkpoint)
RESTARTING_ACTIONS = EVICTING_ACTIONS | {"rollback", "restart_in_process"}
INCIDENT_CLASSES = tuple(CLASSES)  # declared, with what each means to every part, in schemas/classes.py
RECOVERY_PATHS = ("hot", "cold", "in_process", "non_stop", "manual")


# --- nested values -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RankInfo:
    """Where one rank of a job runs and which parallel groups it belongs to."""

    rank: RANK
    node: ID
    gpu: Annotated[int, Meta(minimum=0)] | None = None
    tp: Annotated[int, Meta(minimum=0)] = 0
    pp: Annotated[int, Meta(minimum=0)] = 0
    dp: Annotated[int, Meta(minimum=0)] = 0
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True, slots=True)
class Frame:
    """One stack frame of a `frames`-format stack dump."""

    func: TEXT
    file: TEXT | None = None
    line: int | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True, slots=True)
class FlightGroup:
    """One process group in a flight-recorder summary; -1 means unknown."""

    pg: ID
    ranks: Annotated[list[RANK], Meta(max_len=1_000_000)]
    desc: ID | None = None
    last_enqueued: int = -1
    last_started: int = -1
    last_completed: int = -1
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True, slots=True)
class FlightEntry:
    """One recent collective of a flight-recorder summary."""

    seq: int
    op: ID
    pg: ID
    state: Annotated[str, Meta(enum=FLIGHT_STATES)]
    size: int | None = None
    dtype: ID | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


# --- inputs ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Job:
    """Topology of a job, sent when it (re)starts; replaces any earlier topology."""

    ts: float
    job: ID
    ranks: Annotated[list[RankInfo], Meta(max_len=1_000_000)]
    heartbeat_s: Annotated[float, Meta(minimum=0.001)] = 5.0
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    kind: str = field(default="job", init=False)


@dataclass(frozen=True, slots=True)
class Step:
    """One rank finished one training step."""

    ts: float
    job: ID
    rank: RANK
    step: Annotated[int, Meta(minimum=0)]
    step_s: SECONDS
    compute_s: SECONDS | None = None
    comm_wait_s: SECONDS | None = None
    data_wait_s: SECONDS | None = None
    loss: NUMBER | None = None
    grad_norm: NUMBER | None = None
    replica_digest: ID | None = None
    mono: SECONDS | None = None  # the sender's monotonic clock when it stamped `ts` (see `Heartbeat.mono`)
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    kind: str = field(default="step", init=False)


# A node agent's heartbeat on behalf of a rank whose process lives but whose own threads cannot run carries
# `source: "agent"` and `proc_state`, the /proc/PID/stat state letter (in `extra`): these letters, in words
FROZEN_STATES = {"T": "stopped", "t": "stopped by a tracer", "D": "in uninterruptible sleep"}


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """The rank process is alive."""

    ts: float
    job: ID
    rank: RANK
    step: Annotated[int, Meta(minimum=0)] | None = None
    # the sender's monotonic clock (seconds since its node booted: Linux CLOCK_MONOTONIC, one for every process of
    # the node) when it stamped `ts`: it does not step when the wall clock does, so `ts - mono` changing at once
    # is the node's wall clock stepped (`detectors/clocks.py`, `ClockSteps`)
    mono: SECONDS | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    kind: str = field(default="heartbeat", init=False)


@dataclass(frozen=True, slots=True)
class Hw:
    """A hardware or OS event on a node (Xid, ECC, NIC, PCIe, ...); `message` is the raw line."""

    ts: float
    node: ID
    source: Annotated[str, Meta(enum=HW_SOURCES)]
    message: TEXT = ""
    gpu: Annotated[int, Meta(minimum=0)] | None = None
    code: int | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    kind: str = field(default="hw", init=False)


@dataclass(frozen=True, slots=True)
class Gpu:
    """A periodic NVML sample of one GPU."""

    ts: float
    node: ID
    gpu: Annotated[int, Meta(minimum=0)]
    temp_c: float | None = None
    power_w: Annotated[float, Meta(minimum=0.0)] | None = None
    sm_clock_mhz: Annotated[float, Meta(minimum=0.0)] | None = None
    util_pct: Annotated[float, Meta(minimum=0.0)] | None = None
    throttle: Annotated[list[ID], Meta(max_len=64)] | None = None
    ecc_sbe: Annotated[int, Meta(minimum=0)] | None = None
    ecc_dbe: Annotated[int, Meta(minimum=0)] | None = None
    remap_pending: bool | None = None
    pcie_replay: Annotated[int, Meta(minimum=0)] | None = None
    nvlink_crc: Annotated[int, Meta(minimum=0)] | None = None
    mono: SECONDS | None = None  # the sampling agent's monotonic clock (see `Heartbeat.mono`)
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    kind: str = field(default="gpu", init=False)


@dataclass(frozen=True, slots=True)
class Framework:
    """What the training framework itself reported (NCCL timeout, exception, exit, ...)."""

    ts: float
    job: ID
    rank: RANK
    type: Annotated[str, Meta(enum=FRAMEWORK_TYPES)]
    op: ID | None = None
    seq: int | None = None
    pg: ID | None = None
    peer: RANK | None = None
    message: TEXT | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    kind: str = field(default="framework", init=False)


@dataclass(frozen=True, slots=True)
class Lifecycle:
    """A moment of a job's ordinary life, said by whoever knows it: one rank (`rank` set) or the launcher or
    controller for the whole job (`rank` None).

    `event`: `pause` / `resume` bracket known pauses (a synchronous checkpoint save, an evaluation pass;
    `reason` says which); `stop` is a rank (or the job) stopped on purpose (`reason`: the signal, or who
    stopped it); `end` the job finished; `start` the launcher started it; `restart` the controller is stopping
    it to start it again. None of these is a fault.
    """

    ts: float
    job: ID
    event: Annotated[str, Meta(enum=LIFECYCLE_EVENTS)]
    rank: RANK | None = None
    reason: ID | None = None
    source: ID | None = None  # who said it: trainer, launcher, controller, ...
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    kind: str = field(default="lifecycle", init=False)


@dataclass(frozen=True, slots=True)
class Stack:
    """One rank's stack dump; a sweep of a job shares one `snapshot` id."""

    ts: float
    job: ID
    rank: RANK
    snapshot: ID
    format: Annotated[str, Meta(enum=STACK_FORMATS)]
    dump: Annotated[str, Meta(max_len=4_194_304)] | None = None
    frames: Annotated[list[Frame], Meta(max_len=10_000)] | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    kind: str = field(default="stack", init=False)


@dataclass(frozen=True, slots=True)
class Flight:
    """One rank's NCCL flight-recorder summary."""

    ts: float
    job: ID
    rank: RANK
    snapshot: ID
    entries: Annotated[list[FlightEntry], Meta(max_len=100_000)]
    groups: Annotated[list[FlightGroup], Meta(max_len=100_000)] | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    kind: str = field(default="flight", init=False)


@dataclass(frozen=True, slots=True)
class Ops:
    """An operator's or scheduler's annotation (maintenance, silence, ...)."""

    ts: float
    type: ID
    job: ID | None = None
    node: ID | None = None
    planned: bool = False
    until_ts: float | None = None
    note: TEXT | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    kind: str = field(default="ops", init=False)


@dataclass(frozen=True, slots=True)
class Recovery:
    """The job controller reports progress on an action."""

    ts: float
    job: ID
    action: ID
    phase: Annotated[str, Meta(enum=RECOVERY_PHASES)]
    # `replay_result`: each group of the replay phase asked for (its `id`) -> "pass" or "fail"
    results: dict[ID, ID] | None = None
    # `dual_run_result`: node -> digest of the same step run on it (the suspects and the `reference` machine)
    digests: dict[ID, ID] | None = None
    reference: ID | None = None  # `dual_run_result`: the machine trusted as the reference
    spares: Annotated[int, Meta(minimum=0)] | None = None  # warm spares the controller holds for the job now
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    kind: str = field(default="recovery", init=False)


# --- outputs ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Finding:
    """One detector's judgement; `ts` is when the pipeline could first have known it.

    `type` is open: each detector declares the types it emits, with the shape of their `evidence`
    (`gangwatch.detectors.catalog.REGISTRY`), so a new detector needs no new contract version.
    """

    id: ID
    ts: float
    job: ID
    type: ID
    detector: ID
    rank: RANK | None = None
    node: ID | None = None
    gpu: Annotated[int, Meta(minimum=0)] | None = None
    score: float | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    kind: str = field(default="finding", init=False)


@dataclass(frozen=True, slots=True)
class Action:
    """What the job controller is asked to do; `id` is an idempotency key."""

    id: ID
    ts: float
    job: ID
    incident: ID
    type: Annotated[str, Meta(enum=ACTION_TYPES)]
    nodes: Annotated[list[ID], Meta(max_len=100_000)] = field(default_factory=list)
    reason: TEXT = ""
    evidence: Annotated[list[ID], Meta(max_len=100_000)] = field(default_factory=list)
    path: Annotated[str, Meta(enum=RECOVERY_PATHS)] | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    kind: str = field(default="action", init=False)


@dataclass(frozen=True, slots=True)
class Incident:
    """One interruption from onset to recovery, re-emitted as it moves."""

    id: ID
    ts: float
    job: ID
    # `class` is a Python keyword: the attribute is `cls`, the wire name is "class".
    cls: Annotated[str, Meta(enum=INCIDENT_CLASSES)]
    planned: bool = False
    onset_ts: float | None = None
    detected_ts: float | None = None
    localized_ts: float | None = None
    decided_ts: float | None = None
    recovered_ts: float | None = None
    culprit_nodes: Annotated[list[ID], Meta(max_len=100_000)] = field(default_factory=list)
    evicted_nodes: Annotated[list[ID], Meta(max_len=100_000)] = field(default_factory=list)
    path: Annotated[str, Meta(enum=RECOVERY_PATHS)] | None = None
    stage_s: dict[str, float] = field(default_factory=dict)
    over_budget: Annotated[list[ID], Meta(max_len=64)] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    kind: str = field(default="incident", init=False)


INPUT_KINDS: dict[str, type] = {
    "job": Job, "step": Step, "heartbeat": Heartbeat, "hw": Hw, "gpu": Gpu, "framework": Framework,
    "stack": Stack, "flight": Flight, "ops": Ops, "recovery": Recovery, "lifecycle": Lifecycle,
}
OUTPUT_KINDS: dict[str, type] = {"finding": Finding, "action": Action, "incident": Incident}
KINDS: dict[str, type] = {**INPUT_KINDS, **OUTPUT_KINDS}
# Python attribute name -> wire name, where they differ.
WIRE_NAMES = {"cls": "class"}

Record = (Job | Step | Heartbeat | Hw | Gpu | Framework | Lifecycle | Stack | Flight | Ops | Recovery | Finding | Action
          | Incident)
