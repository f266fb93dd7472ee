"""The trainer-side reporter: contract records keyed by job, batched, with an injected clock."""

from __future__ import annotations

import pytest
from gangwatch.producers.reporter import Reporter
from gangwatch.schemas import DecodeError, Framework, Heartbeat, Step, decode

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.t = 1_700_000_000.0

    def __call__(self) -> float:
        self.t += 0.5
        return self.t


def test_steps_heartbeats_and_events_are_contract_records_keyed_by_job():
    sent = []
    rep = Reporter("j1", 5, send=lambda *m: sent.append(m), clock=Clock())
    rep.heartbeat()
    rep.step(100, 1.84, compute_s=1.1, comm_wait_s=0.66, loss=float("nan"))
    rep.heartbeat()
    rep.event("exception", "CUDA error: an illegal memory access")
    assert {(topic, key) for topic, key, _ in sent} == {("gw.telemetry", b"j1")}
    recs = [r for _, _, v in sent for r in decode(v)]
    assert not any(isinstance(r, DecodeError) for r in recs)
    assert [type(r) for r in recs] == [Heartbeat, Step, Heartbeat, Framework]
    assert recs[0].step is None and recs[2].step == 100  # a heartbeat carries the last finished step
    assert recs[1].compute_s == 1.1 and recs[1].loss != recs[1].loss  # NaN travels
    assert [r.ts for r in recs] == sorted(r.ts for r in recs)


def test_pending_records_go_out_as_batches():
    sent = []
    rep = Reporter("j1", 0, send=lambda *m: sent.append(m), clock=Clock(), batch_max=3)
    for k in range(7):
        rep._add(Heartbeat(ts=float(k), job="j1", rank=0))
    rep.flush()
    sizes = [len(decode(v)) for _, _, v in sent]
    assert sizes == [3, 3, 1]
    assert b'"kind":"batch"' in sent[0][2] and b'"kind":"batch"' not in sent[2][2]


def test_exactly_one_way_to_send():
    with pytest.raises(ValueError, match="exactly one"):
        Reporter("j1", 0)
