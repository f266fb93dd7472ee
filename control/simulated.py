"""The reference controller's simulated mode: no job runs; each action is answered from a ground truth, on time.

    gangwatch controller --simulate sim/sim.truth.json --job sim
    gangwatch controller --simulate n003,n007 --job j1 --replace-delay 45

For drills (`gangwatch drill`) and for trying the whole loop without GPUs. It reads the job's signed actions
from the alert topic as the real controller does (`control.controller.TopicSource`), answers each with
`producers.simulate.controller.SimulatedController` (which records a controller sends back for which action,
after which delay) and publishes the answers where the real controller does (`control.controller.Publisher`:
`recovery` on `gw.ops`, `lifecycle` on `gw.telemetry`), each when it is due on the clock: an answer due 30 s
after the action is sent 30 s after the controller took the action, stamped with the clock then.

The clock is wall time, or a faster one for a drill that runs its job's time faster
(`EventClock`: event time = origin + (now - origin) x speed); the delays are in that time.

Restarts are announced as the real controller announces them: an action answered by a restart (`RESTARTS`)
gets a job-level `lifecycle` `restart` (source `controller`, reason "<type> <id>") right after its
`accepted`, so the job's silence until `resumed` is expected, not a fault.

Checkpoints: when the truth names checkpoints (`benign.checkpoints`: `{step, ts, end_ts}`, as `gangwatch
simulate` writes them), each `ckpt_loaded` carries the newest one saved before the action was accepted, as
`extra.checkpoint` ("step-<N>") and `extra.step` (N): what a restore check reads (docs/drills.md). The truth
file is read again when it changes, so a drill that adds the checkpoints its job saves has them named; the
faulty and corrupting machines are the ones it named at the start.

Once means once within a run (an action id is answered once); the mode keeps no journal, so a restarted
simulated controller answers again what its group re-reads.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import orjson
from gangwatch.producers.simulate.responder import SimulatedController
from gangwatch.schemas import Action, Lifecycle, Record, Recovery

log = logging.getLogger("gangwatch.controller")

RESTARTS = frozenset({"replace", "evict_group", "requeue", "rollback", "restart_in_process"})

Publish = Callable[[Record], None]
Checkpoints = Callable[[], list[dict[str, Any]]]  # the job's checkpoints so far: {step, ts, end_ts}


class EventClock:
    """The clock answers are due and stamped on: wall time, or `speed` times as fast from `origin` (epoch s)."""

    def __init__(self, speed: float = 1.0, origin: float | None = None,
                 wall: Callable[[], float] = time.time) -> None:
        if speed <= 0:
            raise ValueError(f"the clock's speed must be > 0, got {speed:g}")
        self.speed, self.wall = speed, wall
        self.origin = wall() if origin is None else origin

    def __call__(self) -> float:
        return self.origin + (self.wall() - self.origin) * self.speed

    def wall_seconds(self, event_s: float) -> float:
        """Wall seconds that `event_s` seconds of this clock take."""
        return event_s / self.speed


def read_truth(path: Path) -> dict[str, Any]:
    """A scenario's ground truth (`NAME.truth.json`); ValueError with what to give instead."""
    try:
        truth = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e}); want a scenario's NAME.truth.json") from None
    if not isinstance(truth, dict) or not isinstance(truth.get("faults"), list):
        raise ValueError(f"{path}: no `faults` list in it; want the NAME.truth.json `gangwatch simulate` writes "
                         "beside NAME.jsonl.gz")
    return truth


def controller_of(spec: str, **kw: Any) -> tuple[SimulatedController, Path | None]:
    """The simulated controller `spec` names: a truth file (`*.json`: its faults' machines are faulty, its SDC
    faults' machines corrupt) or faulty machines, comma-separated (each also corrupt); and the truth file."""
    if spec.endswith(".json"):
        path = Path(spec)
        return SimulatedController.of_truth(read_truth(path), **kw), path
    nodes = frozenset(n.strip() for n in spec.split(",") if n.strip())
    if not nodes:
        raise ValueError(f"--simulate {spec!r}: name the faulty machines (n003,n007) or a NAME.truth.json")
    return SimulatedController(faulty=nodes, corrupting=nodes, **kw), None


def truth_checkpoints(path: Path) -> Checkpoints:
    """The checkpoints of the truth at `path` (`benign.checkpoints`), read again whenever the file changes; a file
    being replaced or unreadable for a moment gives the ones read before."""
    seen: dict[str, Any] = {"mtime": None, "list": []}

    def read() -> list[dict[str, Any]]:
        try:
            mtime = path.stat().st_mtime_ns
            if mtime != seen["mtime"]:
                seen["list"] = list((orjson.loads(path.read_bytes()).get("benign") or {}).get("checkpoints") or ())
                seen["mtime"] = mtime
        except (OSError, orjson.JSONDecodeError, AttributeError):
            pass
        return seen["list"]

    return read


class SimulatedMode:
    """One job's actions in, their answers out when due. `handle` schedules, `tick` publishes what is due.

    Invariants: every answer is published once, no earlier than its due time, stamped with `clock()` at
    publication (never earlier than its due time); answers of one action keep their order.
    """

    def __init__(self, job: str, controller: SimulatedController, publish: Publish, clock: Callable[[], float],
                 checkpoints: Checkpoints | None = None) -> None:
        self.job, self.controller, self.publish, self.clock = job, controller, publish, clock
        self.checkpoints = checkpoints
        self._due: list[tuple[float, int, Record]] = []  # (due, order, answer as computed): a heap
        self._order = itertools.count()
        self._accepted: dict[str, float] = {}  # action id -> when its `accepted` was published

    def handle(self, action: Action) -> int:
        """Schedule the answers to `action` (none for another job's, or an id answered before); how many."""
        if action.job != self.job:
            return 0
        answers = self.controller.answer(action)
        if not answers:
            return 0
        now = self.clock()
        log.info("action %s: %s %s: %d answer(s) from %+.1f s", action.id, action.type,
                 ",".join(action.nodes) or "-", len(answers), answers[0].ts - action.ts)
        for r in answers:
            self._push(now + (r.ts - action.ts), r)
            if r.phase == "accepted" and action.type in RESTARTS:
                self._push(now + (r.ts - action.ts), Lifecycle(ts=r.ts, job=action.job, event="restart",
                                                              reason=f"{action.type} {action.id}"[:256],
                                                              source="controller"))
        return len(answers)

    def _push(self, due: float, rec: Record) -> None:
        heapq.heappush(self._due, (due, next(self._order), rec))

    def next_due(self) -> float | None:
        """The clock time of the next answer (None: nothing waits)."""
        return self._due[0][0] if self._due else None

    def tick(self) -> int:
        """Publish every answer now due, in order; how many."""
        n = 0
        while self._due and self._due[0][0] <= self.clock():
            _, _, rec = heapq.heappop(self._due)
            stamped = dataclasses.replace(rec, ts=round(self.clock(), 6))
            if isinstance(stamped, Recovery) and stamped.phase == "accepted":
                self._accepted[stamped.action] = stamped.ts
            if isinstance(stamped, Recovery) and stamped.phase == "ckpt_loaded":
                stamped = self._with_checkpoint(stamped)
            self.publish(stamped)
            log.info("%s %s: %s", stamped.kind, getattr(stamped, "action", None) or stamped.job,
                     getattr(stamped, "phase", None) or getattr(stamped, "event", ""))
            n += 1
        return n

    def _with_checkpoint(self, rec: Recovery) -> Recovery:
        """`rec` naming the newest checkpoint saved before the controller accepted its action (the job stopped
        there), unchanged when there is none."""
        stopped = self._accepted.get(rec.action, rec.ts)
        saved = [c for c in (self.checkpoints() if self.checkpoints else ())
                 if isinstance(c.get("step"), int) and float(c.get("end_ts") or c.get("ts") or 0) <= stopped]
        if not saved:
            return rec
        newest = max(saved, key=lambda c: (float(c.get("end_ts") or c.get("ts")), c["step"]))
        return dataclasses.replace(rec, extra={**rec.extra, "checkpoint": f"step-{newest['step']}",
                                               "step": newest["step"]})


class ActionSource(Protocol):
    def poll(self, timeout_s: float) -> list[Any]: ...

    def commit(self) -> None: ...


def run(mode: SimulatedMode, source: ActionSource, stop: threading.Event, wall_s: Callable[[float], float],
        poll_s: float = 0.25) -> None:
    """Answer what arrives until `stop` is set: each poll waits at most until the next answer is due
    (`wall_s` turns the clock's seconds into wall seconds)."""
    while not stop.is_set():
        nxt = mode.next_due()
        wait = poll_s if nxt is None else min(poll_s, max(0.0, wall_s(nxt - mode.clock())))
        for rec in source.poll(wait):
            if isinstance(rec, Action):
                mode.handle(rec)
        source.commit()
        mode.tick()

