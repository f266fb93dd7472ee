"""Apply gangwatch's node actions to a cluster manager, once: the loop the Slurm and Kubernetes adapters share.

    fencer = Fencer(SlurmBackend(), act=False, applied=AppliedLog(Path("slurm-applied.jsonl")))
    for rec in read_records(Path("out/actions.jsonl")):
        fencer.handle(rec)

What is applied. An `action` whose type takes nodes out of service
(`replace`, `isolate`, `evict_group`, and a `requeue` that names nodes: it
restarts the job *without* them; `FENCING`) has each of its nodes
*fenced* by the backend: drained in Slurm, cordoned and tainted in
Kubernetes, so no new work lands there. Every other action (rollback, degrade,
a requeue naming no node, escalate, collect_stacks, ...) is the job controller's or a
human's business and is passed over with a line saying so. Records that are
not actions are ignored, except `incident` records, whose class is remembered
to name the fault (the Kubernetes taint's value).

Bringing a node back is never automatic. A fenced node returns only through
`Fencer.restore(nodes, note)`, the `gangwatch slurm|kubernetes resume NODE...
--repaired NOTE --act` command, which an operator runs once the repair is
confirmed; the note is kept in the applied log. A backend restores only nodes
that gangwatch itself fenced (a drain reason starting `gangwatch:`, the
gangwatch taint), never an operator's own drain or cordon.

Dry run is the default: the backend reads the node and says what it would do,
changes nothing, and the applied log is read but not written. `act=True`
changes the cluster.

Once means once. Delivery to the adapter is at least once (the topic can be
re-read, a file re-run), and `Action.id` is an idempotency key. The ids of
applied actions are appended to the applied log (`AppliedLog`, JSON lines,
flushed and fsynced before the next action) and skipped when seen again, in
this run or a later one. The backends are idempotent on their own as well: a
node already drained or tainted by gangwatch is left as it is. An action whose
backend call failed (scheduler unreachable) is retried `retries` times, then
logged as failed and *not* counted as applied, so a later delivery tries again:
`follow` stops without committing the topic's offsets (`FenceError`), so the
action is delivered again when the adapter is restarted.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from gangwatch.schemas import Action, DecodeError, Record, decode
from gangwatch.streams.follow import TopicReader
from gangwatch.streams.topics import TopicSettings

log = logging.getLogger("gangwatch.fence")

FENCING = frozenset({"replace", "isolate", "evict_group", "requeue"})  # those naming nodes
REASON_PREFIX = "gangwatch:"  # how a backend recognizes a node gangwatch fenced


@dataclass(frozen=True)
class Outcome:
    """What happened to one node: `what` in words, whether the cluster was `changed`, `error` if it failed."""

    node: str
    what: str
    changed: bool = False
    error: str = ""


class Backend(Protocol):
    """A cluster manager that can take a node out of service and put it back."""

    name: str

    def fence(self, node: str, action: Action, *, cls: str, act: bool) -> Outcome:
        """Take `node` out of service for `action` (`cls`: the fault class); with `act=False` only say what."""

    def restore(self, node: str, note: str, *, act: bool) -> Outcome:
        """Put `node` back after a confirmed repair, if gangwatch fenced it."""


def drain_reason(action: Action, limit: int = 200) -> str:
    """`gangwatch: <incident> <type>: <reason>` on one line, at most `limit` characters (Slurm and Kubernetes)."""
    text = " ".join(f"{REASON_PREFIX} {action.incident} {action.type}: {action.reason}".split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class AppliedLog:
    """The ids of actions already applied, kept in an append-only JSON-lines file (`path`; None: memory only).

    One line per applied action: `{"id", "at", "type", "job", "incident", "nodes", "status", "outcomes"}`,
    `status` being `applied` or `failed` (only `applied` ids are skipped later), and one per restore:
    `{"restore": node, "at", "note", "outcome"}`. A torn last line (a crash mid-write) is ignored.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._ids: set[str] = set()
        if path is not None and path.exists():
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if isinstance(entry, dict) and entry.get("status") == "applied" and isinstance(entry.get("id"), str):
                    self._ids.add(entry["id"])

    def __contains__(self, action_id: str) -> bool:
        return action_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def add(self, action: Action, outcomes: Sequence[Outcome], *, ok: bool) -> None:
        if ok:
            self._ids.add(action.id)
        self._append({"id": action.id, "at": time.time(), "type": action.type, "job": action.job,
                      "incident": action.incident, "nodes": list(action.nodes),
                      "status": "applied" if ok else "failed", "outcomes": [asdict(o) for o in outcomes]})

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


Report = Callable[[Action, list[Outcome]], None]


class Fencer:
    """Applies each fencing action once through a backend; dry run unless `act`.

    `node_map` renames gangwatch's node ids to the cluster's names (ids not in it
    are used as they are). `report(action, outcomes)` is called for every action
    handled (the CLI prints a line). `retries` and `retry_wait_s` bound the retries
    of a failed backend call.
    """

    def __init__(self, backend: Backend, *, act: bool = False, applied: AppliedLog | None = None,
                 node_map: Mapping[str, str] | None = None, report: Report | None = None, retries: int = 3,
                 retry_wait_s: float = 2.0, sleep: Callable[[float], None] = time.sleep) -> None:
        self.backend = backend
        self.act = act
        self.applied = applied if applied is not None else AppliedLog(None)
        self.node_map = dict(node_map or {})
        self._report = report
        self.retries = retries
        self.retry_wait_s = retry_wait_s
        self._sleep = sleep
        self._seen: set[str] = set()  # handled in this run (dry runs included)
        self._classes: OrderedDict[str, str] = OrderedDict()  # incident id -> class, from incident records
        self.handled = 0
        self.duplicates = 0

    def handle(self, rec: Record) -> list[Outcome]:
        """Apply one record (only fencing actions do anything); returns what happened to each node."""
        if rec.kind == "incident":
            self._classes[rec.id] = rec.cls
            self._classes.move_to_end(rec.id)
            if len(self._classes) > 10_000:
                self._classes.popitem(last=False)
            return []
        if not isinstance(rec, Action):
            return []
        if rec.id in self._seen or rec.id in self.applied:
            self.duplicates += 1
            log.info("action %s (%s) was applied before: skipped", rec.id, rec.type)
            self._emit(rec, [Outcome(n, "already applied (same action id)") for n in self._nodes(rec)])
            return []
        self._seen.add(rec.id)
        self.handled += 1
        if rec.type not in FENCING or not rec.nodes:
            outcomes = [Outcome("-", f"{rec.type}: nothing for {self.backend.name} to do")]
            self._emit(rec, outcomes)
            return outcomes
        cls = str(rec.extra.get("class") or self._classes.get(rec.incident) or rec.type)
        outcomes = [self._fence(node, rec, cls) for node in self._nodes(rec)]
        ok = not any(o.error for o in outcomes)
        if self.act:
            self.applied.add(rec, outcomes, ok=ok)
        if not ok:
            self._seen.discard(rec.id)  # a later delivery may try again
        self._emit(rec, outcomes)
        return outcomes

    def restore(self, nodes: Sequence[str], note: str) -> list[Outcome]:
        """Put nodes back after a confirmed repair (`note` says which: a ticket, who checked)."""
        if not note.strip():
            raise ValueError("a restore needs a note saying how the repair was confirmed")
        out = []
        for node in nodes:
            o = self.backend.restore(self.node_map.get(node, node), note, act=self.act)
            if self.act:
                self.applied.restored(o, note)
            out.append(o)
        return out

    def _nodes(self, action: Action) -> list[str]:
        return [self.node_map.get(n, n) for n in action.nodes]

    def _fence(self, node: str, action: Action, cls: str) -> Outcome:
        for attempt in range(self.retries + 1):
            o = self.backend.fence(node, action, cls=cls, act=self.act)
            if not o.error:
                return o
            if attempt < self.retries:
                log.warning("%s: %s for action %s failed (%s); retry %d of %d", self.backend.name, node, action.id,
                            o.error, attempt + 1, self.retries)
                self._sleep(self.retry_wait_s * 2 ** attempt)
        log.error("%s: %s for action %s failed: %s; not counted as applied", self.backend.name, node, action.id,
                  o.error)
        return o

    def _emit(self, action: Action, outcomes: list[Outcome]) -> None:
        if self._report is not None:
            self._report(action, outcomes)


# --- where actions come from ---------------------------------------------------------------------


def read_records(path: Path) -> Iterator[Record]:
    """The records of a JSONL or gzipped JSONL file (batches unpacked); lines that do not decode are logged."""
    with path.open("rb") as raw:
        gz = raw.read(2) == b"\x1f\x8b"
    opener = gzip.open if gz else open
    with opener(path, "rb") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            for rec in decode(line):
                if isinstance(rec, DecodeError):
                    log.warning("%s:%d: skipped, does not decode: %s", path, n, rec.reason)
                else:
                    yield rec


class ActionTopic(TopicReader):
    """The alert topic (`gw.actions`, prefix from the topic settings) through a consumer group (`streams.follow`:
    a new group starts at the end unless `from_beginning`; offsets committed after each poll was handled)."""

    def __init__(self, bootstrap: str, topics: TopicSettings, group: str, *, from_beginning: bool = False) -> None:
        super().__init__(bootstrap, [topics.actions], group, from_beginning=from_beginning)


class FenceError(ConnectionError):
    """An action could not be applied within its retries (the scheduler is unreachable or refuses)."""


def follow(fencer: Fencer, source: ActionTopic, stop: threading.Event, *, idle_timeout_s: float | None = None,
           poll_s: float = 0.5) -> None:
    """Apply what arrives on the topic until `stop` is set, or nothing arrived for `idle_timeout_s`.

    An action that fails for good raises `FenceError` before the offsets are committed: the
    adapter stops (its supervisor restarts it) and the action is delivered again, while the
    ones already applied are skipped by their ids.
    """
    last = time.monotonic()
    while not stop.is_set():
        recs = source.poll(poll_s)
        for rec in recs:
            failed = [o for o in fencer.handle(rec) if o.error]
            if failed:
                raise FenceError(f"action {rec.id} ({rec.kind}) not applied: "
                                 + "; ".join(f"{o.node}: {o.error}" for o in failed))
        source.commit()
        if recs:
            last = time.monotonic()
        elif idle_timeout_s is not None and time.monotonic() - last >= idle_timeout_s:
            return
