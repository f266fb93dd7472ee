"""Flight recorder: safe loading of real PyTorch dumps, mapping to `flight` records, FlightDetector."""

from __future__ import annotations

import gzip
import os
import pickle
import pickletools
from dataclasses import replace
from pathlib import Path

import orjson
import pytest
from gangwatch.detectors.config import FlightConfig
from gangwatch.detectors.flight import FlightDetector, localize, rank_view
from gangwatch.detectors.topology import Topology
from gangwatch.producers.flight import FlightDumpError, UnsafePickleError, load_dump, op_name, to_flight_record
from gangwatch.schemas import Flight, Job, RankInfo, decode

from tests.helpers import data_path

pytestmark = pytest.mark.unit

FR = "flight-recorder/gloo-dataloader-hang-4ranks"


def topology(n: int, per_node: int = 8) -> Topology:
    ranks = [RankInfo(rank=r, node=f"n{r // per_node:03d}", gpu=r % per_node) for r in range(n)]
    return Topology.from_job(Job(ts=0.0, job="j1", ranks=ranks))


def as_flight(rec: dict) -> Flight:
    """Through the wire: JSON bytes -> `schemas.decode` -> a typed `Flight` record."""
    (out,) = decode(orjson.dumps(rec))
    assert isinstance(out, Flight), out
    return out


def real_records(ts0: float = 2000.0) -> list[Flight]:
    root = data_path(FR)
    return [as_flight(to_flight_record(load_dump(root / f"rank{r}.pkl"), job="j1", rank=r, snapshot="fr-1",
                                       ts=ts0 + r)) for r in range(4)]


def fr(rank: int, groups: list[tuple], entries: list[tuple] = (), *, ts: float = 1.0, snapshot: str = "s-1",
       with_groups: bool = True) -> Flight:
    """A synthetic `flight` record: groups (pg, ranks, enqueued, started, completed), entries
    (seq, op, pg, state, size, dtype)."""
    rec = {"kind": "flight", "v": 1, "ts": ts, "job": "j1", "rank": rank, "snapshot": snapshot,
           "entries": [{"seq": s, "op": op, "pg": pg, "state": st, "size": size, "dtype": dt}
                       for s, op, pg, st, size, dt in entries]}
    if with_groups:
        rec["groups"] = [{"pg": pg, "ranks": list(ranks), "last_enqueued": e, "last_started": s,
                          "last_completed": c} for pg, ranks, e, s, c in groups]
    return as_flight(rec)


# --- loading real dumps safely -------------------------------------------------------------


def test_real_pickles_hold_only_plain_data():
    pickles = sorted(data_path(FR).glob("rank*.pkl"))
    assert pickles, f"no rank*.pkl under {data_path(FR)}"
    for path in pickles:
        ops = {op.name for op, _, _ in pickletools.genops(path.read_bytes())}
        assert not ops & {"GLOBAL", "STACK_GLOBAL", "REDUCE", "BUILD", "INST", "OBJ", "NEWOBJ", "NEWOBJ_EX",
                          "EXT1", "EXT2", "EXT4", "PERSID", "BINPERSID"}, (path, ops)


def test_load_real_dump():
    root = data_path(FR)
    dump = load_dump(root / "rank0.pkl")
    assert dump == load_dump((root / "rank0.pkl").read_bytes()) == load_dump(str(root / "rank0.pkl"))
    assert dump["version"] == "2.10"
    assert set(dump) >= {"entries", "pg_config", "pg_status"}
    assert dump["pg_status"]["0"]["last_enqueued_collective"] == 13
    assert dump["entries"][-1]["process_group"] == ("0", "default_pg")


def test_real_dump_maps_onto_a_flight_record():
    recs = real_records()
    r0, r3 = recs[0], recs[3]
    (g,) = r0.groups
    assert (g.pg, g.desc, g.ranks) == ("0", "default_pg", [0, 1, 2, 3])
    assert (g.last_enqueued, g.last_started, g.last_completed) == (13, -1, 12)
    assert r3.groups[0].last_enqueued == 12
    assert [e.seq for e in r0.entries] == list(range(1, 14)) and [e.seq for e in r3.entries] == list(range(1, 13))
    last = r0.entries[-1]
    assert (last.op, last.pg, last.state, last.size, last.dtype) == ("allreduce", "0", "scheduled", 18696, "Float")
    assert last.extra["profiling_name"] == "gloo:all_reduce"
    assert [e.op for e in r0.entries[:2]] == ["allgather", "broadcast"]
    barrier = next(e for e in r0.entries if e.op == "barrier")
    assert barrier.size == 0 and barrier.dtype is None
    assert r0.extra["fr_version"] == "2.10"


def test_nccl_style_dump_mapping():
    dump = {
        "version": "2.4", "comm_lib_version": "2.21.5",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"},
                      "5": {"name": "5", "desc": "TENSOR_MODEL_PARALLEL_GROUP", "ranks": [0, 1]}},
        "pg_status": {"0": {"last_enqueued_collective": 4, "last_started_collective": 4,
                            "last_completed_collective": 3},
                      "5": {"last_enqueued_collective": 9, "last_started_collective": 9,
                            "last_completed_collective": 9}},
        "entries": [
            {"collective_seq_id": 4, "process_group": ("0", "default_pg"), "profiling_name": "nccl:_allgather_base",
             "state": "started", "input_sizes": [[2, 3], [4]], "input_dtypes": ["BFloat16", "BFloat16"]},
            {"collective_seq_id": 9, "p2p_seq_id": 3, "is_p2p": True, "process_group": ("5", ""),
             "profiling_name": "nccl:send 0->1", "state": "weird", "input_sizes": "bad"},
            "not an entry", {"profiling_name": "nccl:all_reduce"},
        ],
    }
    dump = load_dump(pickle.dumps(dump, protocol=4))
    rec = as_flight(to_flight_record(dump, job="j1", rank=0, snapshot="s", ts=5.0))
    assert [(g.pg, g.desc, g.ranks, g.last_enqueued, g.last_completed) for g in rec.groups] == [
        ("0", "default_pg", [0, 1, 2, 3], 4, 3), ("5", "TENSOR_MODEL_PARALLEL_GROUP", [0, 1], 9, 9)]
    a, p2p = rec.entries
    assert (a.seq, a.op, a.state, a.size, a.dtype) == (4, "allgather", "started", 10, "BFloat16")
    assert (p2p.seq, p2p.op, p2p.pg, p2p.state, p2p.size) == (3, "send", "5", "scheduled", None)
    assert p2p.extra == {"profiling_name": "nccl:send 0->1", "p2p": True, "peer": 1, "raw_state": "weird"}
    assert rec.extra["comm_lib_version"] == "2.21.5"
    assert to_flight_record(dump, job="j1", rank=0, snapshot="s", ts=5.0, max_entries=1)["entries"] == []


def test_op_names():
    assert [op_name(n) for n in ("nccl:all_reduce", "gloo:broadcast", "nccl:_reduce_scatter_base",
                                 "nccl:recv 1<-0", "all_to_all", "")] == [
        "allreduce", "broadcast", "reducescatter", "recv", "alltoall", "unknown"]


# --- malicious pickles ---------------------------------------------------------------------


def _touch(path: str) -> None:
    Path(path).write_text("pwned")


class _Shell:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


class _Opener:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


class _Custom:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (_touch, (str(self.path),))


class _Plain:
    """A custom class without __reduce__: still a reference to code."""

    def __init__(self) -> None:
        self.x = 1


@pytest.mark.parametrize("make", [_Shell, _Opener, _Custom])
def test_malicious_pickle_is_rejected_without_side_effects(tmp_path, make):
    target = tmp_path / "created-by-pickle"
    for payload in (make(target), {"version": "2.10", "pg_config": {}, "entries": [make(target)]}):
        data = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
        with pytest.raises(UnsafePickleError, match="refused"):
            load_dump(data)
        path = tmp_path / "dump.pkl"
        path.write_bytes(data)
        with pytest.raises(UnsafePickleError):
            load_dump(path)
        assert not target.exists()


def test_hand_written_global_opcodes_are_rejected(tmp_path):
    target = tmp_path / "x"
    protocol0 = f"cos\nsystem\n(S'touch {target}'\ntR.".encode()
    with pytest.raises(UnsafePickleError, match="os.system"):
        load_dump(protocol0)
    with pytest.raises(UnsafePickleError):
        load_dump(pickle.dumps(_Plain()))
    with pytest.raises(UnsafePickleError):
        load_dump(pickle.dumps({"entries": [], "when": __import__("datetime").date(2024, 1, 1)}))
    assert not target.exists()
    assert issubclass(UnsafePickleError, pickle.UnpicklingError)


def test_not_a_dump_is_a_clear_error(tmp_path):
    for data in (b"", b"not a pickle", pickle.dumps([1, 2, 3]), pickle.dumps({"entries": "nope"}),
                 pickle.dumps({"entries": []})[:-3]):
        with pytest.raises(FlightDumpError):
            load_dump(data)
    with pytest.raises(FileNotFoundError):
        load_dump(tmp_path / "missing.pkl")


# --- the detector --------------------------------------------------------------------------


def test_real_dataset_localizes_rank_3():
    det = FlightDetector(topology(4))
    recs = real_records()
    for rec in recs[:-1]:
        assert det.observe(rec) == []
    out = det.observe(recs[-1])
    assert [f.rank for f in out] == [3]
    f = out[0]
    assert (f.type, f.detector, f.node, f.ts) == ("stack_outlier", "flight", "n000", recs[-1].ts)
    ev = f.evidence
    assert (ev["pg"], ev["desc"], ev["seq"], ev["op"], ev["reason"]) == ("0", "default_pg", 13, "allreduce",
                                                                          "never_enqueued")
    assert (ev["size"], ev["dtype"], ev["last_enqueued"], ev["ranks_waiting"]) == (18696, "Float", 12, 3)
    assert f.score == 0.75
    assert orjson.loads(orjson.dumps(ev)) == ev


def test_partial_real_snapshot_after_the_window():
    det = FlightDetector(topology(4), FlightConfig(window_s=30.0))
    recs = real_records(ts0=100.0)
    for rec in recs[1:]:  # rank 0 never dumps
        assert det.observe(rec) == []
    assert det.advance(130.9) == []
    out = det.advance(131.0)
    assert [f.rank for f in out] == [3] and out[0].ts == 131.0 and out[0].evidence["ranks_reported"] == 3


def test_state_round_trip_mid_snapshot_gives_identical_findings():
    recs = real_records()
    a = FlightDetector(topology(4))
    for rec in recs[:2]:
        a.observe(rec)
    state = orjson.loads(orjson.dumps(a.state()))
    b = FlightDetector.from_state(state, topology(4))
    assert b.state() == state
    out_a = [f for rec in recs[2:] for f in a.observe(rec)]
    out_b = [f for rec in recs[2:] for f in b.observe(rec)]
    assert out_a == out_b and [f.rank for f in out_a] == [3]


def test_every_process_group_is_checked_and_victims_are_not_blamed():
    """Rank 5 hangs before TP collective 40: rank 4 waits in TP and so never reaches DP collective 20.
    Rank 4 is behind in its DP group, but it is a victim; only rank 5 is the root cause."""
    tp = {r: f"tp{r // 2}" for r in range(8)}
    dp = {r: f"dp{r % 2}" for r in range(8)}
    recs = []
    for r in range(8):
        tp_ranks, dp_ranks = [r - r % 2, r - r % 2 + 1], [x for x in range(8) if x % 2 == r % 2]
        if r == 5:
            t, d = (39, 39, 39), (19, 19, 19)
        elif r == 4:
            t, d = (40, 40, 39), (19, 19, 19)
        else:
            t, d = (40, 40, 40), (20, 20, 19)
        entries = [(t[0], "allreduce", tp[r], "started", 4096, "BFloat16"),
                   (d[0], "reducescatter", dp[r], "started", 1 << 20, "Float")]
        recs.append(fr(r, [(tp[r], tp_ranks, *t), (dp[r], dp_ranks, *d)], entries))
    det = FlightDetector(topology(8, per_node=4))
    out = [f for rec in recs for f in det.observe(rec)]
    assert [f.rank for f in out] == [5]
    ev = out[0].evidence
    assert out[0].node == "n001"
    assert {(x["pg"], x["seq"], x["reason"]) for x in ev["reasons"]} == {("dp1", 20, "never_enqueued"),
                                                                         ("tp2", 40, "never_enqueued")}
    assert ev["op"] in ("allreduce", "reducescatter")


def test_never_started():
    recs = [fr(r, [("0", [0, 1, 2, 3], 7, 6 if r == 2 else 7, 6)], [(7, "allreduce", "0", "scheduled", 8, "Float")])
            for r in range(4)]
    det = FlightDetector(topology(4))
    out = [f for rec in recs for f in det.observe(rec)]
    assert [(f.rank, f.evidence["reason"], f.evidence["seq"]) for f in out] == [(2, "never_started", 7)]


def test_size_and_op_mismatch():
    recs = []
    for r in range(4):
        size = 1024 if r == 2 else 2048
        op = "allgather" if r == 1 else "allreduce"
        entries = [(4, "allreduce", "0", "completed", 64, "Float"), (5, op, "0", "completed", size, "Float")]
        recs.append(fr(r, [("0", [0, 1, 2, 3], 5, 5, 5)], entries))
    det = FlightDetector(topology(4))
    out = [f for rec in recs for f in det.observe(rec)]
    got = {(f.rank, f.evidence["reason"], f.evidence["expected"], f.evidence["got"]) for f in out}
    assert got == {(1, "op_mismatch", "allreduce", "allgather"), (2, "size_mismatch", 2048, 1024)}


def test_entries_only_records_and_p2p_ignored():
    recs = []
    for r in range(4):
        entries = [(8, "allreduce", "0", "scheduled", 16, "Float")]
        if r != 1:
            entries.append((9, "allreduce", "0", "scheduled", 16, "Float"))
        rec = fr(r, [], entries, with_groups=False)
        recs.append(rec)
    views = {rec.rank: rank_view(rec) for rec in recs}
    assert [(s.rank, s.reason, s.seq) for s in localize(views)] == [(1, "never_enqueued", 9)]
    p2p = as_flight({"kind": "flight", "v": 1, "ts": 1.0, "job": "j1", "rank": 0, "snapshot": "s",
                     "entries": [{"seq": 99, "op": "send", "pg": "0", "state": "scheduled", "p2p": True}]})
    assert rank_view(p2p).groups == {}


def test_no_verdict_when_healthy_or_when_most_are_behind():
    healthy = [fr(r, [("0", [0, 1, 2, 3], 9, 9, 9)], [(9, "allreduce", "0", "completed", 8, "Float")])
               for r in range(4)]
    det = FlightDetector(topology(4))
    assert [f for rec in healthy for f in det.observe(rec)] == []
    ahead = [fr(r, [("0", [0, 1, 2, 3], 10 if r == 0 else 9, 9, 9)]) for r in range(4)]  # rank 0 ran ahead
    det = FlightDetector(topology(4))
    assert [f for rec in ahead for f in det.observe(rec)] == []


def test_late_and_repeated_snapshots():
    recs = real_records(ts0=0.0)
    det = FlightDetector(topology(4), FlightConfig(window_s=2.5))
    assert det.observe(recs[0]) == [] and det.observe(recs[1]) == [] and det.observe(recs[2]) == []
    assert det.observe(recs[3]) == []  # ts 3.0 > 0.0 + 2.5: late
    assert det.advance(2.5) == []  # ranks 0-2 agree: nobody behind among them
    assert det.observe(recs[3]) == [] and det.pending == {}


# --- several culprits, and point-to-point waits ---------------------------------------------------------


def p2p_fr(rank: int, groups: list[tuple], entries: list[dict], snapshot: str = "s-2") -> Flight:
    rec = {"kind": "flight", "v": 1, "ts": 1.0, "job": "j1", "rank": rank, "snapshot": snapshot, "entries": entries,
           "groups": [{"pg": pg, "ranks": list(ranks), "last_enqueued": e, "last_started": s, "last_completed": c}
                      for pg, ranks, e, s, c in groups]}
    return as_flight(rec)


def pipeline_job(stuck: dict[int, str]) -> list[Flight]:
    """8 ranks: two pipelines (0-3, 4-7) of four stages; DP groups pair stage s of both ({s, s + 4}).
    `stuck`: rank -> "broadcast" (a stray collective on its pipeline group), "recv" (waiting to receive from
    the stage before it), "loader" (never enqueued anything of the step). Everyone else has enqueued the
    gradient all_reduce (DP collective 11) and waits in it."""
    recs = []
    for r in range(8):
        pipe = [r - r % 4 + q for q in range(4)]
        dp = [r % 4, r % 4 + 4]
        how = stuck.get(r)
        d = (10, 10, 10) if how else (11, 11, 10)
        p = (0, 0, -1) if how == "broadcast" else (-1, -1, -1)
        entries = [{"seq": d[0], "op": "allreduce", "pg": f"dp{r % 4}", "state": "started" if not how else "completed"}]
        if how == "broadcast":
            entries.append({"seq": 0, "op": "broadcast", "pg": f"pp{r // 4}", "state": "started"})
        if how == "recv":
            entries.append({"seq": 40, "op": "recv", "pg": f"pp{r // 4}", "state": "started", "p2p": True,
                            "peer": r % 4 - 1})
        recs.append(p2p_fr(r, [(f"pp{r // 4}", pipe, *p), (f"dp{r % 4}", dp, *d)], entries))
    return recs


def test_a_rank_waiting_to_receive_from_a_suspect_is_its_victim():
    """Rank 1 sits in a broadcast no other stage calls; rank 2 waits to receive from it. Both never reached the
    gradient all_reduce, but rank 2 waits on rank 1: only rank 1 is named."""
    recs = pipeline_job({1: "broadcast", 2: "recv"})
    views = {rec.rank: rank_view(rec) for rec in recs}
    assert views[2].waits_on == (("pp0", "recv", 1),) and views[1].waits_on == ()
    assert [(s.rank, s.reason) for s in localize(views)] == [(1, "never_enqueued")]
    det = FlightDetector(topology(8, per_node=2))
    out = [f for rec in recs for f in det.observe(rec)]
    assert [f.rank for f in out] == [1]


def test_two_ranks_each_holding_up_a_different_group_are_both_named():
    recs = pipeline_job({1: "loader", 6: "loader"})
    det = FlightDetector(topology(8, per_node=2))
    out = [f for rec in recs for f in det.observe(rec)]
    assert [(f.rank, f.evidence["pg"], f.evidence.get("cycle")) for f in out] == [(1, "dp1", None), (6, "dp2", None)]
    from gangwatch.detectors.catalog import typed
    from gangwatch.triage.localize import localize as fuse

    ts = [typed(f) for f in out]
    assert all(t.root_cause for t in ts)
    loc = fuse(ts, topology(8, per_node=2), 0.5)
    assert loc.culprits == ["n000", "n003"] and loc.group is None  # two culprits, not one somewhere in a group


def test_ranks_waiting_on_each_other_are_a_cycle_kept_with_less_confidence():
    recs = pipeline_job({1: "recv", 2: "loader"})
    # make rank 2 wait to receive from rank 1 as well: each waits on the other
    recs[2] = p2p_fr(2, [("pp0", [0, 1, 2, 3], -1, -1, -1), ("dp2", [2, 6], 10, 10, 10)],
                     [{"seq": 41, "op": "recv", "pg": "pp0", "state": "started", "p2p": True, "peer": 1}])
    recs[1] = p2p_fr(1, [("pp0", [0, 1, 2, 3], -1, -1, -1), ("dp1", [1, 5], 10, 10, 10)],
                     [{"seq": 40, "op": "recv", "pg": "pp0", "state": "started", "p2p": True, "peer": 2}])
    views = {rec.rank: rank_view(rec) for rec in recs}
    found = localize(views)
    assert sorted(s.rank for s in found) == [1, 2] and all(s.detail.get("cycle") for s in found)


def test_p2p_peers_from_pytorch_profiling_names():
    from gangwatch.producers.flight import p2p_peer

    assert p2p_peer("nccl:send 1->2") == 2 and p2p_peer("nccl:recv 3<-0") == 0
    assert p2p_peer("gloo:recv 3<-?") is None and p2p_peer("nccl:all_reduce") is None
    assert p2p_peer("nccl:send 12 -> 3") == 3 and p2p_peer("weird") is None


# --- consequences across process groups: NVIDIA's public flight-recorder scenarios, real dumps -----------------
#
# nvidia-resiliency-ext ships four real 16-rank flight-recorder sweeps of a Megatron MoE job (TP 2, DP 2, PP 4,
# expert groups; timing off, so no started ids) with faults injected on two ranks each; `fault_injection.log`'s
# first line lists them. Every rank is stuck somewhere, the pipeline groups' counters count point-to-point ops
# (the end stages trail the middle ones by ~1700 without anyone being late), and the two faulty ranks' pipeline
# and data-parallel peers wait on them in every group they share. Named must be the faulty ranks and no one else.

NVRX = "flight-recorder/nvrx"
NVRX_TRUTH = {"gpu_error_1st": [12, 14], "gpu_error_2nd": [9, 14], "lock_gil_1st": [9, 14], "lock_gil_2nd": [10, 15]}


def nvrx_truth(scenario: str) -> list[int]:
    """The faulty ranks as the scenario's own `fault_injection.log` states them (``Fault ranks: [12, 14]``)."""
    first = (data_path(NVRX) / scenario / "fault_injection.log").read_text().splitlines()[0]
    assert first.startswith("Fault ranks:"), first
    return sorted(orjson.loads(first.split(":", 1)[1]))


def nvrx_dumps(scenario: str) -> list[Flight]:
    """The scenario's 16 real pickles through gangwatch's reader and the wire: one `flight` record per rank."""
    root = data_path(NVRX) / scenario
    return [as_flight(to_flight_record(load_dump(root / f"_dump_{r}"), job="j1", rank=r, snapshot=scenario,
                                       ts=100.0 + r / 10)) for r in range(16)]


def nvrx_framed(scenario: str) -> list[Flight]:
    """The same dumps as another producer framed them (`<scenario>.jsonl.gz`): PyTorch's profiling names as ops
    (``nccl:send 0->3``), point-to-point entries neither marked nor numbered apart from the collectives."""
    with gzip.open(data_path(NVRX) / f"{scenario}.jsonl.gz") as f:
        recs = [x for line in f for x in decode(line)]
    return [r for r in recs if isinstance(r, Flight)]


def nvrx_topology() -> Topology:
    """One rank per node, ``node-000`` .. ``node-015``, as the framed sets' `job` record has them."""
    return Topology.from_job(Job(ts=0.0, job="j1", ranks=[RankInfo(rank=r, node=f"node-{r:03d}", gpu=0)
                                                           for r in range(16)]))


@pytest.mark.parametrize("scenario", sorted(NVRX_TRUTH))
def test_nvidia_real_scenarios_name_the_faulty_ranks_and_no_peer(scenario):
    truth = nvrx_truth(scenario)
    assert truth == NVRX_TRUTH[scenario]
    det = FlightDetector(nvrx_topology())
    out = [f for rec in nvrx_dumps(scenario) for f in det.observe(rec)]
    assert [f.rank for f in out] == truth
    assert [f.node for f in out] == [f"node-{r:03d}" for r in truth]
    assert all(f.type == "stack_outlier" and not f.evidence.get("cycle") for f in out)
    assert all(f.evidence["reason"] in ("never_enqueued", "never_completed") for f in out)
    assert all(f.evidence["ranks_reported"] == 16 for f in out)
    from gangwatch.detectors.catalog import typed
    from gangwatch.triage.localize import localize as fuse

    ts = [typed(f) for f in out]
    assert all(t.root_cause for t in ts)  # each faulty rank is a root cause on its own
    assert fuse(ts, nvrx_topology(), 0.5).culprits == [f"node-{r:03d}" for r in truth]


@pytest.mark.parametrize("scenario", sorted(NVRX_TRUTH))
def test_nvidia_real_scenarios_framed_without_p2p_marks_read_the_same(scenario):
    """The framed records mark no point-to-point op and number them with the collective counter: read by their
    names, each rank waits on the same peers, in the same groups, and the same ranks are named."""
    dumps = {rec.rank: rank_view(rec) for rec in nvrx_dumps(scenario)}
    framed = {rec.rank: rank_view(rec) for rec in nvrx_framed(scenario)}
    assert sorted(framed) == list(range(16))
    for r in range(16):
        assert framed[r].waits_on == dumps[r].waits_on and framed[r].p2p == dumps[r].p2p
    assert any(v.waits_on for v in framed.values())  # pipeline ranks do wait on peers
    assert sorted({s.rank for s in localize(framed)}) == nvrx_truth(scenario)


@pytest.mark.parametrize("scenario", sorted(NVRX_TRUTH))
def test_nvidia_real_scenarios_without_known_peers_still_exact(scenario):
    """A point-to-point op whose peer is unknown (gloo's ``recv 3<-?``) gives no wait edge: the pipeline peers of
    the faulty ranks are still no suspects, the collective groups alone name the faulty ranks."""
    views = {rec.rank: replace(rank_view(rec), waits_on=()) for rec in nvrx_dumps(scenario)}
    assert sorted({s.rank for s in localize(views)}) == nvrx_truth(scenario)
    assert not any(s.detail.get("cycle") for s in localize(views))


def test_nvidia_gpu_error_1st_reasons():
    """Rank 12's GPU stopped completing, then its host stopped enqueuing (behind its TP and expert peers); rank 14
    enqueued as far as its peers but completed nothing after the fault while 13 and 15 did (``never_completed``
    in its TP and expert groups). Their pipeline group's counters differ by point-to-point counts only."""
    views = {rec.rank: rank_view(rec) for rec in nvrx_dumps("gpu_error_1st")}
    assert views[0].p2p == {"43"} and ("43", "recv", 4) in views[0].waits_on
    reasons = {(s.rank, s.desc, s.reason) for s in localize(views)}
    assert (12, "EXPERT_MODEL_PARALLEL_GROUP", "never_enqueued") in reasons
    assert (14, "TENSOR_MODEL_PARALLEL_GROUP", "never_completed") in reasons
    assert (14, "EXPERT_MODEL_PARALLEL_GROUP", "never_completed") in reasons
    assert not any(d == "PIPELINE_MODEL_PARALLEL_GROUP" for _, d, _ in reasons)


def test_a_rank_behind_only_because_it_waits_on_a_stuck_rank_elsewhere_is_a_consequence():
    """8 ranks: TP pairs {0,1} {2,3} {4,5} {6,7}, pipeline pairs {i, i+4}, expert groups {0-3} {4-7}. Rank 3's
    host thread is stuck before expert collective 50. Rank 2 waits in it (behind in nothing); rank 6 waits to
    receive from rank 2, its pipeline peer, and so never enqueued TP collective 31, which rank 7 waits in.
    6 -> 2 -> 3: rank 6 is a consequence; rank 3 alone is named."""
    recs = []
    for r in range(8):
        tp, pp, ep = f"tp{r // 2}", f"pp{r % 4}", f"ep{r // 4}"
        t = {6: (30, -1, 30), 7: (31, -1, 30)}.get(r, (31, -1, 31))
        e = (49, -1, 49) if r == 3 else (50, -1, 49) if r < 4 else (50, -1, 50)
        entries = [{"seq": 7, "op": "recv", "pg": pp, "state": "scheduled", "p2p": True, "peer": 0}] if r == 6 else []
        recs.append(p2p_fr(r, [(tp, [r - r % 2, r - r % 2 + 1], *t), (pp, [r % 4, r % 4 + 4], -1, -1, -1),
                               (ep, [4 * (r // 4) + i for i in range(4)], *e)], entries))
    views = {rec.rank: rank_view(rec) for rec in recs}
    assert views[6].waits_on == (("pp2", "recv", 2),)
    assert [(s.rank, s.pg, s.reason) for s in localize(views)] == [(3, "ep0", "never_enqueued")]


def test_a_gpu_fault_is_named_when_every_member_enqueued():
    """Nobody is behind in what they enqueued, but rank 1 never completed collective 6 that ranks 0, 2 and 3
    completed: its GPU stopped there (``never_completed``); the others wait in 7 and 8 for it."""
    recs = [fr(r, [("0", [0, 1, 2, 3], 8, -1, 5 if r == 1 else 6)], [(8, "allreduce", "0", "scheduled", 8, "Float")])
            for r in range(4)]
    views = {rec.rank: rank_view(rec) for rec in recs}
    assert [(s.rank, s.reason, s.seq, s.detail["ranks_waiting"]) for s in localize(views)] == [
        (1, "never_completed", 6, 1)]
    healthy = [fr(r, [("0", [0, 1, 2, 3], 8, -1, 6)]) for r in range(4)]
    assert localize({rec.rank: rank_view(rec) for rec in healthy}) == []
