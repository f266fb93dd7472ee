"""JobSlowdownDetector, and the StepBuffer / StepColumns that all step-scoring detectors share."""

from __future__ import annotations

import math

import numpy as np
import orjson
import pytest
from gangwatch.detectors.config import BufferConfig, SlowdownConfig
from gangwatch.detectors.failslow import FailSlowDetector
from gangwatch.detectors.runs import StepColumns
from gangwatch.detectors.slowdown import JobSlowdownDetector
from gangwatch.detectors.step_buffer import StepBuffer
from gangwatch.schemas import Step, to_dict
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.stepgen import (
    JobSlow,
    Straggler,
    assert_json_safe,
    by_type,
    feed,
    gen_columns,
    gen_steps,
    interleave_late,
    make_topology,
    roundtrip,
)

pytestmark = pytest.mark.unit

CFG = SlowdownConfig()
LEAN = {"numbers": False, "digests": False}


@pytest.fixture(scope="module")
def topo():
    return make_topology(128)


def rec(step: int, rank: int, ts: float, step_s: float = 1.0, **kw) -> Step:
    return Step(ts=ts, job="j1", rank=rank, step=step, step_s=step_s, **kw)


def closed_view(closed):
    """Comparable form of closed steps (NaN != NaN, so floats as repr)."""
    return [(c.step, c.ts, c.epoch, c.seen.tolist(), {k: list(map(repr, v.tolist())) for k, v in c.vals.items()},
             {k: v.tolist() for k, v in c.present.items()}, {k: v.tolist() for k, v in c.codes.items()}, c.vocab)
            for c in closed]


# --- StepBuffer -----------------------------------------------------------------------------------


def test_buffer_hands_over_complete_steps():
    buf = StepBuffer(4, {"step_s": "f"})
    out = []
    for s in range(3):
        for r in range(4):
            out += buf.add_record(rec(s, r, s + r / 10, step_s=1.0 + r))
    assert [(c.step, c.ts) for c in out] == [(0, 0.3), (1, 1.3), (2, 2.3)]
    assert out[0].vals["step_s"].tolist() == [1.0, 2.0, 3.0, 4.0] and buf.dropped == 0 and not buf.open


def test_buffer_closes_a_step_missing_a_rank_once_most_ranks_moved_on():
    buf = StepBuffer(4, {"step_s": "f"}, BufferConfig(lag=2, close_frac=0.5))
    out = []
    for s in range(4):
        for r in range(4):
            if not (s == 0 and r == 3):
                out += buf.add_record(rec(s, r, float(s)))
    # step 0 closes when 2 of 4 ranks reached step 2, before step 1 completes? no: 1 completes first,
    # closing 0 with it (closing is monotone: everything up to the closed step)
    assert [c.step for c in out] == [0, 1, 2, 3]
    assert out[0].seen.tolist() == [True, True, True, False]
    assert buf.add_record(rec(0, 3, 9.0)) == [] and buf.dropped == 1  # too late


def test_buffer_majority_rule_and_max_open_wait_out_the_reorder_window():
    buf = StepBuffer(4, {"step_s": "f"}, BufferConfig(lag=2, close_frac=0.5, max_open=3, reorder_s=3.0))
    out = []
    out += buf.add_record(rec(0, 0, 0.0))  # only rank 0 reports step 0
    out += buf.add_record(rec(2, 0, 2.0))
    out += buf.add_record(rec(2, 1, 2.1))  # half the job is at step 2: step 0 is due, but only 2.1 s old
    assert out == [] and sorted(buf.open) == [0, 2]
    out += buf.add_record(rec(3, 0, 3.05))  # a step opened 3 s after step 0's first record: step 0 closes
    assert [(c.step, c.ts, int(c.seen.sum())) for c in out] == [(0, 3.05, 1)]
    buf.add_record(rec(4, 0, 4.0))  # 3 open (2, 3, 4)
    assert buf.add_record(rec(5, 0, 4.5)) == []  # a fourth: the oldest (2, from 2.0) is not 3 s old, it waits
    out = buf.add_record(rec(6, 0, 5.2))  # now it is: crowding closes it
    assert [c.step for c in out] == [2] and sorted(buf.open) == [3, 4, 5, 6]


def test_buffer_keeps_at_most_its_cap_of_steps_open_while_they_wait():
    buf = StepBuffer(4, {"step_s": "f"}, BufferConfig(max_open=2, reorder_s=3.0, reorder_cells=12))
    assert buf.cap == 3  # 12 rank-values of a 4-rank job
    out = [c for s in range(3) for c in buf.add_record(rec(s, 0, s / 10))]
    assert out == [] and sorted(buf.open) == [0, 1, 2]
    assert [c.step for c in buf.add_record(rec(3, 0, 0.3))] == [0]


def _batched(recs: list[Step], flush_s: float, seed: int) -> list[Step]:
    """`recs` (in event-time order) as they reach the worker when each rank sends its records every `flush_s`,
    at its own phase: a rank's batch arrives whole, the batches of different ranks in order of sending."""
    rng = np.random.default_rng(seed)
    phase = {r: float(rng.uniform(0, flush_s)) for r in {x.rank for x in recs}}
    sent = [(math.ceil((x.ts - phase[x.rank]) / flush_s) * flush_s + phase[x.rank], x.rank, i)
            for i, x in enumerate(recs)]
    return [recs[i] for _, _, i in sorted(sent)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_buffer_scores_the_same_steps_live_as_in_event_time_order(seed):
    """Ranks that send their records in batches every second (the trainer client) deliver one rank's next
    steps before another's current one; within the reorder window the steps are whole all the same. A rank
    that died (rank 5, from step 30) leaves its steps to the most-ranks rule, the same way in both orders."""
    recs = [rec(s, r, s * 0.125 + r / 1000, step_s=1.0 + r) for s in range(80) for r in range(8)
            if not (r == 5 and s >= 30)]

    def closed(order: list[Step], cfg: BufferConfig) -> list:
        buf = StepBuffer(8, {"step_s": "f"}, cfg)
        return [(c.step, c.seen.tolist()) for r in order for c in buf.add_record(r)] + \
            [(c.step, c.seen.tolist()) for c in buf.expire(math.inf)]

    live, ordered = _batched(recs, 1.0, seed), sorted(recs, key=lambda x: x.ts)
    assert live != ordered
    assert closed(live, BufferConfig()) == closed(ordered, BufferConfig())
    assert [s for s, seen in closed(live, BufferConfig()) if not all(seen)] == list(range(30, 80))
    without = BufferConfig(reorder_s=0.0)  # what it did before the window: live lost whole ranks' steps
    assert closed(live, without) != closed(ordered, without)


def test_buffer_out_of_order_records_within_lateness_are_kept(topo):
    buf = StepBuffer(topo.size, {"step_s": "f"})
    out = []
    for batch in interleave_late(gen_steps(topo, 30, **LEAN), frac=0.2):
        for r in batch:
            out += buf.add_record(r)
    assert buf.dropped == 0 and [c.step for c in out] == list(range(30))
    assert all(c.seen.all() for c in out)


def test_buffer_expire_is_independent_of_how_often_time_advances():
    def run(nows):
        buf = StepBuffer(8, {"step_s": "f"}, BufferConfig(lateness_s=5.0))
        buf.add_record(rec(0, 0, 10.0))
        buf.add_record(rec(1, 0, 9.0))  # a younger step whose first record is older
        buf.add_record(rec(2, 0, 30.0))
        out = []
        for now in nows:
            out += buf.expire(now)
        return [(c.step, c.ts) for c in out]
    expected = [(0, 15.0), (1, 15.0), (2, 35.0)]
    assert run([100.0]) == expected
    assert run([14.0, 14.5, 15.0, 20.0, 34.9, 35.0]) == expected
    assert run([14.9]) == []


def test_buffer_rewind_to_a_checkpoint():
    buf = StepBuffer(4, {"step_s": "f"}, BufferConfig(max_open=4))
    out = []
    for s in list(range(30)) + list(range(10, 20)):  # the job restarts from step 10
        for r in range(4):
            out += buf.add_record(rec(s, r, float(len(out))))
    assert buf.epoch == 1
    again = [c for c in out if c.epoch == 1]
    assert [c.step for c in again] == list(range(11, 20))  # step 10 voted for the rewind


def _messy_stream(n_ranks: int, seed: int):
    """Records in shuffled order with duplicates, out-of-range ranks, missing values and NaNs."""
    rng = np.random.default_rng(seed)
    recs = []
    for s in range(12):
        for r in rng.permutation(n_ranks + 2):  # two ranks beyond the topology
            loss = [None, math.nan, math.inf, 1.0 + r][int(rng.integers(4))]
            recs.append(rec(s, int(r), s + int(r) / 1000, compute_s=None if r % 7 == 0 else 0.5 + r / 100,
                            loss=loss, replica_digest=None if r % 5 == 0 else f"d{s}-{r % 3}"))
    for i in rng.integers(0, len(recs), 40):  # duplicates
        recs.insert(int(i), recs[int(i)])
    for _ in range(30):  # local reordering
        i = int(rng.integers(0, len(recs) - 50))
        j = i + int(rng.integers(1, 50))
        recs[i], recs[j] = recs[j], recs[i]
    return recs


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_buffer_batch_path_equals_record_path(seed):
    fields = {"compute_s": "f", "loss": "nf", "replica_digest": "c"}
    recs = _messy_stream(40, seed)
    a, b = StepBuffer(40, fields, BufferConfig(max_open=4)), StepBuffer(40, fields, BufferConfig(max_open=4))
    one = [c for r in recs for c in a.add_record(r)]
    many = []
    for i in range(0, len(recs), 97):
        many += b.add_columns(StepColumns(recs[i:i + 97]))
    assert closed_view(one) == closed_view(many) and one
    assert a.state() == b.state() and a.dropped == b.dropped > 0


_VALUES = st.one_of(st.none(), st.just(math.nan), st.just(math.inf), st.floats(0.1, 2.0))
_RECORD = st.tuples(st.integers(0, 5), st.integers(0, 9), _VALUES, st.sampled_from([None, "a", "b", "c"]))


@settings(max_examples=60, deadline=None)
@given(st.lists(_RECORD, min_size=60, max_size=300), st.lists(st.integers(1, 40), min_size=1, max_size=20),
       st.booleans())
def test_buffer_batch_path_equals_record_path_for_any_stream(raw, cuts, by_step):
    """Any order, duplicates, late and out-of-range records, any batch boundaries: the same steps."""
    if by_step:  # long runs of one step: the vectorized path
        raw = sorted(raw, key=lambda x: x[0])
    recs = [rec(s, r, s + r / 100, loss=v, compute_s=None if v is None or v != v else v, replica_digest=d)
            for s, r, v, d in raw]
    fields = {"compute_s": "f", "loss": "nf", "replica_digest": "c"}
    cfg = BufferConfig(max_open=3, lag=1)
    a, b = StepBuffer(8, fields, cfg), StepBuffer(8, fields, cfg)
    one = [c for r in recs for c in a.add_record(r)] + a.expire(math.inf)
    many, i, k = [], 0, 0
    while i < len(recs):
        n = cuts[k % len(cuts)] * (20 if k % 2 == 0 else 1)  # long runs take the vectorized path
        many += b.add_columns(StepColumns(recs[i:i + n]))
        i, k = i + n, k + 1
    many += b.expire(math.inf)
    assert closed_view(one) == closed_view(many) and a.state() == b.state()


def test_buffer_state_round_trip_keeps_nan_apart_from_missing():
    fields = {"compute_s": "f", "loss": "nf", "replica_digest": "c"}
    buf = StepBuffer(6, fields)
    for r, loss in enumerate([None, math.nan, math.inf, -math.inf, 2.5]):
        buf.add_record(rec(3, r, 1.0, compute_s=None if r == 0 else 0.5, loss=loss, replica_digest=f"x{r % 2}"))
    st = buf.state()
    assert_json_safe(st)
    assert st["open"][0]["loss"] == [None, "NaN", "Infinity", "-Infinity", 2.5]
    back = StepBuffer(6, fields)
    back.load(orjson.loads(orjson.dumps(st)))
    assert back.state() == st
    (c,) = back.add_record(rec(3, 5, 2.0, compute_s=0.5, loss=1.0, replica_digest="x1"))
    assert c.present["loss"].tolist() == [False, True, True, True, True, True]
    assert [c.vocab["replica_digest"][k] for k in c.codes["replica_digest"]] == ["x0", "x1"] * 3


def test_columns_from_arrays_equal_columns_from_records(topo):
    kw = dict(seed=3, stragglers=[Straggler(5, 1.2, start=50)], slow=[JobSlow(60, 65)], nan_loss={30: [2]})
    a, b = FailSlowDetector(topo), JobSlowdownDetector(topo)
    c, d = FailSlowDetector(topo), JobSlowdownDetector(topo)
    want = [f for batch in gen_steps(topo, 80, **kw) for f in a.observe_many(batch) + b.observe_many(batch)]
    got = [f for cols in gen_columns(topo, 80, **kw) for f in c.observe_many(cols) + d.observe_many(cols)]
    assert got == want and len(want) == 2
    assert a.state() == c.state() and b.state() == d.state()


# --- JobSlowdownDetector --------------------------------------------------------------------------


def test_baseline_appears_after_warmup(topo):
    det = JobSlowdownDetector(topo)
    feed(det, gen_steps(topo, CFG.warmup_steps + 2, **LEAN))
    assert det.baseline_s() is None
    feed(det, gen_steps(topo, 30, start_step=20, t0=20.0, **LEAN))
    assert det.baseline_s() == pytest.approx(0.98, rel=0.03)


def test_checkpoint_slowdown_is_one_job_finding_with_no_culprit(topo):
    det, fs = JobSlowdownDetector(topo), FailSlowDetector(topo)
    found = []
    for batch in gen_steps(topo, 150, slow=[JobSlow(100, 106, factor=3.0)]):
        found += det.observe_many(batch) + fs.observe_many(batch)
    assert [f.type for f in found] == ["job_slowdown"]  # and no fail_slow
    f = found[0]
    assert f.rank is None and f.node is None and f.gpu is None and f.detector == "slowdown.step_time"
    ev = f.evidence
    assert ev["first_step"] == 100 and ev["step"] == 100 + CFG.min_steps - 1 and ev["steps"] == CFG.min_steps
    assert ev["ratio"] == pytest.approx(3.0, rel=0.05) and ev["step_s"] > 2.5 and 0.9 < ev["baseline_s"] < 1.1


def test_short_or_benign_slowdowns_are_not_findings(topo):
    det = JobSlowdownDetector(topo)
    slow = [JobSlow(50, 50 + CFG.min_steps - 1, 5.0), JobSlow(100, 200, 1.3)]  # a 2-step stall, a 1.3x phase
    assert feed(det, gen_steps(topo, 250, slow=slow, **LEAN), batch=True) == []


def test_each_episode_is_reported_once_and_rearms(topo):
    det = JobSlowdownDetector(topo)
    slow = [JobSlow(50, 60, 2.0), JobSlow(62, 70, 2.0), JobSlow(120, 125, 2.0)]
    found = by_type(feed(det, gen_steps(topo, 150, slow=slow, **LEAN), batch=True), "job_slowdown")
    assert [f.evidence["first_step"] for f in found] == [50, 120]  # 60..61 was too short a break


def test_a_long_slowdown_becomes_the_new_baseline(topo):
    det = JobSlowdownDetector(topo, SlowdownConfig(rebaseline_steps=50))
    found = feed(det, gen_steps(topo, 200, slow=[JobSlow(40, 1000, 2.0)], **LEAN), batch=True)
    assert len(found) == 1 and det.baseline_s() == pytest.approx(1.98, rel=0.03) and not det.in_episode


def test_no_findings_in_an_hour_of_healthy_steps(topo):
    det = JobSlowdownDetector(topo)
    assert feed(det, gen_columns(topo, 3600, seed=11, **LEAN), batch=True) == []
    assert det.baseline_s() == pytest.approx(0.98, rel=0.03) and len(det.recent) == CFG.history


def test_batch_equals_per_record_and_state_round_trip(topo):
    def recs():
        s = gen_steps(topo, 80, seed=2, slow=[JobSlow(40, 45), JobSlow(60, 66, 2.0)], **LEAN)
        return [r for b in interleave_late(s, frac=0.1) for r in b]
    a, b = JobSlowdownDetector(topo), JobSlowdownDetector(topo)
    one = feed(a, [recs()])
    assert feed(b, [recs()], batch=True) == one and len(one) == 2 and a.state() == b.state()
    stream = recs()
    cut = 42 * 128 + 50
    det = JobSlowdownDetector(topo)
    got = feed(det, [stream[:cut]])
    det = roundtrip(det, topo)
    assert got + feed(det, [stream[cut:]]) == one


def test_deterministic(topo):
    def run():
        return feed(JobSlowdownDetector(topo), gen_steps(topo, 60, seed=1, slow=[JobSlow(30, 40)], **LEAN))
    first = run()
    assert first == run() and len(first) == 1
    assert_json_safe(to_dict(first[0]))


def test_set_topology_keeps_the_baseline_only_for_the_same_size(topo):
    det = JobSlowdownDetector(topo)
    feed(det, gen_steps(topo, 40, **LEAN), batch=True)
    base = det.baseline_s()
    det.set_topology(make_topology(128, job="j1", ts=50.0))
    assert det.baseline_s() == base and det.warm == 0
    det.set_topology(make_topology(256))
    assert det.baseline_s() is None and det.buf.size == 256


def test_missing_step_s_values_and_ranks_are_tolerated(topo):
    det = JobSlowdownDetector(topo)
    batches = gen_steps(topo, 60, slow=[JobSlow(40, 45)], **LEAN)
    found = feed(det, ([r for r in b if r.rank % 3] for b in batches))  # a third of the ranks never report
    assert [f.type for f in found] == ["job_slowdown"]


@settings(max_examples=60, deadline=None)
@given(st.lists(_RECORD, min_size=60, max_size=300), st.lists(st.integers(1, 40), min_size=1, max_size=20),
       st.booleans())
def test_buffer_batch_path_says_which_record_closed_each_step(raw, cuts, by_step):
    """`add_columns(cols, at)`: each step closed comes with the position of the record that closed it on the
    record path (the run path of the core hands a step's findings to triage at that record)."""
    if by_step:
        raw = sorted(raw, key=lambda x: x[0])
    recs = [rec(s, r, s + r / 100, loss=v, replica_digest=d) for s, r, v, d in raw]
    fields = {"loss": "nf", "replica_digest": "c"}
    cfg = BufferConfig(max_open=3, lag=1)
    a, b = StepBuffer(8, fields, cfg), StepBuffer(8, fields, cfg)
    one = [(i, c) for i, r in enumerate(recs) for c in a.add_record(r)]
    many, i, k = [], 0, 0
    while i < len(recs):
        n = cuts[k % len(cuts)] * (20 if k % 2 == 0 else 1)
        at: list[int] = []
        closed = b.add_columns(StepColumns(recs[i:i + n]), at)
        assert len(at) == len(closed)
        many += [(i + p, c) for p, c in zip(at, closed, strict=True)]
        i, k = i + n, k + 1
    assert [p for p, _ in one] == [p for p, _ in many]
    assert closed_view([c for _, c in one]) == closed_view([c for _, c in many])
