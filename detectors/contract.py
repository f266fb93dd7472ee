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
    """One detector, its topology, and the records it has been fed, with the job's clock as `JobMonitor` keeps it:
    time moves by the job's own time (`ClockDetector.now`) and the detector reads each record with its node's
    clock offset taken out (the clock detector itself reads them raw)."""

    def __init__(self, det: Any, topo: Topology, clock: ClockDetector | None = None) -> None:
        self.det, self.topo = det, topo
        self.clock = det if isinstance(det, ClockDetector) else clock or ClockDetector(topo)
        if hasattr(det, "clock") and det is not self.clock:
            det.clock = self.clock
        self.last_ts: float | None = None

    @classmethod
    def fresh(cls, det_cls: type, recs: Sequence[Record]) -> Driver:
        topo = Topology.from_job(recs[0])
        return cls(det_cls(topo), topo)

    def feed(self, rec: Record) -> list[Finding]:
        clock = self.clock
        if rec.kind != "job":
            clock.heard(rec)
        now = max(clock.now(), self.topo.ts)
        out = self.det.advance(now)
        if clock is not self.det:
            clock.advance(now)
        self.last_ts = now if self.last_ts is None else max(self.last_ts, now)
        if rec.kind == "job":
            if rec.ts > self.topo.ts or rec.ranks != list(self.topo.ranks):  # not the job record it started from
                self.set_topology(Topology.from_job(rec))
        else:
            if clock is not self.det and rec.kind in clock.kinds:
                clock.observe(rec)
            if rec.kind in self.det.kinds:
                out += self.det.observe(rec if clock is self.det else clock.corrected(rec))
        return out

    def set_topology(self, topo: Topology) -> None:
        self.topo = topo
        self.det.set_topology(topo)
        if self.clock is not self.det:
            self.clock.set_topology(topo)

    def finish(self) -> list[Finding]:
        return self.det.advance(self.last_ts) if self.last_ts is not None else []

    def run(self, recs: Iterable[Record]) -> list[Finding]:
        out: list[Finding] = []
        for rec in recs:
            out += self.feed(rec)
        return out + self.finish()


def run(det_cls: type, recs: Sequence[Record]) -> list[Finding]:
    """The findings of a fresh `det_cls` driven over `recs` (the first a `job` record)."""
    return Driver.fresh(det_cls, recs).run(recs)


def run_traced(det_cls: type, recs: Sequence[Record]) -> tuple[list[Finding], list[int]]:
    """`run`, and after how many records each batch of findings came (`cut_points` cuts right after the first and
    the last): one run gives both, so that a caller keeping its in-order run (a test suite's reference, passed to
    `check_state_round_trip` as `emitted`) need not drive the detector over the whole stream again to find them."""
    drv, out, emitted = Driver.fresh(det_cls, recs), [], []
    for i, rec in enumerate(recs):
        found = drv.feed(rec)
        if found:
            out += found
            emitted.append(i + 1)
    return out + drv.finish(), emitted


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


def check_deterministic(cls: type, recs: Sequence[Record], reference: Sequence[Finding] | None = None) -> None:
    """A fresh instance fed the same records finds the same, ids included."""
    reference = run(cls, recs) if reference is None else reference
    assert wire_list(run(cls, recs)) == wire_list(reference)


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


def cut_points(cls: type, recs: Sequence[Record], emitted: Sequence[int] | None = None) -> list[int]:
    """Where to save and restore: 25/50/75% of the records and of the event time, the middle record of
    each kind the detector observes (mid-sweep, mid-storm), and right after its first and last findings
    (episode and "reported" flags set). `emitted`: `run_traced`'s second half for these records, where the
    caller has it (the detector is driven over them here otherwise)."""
    n, t0, t1 = len(recs), recs[0].ts, recs[-1].ts
    cuts = {int(q * n) for q in (0.25, 0.5, 0.75)}
    cuts |= {next(i for i, r in enumerate(recs) if r.ts >= t0 + q * (t1 - t0)) for q in (0.25, 0.5, 0.75)}
    for kind in sorted(cls.kinds):
        at = [i for i, r in enumerate(recs) if r.kind == kind]
        if at:
            cuts.add(at[len(at) // 2])
    if emitted is None:
        emitted = run_traced(cls, recs)[1]
    cuts |= {emitted[0], emitted[-1]} if emitted else set()
    return sorted(c for c in cuts if 0 < c < n)


def check_state_round_trip(cls: type, recs: Sequence[Record], reference: Sequence[Finding] | None = None,
                           emitted: Sequence[int] | None = None) -> None:
    """At every cut point: the state is plain JSON, a snapshot later records do not change, and restored it
    continues exactly as the original went on (same later findings, same state again). `reference` and `emitted`:
    `run_traced(cls, recs)`, where the caller has it (else the detector is driven over `recs` for them here)."""
    cuts = set(cut_points(cls, recs, emitted))
    orig = Driver.fresh(cls, recs)
    out: list[Finding] = []
    snaps = []  # (cut, state object, its bytes, findings so far, topology, the clock's state)
    orig_last = []  # the driver's time after each record
    for i, rec in enumerate(recs):
        if i in cuts:
            st = orig.det.state()
            assert_json_safe(st)
            clock = None if orig.clock is orig.det else _dumps(orig.clock.state())  # the job's clock, saved too
            snaps.append((i, st, _dumps(st), len(out), orig.topo, clock))
        out += orig.feed(rec)
        orig_last.append(orig.last_ts)
    out += orig.finish()
    for i, st, blob, n, topo, clock in snaps:
        assert _dumps(st) == blob, f"cut {i}: the state snapshot changed as the detector went on (aliasing)"
        given = _loads(blob)
        restored = cls.from_state(given, topo)
        again = _loads(_dumps(restored.state()))
        assert again == _loads(blob), f"cut {i}: state -> from_state -> state is not the same state"
        resumed = Driver(restored, topo, None if clock is None else ClockDetector.from_state(_loads(clock), topo))
        resumed.last_ts = orig_last[i - 1]
        later = resumed.run(recs[i:])
        assert wire_list(later) == wire_list(out[n:]), f"cut {i} of {len(recs)}: the restored detector diverged"
        assert _dumps(given) == blob, f"cut {i}: the restored detector changed the state it was given"
    reference = run(cls, recs) if reference is None else reference
    assert wire_list(out) == wire_list(reference)


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
                                       reference: Sequence[Finding] | None = None) -> None:
    """The same kinds of findings on the same nodes from records swapped within `LATENESS_S`.

    Not the same findings byte for byte, legitimately: ids and timestamps key on event times that
    depend on arrival order (the hang detector's progress time is the first record of the newest
    step; a heartbeat timeout fires from whichever record came last), and `advance` sees a slightly
    different clock when it is driven by the records' own (now non-monotonic) times.
    """
    shuffled = jitter(recs, seed=seed)
    moved = sum(a is not b for a, b in zip(recs, shuffled, strict=True))
    assert moved > len(recs) // 10, "the shuffle must actually reorder the stream"
    reference = run(cls, recs) if reference is None else reference
    assert kinds_and_nodes(run(cls, shuffled)) == kinds_and_nodes(reference)


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


def check_unknown_ranks_and_topology_changes(cls: type, recs: Sequence[Record]) -> None:
    """Records of ranks beyond the topology and of unknown nodes and GPUs, and a topology that doubles at 40 %
    of the stream then halves at 80 %, raise nothing; findings stay valid and name only ranks of a topology."""
    size = Topology.from_job(recs[0]).size
    extended = with_strangers(recs, size)
    grow_at, shrink_at = int(0.4 * len(extended)), int(0.8 * len(extended))
    drv = Driver.fresh(cls, extended)
    findings: list[Finding] = []
    for i, rec in enumerate(extended):
        if i == grow_at:
            drv.set_topology(Topology.from_job(resized_job(drv.topo, 2 * size, rec.ts)))
        elif i == shrink_at:
            drv.set_topology(Topology.from_job(resized_job(drv.topo, size // 2, rec.ts)))
        findings += drv.feed(rec)
    findings += drv.finish()
    for f in findings:
        [back] = decode(encode(f))
        assert back == f, back
        assert f.rank is None or f.rank < 2 * size, f"a finding names rank {f.rank}, in no topology it was given"


def check_detector(cls: type, records: Sequence[Record], *, seed: int = 0) -> list[Finding]:
    """Every check above on `cls` over `records` (a job's stream, its `job` record first); returns its findings
    (a detector that finds nothing in a stream meant to show its fault passes every property vacuously)."""
    assert records and records[0].kind == "job", "a stream starts with its job's topology"
    check_protocol(cls, records[0])
    reference, emitted = run_traced(cls, records)
    check_deterministic(cls, records, reference)
    check_findings_are_contract_records(cls, records, reference)
    check_state_round_trip(cls, records, reference, emitted)
    check_input_not_mutated(cls, records)
    check_out_of_order_within_lateness(cls, records, seed, reference)
    check_unknown_ranks_and_topology_changes(cls, records)
    return reference
