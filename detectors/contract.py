"""The detector contract as checks a detector can run on itself, like river's `check_estimator`.

    from gangwatch.detectors.contract import check_detector
    check_detector(MyDetector, records)   # raises AssertionError naming the first property broken

`records` is a realistic stream of one job in event-time order, starting with its `job` record (the project's
own test streams are small simulated jobs, one per fault: tests/contract/harness.py). Each detector is driven
as `JobMonitor` drives it (`Driver`): the first `job` record gives the topology, a later one is passed to
`set_topology`; time moves by the job's own clock (`ClockDetector`), which takes each node's clock offset out of
the records the detector reads; only the kinds in `det.kinds` are observed, and a final `advance` closes the
run. The properties, one `check_*` function each:

- the protocol: name, kinds, methods, a fresh state that round-trips, findings from silence that are valid;
- determinism: two fresh instances, the same records -> the same findings, ids included;
- findings are valid contract records (encode -> decode gives them back), of the stream's job, with unique ids,
  carrying the detector's name;
- state: `state()` mid-stream is plain JSON (no numpy scalars, no NaN/Inf, str keys), a snapshot that later
  records do not change, and `from_state` continues exactly as the original would have;
- input records are not mutated;
- records out of order within a small lateness give the same kinds of findings on the same nodes;
- ranks beyond the topology, unknown nodes and a topology that grows (then shrinks) mid-stream raise nothing.

What needs a test runner stays in tests/contract/test_detectors.py: every optional field missing, no wall clock
read (clocks patched), the same findings in another process with another hash seed.

Adding a detector: its module, its line in `detectors/catalog.py`, its tests; the contract suite runs these
checks on every detector the catalog lists, over every stream of the harness.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
from collections.abc import Iterable, Sequence
from typing import Any

from gangwatch.detectors.clocks import ClockDetector
from gangwatch.detectors.topology import Topology
from gangwatch.schemas import KINDS, DecodeError, Finding, Job, RankInfo, Record, decode, decode_obj, encode, to_dict

LATENESS_S = 0.5  # out-of-order records: adjacent records closer than this may swap


class Driver:
    """Detectors, their topology, and the records they have been fed, with the job's clock as `JobMonitor` keeps
    it: time moves by the job's own time (`ClockDetector.now`) and each detector reads each record with its node's
    clock offset taken out (the clock detector itself reads them raw).

    `det` is the detector under test; `others` are more, driven beside it on the same clock (a suite checking many
    detectors on one stream pays for the clock once): each one's findings are its own (`feed_each`), and are what
    it finds driven alone, as none of them changes the clock or the records (test_detectors.py compares the two)."""

    def __init__(self, det: Any, topo: Topology, clock: ClockDetector | None = None,
                 others: Sequence[Any] = ()) -> None:
        self.det, self.topo = det, topo
        self.dets = (det, *others)
        clocks = [d for d in self.dets if isinstance(d, ClockDetector)]
        self.clock = clocks[0] if clocks else clock or ClockDetector(topo)
        for d in self.dets:
            if hasattr(d, "clock") and d is not self.clock:
                d.clock = self.clock
        self._mine = next((i for i, d in enumerate(self.dets) if d is self.clock), None)  # the clock, if under test
        self.last_ts: float | None = None

    @classmethod
    def fresh(cls, det_cls: type, recs: Sequence[Record], others: Sequence[type] = ()) -> Driver:
        topo = Topology.from_job(recs[0])
        return cls(det_cls(topo), topo, others=[o(topo) for o in others])

    def feed_each(self, rec: Record) -> list[list[Finding]]:
        """Each detector's findings of one more record (in `dets` order). The others advance first, then the clock
        (its own findings where it is one of `dets`), as where it is not under test the clock moves after the
        detector; a record's kinds are observed by the clock first (raw), then by the others (corrected)."""
        clock = self.clock
        if rec.kind != "job":
            clock.heard(rec)
        now = max(clock.now(), self.topo.ts)
        outs = [[] if d is clock else d.advance(now) for d in self.dets]
        ticked = clock.advance(now)
        mine = None if self._mine is None else outs[self._mine]
        if mine is not None:
            mine += ticked
        self.last_ts = now if self.last_ts is None else max(self.last_ts, now)
        if rec.kind == "job":
            if rec.ts > self.topo.ts or rec.ranks != list(self.topo.ranks):  # not the job record it started from
                self.set_topology(Topology.from_job(rec))
            return outs
        if rec.kind in clock.kinds:
            seen = clock.observe(rec)
            if mine is not None:
                mine += seen
        corrected = None
        for d, out in zip(self.dets, outs, strict=True):
            if d is not clock and rec.kind in d.kinds:
                corrected = clock.corrected(rec) if corrected is None else corrected
                out += d.observe(corrected)
        return outs

    def feed(self, rec: Record) -> list[Finding]:
        """The findings of the detector under test (`det`) of one more record."""
        return self.feed_each(rec)[0]

    def set_topology(self, topo: Topology) -> None:
        self.topo = topo
        for d in self.dets:
            d.set_topology(topo)
        if self.clock not in self.dets:
            self.clock.set_topology(topo)

    def finish_each(self) -> list[list[Finding]]:
        """Each detector's findings at the end of the input (the clock last, as it moves after the others)."""
        if self.last_ts is None:
            return [[] for _ in self.dets]
        outs = [[] if d is self.clock else d.advance(self.last_ts) for d in self.dets]
        for d, out in zip(self.dets, outs, strict=True):
            if d is self.clock:
                out += d.advance(self.last_ts)
        return outs

    def finish(self) -> list[Finding]:
        return self.finish_each()[0]

    def run_each(self, recs: Iterable[Record]) -> list[list[Finding]]:
        outs: list[list[Finding]] = [[] for _ in self.dets]
        for rec in recs:
            for out, found in zip(outs, self.feed_each(rec), strict=True):
                out += found
        for out, found in zip(outs, self.finish_each(), strict=True):
            out += found
        return outs

    def run(self, recs: Iterable[Record]) -> list[Finding]:
        return self.run_each(recs)[0]


def run(det_cls: type, recs: Sequence[Record]) -> list[Finding]:
    """The findings of a fresh `det_cls` driven over `recs` (the first a `job` record)."""
    return Driver.fresh(det_cls, recs).run(recs)


def run_each(det_classes: Sequence[type], recs: Sequence[Record]) -> dict[str, list[Finding]]:
    """Detector name -> the findings of a fresh instance of each of `det_classes`, driven together over `recs` on
    one clock: what `run` gives each alone, for the clock's cost once."""
    first, *others = det_classes
    drv = Driver.fresh(first, recs, others)
    return {cls.name: out for cls, out in zip(det_classes, drv.run_each(recs), strict=True)}


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """A detector's state saved before record `at` of a traced run, and what restoring it there needs."""

    at: int
    state: Any  # what `state()` returned, kept: later records must not change it (no aliasing)
    blob: bytes  # ... and its bytes then
    found: int  # how many findings came before it
    topo: Topology
    clock: bytes | None  # the job's clock's state (None where the detector is the clock)
    last_ts: float | None  # the driver's time


@dataclasses.dataclass(frozen=True)
class Trace:
    """A detector's in-order run over a stream: its findings, after how many records each batch of them came, and
    its state saved at every cut point (`cut_points`). One run gives all three, so that a suite keeping its
    in-order run for the other properties need not drive the detector over the stream again for the state's."""

    findings: list[Finding]
    emitted: list[int]
    snapshots: dict[int, Snapshot]


def trace(det_cls: type, recs: Sequence[Record]) -> Trace:
    """`run`, with its `Trace`: the state is saved at the cut points known before the run, and after every batch
    of findings (those but the first and the last are dropped at the end)."""
    fixed = set(_fixed_cuts(det_cls, recs))
    drv, out, emitted, snaps = Driver.fresh(det_cls, recs), [], [], {}

    def save(at: int) -> None:
        if at not in snaps and 0 < at < len(recs):
            st = drv.det.state()
            clock = None if drv.clock is drv.det else _dumps(drv.clock.state())
            snaps[at] = Snapshot(at, st, _dumps(st), len(out), drv.topo, clock, drv.last_ts)

    for i, rec in enumerate(recs):
        if i in fixed:
            save(i)
        found = drv.feed(rec)
        if found:
            out += found
            emitted.append(i + 1)
            save(i + 1)
    out += drv.finish()
    keep = set(cut_points(det_cls, recs, emitted))
    return Trace(out, emitted, {at: snap for at, snap in sorted(snaps.items()) if at in keep})


def wire_list(findings: Iterable[Finding]) -> list[dict[str, Any]]:
    """Findings as wire dicts: compares every field, `extra` and the id included."""
    return [to_dict(f) for f in findings]


def kinds_and_nodes(findings: Iterable[Finding]) -> set[tuple[str, str, str | None]]:
    return {(f.type, f.detector, f.node) for f in findings}


def assert_json_safe(obj: Any, path: str = "$") -> None:
    """Only plain JSON values: dicts with str keys, lists, str, int, finite float, bool, None (exact types)."""
    t = type(obj)
    if t is dict:
        for k, v in obj.items():
            assert type(k) is str, f"{path}: key {k!r} is a {type(k).__name__}, not a str"
            assert_json_safe(v, f"{path}.{k}")
    elif t is list:
        for i, v in enumerate(obj):
            assert_json_safe(v, f"{path}[{i}]")
    elif t is float:
        assert math.isfinite(obj), f"{path}: {obj} (JSON has no NaN/Infinity)"
    else:
        assert obj is None or t in (str, int, bool), f"{path}: a {t.__module__}.{t.__name__} is not a JSON value"


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def _loads(blob: bytes) -> Any:
    return json.loads(blob)


# --- the checks ------------------------------------------------------------------------------------------------


def check_protocol(cls: type, job: Job) -> None:
    """What `JobMonitor` relies on: a name, the kinds it observes, the methods, a classmethod `from_state`; a fresh
    detector's state is plain JSON and round-trips; what it finds in silence (no record ever) is valid."""
    assert isinstance(cls.name, str) and cls.name
    assert isinstance(cls.kinds, frozenset) and cls.kinds and cls.kinds <= set(KINDS) - {"job"}
    for method in ("observe", "advance", "set_topology", "state"):
        assert callable(getattr(cls, method, None)), method
    assert isinstance(cls.__dict__.get("from_state"), classmethod)
    topo = Topology.from_job(job)
    st = cls(topo).state()
    assert_json_safe(st)
    assert _loads(_dumps(cls.from_state(_loads(_dumps(st)), topo).state())) == st
    for f in cls(topo).advance(topo.ts + 3600.0):  # silence from the start (fail-stop: nobody ever came up)
        assert decode(encode(f)) == [f]


def check_deterministic(cls: type, recs: Sequence[Record], reference: Sequence[Finding] | None = None,
                        again: Sequence[Finding] | None = None) -> None:
    """A fresh instance fed the same records finds the same, ids included (`again`: what another fresh instance
    found, where the caller has it: `run_each`'s, driven beside other detectors, must be the same too)."""
    reference = run(cls, recs) if reference is None else reference
    again = run(cls, recs) if again is None else again
    assert wire_list(again) == wire_list(reference)


def check_findings_are_contract_records(cls: type, recs: Sequence[Record],
                                        findings: Sequence[Finding] | None = None) -> None:
    """Valid contract records, of the stream's job, one id each, carrying the detector's name."""
    findings = run(cls, recs) if findings is None else findings
    ids = [f.id for f in findings]
    assert len(ids) == len(set(ids)), "finding ids identify one finding each"
    for f in findings:
        assert isinstance(f, Finding)
        [back] = decode(encode(f))
        assert not isinstance(back, DecodeError), f"{back}: {f}"
        assert back == f
        assert f.job == recs[0].job
        assert f.detector.split(".")[0] == cls.name, "a detector's findings carry its name"


def _fixed_cuts(cls: type, recs: Sequence[Record]) -> set[int]:
    n, t0, t1 = len(recs), recs[0].ts, recs[-1].ts
    cuts = {int(q * n) for q in (0.25, 0.5, 0.75)}
    cuts |= {next(i for i, r in enumerate(recs) if r.ts >= t0 + q * (t1 - t0)) for q in (0.25, 0.5, 0.75)}
    for kind in sorted(cls.kinds):
        at = [i for i, r in enumerate(recs) if r.kind == kind]
        if at:
            cuts.add(at[len(at) // 2])
    return cuts


def cut_points(cls: type, recs: Sequence[Record], emitted: Sequence[int] | None = None) -> list[int]:
    """Where to save and restore: 25/50/75% of the records and of the event time, the middle record of
    each kind the detector observes (mid-sweep, mid-storm), and right after its first and last findings
    (episode and "reported" flags set). `emitted`: after how many records each batch of findings came (`Trace`),
    where the caller has it (the detector is driven over them here otherwise)."""
    cuts = _fixed_cuts(cls, recs)
    if emitted is None:
        emitted = trace(cls, recs).emitted
    cuts |= {emitted[0], emitted[-1]} if emitted else set()
    return sorted(c for c in cuts if 0 < c < len(recs))


def _restored(cls: type, snap: Snapshot, what: str) -> tuple[Driver, Any]:
    """A driver of `cls` restored from `snap` (its clock too), and the state it was given (to show it unchanged)."""
    given = _loads(snap.blob)
    restored = cls.from_state(given, snap.topo)
    assert _loads(_dumps(restored.state())) == _loads(snap.blob), \
        f"{what}: state -> from_state -> state is not the same state"
    clock = None if snap.clock is None else ClockDetector.from_state(_loads(snap.clock), snap.topo)
    drv = Driver(restored, snap.topo, clock)
    drv.last_ts = snap.last_ts
    return drv, given


def check_state_round_trip(cls: type, recs: Sequence[Record], traced: Trace | None = None) -> None:
    """The state at every cut point of the in-order run (`traced`, else run here) is plain JSON, a snapshot that
    later records do not change, and restored it continues exactly as the original went on:

    - restored at the first cut, the detector runs to the end: the same findings, and at every later cut the very
      state the original had there (restored once, it stays the original);
    - restored at each later cut, it runs to the next: the same findings on the way, the original's state there
      (the last to the end of the input).

    Every restore starts from the original's own state, so a cut's failure names that cut."""
    tr = trace(cls, recs) if traced is None else traced
    cuts = sorted(tr.snapshots)
    for at in cuts:
        snap = tr.snapshots[at]
        assert_json_safe(snap.state, f"cut {at}: $")
        assert _dumps(snap.state) == snap.blob, \
            f"cut {at}: the state snapshot changed as the detector went on (aliasing)"
    for k, at in enumerate(cuts):
        snap = tr.snapshots[at]
        drv, given = _restored(cls, snap, f"cut {at}")
        stops = cuts[k + 1:] if k == 0 else cuts[k + 1:k + 2]  # the first restore goes on to the end
        found, pos = [], at
        for stop in stops:
            for rec in recs[pos:stop]:
                found += drv.feed(rec)
            pos = stop
            later = tr.snapshots[stop]
            assert wire_list(found) == wire_list(tr.findings[snap.found:later.found]), \
                f"restored at cut {at} of {len(recs)}, the detector diverged before cut {stop}"
            assert _loads(_dumps(drv.det.state())) == _loads(later.blob), \
                f"restored at cut {at}, the detector's state at cut {stop} is not the original's there"
        if not stops or k == 0:  # the first restore and the last cut's go on to the end of the input
            found += drv.run(recs[pos:])
            assert wire_list(found) == wire_list(tr.findings[snap.found:]), \
                f"restored at cut {at} of {len(recs)}, the detector diverged after cut {pos}"
        assert _dumps(given) == snap.blob, f"cut {at}: the restored detector changed the state it was given"


def check_input_not_mutated(cls: type, recs: Sequence[Record], wire: Sequence[dict[str, Any]] | None = None, *,
                            ran: bool = False) -> None:
    """The records it reads are as they were (compared as wire bytes of the kinds it observes) to `wire`, the
    stream's wire dicts (by default, the records' own before the run).

    `ran`: the caller has already driven a fresh `cls` over these very record objects (a test suite's cached
    reference run), so they are compared without a run of their own; `wire` is then required (what they were
    before that run). A mutation stays in the records: the earlier run shows it as well as another would."""
    if ran:
        assert wire is not None, "ran=True compares with the records' wire dicts from before that run: pass `wire`"
    before = [_dumps(to_dict(decode_obj(d))) for d in (wire if wire is not None else map(to_dict, recs))]
    if not ran:
        run(cls, recs)
    # bytes, not dicts: to_dict shares nested dicts (extra) with the record. Records of other kinds never
    # reach the detector (advance takes no record), so only the kinds it observes are compared.
    changed = [i for i, r in enumerate(recs) if r.kind in cls.kinds and _dumps(to_dict(r)) != before[i]]
    if changed:
        i = changed[0]
        now = _dumps(to_dict(recs[i]))
        at = next(k for k in range(min(len(now), len(before[i]))) if now[k] != before[i][k]) if now != before[i] else 0
        raise AssertionError(f"{len(changed)} records mutated, first {i}: ...{before[i][at:at + 120]!r} -> "
                             f"...{now[at:at + 120]!r}")


def jitter(recs: Sequence[Record], seed: int, lateness_s: float = LATENESS_S) -> list[Record]:
    """Swap about half of the adjacent pairs closer than `lateness_s` (deterministic; `job` records stay)."""
    rng = random.Random(seed)
    out = list(recs)
    i = 0
    while i < len(out) - 1:
        a, b = out[i], out[i + 1]
        if "job" not in (a.kind, b.kind) and b.ts - a.ts < lateness_s and rng.random() < 0.5:
            out[i], out[i + 1] = b, a
            i += 2
        else:
            i += 1
    return out


def check_out_of_order_within_lateness(cls: type, recs: Sequence[Record], seed: int,
                                       reference: Sequence[Finding] | None = None,
                                       found: Sequence[Finding] | None = None) -> None:
    """The same kinds of findings on the same nodes from records swapped within `LATENESS_S` (`jitter(recs, seed)`;
    `found`: what `cls` found in those, where the caller has it).

    Not the same findings byte for byte, legitimately: ids and timestamps key on event times that
    depend on arrival order (the hang detector's progress time is the first record of the newest
    step; a heartbeat timeout fires from whichever record came last), and `advance` sees a slightly
    different clock when it is driven by the records' own (now non-monotonic) times.
    """
    shuffled = jitter(recs, seed=seed)
    moved = sum(a is not b for a, b in zip(recs, shuffled, strict=True))
    assert moved > len(recs) // 10, "the shuffle must actually reorder the stream"
    reference = run(cls, recs) if reference is None else reference
    found = run(cls, shuffled) if found is None else found
    assert kinds_and_nodes(found) == kinds_and_nodes(reference)


def resized_job(topo: Topology, n: int, ts: float) -> Job:
    """A `job` record of the same job with `n` ranks: the first ranks keep their placement, new ranks land
    on new nodes (``x000``, ...) as further data-parallel replicas."""
    size, dp = topo.size, int(topo.dp.max()) + 1
    ranks = []
    for r in range(n):
        base = topo.ranks[r % size]
        if r < size:
            ranks.append(base)
        else:
            ranks.append(RankInfo(r, f"x{(r - size) // 8:03d}", (r - size) % 8, base.tp, base.pp,
                                  base.dp + dp * (r // size)))
    return Job(ts=ts, job=topo.job, ranks=ranks, heartbeat_s=topo.heartbeat_s)


def with_strangers(recs: Sequence[Record], size: int) -> list[Record]:
    """The stream plus copies of some records from ranks beyond the topology and from unknown nodes/GPUs."""
    out: list[Record] = []
    for i, rec in enumerate(recs):
        out.append(rec)
        if rec.kind == "job" or i % 5:
            continue
        d = to_dict(rec)
        if "rank" in d and rec.kind != "job":
            for rank in (size + i % 7, size * 2 + 3, 10**6):
                out.append(decode_obj({**d, "rank": rank}))
            if rec.kind == "flight":
                groups = [{**g, "ranks": [*g["ranks"], size + 1, 10**6]} for g in d.get("groups", [])]
                out.append(decode_obj({**d, "groups": groups}))
        if "node" in d and rec.kind in ("hw", "gpu"):
            out.append(decode_obj({**d, "node": "n-unknown"}))
            if "gpu" in d:
                out.append(decode_obj({**d, "gpu": 9}))
    bad = [r for r in out if isinstance(r, DecodeError)]
    assert not bad, bad[:3]
    return out


def run_with_strangers(det_classes: Sequence[type], recs: Sequence[Record]) -> dict[str, list[Finding]]:
    """Detector name -> the findings of each of `det_classes` (driven together) over `recs` with records of ranks
    beyond the topology and of unknown nodes and GPUs (`with_strangers`), its topology doubled at 40 % of the stream
    then halved at 80 %."""
    size = Topology.from_job(recs[0]).size
    extended = with_strangers(recs, size)
    grow_at, shrink_at = int(0.4 * len(extended)), int(0.8 * len(extended))
    first, *others = det_classes
    drv = Driver.fresh(first, extended, others)
    outs: list[list[Finding]] = [[] for _ in det_classes]
    for i, rec in enumerate(extended):
        if i == grow_at:
            drv.set_topology(Topology.from_job(resized_job(drv.topo, 2 * size, rec.ts)))
        elif i == shrink_at:
            drv.set_topology(Topology.from_job(resized_job(drv.topo, size // 2, rec.ts)))
        for out, found in zip(outs, drv.feed_each(rec), strict=True):
            out += found
    for out, found in zip(outs, drv.finish_each(), strict=True):
        out += found
    return {cls.name: out for cls, out in zip(det_classes, outs, strict=True)}


def check_unknown_ranks_and_topology_changes(cls: type, recs: Sequence[Record],
                                             found: Sequence[Finding] | None = None) -> None:
    """Records of ranks beyond the topology and of unknown nodes and GPUs, and a topology that doubles at 40 %
    of the stream then halves at 80 %, raise nothing; findings stay valid and name only ranks of a topology.
    `found`: `run_with_strangers`'s findings of `cls`, where the caller has them."""
    size = Topology.from_job(recs[0]).size
    found = run_with_strangers([cls], recs)[cls.name] if found is None else found
    for f in found:
        [back] = decode(encode(f))
        assert back == f, back
        assert f.rank is None or f.rank < 2 * size, f"a finding names rank {f.rank}, in no topology it was given"


def check_detector(cls: type, records: Sequence[Record], *, seed: int = 0) -> list[Finding]:
    """Every check above on `cls` over `records` (a job's stream, its `job` record first); returns its findings
    (a detector that finds nothing in a stream meant to show its fault passes every property vacuously)."""
    assert records and records[0].kind == "job", "a stream starts with its job's topology"
    check_protocol(cls, records[0])
    traced = trace(cls, records)
    reference = traced.findings
    check_deterministic(cls, records, reference)
    check_findings_are_contract_records(cls, records, reference)
    check_state_round_trip(cls, records, traced)
    check_input_not_mutated(cls, records)
    check_out_of_order_within_lateness(cls, records, seed, reference)
    check_unknown_ranks_and_topology_changes(cls, records)
    return reference
