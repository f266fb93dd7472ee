"""A simulated job controller: answers gangwatch's actions as a real one would, from a ground truth.

The reference controller (`gangwatch.control.controller`) carries actions out on a real torchrun job; this one
only says what would have happened, so the whole loop of active diagnosis runs in replay, in the worker and in
drills: actions in, the `recovery` records a controller sends back out, each at the action's time plus a
configurable delay.

| action | answer |
|---|---|
| `replace`, `evict_group` | accepted, replaced, ckpt_loaded, comm_ready, resumed (`spares` left on `replaced`) |
| `requeue`, `rollback`, `restart_in_process` | accepted, ckpt_loaded, comm_ready, resumed |
| `isolate` | accepted |
| `replay` | `replay_result`: a group fails when it holds a faulty machine |
| `dual_run` | `dual_run_result`: a corrupting machine's digest differs from the reference's, anyone else's agrees |
| `collect_stacks`, `degrade`, `escalate`, `readmit` | nothing (the sidecars, the job itself or a human answer) |

`silent` names action types it never answers (to try the timeouts), `fails` the ones whose restart fails.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection
from dataclasses import dataclass, field

from gangwatch.schemas import Action, Recovery

RESTART_PHASES = ("accepted", "ckpt_loaded", "comm_ready", "resumed")


@dataclass(frozen=True)
class Delays:
    """Seconds from the action to each answer (a replacement's phases add up: accepted, then replaced, ...)."""

    accept_s: float = 1.0
    replace_s: float = 30.0
    ckpt_s: float = 40.0
    comm_s: float = 10.0
    resume_s: float = 5.0
    replay_s: float = 120.0  # one replay phase: every group of it runs at once
    dual_run_s: float = 60.0


@dataclass
class SimulatedController:
    """Answers actions from what is known to be broken: `faulty` machines fail a replay; `corrupting` ones give
    a different digest in a dual run."""

    faulty: frozenset[str] = frozenset()
    corrupting: frozenset[str] = frozenset()
    delays: Delays = field(default_factory=Delays)
    spares: int | None = None  # warm spares held (None: not reported)
    reference: str = "spare-ref"  # the machine a dual run trusts
    silent: frozenset[str] = frozenset()
    fails: frozenset[str] = frozenset()
    answered: set[str] = field(default_factory=set)  # action ids already answered (actions come at least once)

    @classmethod
    def of_truth(cls, truth: dict, **kw) -> SimulatedController:
        """From a simulated scenario's ground truth (`producers.simulate.truth`): its unplanned faults' nodes are
        faulty, its SDC faults' nodes corrupt."""
        faults = [f for f in truth.get("faults", ()) if not f.get("planned") and f.get("class")]
        return cls(faulty=frozenset(n for f in faults for n in f["nodes"]),
                   corrupting=frozenset(n for f in faults if f["class"] == "sdc" for n in f["nodes"]), **kw)

    def answer(self, action: Action) -> list[Recovery]:
        """The records the controller sends back for `action`, in time order (none twice for one action id)."""
        if action.id in self.answered or action.type in self.silent:
            return []
        self.answered.add(action.id)
        d, t = self.delays, action.ts

        def rec(dt: float, phase: str, **kw) -> Recovery:
            return Recovery(ts=round(t + dt, 6), job=action.job, action=action.id, phase=phase, **kw)

        kind = action.type
        if kind == "replay":
            groups = action.extra.get("groups") or []
            return [rec(d.replay_s, "replay_result", results={
                str(g["id"]): "fail" if self.faulty & set(g["nodes"]) else "pass" for g in groups})]
        if kind == "dual_run":
            digests = {n: self._digest(action, n) for n in action.nodes}
            digests[self.reference] = self._digest(action, self.reference)
            return [rec(d.dual_run_s, "dual_run_result", digests=digests, reference=self.reference)]
        if kind == "isolate":
            return [rec(d.accept_s, "accepted")]
        if kind not in ("replace", "evict_group", "requeue", "rollback", "restart_in_process"):
            return []
        out = [rec(d.accept_s, "accepted")]
        at = d.accept_s
        if kind in ("replace", "evict_group"):
            at += d.replace_s
            left = None if self.spares is None else max(0, self.spares - len(action.nodes))
            if self.spares is not None:
                self.spares = left
            out.append(rec(at, "replaced", spares=left))
        if kind in self.fails:
            return [*out, rec(at + d.ckpt_s, "failed")]
        for dt, phase in ((d.ckpt_s, "ckpt_loaded"), (d.comm_s, "comm_ready"), (d.resume_s, "resumed")):
            at += dt
            out.append(rec(at, phase))
        return out

    def _digest(self, action: Action, node: str) -> str:
        """The same step on a healthy machine always gives the same digest; a corrupting one another."""
        salt = node if node in self.corrupting else "healthy"
        return hashlib.sha256(f"{action.job}|{action.incident}|{salt}".encode()).hexdigest()[:16]


def answers(controller: SimulatedController, actions: Collection[Action]) -> list[Recovery]:
    """Every answer to `actions`, in time order."""
    return sorted((r for a in actions for r in controller.answer(a)), key=lambda r: r.ts)
