"""Stack sweeps: py-spy parsing, normalization, clustering, and the StackDetector."""

from __future__ import annotations

import random

import orjson
import pytest
from gangwatch.detectors.stacks import (
    StackConfig,
    StackDetector,
    cluster_ranks,
    normalize_frame,
    parse_pyspy,
    signature,
    suspect_clusters,
    thread_stacks,
)
from gangwatch.detectors.topology import Topology
from gangwatch.schemas import Job, RankInfo, Stack, decode

from tests.helpers import data_path

pytestmark = pytest.mark.unit

PYSPY = "pyspy/dataloader-hang-8ranks"


def topology(n: int, per_node: int = 8, job: str = "j1") -> Topology:
    ranks = [RankInfo(rank=r, node=f"n{r // per_node:03d}", gpu=r % per_node) for r in range(n)]
    return Topology.from_job(Job(ts=0.0, job=job, ranks=ranks))


def stack_rec(rank: int, dump: str, ts: float, snapshot: str = "s-1", job: str = "j1") -> Stack:
    """A `stack` record, through the wire decoder as the pipeline would see it."""
    (rec,) = decode(orjson.dumps({"kind": "stack", "v": 1, "ts": ts, "job": job, "rank": rank,
                                  "snapshot": snapshot, "format": "py-spy", "dump": dump}))
    assert isinstance(rec, Stack), rec
    return rec


def real_records(ts0: float = 1000.0) -> list[Stack]:
    root = data_path(PYSPY)
    return [stack_rec(r, (root / f"dump_rank{r}.txt").read_text(), ts0 + 0.1 * r) for r in range(8)]


HEALTHY = [("all_reduce", "torch/distributed/distributed_c10d.py"), ("wrapper", "torch/distributed/c10d_logger.py"),
           ("_engine_run_backward", "torch/autograd/graph.py"), ("backward", "torch/autograd/__init__.py"),
           ("Tensor.backward", "torch/_tensor.py"), ("train_step", "train.py"), ("main", "train.py"),
           ("<module>", "train.py")]
CHECKPOINT = [("BufferedWriter.write", "io.py"), ("_save", "torch/serialization.py"),
              ("save", "torch/serialization.py"), ("save_checkpoint", "ckpt.py"), ("main", "train.py"),
              ("<module>", "train.py")]


def pyspy_text(frames: list[tuple[str, str]], rng: random.Random, *, feeder: bool = True) -> str:
    """A py-spy dump of `frames` with random pids, thread ids, line numbers and directories."""
    pid = rng.randint(1000, 99999)
    prefix = rng.choice(["/usr/lib/python3.11/site-packages/", "/opt/venv/lib/python3.11/site-packages/", ""])
    lines = [f"Process {pid}: /usr/bin/python3 -u train.py", "Python v3.11.7 (/usr/bin/python3.11)", "",
             f'Thread 0x{rng.getrandbits(48):X} (idle): "MainThread"']
    lines += [f"    {func} ({prefix if '/' in file else ''}{file}:{rng.randint(1, 3000)})" for func, file in frames]
    if feeder:
        lines += [f'Thread {pid + 7} (idle): "QueueFeederThread"',
                  f"    Condition.wait (threading.py:{rng.randint(300, 330)})",
                  "    Thread.run (threading.py:982)"]
    return "\n".join(lines) + "\n"


# --- parsing and normalization -----------------------------------------------------------


def test_parse_real_dump():
    threads = parse_pyspy((data_path(PYSPY) / "dump_rank0.txt").read_text())
    assert [t.name for t in threads] == ["MainThread", "QueueFeederThread"]
    main = threads[0]
    assert main.is_main and main.state == "idle" and main.pid == 14149 and main.thread == "14149"
    assert main.frames[0] == ("_engine_run_backward", "torch/autograd/graph.py", 979)
    assert main.frames[2].func == "Tensor.backward"
    assert main.frames[-1] == ("<module>", "train.py", 40)
    assert len(main.frames) == 5 and len(threads[1].frames) == 5


def test_parse_variants():
    text = ("Process 12: python x.py\nPython v3.11.7\n\n"
            'Thread 0x7F3A2B (active+gil): "MainThread"\n'
            "    compute (/a/b/model.py:10)\n"
            "        Arguments:\n            x: 3\n        Locals:\n            y: <tensor at 0x7f00>\n"
            "    <lambda> (model.py)\n"
            "    0x7f1234abcd (libc.so.6)\n"
            "    bare_native\n"
            "Thread 0x7F3A2C (idle)\n"
            "    sleep (time.py:1)\n"
            "Process 13: worker\n"
            'Thread 13 (idle): "MainThread"\n'
            "    loop (worker.py:5)\n")
    threads = parse_pyspy(text)
    assert [(t.pid, t.thread, t.state, t.name) for t in threads] == [
        (12, "0x7F3A2B", "active+gil", "MainThread"), (12, "0x7F3A2C", "idle", None), (13, "13", "idle", "MainThread")]
    assert threads[0].is_active and not threads[1].is_active
    assert threads[0].frames == (("compute", "/a/b/model.py", 10), ("<lambda>", "model.py", None),
                                 ("0x7f1234abcd", "libc.so.6", None), ("bare_native", None, None))
    assert normalize_frame("0x7f1234abcd", "libc.so.6") == "0x (libc.so.6)"
    assert parse_pyspy("") == [] and parse_pyspy("garbage\n  more garbage\n") == []


def test_normalization_merges_paths_differing_only_in_line_numbers():
    a, b = random.Random(1), random.Random(2)
    da, db = pyspy_text(HEALTHY, a), pyspy_text(HEALTHY, b)
    assert da != db  # different pids, thread ids, lines, directories
    sa, sb = signature(parse_pyspy(da)), signature(parse_pyspy(db))
    assert sa == sb
    assert sa[0] == "all_reduce (distributed_c10d.py)" and all(":" not in f for f in sa)
    clusters = cluster_ranks({0: sa, 1: sb, 2: signature(parse_pyspy(pyspy_text(HEALTHY, random.Random(3))))})
    assert len(clusters) == 1 and clusters[0].ranks == (0, 1, 2)


def test_signature_modes_and_frames_format():
    text = ('Thread 1 (idle): "MainThread"\n    a (x.py:1)\n'
            'Thread 2 (active): "worker"\n    b (y.py:2)\n'
            'Thread 3 (idle): "other"\n    c (z.py:3)\n')
    threads = parse_pyspy(text)
    assert signature(threads) == ("a (x.py)",)
    assert signature(threads, "active") == ("a (x.py)", "|", "b (y.py)")
    assert signature(threads, "all") == ("a (x.py)", "|", "b (y.py)", "|", "c (z.py)")
    assert signature(threads[1:]) == ("b (y.py)",)  # no main thread: the active ones
    (rec,) = decode(orjson.dumps({"kind": "stack", "v": 1, "ts": 1.0, "job": "j1", "rank": 0, "snapshot": "s",
                                  "format": "frames", "frames": [{"func": "a", "file": "/p/x.py", "line": 9}]}))
    assert signature(thread_stacks(rec)) == ("a (x.py)",)


# --- clustering ------------------------------------------------------------------------


def test_cluster_and_suspects():
    rng = random.Random(0)
    sigs = {r: signature(parse_pyspy(pyspy_text(HEALTHY, rng))) for r in range(10)}
    sigs[4] = signature(parse_pyspy(pyspy_text(CHECKPOINT, rng)))
    # a near variant of the healthy path (one extra innermost frame) stays with the healthy ranks
    sigs[7] = ("synchronize (streams.py)",) + sigs[0]
    clusters = cluster_ranks(sigs)
    assert [c.ranks for c in clusters] == [(0, 1, 2, 3, 5, 6, 7, 8, 9), (4,)]
    assert clusters[0].distance == 0.0 and clusters[1].distance > 0.5
    assert [c.ranks for c in suspect_clusters(clusters, 10)] == [(4,)]
    # a 50/50 split has no healthy majority: no suspects
    half = {r: sigs[0] if r < 5 else sigs[4] for r in range(10)}
    assert suspect_clusters(cluster_ranks(half), 10) == []


def test_cluster_beyond_max_distinct_is_consistent():
    rng = random.Random(5)
    sigs = {r: signature(parse_pyspy(pyspy_text(HEALTHY, rng))) for r in range(20)}
    for r in (3, 11):
        sigs[r] = signature(parse_pyspy(pyspy_text(CHECKPOINT, rng)))
    for r in (5, 6, 7):  # distinct but close variants
        sigs[r] = (f"variant{r} (v.py)",) + sigs[0]
    exact = cluster_ranks(sigs)
    capped = cluster_ranks(sigs, max_distinct=2)
    assert [c.ranks for c in exact] == [c.ranks for c in capped]



def test_each_clusters_distance_is_the_cosine_distance_of_its_path_from_the_dominant_one():
    """Paths of distinct frames (no hash collisions): the cosine of two binary token sets is |A & B| / sqrt(|A||B|),
    tokens being the frames and caller<-callee pairs; a sweep with every rank on its own path takes one product."""
    rng = random.Random(3)
    frames = [f"f{i} (m{i % 7}.py)" for i in range(40)]
    sigs = {r: tuple(rng.sample(frames, rng.randint(2, 12))) for r in range(300)}
    sigs.update({r: sigs[0] for r in range(300, 700)})  # the dominant path

    def tokens(sig: tuple[str, ...]) -> set[str]:
        return set(sig) | {f"{a}<-{b}" for a, b in zip(sig, sig[1:], strict=False)}

    clusters = cluster_ranks(sigs, distance_threshold=0.01, max_distinct=64)
    assert clusters[0].signature == sigs[0] and len(clusters[0].ranks) >= 401
    dom = tokens(clusters[0].signature)
    for c in clusters:
        mine = tokens(c.signature)
        cos = len(mine & dom) / (len(mine) * len(dom)) ** 0.5
        assert c.distance == pytest.approx(max(0.0, 1.0 - cos), abs=2e-6)
    assert sorted(r for c in clusters for r in c.ranks) == list(range(700))


def test_preload_imports_the_clustering_libraries():
    """The worker imports scikit-learn at start (`preload`, in a thread), not on the first sweep, which waited for
    it on the event loop."""
    import subprocess
    import sys

    code = ("import sys; from gangwatch.detectors.stacks import preload; "
            "assert 'sklearn.cluster' not in sys.modules; preload(); assert 'sklearn.cluster' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


# --- detector --------------------------------------------------------------------------


def test_real_dataset_localizes_rank_5():
    det = StackDetector(topology(8))
    recs = real_records()
    out = []
    for rec in recs[:-1]:
        assert det.observe(rec) == []
    out = det.observe(recs[-1])  # the last rank completes the snapshot
    assert [f.rank for f in out] == [5]
    f = out[0]
    assert f.type == "stack_outlier" and f.detector == "stacks" and f.node == "n000" and f.gpu == 5
    assert f.ts == pytest.approx(recs[-1].ts)
    assert 0.5 < f.score <= 1.0
    ev = f.evidence
    assert ev["snapshot"] == "s-1" and ev["cluster"] == 1 and ev["cluster_size"] == 1 and ev["dominant_size"] == 7
    assert "_BaseDataLoaderIter.__next__ (dataloader.py)" in ev["frames"]
    assert ev["top_frame"] == "_PollLikeSelector.select (selectors.py)"
    assert "Tensor.backward (_tensor.py)" in ev["missing_frames"]
    assert det.pending == {} and det.advance(1e9) == []
    assert det.observe(recs[0]) == []  # a late record of an analysed snapshot is ignored
    assert orjson.loads(orjson.dumps(f.evidence)) == f.evidence


def test_partial_snapshot_is_analysed_after_the_window():
    det = StackDetector(topology(8), StackConfig(window_s=30.0))
    recs = real_records(ts0=500.0)
    for rec in recs[1:]:  # rank 0 never reports
        assert det.observe(rec) == []
    deadline = recs[1].ts + 30.0  # the first record that arrived, plus the window
    assert det.advance(deadline - 0.01) == []
    out = det.advance(deadline)
    assert [f.rank for f in out] == [5] and out[0].ts == pytest.approx(deadline)
    assert out[0].evidence["ranks_reported"] == 7
    assert det.advance(600.0) == []


def test_record_after_the_window_is_late():
    det = StackDetector(topology(8), StackConfig(window_s=10.0))
    recs = real_records(ts0=0.0)
    for rec in recs[:6]:
        det.observe(rec)
    late = stack_rec(6, recs[6].dump, ts=11.0)
    assert det.observe(late) == []
    assert 6 not in det.pending["s-1"].items
    assert [f.rank for f in det.advance(10.0)] == [5]


def test_state_round_trip_mid_snapshot_gives_identical_findings():
    recs = real_records()
    a = StackDetector(topology(8))
    for rec in recs[:4]:
        assert a.observe(rec) == []
    state = orjson.loads(orjson.dumps(a.state()))
    b = StackDetector.from_state(state, topology(8))
    assert b.state() == state
    out_a = [f for rec in recs[4:] for f in a.observe(rec)]
    out_b = [f for rec in recs[4:] for f in b.observe(rec)]
    assert out_a == out_b and [f.rank for f in out_a] == [5]
    assert [f.id for f in out_a] == [f.id for f in out_b]


def test_sixteen_ranks_two_outliers_on_one_node():
    rng = random.Random(42)
    det = StackDetector(topology(16))
    out = []
    for r in rng.sample(range(16), 16):  # arrival order does not matter
        frames = CHECKPOINT if r in (10, 13) else HEALTHY
        out += det.observe(stack_rec(r, pyspy_text(frames, rng), ts=100.0 + rng.random()))
    assert sorted(f.rank for f in out) == [10, 13]
    assert {f.node for f in out} == {"n001"}
    assert all(f.evidence["cluster_size"] == 2 and f.evidence["node_suspects"] == 2 for f in out)
    assert all("save_checkpoint (ckpt.py)" in f.evidence["frames"] for f in out)
    assert len({f.id for f in out}) == 2


def test_no_findings_when_all_ranks_agree_or_too_few():
    rng = random.Random(9)
    det = StackDetector(topology(8))
    assert [f for r in range(8) for f in det.observe(stack_rec(r, pyspy_text(HEALTHY, rng), 1.0))] == []
    det = StackDetector(topology(8), StackConfig(min_ranks=3))
    det.observe(stack_rec(0, pyspy_text(HEALTHY, rng), 1.0))
    det.observe(stack_rec(1, pyspy_text(CHECKPOINT, rng), 1.0))
    assert det.advance(100.0) == []


def test_pipeline_stages_are_compared_separately():
    """Stage 1 legitimately sits elsewhere; only the odd rank within a stage is suspect."""
    ranks = [RankInfo(rank=r, node=f"n{r // 4:03d}", gpu=r % 4, pp=r // 8) for r in range(16)]
    topo = Topology.from_job(Job(ts=0.0, job="j1", ranks=ranks))
    rng = random.Random(3)
    recv = [("recv", "torch/distributed/distributed_c10d.py"), ("recv_forward", "p2p.py"), ("main", "train.py")]
    det = StackDetector(topo)
    out = []
    for r in range(16):
        frames = HEALTHY if r < 8 else recv
        if r == 12:
            frames = CHECKPOINT
        out += det.observe(stack_rec(r, pyspy_text(frames, rng), 1.0))
    assert [(f.rank, f.evidence["stage"]) for f in out] == [(12, 1)]


def test_snapshots_are_independent_and_bounded():
    rng = random.Random(4)
    det = StackDetector(topology(4), StackConfig(max_pending=2, min_ranks=3))
    for i in range(3):
        for r in range(3):
            frames = CHECKPOINT if r == 0 else HEALTHY
            det.observe(stack_rec(r, pyspy_text(frames, rng), ts=float(i), snapshot=f"s-{i}"))
    assert len(det.pending) == 2 and "s-0" in det.done
    out = det.advance(1000.0)
    assert [f.evidence["snapshot"] for f in out] == []  # 3 ranks, 1 outlier: 1/3 > max_outlier_fraction
    det = StackDetector(topology(4), StackConfig(max_outlier_fraction=0.34))
    for r in range(4):
        out = det.observe(stack_rec(r, pyspy_text(CHECKPOINT if r == 2 else HEALTHY, rng), 1.0, snapshot="a"))
    assert [f.rank for f in out] == [2]


def test_topology_change_drops_ranks_beyond_the_new_size():
    rng = random.Random(6)
    det = StackDetector(topology(8))
    for r in range(8):
        if r != 3:
            det.observe(stack_rec(r, pyspy_text(HEALTHY, rng), 1.0))
    det.set_topology(topology(4))
    assert sorted(det.pending["s-1"].items) == [0, 1, 2]
    assert det.observe(stack_rec(3, pyspy_text(HEALTHY, rng), 2.0)) == []
    assert det.pending == {}
