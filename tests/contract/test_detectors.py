"""The detector contract suite: one set of properties checked on every detector of `DEFAULT_DETECTORS`.

Each detector is driven as `JobMonitor` drives it: the first `job` record gives
the topology, a later one is passed to `set_topology`; every record moves event
time (`advance(rec.ts)` before it), only the kinds in `det.kinds` are observed,
and a final `advance(last_ts)` closes the run. The input is realistic: small
simulated jobs (64 ranks, 200 s), each with one fault chosen so that every
detector has something to find (see `test_every_detector_finds_something`).

Properties, per detector and scenario:

- determinism: two fresh instances, the same records -> the same findings, ids included;
  also across processes with different hash seeds (set and dict order must not leak in);
- findings are valid contract records (encode -> decode gives them back);
- state: `state()` mid-stream is plain JSON (no numpy scalars, no NaN/Inf, str keys), a
  snapshot that later records do not change, and `from_state` continues exactly as the
  original would have (same later findings, same state again);
- input records are not mutated;
- every optional field may be missing;
- records out of order within a small lateness give the same kinds of findings on the same nodes;
- no wall clock: every clock (time.time/monotonic/perf_counter[_ns], datetime.now/utcnow/today)
  raises when project code reads it, and the findings are the same (a library's own bookkeeping,
  joblib's timestamp inside scikit-learn's clustering, gets a fake 1970 clock instead);
- ranks beyond the topology, unknown nodes and a topology that grows (then shrinks)
  mid-stream raise nothing.

A detector added to `DEFAULT_DETECTORS` is covered automatically. The properties that need no test runner are
`gangwatch.detectors.contract` (`check_detector` runs them all, for a detector of one's own); the tests here
run them per detector and scenario, and add those that need one.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import hashlib
import os
import subprocess
import sys
import typing
from collections.abc import Iterable, Sequence
from typing import Any
from unittest import mock

import orjson
import pytest
from gangwatch.detectors import contract
from gangwatch.detectors.contract import resized_job, wire_list
from gangwatch.detectors.monitor import DEFAULT_DETECTORS
from gangwatch.detectors.topology import Topology
from gangwatch.schemas import KINDS, DecodeError, Finding, Record, decode, decode_obj, encode
from gangwatch.schemas.records import WIRE_NAMES
from gangwatch.schemas.validators import unwrap

from tests.contract.harness import DET_IDS, DETECTORS, REPO, SC_IDS, reference, stream, traced, wire

pytestmark = pytest.mark.contract

# Every detector of the catalog, in its order: the properties that drive each over a changed stream (fields
# stripped, clocks faked, records jittered, strangers added) drive them all together over it, on one clock
# (`contract.Driver`'s `others`): nearly all of a run's time is the clock, paid once per stream instead of once per
# detector. test_deterministic shows that each finds together what it finds alone.
ALL = tuple(DETECTORS.values())


@functools.cache
def together(sc_name: str) -> dict[str, list[Finding]]:
    """Detector name -> its findings over the scenario, every detector driven again, together (`contract.run_each`)."""
    return contract.run_each(ALL, stream(sc_name))


# --- 0. the input is good enough to test anything -----------------------------------------------


@pytest.mark.parametrize("det_name", DET_IDS)
def test_every_detector_finds_something(det_name, other_processes):
    """Guards the suite itself: a detector that never fires would pass every property vacuously."""
    other_processes.start()  # the hash-seed child, read by the last tests (started early)
    found = {sc: len(reference(det_name, sc)) for sc in SC_IDS}
    assert any(found.values()), f"{det_name} found nothing in any scenario: {found}"


def test_every_per_detector_test_is_grouped(request):
    """tests/contract/groups.py names the tests parametrized by detector, so that xdist runs them on one worker
    (the runs they read are computed once, there); it sees test ids only. Every collected test of the two files
    parametrized by detector is in the group (one left out would still pass, only its runs would be computed again
    on another worker), no other test is in any, and every name there is a test."""
    from tests.contract.groups import GROUP, PER_DETECTOR, group_of

    assert not any("-" in det for det in DET_IDS), "a detector's name starts its test ids, up to the first '-'"
    for item in request.session.items:
        path = item.nodeid.partition("::")[0]
        if path in PER_DETECTOR:
            params = getattr(getattr(item, "callspec", None), "params", {})
            det = params.get("det_name") or getattr(params.get("det_cls"), "name", None)
            assert group_of(item.nodeid) == (det and GROUP), \
                f"{item.nodeid}: name the tests parametrized by detector (only those) in tests/contract/groups.py"
    for path, names in PER_DETECTOR.items():
        source = (REPO / path).read_text()
        missing = sorted(n for n in names if f"\ndef {n}(" not in source)
        assert not missing, f"tests/contract/groups.py names tests {path} does not have: {missing}"


@pytest.mark.parametrize("det_name", DET_IDS)
def test_detector_protocol(det_name):
    contract.check_protocol(DETECTORS[det_name], stream("xid79")[0])
    assert len(DETECTORS) == len(DEFAULT_DETECTORS), "detector names must be unique (JobMonitor keys state by name)"


# --- 1. determinism -----------------------------------------------------------------------------


@pytest.mark.parametrize("sc_name", SC_IDS)
@pytest.mark.parametrize("det_name", DET_IDS)
def test_deterministic(det_name, sc_name):
    """Driven again, beside every other detector on one clock (`together`), it finds what it found alone: the same
    records give the same findings, and the detectors driven together are as if each were alone (so the properties
    below may drive them together, paying for the job's clock once)."""
    contract.check_deterministic(DETECTORS[det_name], stream(sc_name), reference(det_name, sc_name),
                                 together(sc_name)[det_name])


@pytest.mark.parametrize("sc_name", SC_IDS)
@pytest.mark.parametrize("det_name", DET_IDS)
def test_findings_are_contract_records(det_name, sc_name):
    contract.check_findings_are_contract_records(DETECTORS[det_name], stream(sc_name), reference(det_name, sc_name))


_DIGEST_SCRIPT = """
import json, sys
sys.path.insert(0, sys.argv[1])
from tests.contract import test_detectors as t
print(json.dumps({det: t.digest(t.together(sc)[det] for sc in t.SC_IDS) for det in t.DET_IDS}))
"""


def digest(runs: Iterable[Sequence[Finding]]) -> str:
    """One hash of the findings of several runs (a detector's over every scenario)."""
    h = hashlib.sha256()
    for found in runs:
        for f in found:
            h.update(encode(f))
    return h.hexdigest()


class _OtherProcess:
    """Every detector's digest (its findings over every scenario) computed in a child process with another hash seed,
    the detectors driven together there (`together`): started by the first test of the suite, read by the last.

    One child for all: tests/contract/groups.py runs the per-detector tests on one xdist worker."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self._digests: dict[str, str] | None = None

    def start(self) -> None:
        if self.proc is None:
            seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"
            self.proc = subprocess.Popen([sys.executable, "-c", _DIGEST_SCRIPT, str(REPO)], cwd=REPO,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         env={**os.environ, "PYTHONHASHSEED": seed})

    def digest(self, det_name: str) -> str:
        if self._digests is None:
            self.start()
            assert self.proc is not None
            stdout, stderr = self.proc.communicate(timeout=300)
            assert self.proc.returncode == 0, stderr.decode()[-3000:]
            self._digests = orjson.loads(stdout.splitlines()[-1])
        return self._digests[det_name]

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


@pytest.fixture(scope="module")
def other_processes():
    child = _OtherProcess()
    yield child
    child.close()


# --- 2. state round trip ------------------------------------------------------------------------


@pytest.mark.parametrize("sc_name", SC_IDS)
@pytest.mark.parametrize("det_name", DET_IDS)
def test_state_round_trip(det_name, sc_name):
    contract.check_state_round_trip(DETECTORS[det_name], stream(sc_name), traced(det_name, sc_name))


class _Forgetful(DETECTORS["hang"]):
    """The hang detector with one field of its state forgotten: saved without it, restored with a fresh one.
    state -> from_state -> state is still the same state; only going on from a restore shows the loss."""

    forgets = ""

    def state(self) -> dict[str, Any]:
        st = super().state()
        del st[self.forgets]
        return st

    @classmethod
    def from_state(cls, st: dict[str, Any], topo: Topology) -> Any:
        return super().from_state({**DETECTORS["hang"](topo).state(), **st}, topo)


class _Aliasing(DETECTORS["hang"]):
    """The hang detector whose state hands out a list it goes on appending to."""

    def __init__(self, topo: Topology) -> None:
        super().__init__(topo)
        self.seen: list[float] = []

    def observe(self, rec: Record) -> list[Any]:
        self.seen.append(rec.ts)
        return super().observe(rec)

    def state(self) -> dict[str, Any]:
        return {**super().state(), "seen": self.seen}

    @classmethod
    def from_state(cls, st: dict[str, Any], topo: Topology) -> Any:
        det = super().from_state({k: v for k, v in st.items() if k != "seen"}, topo)
        det.seen = list(st["seen"])
        return det


@pytest.mark.parametrize(("forgets", "why"), [
    ("progress_ts", r"restored at cut \d+ of \d+, the detector diverged"),  # its finding changes
    ("first_ts", r"restored at cut \d+, the detector's state at cut \d+ is not the original's"),  # its state does
    ("reported", r"restored at cut \d+ of \d+, the detector diverged"),  # only past its finding: the cut after it
])
def test_the_state_round_trip_fails_a_detector_that_forgets(forgets, why):
    forgetful = type("Forgetful", (_Forgetful,), {"forgets": forgets})
    with pytest.raises(AssertionError, match=why):
        contract.check_state_round_trip(forgetful, stream("hang"))


def test_the_state_round_trip_fails_a_state_that_aliases_the_detector():
    with pytest.raises(AssertionError, match="changed as the detector went on"):
        contract.check_state_round_trip(_Aliasing, stream("hang"))


# --- 3. input records are not mutated -----------------------------------------------------------


@pytest.mark.parametrize("sc_name", SC_IDS)
@pytest.mark.parametrize("det_name", DET_IDS)
def test_input_not_mutated(det_name, sc_name):
    """Checked after the cached in-order run of this detector over these very records (`reference`, run here if
    no test has yet): a mutation stays in the records, so a run of its own would show nothing more."""
    reference(det_name, sc_name)
    contract.check_input_not_mutated(DETECTORS[det_name], stream(sc_name), wire(sc_name), ran=True)


# --- 4. missing optional fields -----------------------------------------------------------------


def _nested_dataclass(tp: Any) -> type | None:
    base = unwrap(tp)[0]
    if typing.get_origin(base) is list:
        base = unwrap(typing.get_args(base)[0])[0]
    return base if dataclasses.is_dataclass(base) else None


@functools.cache
def _plan(cls: type) -> tuple[tuple[str, bool, bool, type | None], ...]:
    """Per wire field of `cls`: (name, defaults to None, has a default, nested dataclass)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    return tuple(
        (WIRE_NAMES.get(f.name, f.name), f.default is None,
         f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING,
         _nested_dataclass(hints[f.name]))
        for f in dataclasses.fields(cls) if f.name not in ("extra", "kind"))


def strip(obj: dict[str, Any], cls: type, how: str) -> dict[str, Any]:
    """`obj` without its optional fields, recursively.

    how="nullable": fields that default to None (measurements, op/pg/peer, digests, gpu, ...);
    how="defaults": every field with a default, and unknown (extra) fields too.
    """
    out = {k: obj[k] for k in ("kind", "v") if k in obj}
    known = {"kind", "v"}
    for w, nullable, has_default, inner in _plan(cls):
        known.add(w)
        if w not in obj or (how == "nullable" and nullable) or (how == "defaults" and has_default):
            continue
        v = obj[w]
        if inner is not None and isinstance(v, list):
            v = [strip(x, inner, how) for x in v]
        elif inner is not None and isinstance(v, dict):
            v = strip(v, inner, how)
        out[w] = v
    if how == "nullable":
        out.update({k: v for k, v in obj.items() if k not in known})
    return out


@functools.cache
def stripped(sc_name: str, how: str) -> tuple[Record, ...]:
    recs = []
    for d in wire(sc_name):
        rec = decode_obj(strip(d, KINDS[d["kind"]], how))
        assert not isinstance(rec, DecodeError), rec
        recs.append(rec)
    return tuple(recs)


def test_strip_removes_what_it_should():
    d = {"kind": "step", "v": 1, "ts": 1.0, "job": "j", "rank": 0, "step": 3, "step_s": 1.0, "compute_s": 0.5,
         "loss": 2.0, "replica_digest": "ab", "x_site": "dc"}
    assert strip(d, KINDS["step"], "nullable") == {"kind": "step", "v": 1, "ts": 1.0, "job": "j", "rank": 0,
                                                   "step": 3, "step_s": 1.0, "x_site": "dc"}
    assert strip(d, KINDS["step"], "defaults") == {"kind": "step", "v": 1, "ts": 1.0, "job": "j", "rank": 0,
                                                   "step": 3, "step_s": 1.0}
    job = {"kind": "job", "v": 1, "ts": 1.0, "job": "j", "heartbeat_s": 5.0,
           "ranks": [{"rank": 0, "node": "n0", "gpu": 0, "tp": 0, "pp": 1, "dp": 0}]}
    assert strip(job, KINDS["job"], "nullable")["ranks"] == [{"rank": 0, "node": "n0", "tp": 0, "pp": 1, "dp": 0}]
    assert strip(job, KINDS["job"], "defaults")["ranks"] == [{"rank": 0, "node": "n0"}]


# Detectors that need an optional field to find anything: without it they must still run, and find nothing.
# Every other detector reads what the contract requires only, and finds something wherever it did on the whole
# input (test_missing_optional_fields asserts both, so that its round trips are never of nothing but nothing).
NEEDS_OPTIONAL = {
    "failslow": "a rank's own compute time (step.compute_s)",
    "sdc": "replica digests, loss and grad-norm (step.replica_digest, .loss, .grad_norm)",
    "stacks": "the frames or dump of a stack record",
    "linkerrors": "NVML's link counters (gpu.pcie_replay, .nvlink_crc)",
}


def test_every_detector_is_classed_by_what_it_needs():
    assert set(NEEDS_OPTIONAL) <= set(DET_IDS), set(NEEDS_OPTIONAL) - set(DET_IDS)
    assert any(reference(d, sc) for d in NEEDS_OPTIONAL for sc in SC_IDS)


@functools.cache
def stripped_run(sc_name: str, how: str) -> tuple[dict[str, list[Finding]], dict[str, Any], Topology]:
    """Every detector driven together over the scenario stripped of its optional fields: detector name -> its
    findings, detector name -> its state at the end, and the topology it ended with."""
    recs = stripped(sc_name, how)
    driver = contract.Driver.fresh(ALL[0], recs, ALL[1:])
    outs = driver.run_each(recs)
    return ({cls.name: out for cls, out in zip(ALL, outs, strict=True)},
            {det.name: det.state() for det in driver.dets}, driver.topo)


@pytest.mark.parametrize("how", ["nullable", "defaults"])
@pytest.mark.parametrize("sc_name", SC_IDS)
@pytest.mark.parametrize("det_name", DET_IDS)
def test_missing_optional_fields(det_name, sc_name, how):
    cls = DETECTORS[det_name]
    found, states, topo = stripped_run(sc_name, how)
    findings, st = found[det_name], states[det_name]
    # what it found: contract records, encoded and decoded back the same (asserted non-empty below where due)
    assert [back for f in findings for back in decode(encode(f))] == findings
    # where it got to, found anything or not: plain JSON, and restored it is the same state
    contract.assert_json_safe(st)
    assert orjson.loads(orjson.dumps(cls.from_state(orjson.loads(orjson.dumps(st)), topo).state())) == \
        orjson.loads(orjson.dumps(st))
    if det_name in NEEDS_OPTIONAL:
        assert not findings, f"{det_name} found {len(findings)} without {NEEDS_OPTIONAL[det_name]}"
    else:  # what it reads is all there: it finds something wherever it did on the whole input
        assert bool(findings) == bool(reference(det_name, sc_name)), (len(findings), len(reference(det_name, sc_name)))


# --- 5. out of order within a small lateness ------------------------------------------------------


JITTERS = 3  # jittered copies of each scenario, every detector driven together over each


def _jitter_seed(sc_name: str, k: int) -> int:
    return sum(map(ord, sc_name)) + k


@functools.cache
def jittered(sc_name: str, k: int) -> dict[str, list[Finding]]:
    return contract.run_each(ALL, contract.jitter(stream(sc_name), seed=_jitter_seed(sc_name, k)))


@pytest.mark.parametrize("sc_name", SC_IDS)
@pytest.mark.parametrize("det_name", DET_IDS)
def test_out_of_order_within_lateness(det_name, sc_name):
    """The same kinds of findings from the same detectors on the same nodes (`contract.check_out_of_order...`),
    in each of `JITTERS` differently jittered copies of the stream."""
    for k in range(JITTERS):
        contract.check_out_of_order_within_lateness(DETECTORS[det_name], stream(sc_name), _jitter_seed(sc_name, k),
                                                    reference(det_name, sc_name), jittered(sc_name, k)[det_name])


# --- 6. no wall clock ---------------------------------------------------------------------------


_PROJECT_DIRS = tuple(str(REPO / p) + os.sep for p in ("schemas", "detectors", "triage", "gangwatch"))


class _FakeClock:
    """Stands in for every clock during a run.

    Called from project code (the detector itself), it raises. Called from a library the detector
    uses (scikit-learn's clustering builds a `joblib.Memory`, which stamps `time.time()` for its own
    bookkeeping), it answers a fake time that has nothing to do with now (1970, one second more per
    call): library bookkeeping keeps working, and if such a value ever leaked into a finding, the
    comparison with the reference run would show it.
    """

    def __init__(self) -> None:
        self.calls = 0
        self.foreign: set[str] = set()

    def _tick(self, name: str) -> float:
        caller = sys._getframe(2).f_code.co_filename
        if caller.startswith(_PROJECT_DIRS):
            raise AssertionError(f"{caller} read the wall clock ({name})")
        self.calls += 1
        self.foreign.add(f"{name} from {caller}")
        return float(self.calls)

    def patches(self) -> list[Any]:
        def seconds(name: str) -> Any:
            return lambda *_a, **_k: self._tick(name)

        def nanos(name: str) -> Any:
            return lambda *_a, **_k: int(self._tick(name) * 1e9)

        clock = self

        class FakeDatetime(datetime.datetime):
            @classmethod
            def now(cls, tz: Any = None) -> datetime.datetime:
                return datetime.datetime.fromtimestamp(clock._tick("datetime.now"), tz or datetime.UTC)

            @classmethod
            def utcnow(cls) -> datetime.datetime:
                return datetime.datetime.fromtimestamp(clock._tick("datetime.utcnow"), datetime.UTC)

            @classmethod
            def today(cls) -> datetime.datetime:
                return datetime.datetime.fromtimestamp(clock._tick("datetime.today"), datetime.UTC)

        out = [mock.patch(f"time.{n}", seconds(n)) for n in ("time", "monotonic", "perf_counter")]
        out += [mock.patch(f"time.{n}", nanos(n)) for n in ("time_ns", "monotonic_ns", "perf_counter_ns")]
        out.append(mock.patch("datetime.datetime", FakeDatetime))
        return out


def _import_lazy_libraries() -> None:
    """Import what detectors import on first use before any clock is faked: a C extension imported while
    `datetime.datetime` is the fake's subclass takes that (larger) type for datetime's own (Cython only warns
    when a type grew) and corrupts memory: pandas, imported by scikit-learn, segfaulted a CI worker that way."""
    import scipy.cluster.hierarchy  # noqa: F401 - what AgglomerativeClustering.fit imports
    import sklearn.cluster  # noqa: F401 - detectors/stacks.py, on first use
    import sklearn.feature_extraction.text  # noqa: F401


@functools.cache
def unclocked(sc_name: str) -> tuple[dict[str, list[Finding]], list[str]]:
    """Every detector driven together over the scenario with every clock faked (`_FakeClock`): detector name -> its
    findings, and the C extensions imported meanwhile."""
    _import_lazy_libraries()
    loaded = set(sys.modules)
    patches = _FakeClock().patches()
    for p in patches:
        p.start()
    try:
        found = contract.run_each(ALL, stream(sc_name))
    finally:
        for p in reversed(patches):
            p.stop()
    return found, sorted(m for m in set(sys.modules) - loaded
                         if str(getattr(sys.modules[m], "__file__", "") or "").endswith((".so", ".pyd")))


@pytest.mark.parametrize("sc_name", SC_IDS)
@pytest.mark.parametrize("det_name", DET_IDS)
def test_no_wall_clock(det_name, sc_name):
    found, extensions = unclocked(sc_name)
    assert not extensions, f"imported under the fake clock (add them to _import_lazy_libraries): {extensions}"
    assert wire_list(found[det_name]) == wire_list(reference(det_name, sc_name))


def test_fake_clock_raises_in_project_code():
    clock = _FakeClock()
    ns: dict[str, Any] = {}
    _import_lazy_libraries()
    code = compile("import time, datetime\ndef now(): return time.monotonic()\n"
                   "def today(): return datetime.datetime.now()\n", str(REPO / "detectors" / "_probe.py"), "exec")
    exec(code, ns)  # noqa: S102 - a function whose frames look like detector code
    patches = clock.patches()
    for p in patches:
        p.start()
    try:
        with pytest.raises(AssertionError, match="wall clock"):
            ns["now"]()
        with pytest.raises(AssertionError, match="wall clock"):
            ns["today"]()
        import time

        assert time.time() == 1.0 and time.perf_counter_ns() == 2_000_000_000  # elsewhere: a fake clock
    finally:
        for p in reversed(patches):
            p.stop()


# --- 7. unknown ranks and nodes, topology changes ---------------------------------------------------


@pytest.mark.parametrize("sc_name", SC_IDS)
@pytest.mark.parametrize("det_name", DET_IDS)
def test_unknown_ranks_and_topology_changes(det_name, sc_name):
    contract.check_unknown_ranks_and_topology_changes(DETECTORS[det_name], stream(sc_name),
                                                      with_strangers(sc_name)[det_name])


@functools.cache
def with_strangers(sc_name: str) -> dict[str, list[Finding]]:
    """Every detector driven together over the scenario with strangers and a topology that grows then shrinks."""
    return contract.run_with_strangers(ALL, stream(sc_name))


def test_resized_job_is_a_valid_topology():
    topo = Topology.from_job(stream("xid79")[0])
    big = Topology.from_job(resized_job(topo, 2 * topo.size, topo.ts + 1))
    assert big.size == 2 * topo.size and len(big.nodes) == 2 * len(topo.nodes)
    assert len(set(zip(big.tp.tolist(), big.pp.tolist(), big.dp.tolist(), strict=True))) == big.size
    assert Topology.from_job(resized_job(topo, topo.size // 2, topo.ts + 1)).size == topo.size // 2


def test_check_detector_runs_every_check():
    """What a third party runs: every packaged check on one detector and one stream, its findings back."""
    assert wire_list(contract.check_detector(DETECTORS["hang"], stream("hang"))) == \
        wire_list(reference("hang", "hang"))


# --- last: determinism across processes (the child process started with the first test) ---------------


@pytest.mark.parametrize("det_name", DET_IDS)
def test_deterministic_across_processes(det_name, other_processes):
    """Set and dict iteration order over strings changes with the hash seed; findings must not."""
    assert other_processes.digest(det_name) == digest(reference(det_name, sc) for sc in SC_IDS)
