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
changes the cluster. A dry run needs no cluster: where the node cannot be read
(no `scontrol` here, no Kubernetes API) it says what a real run would do and
that a real run reads the node first (`unread`), and where the fleet's nodes
cannot be counted it says so once and goes on without the breaker (a real run
refuses to fence then, see below).

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

The fleet breaker. The per-job blast-radius guard (triage/safety.py) bounds what
one job's decisions may evict; the adapter sees every job's actions, so it holds
the fleet-wide bound (`Breaker`): before fencing, the distinct nodes it fenced
within `window_s` (1 h; counted from the applied log's outcomes that changed a
node, since the last reset) plus the action's new nodes may not exceed
`max(min_nodes, floor(share * watched))` (5 %, at least 2), `watched` being
`fleet_nodes` when set, else the backend's own node count (`node_count()`,
re-read every 10 min). The first action that would go over it trips the breaker:
the action is refused, and so is every fencing action after it (each logged on
one line and journalled with `status: refused-by-breaker`; not applied, and
nothing retries it by itself), until a person resets it (`Breaker.reset(note)`, the CLI's
`reset-breaker`). The tripped state is a file beside the applied log
(`breaker_path`), written atomically and read before every fencing action, so it
survives restarts and a reset reaches a running adapter. Actions that fence
nothing are never refused. A dry run writes nothing: it counts the nodes it would
fence in memory and trips only in memory, so it tells what a real run would do
without blocking one.
"""

from __future__ import annotations

import getpass
import gzip
import json
import logging
import math
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from gangwatch.control.follow import TopicReader
from gangwatch.control.journal import AppliedLog, Outcome
from gangwatch.schemas import Action, DecodeError, Record, decode
from gangwatch.schemas.topics import TopicSettings

if TYPE_CHECKING:
    from gangwatch.schemas.signature import TopicVerifier

log = logging.getLogger("gangwatch.fence")

FENCING = frozenset({"replace", "isolate", "evict_group", "requeue"})  # those naming nodes
REASON_PREFIX = "gangwatch:"  # how a backend recognizes a node gangwatch fenced


class Backend(Protocol):
    """A cluster manager that can take a node out of service and put it back."""

    name: str

    def fence(self, node: str, action: Action, *, cls: str, act: bool) -> Outcome:
        """Take `node` out of service for `action` (`cls`: the fault class); with `act=False` only say what."""

    def restore(self, node: str, note: str, *, act: bool) -> Outcome:
        """Put `node` back after a confirmed repair, if gangwatch fenced it."""

    # optional: `node_count() -> int`, the nodes the cluster manager knows (the fleet breaker's default fleet)


def drain_reason(action: Action, limit: int = 200) -> str:
    """`gangwatch: <incident> <type>: <reason>` on one line, at most `limit` characters (Slurm and Kubernetes)."""
    text = " ".join(f"{REASON_PREFIX} {action.incident} {action.type}: {action.reason}".split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def unread(node: str, doing: str, why: str, *, would: bool = True) -> Outcome:
    """A dry run's outcome for a node whose state could not be read (`why`): what a real run would do (`doing`)."""
    return Outcome(node, f"would {doing} (dry run; its state could not be read: {why}; a real run reads it first)",
                   would=would)


Report = Callable[[Action, list[Outcome]], None]


def breaker_path(applied: Path) -> Path:
    """The fleet breaker's state file beside an applied log: `slurm-applied.jsonl` -> `slurm-applied.breaker.json`."""
    return applied.with_name(applied.stem + ".breaker.json")


class Breaker:
    """The fleet-wide breaker of a fencing adapter: at most `limit(watched)` distinct nodes fenced per `window_s`.

    `path` holds its state (None: memory only): absent or `{"tripped": false, "reset_at", ...}` when closed,
    `{"tripped": true, "at", "why", ...}` when tripped. It is read at every `state()`, so a reset made by
    another process (the `reset-breaker` command) reaches a running adapter; a file that cannot be read
    counts as tripped (a breaker fails open for nobody). `fleet_nodes`, when set, is the number of watched
    nodes and wins over the backend's count.
    """

    def __init__(self, path: Path | None, *, share: float = 0.05, window_s: float = 3600.0, min_nodes: int = 2,
                 fleet_nodes: int | None = None, clock: Callable[[], float] = time.time) -> None:
        if not 0 < share <= 1:
            raise ValueError(f"the breaker's share must be in (0, 1], not {share}")
        self.path = path
        self.share = share
        self.window_s = window_s
        self.min_nodes = max(1, min_nodes)
        self.fleet_nodes = fleet_nodes
        self.clock = clock
        self._memory: dict[str, Any] = {}  # the state without a file, and a dry run's trip

    def limit(self, watched: int) -> int:
        """The most distinct nodes fenced within the window: `share` of the watched nodes, at least `min_nodes`."""
        return max(self.min_nodes, math.floor(self.share * watched))

    def state(self) -> dict[str, Any]:
        """`{"tripped": bool, ...}`: the file's state, or this process's own trip (a dry run's) when tripped."""
        if self._memory.get("tripped"):
            return dict(self._memory)
        if self.path is None:
            return dict(self._memory) or {"tripped": False}
        try:
            raw = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {"tripped": False}
        except OSError as e:
            return {"tripped": True, "why": f"its state file {self.path} cannot be read ({e})"}
        try:
            st = json.loads(raw)
            if not isinstance(st, dict) or not isinstance(st.get("tripped"), bool):
                raise ValueError("not a breaker state")
        except ValueError as e:
            return {"tripped": True, "why": f"its state file {self.path} is not a breaker state ({e})"}
        return st

    def counting_since(self, st: Mapping[str, Any] | None = None) -> float:
        """Fences count from here: the window's start, or the last reset when that is later."""
        st = self.state() if st is None else st
        reset_at = st.get("reset_at")
        start = self.clock() - self.window_s
        if isinstance(reset_at, int | float) and reset_at >= start:
            return math.nextafter(float(reset_at), math.inf)  # what was fenced up to the reset is over
        return start

    def trip(self, info: Mapping[str, Any], *, persist: bool) -> dict[str, Any]:
        """Trip it (`persist`: in the file, which only a reset clears; else in this process only, a dry run's)."""
        st = {**info, "tripped": True, "at": info.get("at", self.clock())}
        if persist and self.path is not None:
            self._write(st)
        else:
            self._memory = st
        return st

    def reset(self, note: str, *, by: str | None = None) -> dict[str, Any]:
        """Close it after a person looked (`note`: why it is safe to fence again); returns the state it had.

        Fences before the reset no longer count: the window starts afresh at the reset.
        """
        if not note.strip():
            raise ValueError("a reset needs a note saying why fencing may go on")
        was = self.state()
        st = {"tripped": False, "reset_at": self.clock(), "note": note, "by": by or _who(), "was": was}
        if self.path is not None:
            self._write(st)
        self._memory = {} if self.path is not None else st
        return was

    def _write(self, st: Mapping[str, Any]) -> None:
        assert self.path is not None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with tmp.open("w", encoding="utf-8") as f:
            f.write(json.dumps(st, sort_keys=True, indent=1) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        try:
            fd = os.open(self.path.parent, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _who() -> str:
    try:
        return os.environ.get("SUDO_USER") or getpass.getuser()
    except (KeyError, OSError):
        return "?"


class Fencer:
    """Applies each fencing action once through a backend; dry run unless `act`.

    `node_map` renames gangwatch's node ids to the cluster's names (ids not in it
    are used as they are). `report(action, outcomes)` is called for every action
    handled (the CLI prints a line). `retries` and `retry_wait_s` bound the retries
    of a failed backend call. `breaker`: the fleet-wide breaker (None: none), consulted
    before every fencing action; the watched nodes it needs are `breaker.fleet_nodes`,
    else `backend.node_count()`, re-read after `count_ttl_s`.
    """

    def __init__(self, backend: Backend, *, act: bool = False, applied: AppliedLog | None = None,
                 node_map: Mapping[str, str] | None = None, report: Report | None = None, retries: int = 3,
                 retry_wait_s: float = 2.0, sleep: Callable[[float], None] = time.sleep,
                 breaker: Breaker | None = None, count_ttl_s: float = 600.0) -> None:
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
        self.refused = 0
        self.breaker = breaker
        self.count_ttl_s = count_ttl_s
        self._count: tuple[float, int] | None = None  # (when, the backend's node count)
        self._dry_fenced: list[tuple[float, str]] = []  # a dry run's would-be fences, for its breaker
        self.uncounted = ""  # a dry run's reason the breaker was not checked (the fleet's nodes not countable)

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
        nodes = self._nodes(rec)
        held = self._check_breaker(rec, nodes)
        if held is not None:
            return held
        cls = str(rec.extra.get("class") or self._classes.get(rec.incident) or rec.type)
        outcomes = [self._fence(node, rec, cls) for node in nodes]
        ok = not any(o.error for o in outcomes)
        if self.act:
            self.applied.add(rec, outcomes, ok=ok, at=self._now())
        else:
            self._dry_fenced += [(self._now(), o.node) for o in outcomes if o.would or o.changed]
        if not ok:
            self._seen.discard(rec.id)  # a later delivery may try again
        self._emit(rec, outcomes)
        return outcomes

    # --- the fleet breaker ---------------------------------------------------------------------------

    def _now(self) -> float:
        return self.breaker.clock() if self.breaker is not None else time.time()

    def watched(self) -> tuple[int, str]:
        """The watched nodes the breaker's share is of, and where the number comes from."""
        assert self.breaker is not None
        if self.breaker.fleet_nodes is not None:
            return self.breaker.fleet_nodes, "--fleet-nodes"
        count = getattr(self.backend, "node_count", None)
        if count is None:
            raise LookupError(f"{self.backend.name} cannot count its nodes: set the fleet's size (--fleet-nodes)")
        now = time.monotonic()
        if self._count is None or now - self._count[0] >= self.count_ttl_s:
            try:
                self._count = (now, int(count()))
            except Exception as e:  # the scheduler unreachable: the last count if there is one
                if self._count is None:
                    raise LookupError(f"could not count {self.backend.name}'s nodes: {e}") from e
                log.warning("could not count %s's nodes again (%s): the breaker keeps the last count, %d",
                            self.backend.name, e, self._count[1])
        return self._count[1], f"{self.backend.name}'s node count"

    def fenced_in_window(self, st: Mapping[str, Any] | None = None) -> set[str]:
        """The distinct nodes that count against the breaker now (a dry run's would-be fences included)."""
        assert self.breaker is not None
        since = self.breaker.counting_since(st)
        return self.applied.fenced_since(since) | {n for at, n in self._dry_fenced if at >= since}

    def _check_breaker(self, rec: Action, nodes: list[str]) -> list[Outcome] | None:
        """None when the action may fence; else what happened instead (refused, or the fleet not countable)."""
        b = self.breaker
        if b is None:
            return None
        st = b.state()
        if not st.get("tripped"):
            try:
                watched, source = self.watched()
            except LookupError as e:  # like an unreachable scheduler: not applied, delivered again
                if not self.act:  # a dry run needs no cluster: it goes on, and says once what a real run does
                    if not self.uncounted:
                        self.uncounted = str(e)
                        log.warning("%s: the fleet breaker was not checked in this dry run: %s; a real run "
                                    "checks it before fencing and fences nothing while the nodes cannot be "
                                    "counted (--fleet-nodes gives the fleet's size)", self.backend.name, e)
                    return None
                log.error("%s: action %s not applied: the fleet breaker needs the watched nodes: %s",
                          self.backend.name, rec.id, e)
                self._seen.discard(rec.id)
                outcomes = [Outcome(n, "not fenced: the fleet breaker cannot tell the fleet's size", error=str(e))
                            for n in nodes]
                if self.act:
                    self.applied.add(rec, outcomes, ok=False, at=self._now())
                self._emit(rec, outcomes)
                return outcomes
            fenced = self.fenced_in_window(st)
            new = set(nodes) - fenced
            limit = b.limit(watched)
            if not new or len(fenced | new) <= limit:
                return None
            st = b.trip({"why": f"{rec.type} {rec.id} (job {rec.job}) would have made {len(fenced | new)} "
                                f"distinct nodes fenced within {b.window_s:.0f} s, over the limit of {limit} "
                                f"({b.share:.0%} of {watched} watched nodes, from {source}, at least "
                                f"{b.min_nodes})",
                         "action": rec.id, "fenced": sorted(fenced), "limit": limit, "watched": watched,
                         "share": b.share, "window_s": b.window_s, "at": self._now()}, persist=self.act)
            if self.act:
                self.applied.breaker("tripped", st)
            log.error("%s: FLEET BREAKER TRIPPED%s: %s; no node is fenced until a person resets it",
                      self.backend.name, "" if self.act else " (dry run: in this run only)", st["why"])
        self.refused += 1
        self._seen.discard(rec.id)  # delivered again: refused again (or fenced, after a reset), never "applied"
        what = (f"refused by the fleet breaker (tripped {_when(st.get('at'))}: {st.get('why', '?')})"
                + ("" if self.act else " (dry run)"))
        outcomes = [Outcome(n, what) for n in nodes]
        log.warning("%s: refused by the fleet breaker: %s %s (job %s, incident %s, nodes %s) not fenced",
                    self.backend.name, rec.type, rec.id, rec.job, rec.incident, ",".join(nodes))
        if self.act:
            self.applied.refused(rec, outcomes, at=self._now())
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


def _when(ts: Any) -> str:
    if not isinstance(ts, int | float):
        return "at an unknown time"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


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
    """The alert topic (`gw.actions`, prefix from the topic settings) through a consumer group (`control.follow`:
    a new group starts at the end unless `from_beginning`; offsets committed after each poll was handled). Only
    actions whose signature `verify` accepts are handed out (the others are logged, one line each)."""

    def __init__(self, bootstrap: str, topics: TopicSettings, group: str, *, verify: TopicVerifier,
                 from_beginning: bool = False) -> None:
        super().__init__(bootstrap, [topics.actions], group, from_beginning=from_beginning, verify=verify)


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
