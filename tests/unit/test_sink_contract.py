"""The sink contract, the same tests over every sink as the worker runs it (`sinks.queued.queued`).

Sinks: JSONL files, the Kafka topics (kafka-python's producer replaced by a fake
that keeps a log per topic), the ClickHouse store (`StoreSink` over a fake store
that raises clickhouse-driver's own exceptions), the job-controller webhook and
Alertmanager (both against a local http.server). For each:

- idempotent rewrite: the same outputs written twice leave the same end state, by id;
- flush and close: `drain` delivers everything, `close` reports what it left, a
  close with a stuck receiver is bounded in time;
- transient vs permanent errors: two transient failures then success is one
  delivery after two back-offs (1x, 2x the base: the injected sleep records them);
  a permanent failure (HTTP 400, a ClickHouse type mismatch, a record that cannot
  be encoded) is tried once and becomes one dead letter while the rest is delivered;
- backpressure: with the receiver stuck, `write`+`flush` stay within a few ms,
  `pressure()` turns on at the high-water mark, a full queue refuses into dead
  letters, and everything else is delivered once the receiver answers again.

Nothing sleeps to wait for a thread: tests wait on events and on `drain`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from gangwatch.schemas import DeadLetter, Outputs

from tests.unit.sinkcases import (
    BASE_S,
    HARNESSES,
    WAIT_S,
    Harness,
    Watched,
    WebhookHarness,
    send,
)

pytestmark = pytest.mark.unit



@pytest.fixture(params=HARNESSES, ids=[h.name for h in HARNESSES])
def h(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    harness = request.param(tmp_path)
    yield harness
    harness.close()


# --- the contract ---------------------------------------------------------------------------------------


def test_idempotent_rewrite(h: Harness) -> None:
    once = h.make()
    send(once, h.outputs("1"))
    assert once.drain(WAIT_S) == 0
    first = h.state()
    assert set(first) == h.expected("1")
    send(once, h.outputs("1"))  # the same outputs again (a replayed partition, a retried batch)
    send(once, h.outputs("1"))
    assert once.drain(WAIT_S) == 0
    assert h.state() == first
    assert once.take_dead() == []
    assert once.close() == 0


def test_flush_and_close(h: Harness) -> None:
    sink = h.make()
    for i in range(5):
        send(sink, h.outputs(str(i)))
    assert sink.drain(WAIT_S) == 0 and sink.pending() == 0
    assert set(h.state()) == h.expected(*map(str, range(5)))
    assert sink.close() == 0


def test_close_with_a_stuck_receiver_is_bounded_and_says_what_it_left(h: Harness) -> None:
    sink = h.make(close_timeout_s=0.3)
    h.gate.close()
    send(sink, h.outputs("1"))
    assert h.gate.entered.wait(WAIT_S)  # the delivery is stuck at the receiver
    send(sink, h.outputs("2"))
    close = Watched(lambda: sink.close(0.3) if not h.native else sink.close(), h.gate)
    # it gives up on the receiver instead of waiting for it (the Alertmanager sink after one HTTP timeout)
    assert close.returned_while_stuck()
    h.gate.opened.set()
    assert close.value > 0


def test_transient_errors_are_retried_with_capped_exponential_backoff(h: Harness) -> None:
    sink = h.make()
    h.fail_transient(2)
    send(sink, h.outputs("1"))
    assert sink.drain(WAIT_S) == 0
    assert set(h.state()) == h.expected("1")  # delivered
    assert h.sleeps.delays == [BASE_S, 2 * BASE_S]  # after each of the two failures, doubling
    assert h.attempts() == 3
    assert sink.take_dead() == []
    if isinstance(h, WebhookHarness):  # one delivery: one request accepted, by its idempotency key
        assert len(h.receiver.accepted) == 1
    assert sink.close() == 0


def test_permanent_errors_are_not_retried_and_become_dead_letters(h: Harness) -> None:
    sink = h.make()
    send(sink, h.poisoned())
    assert sink.drain(WAIT_S) == 0
    dead = sink.take_dead()
    assert [d.kind for d in dead if "poison" in d.raw] == [dead[0].kind] and dead, dead
    assert all(isinstance(d, DeadLetter) and d.source == f"sink:{sink.name}" and "permanent" in d.reason
               for d in dead)
    assert h.sleeps.delays == []  # no back-off: nothing was retried
    assert not any("poison" in k for k in h.state())
    if not h.native:  # everything but the poison arrived (Alertmanager sends a batch in one POST)
        good = {k for k in h.expected("good1", "good2") if k in _ids(h.poisoned())}
        assert set(h.state()) == good
        assert len(dead) == 1 and sink.failures == 1
    if isinstance(h, WebhookHarness):
        assert [b for b in h.receiver.requests if b"poison" in b] and \
            len([b for b in h.receiver.requests if b"poison" in b]) == 1  # tried once
    assert sink.take_dead() == []  # handed over once


def test_backpressure_write_never_blocks_pressure_is_reported_and_the_backlog_drains(h: Harness) -> None:
    capacity = 10
    sink = h.make(capacity=capacity)
    h.gate.close()
    send(sink, h.outputs("0"))
    assert h.gate.entered.wait(WAIT_S)  # the receiver holds the first delivery
    assert not sink.pressure()
    i = 1
    while not sink.pressure():
        send(sink, h.outputs(str(i)))
        i += 1
        assert i < 50, "pressure never reported"
    pressed_at = sink.pending()
    assert pressed_at >= int(capacity * 0.8)
    for j in range(i, i + 10):  # a full queue refuses what comes (as dead letters), without waiting
        send(sink, h.outputs(str(j)))
    # every write+flush above returned on this thread while the receiver held the first delivery all along
    assert not h.gate.left.is_set()
    if not h.native:
        assert sink.full and sink.overflowed > 0
        refused = sink.take_dead()
        assert refused and all("queue full" in d.reason for d in refused)
    h.gate.opened.set()
    assert sink.drain(WAIT_S) == 0
    assert not sink.pressure()
    delivered = set(h.state())
    assert h.expected("0") <= delivered
    if not h.native:
        assert sink.delivered + sink.overflowed == _count_all(h, i + 10)
    assert sink.close() == 0


def _ids(out: Outputs) -> set[str]:
    return {r.id for r in (*out.findings, *out.actions, *out.incidents)}


def _count_all(h: Harness, n: int) -> int:
    return sum(len(h.expected(str(i))) for i in range(n))  # what the sink takes of them (the webhook: actions)


