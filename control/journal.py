"""The applied-action journal every actuator keeps: what it did, once per action id, across restarts.

The reference controller (`control.controller`) and the fencing adapters (`control.fence`) apply each action
once: an id found in the journal is skipped, so a redelivered action or a restarted actuator reading the topic
again changes nothing. Each entry is appended and fsync'd before the caller goes on.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gangwatch.schemas import Action

REFUSED = "refused-by-breaker"  # the status of an action the tripped fleet breaker refused


@dataclass(frozen=True)
class Outcome:
    """What happened to one node: `what` in words, whether the cluster was `changed`, `error` if it failed."""

    node: str
    what: str
    changed: bool = False
    error: str = ""
    would: bool = False  # a dry run: the node would be changed (what the fleet breaker counts in a dry run)


class AppliedLog:
    """The ids of actions already applied, kept in an append-only JSON-lines file (`path`; None: memory only).

    One line per applied action: `{"id", "at", "type", "job", "incident", "nodes", "status", "outcomes"}`,
    `status` being `applied`, `failed` or `refused-by-breaker` (only `applied` ids are skipped later), one per
    restore: `{"restore": node, "at", "note", "outcome"}`, and one per trip or reset of the fleet breaker:
    `{"breaker": "tripped"|"reset", "at", ...}`. A torn last line (a crash mid-write) is ignored. A line that is
    a bare action id (the reference controller's journal before it was this one) counts as applied.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._ids: set[str] = set()
        self._fenced: list[tuple[float, str]] = []  # (at, node) of every outcome that changed a node
        self.refusals: list[dict[str, Any]] = []  # the refused-by-breaker entries
        if path is not None and path.exists():
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    entry = json.loads(line)
                except ValueError:
                    if line.strip() and not line.lstrip().startswith("{"):  # a bare id: the older journal
                        self._ids.add(line.strip())
                    continue
                if not isinstance(entry, dict):
                    continue
                if entry.get("status") == "applied" and isinstance(entry.get("id"), str):
                    self._ids.add(entry["id"])
                elif entry.get("status") == REFUSED:
                    self.refusals.append(entry)
                at = entry.get("at")
                if isinstance(at, int | float) and isinstance(entry.get("outcomes"), list):
                    self._fenced += [(float(at), o["node"]) for o in entry["outcomes"]
                                     if isinstance(o, dict) and o.get("changed") and isinstance(o.get("node"), str)]

    def __contains__(self, action_id: str) -> bool:
        return action_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def fenced_since(self, since: float) -> set[str]:
        """The distinct nodes this adapter changed (drained, cordoned, tainted, evicted pods of) at `since` or later."""
        return {node for at, node in self._fenced if at >= since}

    def add(self, action: Action, outcomes: Sequence[Outcome], *, ok: bool, at: float | None = None) -> None:
        at = time.time() if at is None else at
        if ok:
            self._ids.add(action.id)
        self._fenced += [(at, o.node) for o in outcomes if o.changed]
        self._append(self._entry(action, outcomes, "applied" if ok else "failed", at))

    def refused(self, action: Action, outcomes: Sequence[Outcome], *, at: float | None = None) -> None:
        """An action the tripped fleet breaker refused: journalled, not applied (a later delivery is tried again)."""
        entry = self._entry(action, outcomes, REFUSED, time.time() if at is None else at)
        self.refusals.append(entry)
        self._append(entry)

    def breaker(self, event: str, info: Mapping[str, Any]) -> None:
        self._append({**info, "breaker": event, "at": info.get("at", time.time())})

    @staticmethod
    def _entry(action: Action, outcomes: Sequence[Outcome], status: str, at: float) -> dict[str, Any]:
        return {"id": action.id, "at": at, "type": action.type, "job": action.job, "incident": action.incident,
                "nodes": list(action.nodes), "status": status, "outcomes": [asdict(o) for o in outcomes]}

    def restored(self, outcome: Outcome, note: str) -> None:
        self._append({"restore": outcome.node, "at": time.time(), "note": note, "outcome": asdict(outcome)})

    def _append(self, entry: dict[str, Any]) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(entry, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
