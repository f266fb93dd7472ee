"""Shadow mode: every action gangwatch would take is recorded and sent nowhere, then scored against what the job
did on its own, so an operator turns automation on for a measured precision, not on faith.

With `TriageConfig.shadow` (worker-wide), or an `ops` record of type `shadow` for one job (`act` ends it), an
action goes to `Outputs.shadow` instead of `Outputs.actions`: the store and `shadow.jsonl` keep it (`shadow` 1
in `gw_actions`); the alert topic, the webhook, Alertmanager and the fencing adapters never see it, and its
incident carries `shadow: true` (Alertmanager leaves it out).

Each would-be eviction and page is watched for `window_s` after it, on event time, and re-emitted once with a
verdict (`extra.verdict`: `true` or `false`, and `why`):

| would-be action                      | false when                                                      |
|--------------------------------------|-----------------------------------------------------------------|
| an eviction after a stop of the job  | the job stepped past the stall with the node still in it        |
| (fail-stop, hang, stall)             |                                                                 |
| an eviction of a straggler           | no new finding named the node within the window (it went away)  |
| a page (escalate)                    | the job stepped past the stall by itself within the window      |

Anything else is `true`: the job stayed down without the action, or the node kept being named. `gangwatch
shadow` prints precision (true / scored) per job and action type.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gangwatch.schemas import EVICTING_ACTIONS, Action, Finding, Outputs, decode_obj, to_dict
from gangwatch.schemas.classes import CLASSES

STOPS_THE_JOB = frozenset(n for n, c in CLASSES.items() if c.stops_the_job)  # the job makes no progress
SCORED = EVICTING_ACTIONS | {"escalate"}


class Shadow:
    """Would-be actions of one job waiting for their verdict."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.watch: list[dict[str, Any]] = []  # {"action", "cls", "stall_step", "until", "named"}

    def would(self, a: Action, cls: str, stall_step: int, out: Outputs) -> None:
        """Record a would-be action; evictions and pages are watched for their verdict."""
        a = replace(a, extra={**a.extra, "shadow": True})
        out.shadow.append(a)
        if a.type in SCORED:
            self.watch.append({"action": to_dict(a), "cls": cls, "stall_step": stall_step,
                               "until": a.ts + self.window_s, "named": False})

    def on_finding(self, f: Finding) -> None:
        """A fault finding naming a watched eviction's node after it: the node was not fine after all."""
        for w in self.watch:
            if f.node and f.ts > w["action"]["ts"] and f.node in w["action"]["nodes"]:
                w["named"] = True

    def on_progress(self, step: int, ts: float, out: Outputs) -> None:
        """The job stepped on: a stop it was paged or evicted for ended without anyone acting."""
        for w in list(self.watch):
            if w["cls"] in STOPS_THE_JOB and step > w["stall_step"] and ts > w["action"]["ts"]:
                what = "the node trained on" if w["action"]["type"] != "escalate" else "nobody had to act"
                self._verdict(w, False, f"the job stepped past step {w['stall_step']} at {ts:.3f}: {what}", ts, out)

    def advance(self, now: float, out: Outputs) -> None:
        for w in list(self.watch):
            if now < w["until"]:
                continue
            a = w["action"]
            if a["type"] != "escalate" and w["cls"] not in STOPS_THE_JOB and not w["named"]:
                self._verdict(w, False, f"nothing named {', '.join(a['nodes'])} again within {self.window_s:g} s",
                              now, out)
            elif w["cls"] in STOPS_THE_JOB:
                self._verdict(w, True, f"the job made no progress within {self.window_s:g} s without it", now, out)
            else:
                self._verdict(w, True, f"{', '.join(a['nodes']) or 'the job'} kept being named", now, out)

    def _verdict(self, w: dict[str, Any], right: bool, why: str, ts: float, out: Outputs) -> None:
        self.watch.remove(w)
        a = decode_obj(w["action"])
        out.shadow.append(replace(a, extra={**a.extra, "shadow": True, "verdict": "true" if right else "false",
                                            "why": why, "scored_ts": round(ts, 6)}))

    def state(self) -> list[dict[str, Any]]:
        return self.watch

    @classmethod
    def from_state(cls, state: list[dict[str, Any]], window_s: float) -> Shadow:
        s = cls(window_s)
        s.watch = [dict(w) for w in state]
        return s
