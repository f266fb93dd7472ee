"""Synthetic `step` streams for detector tests and benchmarks.

`gen_steps` yields, per training step, the Step records of every rank of a
topology, modelled on synchronous training: each rank computes for
`compute_frac` x step time (with gaussian noise), everyone then waits in the
collective for the slowest, so `step_s` is the same on every rank, a slow
rank's `compute_s` is high and its `comm_wait_s` is low. Faults are plain
values: `Straggler`, `JobSlow` (checkpoint-like or compute-wide), `DigestFault`,
and per-step loss / grad-norm spikes and NaNs. Everything is seeded.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
from gangwatch.detectors.contract import assert_json_safe  # noqa: F401 - re-exported for the step-detector tests
from gangwatch.detectors.runs import StepColumns
from gangwatch.detectors.topology import Topology
from gangwatch.schemas import Finding, Job, RankInfo, Step


def make_job(n_ranks: int = 128, *, gpus_per_node: int = 8, tp: int = 8, pp: int = 4, job: str = "j1",
             heartbeat_s: float = 5.0, ts: float = 0.0) -> Job:
    """A job in Megatron order (tp fastest, then dp, then pp); `n_ranks` must be a multiple of tp x pp."""
    if n_ranks % (tp * pp):
        raise ValueError("n_ranks must be a multiple of tp * pp")
    dp = n_ranks // (tp * pp)
    ranks = [RankInfo(rank=r, node=f"n{r // gpus_per_node:05d}", gpu=r % gpus_per_node, tp=r % tp,
                      dp=(r // tp) % dp, pp=r // (tp * dp)) for r in range(n_ranks)]
    return Job(ts=ts, job=job, ranks=ranks, heartbeat_s=heartbeat_s)


def make_topology(n_ranks: int = 128, **kw: Any) -> Topology:
    return Topology.from_job(make_job(n_ranks, **kw))


@dataclass(frozen=True)
class Straggler:
    """`rank` computes `factor` x longer in steps [start, stop), each with probability `prob`."""

    rank: int
    factor: float = 1.10
    start: int = 0
    stop: int | None = None
    prob: float = 1.0


@dataclass(frozen=True)
class JobSlow:
    """The whole job is slower in steps [start, stop): by `factor` x step time, spent waiting
    (where="wait": checkpoint save, data stall) or computing (where="compute": everyone's compute_s)."""

    start: int
    stop: int
    factor: float = 3.0
    where: str = "wait"


@dataclass(frozen=True)
class DigestFault:
    """`rank` reports a wrong replica digest in steps [start, stop)."""

    rank: int
    start: int
    stop: int | None = None


def _active(start: int, stop: int | None, s: int) -> bool:
    return start <= s and (stop is None or s < stop)


def gen_arrays(topo: Topology, n_steps: int, *, start_step: int = 0, t0: float = 0.0, step_s: float = 1.0,
               compute_frac: float = 0.7, noise: float = 0.015, seed: int = 0,
               stragglers: Sequence[Straggler] = (), slow: Sequence[JobSlow] = (),
               digest_faults: Sequence[DigestFault] = (), loss_spikes: dict[int, float] | None = None,
               grad_spikes: dict[int, float] | None = None, nan_loss: dict[int, Sequence[int] | None] | None = None,
               inf_grad: Iterable[int] = (), compute: bool = True, comm: bool = True,
               numbers: bool = True, digests: bool = True) -> Iterator[dict[str, Any]]:
    """Per step (start_step, start_step + 1, ...), every rank's values as lists indexed by rank.

    Keys: step, ts, step_s, compute_s, comm_wait_s, data_wait_s, loss, grad_norm, replica_digest; a field
    switched off (compute=False, ...) is None.
    """
    rng = np.random.default_rng(seed)
    n = topo.size
    shard = topo.shard.tolist()
    loss_spikes, grad_spikes, nan_loss = loss_spikes or {}, grad_spikes or {}, nan_loss or {}
    inf_grad = set(inf_grad)
    t = t0
    for k in range(n_steps):
        s = start_step + k
        c = compute_frac * step_s * (1 + noise * rng.standard_normal(n))
        for st in stragglers:
            if _active(st.start, st.stop, s) and (st.prob >= 1 or rng.random() < st.prob):
                c[st.rank] *= st.factor
        d = 0.01 * step_s * (1 + noise * np.abs(rng.standard_normal(n)))
        wait = 0.0
        for js in slow:
            if _active(js.start, js.stop, s):
                if js.where == "compute":
                    c *= js.factor
                else:
                    wait += (js.factor - 1) * step_s
        collective = (1 - compute_frac) * step_s * 0.8
        T = float((c + d).max()) + collective + wait  # everyone waits for the slowest
        w = T - c - d
        t += T
        row: dict[str, Any] = {
            "step": s, "ts": (t + 0.002 * rng.random(n)).tolist(), "step_s": (T + 1e-4 * rng.random(n)).tolist(),
            "compute_s": c.tolist() if compute else None, "comm_wait_s": w.tolist() if comm else None,
            "data_wait_s": d.tolist(), "loss": None, "grad_norm": None, "replica_digest": None}
        if numbers:
            lv = (2.0 + math.exp(-s / 2000)) * (1 + 0.01 * rng.standard_normal(n)) * loss_spikes.get(s, 1.0)
            loss = lv.tolist()
            for r in (range(n) if s in nan_loss and nan_loss[s] is None else nan_loss.get(s, ())):
                loss[r] = math.nan
            g = 1.0 * (1 + 0.05 * float(rng.standard_normal())) * grad_spikes.get(s, 1.0)  # global: one value
            row["loss"], row["grad_norm"] = loss, [math.inf if s in inf_grad else g] * n
        if digests:
            dig = [f"{s:08x}-{sh:04x}" for sh in shard]
            for f in digest_faults:
                if _active(f.start, f.stop, s):
                    dig[f.rank] = f"bad{f.rank:05x}-{s:08x}"
            row["replica_digest"] = dig
        yield row


_STEP_ORDER = ("ts", "job", "rank", "step", "step_s", "compute_s", "comm_wait_s", "data_wait_s", "loss", "grad_norm",
               "replica_digest")
assert tuple(f.name for f in dataclasses.fields(Step))[:len(_STEP_ORDER)] == _STEP_ORDER  # built positionally


def gen_steps(topo: Topology, n_steps: int, **kw: Any) -> Iterator[list[Step]]:
    """Per step, the Step records of all ranks in rank order (see `gen_arrays` for the options)."""
    fields = _STEP_ORDER[4:]
    for row in gen_arrays(topo, n_steps, **kw):
        cols = [row[f] if row[f] is not None else [None] * topo.size for f in fields]
        rows = zip(row["ts"], *cols, strict=True)
        yield [Step(ts, topo.job, r, row["step"], *vals) for r, (ts, *vals) in enumerate(rows)]


def gen_columns(topo: Topology, n_steps: int, **kw: Any) -> Iterator[StepColumns]:
    """The same steps as `gen_steps`, as columns without record objects (fast: for long streams)."""
    ranks = np.arange(topo.size)
    for row in gen_arrays(topo, n_steps, **kw):
        floats: dict[str, Any] = {f: row[f] for f in ("step_s", "compute_s", "comm_wait_s") if row[f] is not None}
        for f in ("loss", "grad_norm"):  # NaN there is a reported value, not a missing one
            if row[f] is not None:
                floats[f] = (np.asarray(row[f]), np.ones(topo.size, bool))
        strings = {} if row["replica_digest"] is None else {"replica_digest": row["replica_digest"]}
        yield StepColumns.from_arrays(row["ts"], np.full(topo.size, row["step"]), ranks, strings=strings, **floats)


def interleave_late(batches: Iterable[list[Step]], frac: float = 0.1, seed: int = 1) -> Iterator[list[Step]]:
    """Delay a random `frac` of each step's records until halfway through the next step's records."""
    rng = np.random.default_rng(seed)
    held: list[Step] = []
    for batch in batches:
        late = rng.random(len(batch)) < frac
        now = [r for r, x in zip(batch, late, strict=True) if not x]
        half = len(now) // 2
        yield now[:half] + held + now[half:]
        held = [r for r, x in zip(batch, late, strict=True) if x]
    if held:
        yield held


# --- feeding and checking helpers ------------------------------------------------------------


def feed(det: Any, batches: Iterable[list[Step]], *, batch: bool = False) -> list[Finding]:
    """All findings of a detector fed the batches one record at a time, or one batch at a time."""
    out: list[Finding] = []
    for recs in batches:
        if batch:
            out += det.observe_many(recs)
        else:
            for rec in recs:
                out += det.observe(rec)
    return out


def roundtrip(det: Any, topo: Topology) -> Any:
    """The detector rebuilt from its state after a trip through JSON bytes."""
    st = det.state()
    assert_json_safe(st)
    return type(det).from_state(orjson.loads(orjson.dumps(st)), topo)


def by_type(findings: Iterable[Finding], type_: str) -> list[Finding]:
    return [f for f in findings if f.type == type_]
