"""The worker's I/O half (`streams.workerio.WorkerIO`) on fakes of Faust's consumer: when it calls the input path
down."""

from __future__ import annotations

import asyncio
import math
import time
from collections import namedtuple
from types import SimpleNamespace

import pytest
from gangwatch.schemas import Heartbeat, encode
from gangwatch.schemas.topics import TopicSettings
from gangwatch.streams.faust_adapter import seek_to_committed
from gangwatch.streams.jobstate import JobState, Taken, seal
from gangwatch.streams.runner import JobRunner, Result
from gangwatch.streams.workerio import WorkerIO

from tests.integration.kafkakit import T0, messages, scenario

pytestmark = pytest.mark.unit


class Consumer:
    """aiokafka's consumer as `answering` reads it: its assignment and each partition's last answered fetch."""

    def __init__(self, stamps_ms: dict[str, float | None]) -> None:
        self.stamps_ms = stamps_ms

    def assignment(self) -> set[str]:
        return set(self.stamps_ms)

    def last_poll_timestamp(self, tp: str) -> float | None:
        return self.stamps_ms[tp]


def wio(consumer: Consumer) -> WorkerIO:
    thread = SimpleNamespace(_ensure_consumer=lambda: consumer)
    app = SimpleNamespace(consumer=SimpleNamespace(_thread=thread))
    return WorkerIO(app, JobRunner(TopicSettings()), None, {}, (), (), [], False, None)


def test_a_fresh_fetch_answer_means_the_broker_answers() -> None:
    now_ms = time.time() * 1000
    assert wio(Consumer({"a": now_ms - 10_000, "b": now_ms - 200})).answering(1.5)
    assert not wio(Consumer({"a": now_ms - 10_000, "b": now_ms - 3_000})).answering(1.5)
    assert wio(Consumer({"a": None})).answering(1.5)  # nothing fetched yet: no opinion


class Packing:
    """`JobRunner.take_state` that takes `cost` seconds of a fake clock per job packed."""

    def __init__(self, cost: dict[str, float]) -> None:
        self.now = 100.0
        self.cost = cost
        self.packed: list[str] = []

    def clock(self) -> float:
        return self.now

    def take_state(self, job: str) -> Taken:
        self.now += self.cost[job]
        self.packed.append(job)
        return Taken(job.encode(), b"")

    def state_of(self, job: str) -> bytes:
        return seal(self.take_state(job))


def saving(cost: dict[str, float], budget: float = math.inf) -> tuple[WorkerIO, Packing, list[str]]:
    """A WorkerIO whose jobs `cost` take that long to pack; returns it, the packing and the jobs written."""
    g = wio(Consumer({}))
    g.save_every_s, g.save_budget_s = 1.0, budget
    pack = Packing(cost)
    g.clock, g.runner.take_state, g.runner.state_of = pack.clock, pack.take_state, pack.state_of
    g.runner.jobs.update({job: JobState() for job in cost})
    written: list[str] = []
    g.checkpoint.pending._write = lambda job, blob: written.append(job)
    return g, pack, written


def test_states_are_taken_on_the_tick_at_most_every_save_every_s_and_never_most_of_the_time() -> None:
    g, pack, written = saving({"small": 0.001, "big": 0.5})  # packing the big job's state takes half a second

    def batch(*jobs: str) -> None:
        g.save(Result(dirty=set(jobs)))

    def tick(dt: float) -> list[str]:
        pack.now += dt
        pack.packed.clear()
        asyncio.run(g.offer(g.take(pack.now)))
        return sorted(pack.packed)

    batch("small", "big")
    batch("small")
    assert pack.packed == [] and written == []  # batches only remember the jobs they touched
    assert tick(0.5) == ["big", "small"] and sorted(written) == ["big", "small"]
    batch("small", "big")
    assert tick(0.5) == []  # both were taken less than save_every_s ago
    assert tick(0.6) == ["small"]  # the big one took 0.5 s to pack: not again for 10 x 0.5 s
    assert tick(0.5) == []  # nothing touched since
    batch("small", "big")
    assert tick(1.0) == ["small"]
    assert tick(1.5) == []  # the big one waits 5 s after its last packing began (t=100.5)
    assert tick(0.5) == ["big"]
    batch("small", "big")
    g.forget(["big"])  # revoked: nothing of it is saved from here
    pack.packed.clear()
    g.stop(in_flight=False)  # shutdown: every touched job, due or not
    assert pack.packed == ["small"]
    assert "big" not in g.next_take


def test_a_tick_packs_states_for_its_budget_the_jobs_waiting_longest_first() -> None:
    """Many jobs due at once are not packed in one tick (one stall of the event loop for all of them): a tick packs
    until its budget is spent, one job at least, and the next tick goes on with those that waited longest."""
    jobs = {f"j{k}": 0.02 for k in range(5)} | {"huge": 0.3}
    g, pack, written = saving(jobs, budget=0.05)

    def tick() -> list[str]:
        pack.now += 0.5
        pack.packed.clear()
        asyncio.run(g.offer(g.take(pack.now)))
        return pack.packed

    g.save(Result(dirty=set(jobs)))
    assert tick() == ["huge"]  # never taken: by name; alone past the budget
    assert tick() == ["j0", "j1", "j2"]  # the third one spends the budget
    assert tick() == ["j3", "j4"]
    assert sorted(written) == sorted(jobs)
    g.save(Result(dirty={"j0", "j4", "huge"}))
    assert tick() == ["j0"]  # j0 has waited longest; the huge one is not due (10 x its packing: 3 s)
    assert tick() == ["j4"]  # due 1 s after its packing began
    assert tick() == []
    assert tick() == ["huge"]


def test_states_are_compressed_off_the_event_loop_while_batches_go_on() -> None:
    """`offer` compresses in a thread: a batch runs (and takes the lock) while a state is being compressed; the
    state is offered after; a job revoked meanwhile is not, nor is anything once the worker stops."""
    import threading

    from gangwatch.streams import workerio

    g, pack, written = saving({"a": 0.001, "b": 0.001})
    started, release = threading.Event(), threading.Event()

    def slow_seal(taken: list[Taken]) -> list[bytes]:
        started.set()
        assert release.wait(30)
        return [seal(t) for t in taken]

    order: list[str] = []

    async def run() -> None:
        busy = asyncio.Lock()
        g.save(Result(dirty={"a", "b"}))
        async with busy:
            taken = g.take(pack.now)
        assert g.sealing == {"a", "b"}
        offering = asyncio.ensure_future(g.offer(taken))
        while not started.is_set():
            await asyncio.sleep(0)  # let the seal reach its thread
        async with busy:  # a batch, while the states are being compressed
            order.append("batch")
            g.save(Result(dirty={"a"}))
        g.forget(["b"])
        del g.runner.jobs["b"]  # revoked meanwhile
        release.set()
        await offering
        order.append("offered")

    real = workerio._seal_all
    workerio._seal_all = slow_seal
    try:
        asyncio.run(run())
    finally:
        workerio._seal_all = real
    assert order == ["batch", "offered"] and written == ["a"] and g.sealing == set()
    assert g.touched == {"a"}  # the batch's change waits for the next tick

    # stopping while a state is compressed: the compressed one is dropped, `stop` takes it again
    g2, pack2, written2 = saving({"a": 0.001})
    release.clear()
    started.clear()

    async def run_stop() -> None:
        g2.save(Result(dirty={"a"}))
        offering = asyncio.ensure_future(g2.offer(g2.take(pack2.now)))
        while not started.is_set():
            await asyncio.sleep(0)
        g2.stop(in_flight=False)
        assert written2 == ["a"] and pack2.packed == ["a", "a"]  # taken again at the stop, written
        release.set()
        await offering

    workerio._seal_all = slow_seal
    try:
        asyncio.run(run_stop())
    finally:
        workerio._seal_all = real
    assert written2 == ["a"]  # not twice


def test_the_state_changelog_takes_a_100k_rank_jobs_state(tmp_path) -> None:
    """A 100k-rank job's saved state is ~0.8 MB compressed (bench): its changelog topic is made for more than the
    broker's 1 MB default, and the producer may send it."""
    from gangwatch.streams.worker import STATE_MAX_BYTES, make_app
    from gangwatch.streams.worker_settings import WorkerSettings

    app = make_app(WorkerSettings(bootstrap="127.0.0.1:1", datadir=str(tmp_path / "faust"), metrics_port=0))
    changelog = app.tables["core-state"].changelog_topic
    assert int(changelog.config["max.message.bytes"]) == STATE_MAX_BYTES >= 8 << 20
    assert app.conf.producer_max_request_size == STATE_MAX_BYTES


class Seeking:
    """aiokafka's consumer as `seek_to_committed` drives it: the committed offsets, and the seeks made."""

    def __init__(self, committed: dict[tuple[str, int], int | None], kept_from: int = 0) -> None:
        self.committed = committed
        self.kept_from = kept_from  # the first offset the log keeps (retention deleted those before it)
        self.seeks: dict[tuple[str, int], int | str] = {}

    async def seek_to_committed(self) -> dict[tuple[str, int], int | None]:  # aiokafka: only offsets above 0
        self.seeks.update({tp: off for tp, off in self.committed.items() if off and off > 0})
        return dict(self.committed)

    def seek(self, tp: tuple[str, int], offset: int) -> None:
        self.seeks[tp] = offset

    async def beginning_offsets(self, tps: list) -> dict:
        return {tp: self.kept_from for tp in tps}


@pytest.mark.parametrize("reset, kept_from", [("earliest", 0), ("latest", 0), ("earliest", 40)])
def test_the_seek_back_to_the_committed_offsets_reaches_partitions_committed_at_0_or_never(reset, kept_from) -> None:
    """Records Faust fetched for a partition not active yet are dropped and read again from the committed offset:
    one committed at 0, or not at all, has to be sought too (to the first record the log keeps), or those records
    are never delivered; and the worker is told where each partition's reading starts."""
    TP = namedtuple("TP", "topic partition")
    at0, seven, never, log = TP("jobs", 0), TP("jobs", 1), TP("by-job", 3), TP("app-core-state-changelog", 0)
    consumer = Seeking({at0: 0, seven: 7, never: None, log: None}, kept_from)
    committed, starts = asyncio.run(seek_to_committed(consumer, reset, {log.topic}))
    assert committed == consumer.committed  # what Faust reads back is aiokafka's answer
    fresh = {never: kept_from} if reset == "earliest" else {}  # latest: where a new group starts is not known
    assert consumer.seeks == starts == {at0: kept_from, seven: 7, **fresh}  # a changelog: Faust's


class Offsets:
    """Faust's consumer as `lagging` reads it: each partition's high water and the group's committed offset."""

    def __init__(self, highwater: dict[tuple[str, int], int | None], committed: dict[tuple[str, int], int]) -> None:
        self.hw, self._committed_offset = highwater, committed

    def highwater(self, tp: tuple[str, int]) -> int | None:
        return self.hw[tp]


def lagging_glue(hw: dict, committed: dict) -> WorkerIO:
    g = wio(Consumer({}))
    g.app.consumer = Offsets(hw, committed)
    g.app.conf = SimpleNamespace(consumer_auto_offset_reset="earliest")
    return g


def test_an_input_is_lagging_until_its_last_record_is_read(monkeypatch) -> None:
    """Nothing read since start: the committed offset is where reading resumes (Kafka's next offset to read), so
    one record at it is still to read; read past the end, or committed at the end, it is not."""
    monkeypatch.setattr("gangwatch.streams.workerio._tp", lambda topic, partition: (topic, partition))
    g = lagging_glue({("t", 0): 8, ("t", 1): 7, ("t", 2): None, ("t", 3): 3}, {("t", 0): 7, ("t", 1): 7})
    assert g.lagging("t", 0)  # committed 7, end 8: offset 7 is unread
    assert not g.lagging("t", 1)  # committed at the end
    assert g.lagging("t", 2)  # no fetch reported the end yet: cannot tell
    assert g.lagging("t", 3)  # never committed, earliest: everything is to read
    g.next_offset[("t", 0)] = 8
    g.next_offset[("t", 3)] = 3
    assert not g.lagging("t", 0) and not g.lagging("t", 3)


def test_the_input_path_watch_marks_an_outage_and_its_grace() -> None:
    now_ms = time.time() * 1000
    consumer = Consumer({"a": now_ms - 10_000})
    g = wio(consumer)
    g.watch_path(1.5)
    assert g.runner.outages == 1 and g.runner.outage is not None and g.runner.trust_from == float("inf")
    consumer.stamps_ms["a"] = time.time() * 1000
    g.watch_path(1.5)  # answering again: the grace starts
    assert g.runner.outages == 1 and g.runner.trust_from < float("inf")


def test_commits_follow_what_was_read_under_the_cap_and_a_refused_one_is_retried(monkeypatch) -> None:
    """Faust takes a refused commit (a rebalance under way) as done and commits again only when its acks move: at
    the end of the input nothing moves. The wio commits what it handed to the runner, as far as the cap allows."""
    TP = namedtuple("TP", "topic partition")
    monkeypatch.setattr("gangwatch.streams.workerio._tp", TP)
    monkeypatch.setattr("gangwatch.streams.checkpoint.tp", TP)
    g = wio(Consumer({}))
    points = {("t", 0): 30}
    g.checkpoint.router = SimpleNamespace(resume_points=lambda: dict(points))
    g.app.consumer.assignment = lambda: {TP("t", 0)}
    answers, calls = [True, False, True], []

    async def commit(offsets: dict) -> bool:
        calls.append(dict(offsets))
        return answers.pop(0)

    g.checkpoint._commit = commit
    g.next_offset[("t", 0)] = 40
    g.next_offset[("t", 1)] = 9  # not ours (any more): never committed

    async def run() -> None:
        await g.commit_read()  # capped at 30: a record at 30 is in no written state
        await g.commit_read()  # nothing new
        points.clear()  # saved: the cap lifts
        await g.commit_read()  # refused
        await g.commit_read()  # the retry
        await g.commit_read()  # committed: nothing left

    asyncio.run(run())
    assert calls == [{TP("t", 0): 30}, {TP("t", 0): 40}, {TP("t", 0): 40}]
    assert g.checkpoint.committed == {TP("t", 0): 40}


def test_messages_after_a_hole_are_held_back_until_the_hole_is_read_again() -> None:
    """Faust dropped offsets 3-4 of a partition and handed over 5: the runner must not see 5 before 3 (its offsets
    would pass records it never read), the partition is sought back to 3, and commits stay at 3 meanwhile."""
    g = wio(Consumer({}))
    g.checkpoint.router = SimpleNamespace(resume_points=lambda: {})
    sought = []

    async def seek(tp, offset: int) -> None:
        sought.append((tp.topic, tp.partition, offset))

    g.app.consumer.seek = seek

    async def earliest_offsets(*tps) -> dict:
        return {tp: 0 for tp in tps}

    g.app.consumer.earliest_offsets = earliest_offsets

    def ev(offset: int, partition: int = 0) -> SimpleNamespace:
        return SimpleNamespace(message=SimpleNamespace(topic="t", partition=partition, offset=offset, key=b"j",
                                                       value=b"{}", timestamp=1.0))

    def offsets(events: list) -> list[tuple[int, int]]:
        return [(m.partition, m.offset) for m in g.in_order(events)]

    assert offsets([ev(0), ev(1), ev(2), ev(7, 1)]) == [(0, 0), (0, 1), (0, 2), (1, 7)]  # 7: where partition 1 starts
    assert offsets([ev(5), ev(6), ev(8, 1)]) == [(1, 8)]  # 3 and 4 missing: 5 and 6 wait
    assert g.holes == {("t", 0): 3} and g.checkpoint.resume_points() == {("t", 0): 3}
    asyncio.run(g.rewind())
    asyncio.run(g.rewind())  # sought once, not on every tick
    assert sought == [("t", 0, 3)]
    assert offsets([ev(6), ev(3), ev(4), ev(5), ev(6)]) == [(0, 3), (0, 4), (0, 5), (0, 6)]
    assert g.holes == {} and g.checkpoint.resume_points() == {}
    assert offsets([ev(2), ev(7)]) == [(0, 2), (0, 7)]  # a repeat is handed on (the runner skips it)


def test_owed_records_the_read_position_passed_are_read_again() -> None:
    """A restored job owes records 5 and 6 of t:0 (an earlier worker read them, never processed them); reading here
    got to 9 without them: t:0 is read again from 5, and nothing past 5 is handed on until 5 comes."""
    from gangwatch.streams.jobstate import JobState

    g = wio(Consumer({}))
    g.runner.jobs["j"] = JobState(owed={"t:0": {(5, 0), (6, 0)}, "t:1": {(2, 0)}})
    g.next_offset.update({("t", 0): 9, ("t", 1): 2})  # t:1 is not past its owed record yet
    g.find_skipped()
    assert g.holes == {("t", 0): 5}
    ev = SimpleNamespace(message=SimpleNamespace(topic="t", partition=0, offset=9, key=b"j", value=b"{}",
                                                 timestamp=1.0))
    assert g.in_order([ev]) == []


def test_reading_starts_at_the_committed_offset_and_commits_never_pass_what_was_handed_on(monkeypatch) -> None:
    """The group committed 152; the first message handed over is 7000 (152-6999 dropped by Faust): it waits, and
    a commit Faust asks for (it counts what it dropped as read) stays at 152."""
    TP = namedtuple("TP", "topic partition")
    monkeypatch.setattr("gangwatch.streams.workerio._tp", TP)
    monkeypatch.setattr("gangwatch.streams.checkpoint.tp", TP)
    g = WorkerIO(SimpleNamespace(), JobRunner(TopicSettings()), SimpleNamespace(resume_points=lambda: {}), {},
             ("t",), (), [], False, None)
    g.started({TP("t", 0): 152, TP("other", 0): 5}, [TP("t", 0), TP("t", 1), TP("other", 0)])
    assert g.next_offset == {("t", 0): 152}  # t:1: start not known (policy latest, never committed); not an input
    ev = SimpleNamespace(message=SimpleNamespace(topic="t", partition=0, offset=7000, key=b"j", value=b"{}",
                                                 timestamp=1.0))
    assert g.in_order([ev]) == [] and g.holes == {("t", 0): 152}
    calls = []

    async def commit(offsets: dict) -> bool:
        calls.append(dict(offsets))
        return True

    g.checkpoint._commit = commit
    asyncio.run(g.checkpoint.commit({TP("t", 0): 7001, TP("t", 1): 3}))  # nothing handed on from t:1: left alone
    assert calls == [{TP("t", 0): 152}]


def test_nothing_is_handed_on_before_the_seek_back_to_the_committed_offsets(monkeypatch) -> None:
    """Faust resumes the inputs before its seek back to the committed offsets is done, and its fetcher reads on
    meanwhile: a message of that window would set where reading starts (past records a restored job owes). It
    is left for the seek to read again; after the seek, reading starts at the committed offset, and a partition
    the group never committed starts at its first message."""
    TP = namedtuple("TP", "topic partition")
    monkeypatch.setattr("gangwatch.streams.workerio._tp", TP)
    monkeypatch.setattr("gangwatch.streams.checkpoint.tp", TP)
    g = WorkerIO(SimpleNamespace(), JobRunner(TopicSettings()), SimpleNamespace(resume_points=lambda: {}), {},
             ("t",), (), [], False, None)

    def ev(offset: int, partition: int = 0, topic: str = "t") -> SimpleNamespace:
        return SimpleNamespace(message=SimpleNamespace(topic=topic, partition=partition, offset=offset, key=b"j",
                                                       value=b"{}", timestamp=1.0))

    def offsets(events: list) -> list[tuple[int, int]]:
        return [(m.partition, m.offset) for m in g.in_order(events)]

    assert offsets([ev(5000), ev(5001), ev(3, 1)]) == [] and g.next_offset == {}  # before the seek
    g.started({TP("t", 0): 312}, [TP("t", 0), TP("t", 1)])  # t:1: never committed, policy latest
    # Faust may count 5001 as read only now: the seek's copies up to it would be dropped, so 312 is a hole
    assert g.holes == {("t", 0): 312}
    assert offsets([ev(5002), ev(312), ev(313), ev(3, 1), ev(4, 1)]) == [(0, 312), (0, 313), (1, 3), (1, 4)]
    assert g.holes == {} and g.next_offset == {("t", 0): 314, ("t", 1): 5}
    g.revoked([TP("t", 0)])
    assert offsets([ev(314), ev(5, 1)]) == [(1, 5)]  # t:0 waits for the next assignment's seek


def test_a_hole_retention_deleted_moves_to_the_first_record_kept_and_is_owed_no_more() -> None:
    """A restored job owes records 5 and 12 of t:0; the log keeps t:0 from 10 on (retention deleted the rest
    while no worker ran): seeking back to 5 would land past it again forever. Reading goes on from 10, record 5
    is given up (said in the log), 12 is still owed."""
    from gangwatch.streams.jobstate import JobState

    g = wio(Consumer({}))
    sought = []

    async def seek(tp, offset: int) -> None:
        sought.append((tp.topic, tp.partition, offset))

    async def earliest_offsets(*tps) -> dict:
        return {tp: 10 for tp in tps}

    g.app.consumer.seek, g.app.consumer.earliest_offsets = seek, earliest_offsets
    g.runner.jobs["j"] = st = JobState(owed={"t:0": {(5, 0), (12, 0)}})
    g.next_offset[("t", 0)] = 20
    g.find_skipped()
    assert g.holes == {("t", 0): 5}
    asyncio.run(g.rewind())
    assert sought == [("t", 0, 10)] and g.holes == {("t", 0): 10} and st.owed == {"t:0": {(12, 0)}}
    assert g.touched == {"j"}  # its state is saved again without record 5
    g.find_skipped()  # 12 is behind the read position too, but the hole at 10 comes first
    assert g.holes == {("t", 0): 10}


def test_a_hole_is_sought_back_even_when_the_logs_start_cannot_be_asked() -> None:
    """Asking where the log starts fails (the broker away, a rebalance): the partition is sought back anyway."""
    g = wio(Consumer({}))
    sought = []

    async def seek(tp, offset: int) -> None:
        sought.append((tp.topic, tp.partition, offset))

    async def earliest_offsets(*tps) -> dict:
        raise ConnectionError("broker gone")

    g.app.consumer.seek, g.app.consumer.earliest_offsets = seek, earliest_offsets
    g.holes[("t", 0)] = g.next_offset[("t", 0)] = 5
    asyncio.run(g.rewind())
    assert sought == [("t", 0, 5)] and g.holes == {("t", 0): 5}


def test_a_hole_is_sought_back_at_doubling_intervals_a_bounded_number_of_times_then_given_up() -> None:
    """A hole that no seek back reads (the broker never delivers it again): seeks come at 5, 10, 20, 40, 60, 60,
    ... s, RESEEKS of them; then, with messages read past it, the hole is given up: reading goes on from the
    first message read past it, what a restored job owed in between is given up, and it is counted."""
    from gangwatch.streams.jobstate import JobState
    from gangwatch.streams.workerio import RESEEK_FIRST_S, RESEEK_MAX_S, RESEEKS

    g = wio(Consumer({}))
    given_up = []
    g.metrics = SimpleNamespace(given_up=lambda topic, cause, n: given_up.append((topic, cause, n)))
    sought: list[tuple[float, int]] = []
    now = [1000.0]

    async def seek(tp, offset: int) -> None:
        sought.append((now[0], offset))

    async def earliest_offsets(*tps) -> dict:
        return {tp: 0 for tp in tps}

    g.app.consumer.seek, g.app.consumer.earliest_offsets = seek, earliest_offsets
    g.runner.jobs["j"] = st = JobState(owed={"t:0": {(4, 0), (9, 0)}})
    g.holes[("t", 0)] = g.next_offset[("t", 0)] = 3
    ev = SimpleNamespace(message=SimpleNamespace(topic="t", partition=0, offset=8, key=b"j", value=b"{}",
                                                 timestamp=1.0))
    assert g.in_order([ev]) == [] and g.past_hole == {("t", 0): 8}  # read past the hole: left out, remembered
    for _ in range(400):  # 400 s of ticks, a second apart
        asyncio.run(g.rewind(now[0]))
        now[0] += 1.0
    at = [t - 1000.0 for t, offset in sought if offset == 3]
    assert len(at) == RESEEKS
    gaps = [b - a for a, b in zip(at, at[1:], strict=False)]
    assert gaps == [min(RESEEK_FIRST_S * 2 ** k, RESEEK_MAX_S) for k in range(RESEEKS - 1)]
    given_at, offset = sought[RESEEKS]
    assert offset == 8 and given_at - 1000.0 == at[-1] + RESEEK_MAX_S  # given up: sought to where reading goes on
    assert g.holes == {("t", 0): 8} and g.next_offset[("t", 0)] == 8 and g.past_hole == {}
    assert st.owed == {"t:0": {(9, 0)}} and "j" in g.touched  # 4 is given up, 9 is still owed
    assert given_up == [("t", "unreadable", 5)]


def test_a_hole_nothing_was_read_past_is_sought_a_bounded_number_of_times_and_only_holds_the_commit() -> None:
    from gangwatch.streams.workerio import RESEEKS

    g = wio(Consumer({}))
    sought = []

    async def seek(tp, offset: int) -> None:
        sought.append(offset)

    async def earliest_offsets(*tps) -> dict:
        return {}

    g.app.consumer.seek, g.app.consumer.earliest_offsets = seek, earliest_offsets
    g.checkpoint.router = SimpleNamespace(resume_points=lambda: {})
    g.holes[("t", 0)] = g.next_offset[("t", 0)] = 3
    for k in range(3600):
        asyncio.run(g.rewind(1000.0 + k))
    assert sought == [3] * RESEEKS and g.holes == {("t", 0): 3}
    assert g.checkpoint.resume_points() == {("t", 0): 3}  # the commit stays at the hole: nothing past it to lose


class Fetching(Consumer):
    """aiokafka's consumer with Faust's view of which partitions it fetches on purpose."""

    def __init__(self, stamps_ms: dict[str, float | None], paused=(), buffered=(), flow_active=True) -> None:
        super().__init__(stamps_ms)
        self.faust = SimpleNamespace(_thread=SimpleNamespace(_ensure_consumer=lambda: self),
                                     _paused_partitions=set(paused), _buffered_partitions=set(buffered),
                                     flow_active=flow_active)


def test_partitions_faust_does_not_fetch_on_purpose_are_no_sign_of_an_outage() -> None:
    """A partition paused, or with its buffer full while the agents are busy, is not fetched: its last answer
    grows old without the broker being away. Only the partitions Faust fetches tell."""
    now_ms = time.time() * 1000

    def answering(c: Fetching) -> bool:
        app = SimpleNamespace(consumer=c.faust)
        return WorkerIO(app, JobRunner(TopicSettings()), None, {}, (), (), [], False, None).answering(1.5)

    stale, fresh = now_ms - 60_000, now_ms - 100
    assert not answering(Fetching({"a": stale, "b": stale}))  # fetched, and no answer for a minute: an outage
    assert answering(Fetching({"a": stale, "b": stale}, buffered={"a", "b"}))  # both full: nothing fetched
    assert answering(Fetching({"a": stale, "b": fresh}, paused={"c"}))
    assert not answering(Fetching({"a": stale, "b": stale}, paused={"a"}))  # b is fetched and unanswered
    assert answering(Fetching({"a": stale}, flow_active=False))  # a rebalance stopped the flow


class Changelog(dict):
    """A state table whose writes send a changelog message, each confirmed when the test says."""

    def __init__(self) -> None:
        super().__init__()
        self.sends: list[asyncio.Future] = []
        self.on_send = None

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key, value)
        fut = asyncio.get_event_loop().create_future()
        self.sends.append(fut)
        self.on_send(fut)


class Marked:
    """A queued sink's marks: outputs flushed (`mark`) and settled (`done`)."""

    def __init__(self) -> None:
        self.flushed = self.settled = 0

    def mark(self) -> int:
        return self.flushed

    def done(self) -> int:
        return self.settled


def test_the_checkpoint_commits_only_what_a_state_the_broker_confirmed_covers(monkeypatch) -> None:
    """The protocol's order: a job's records are read (offsets 0-2), its state is taken while a sink still holds
    its outputs: nothing is written and the commit stays at 0; the sink settles: the state is written, but the
    commit stays at 0 until the broker confirms the changelog message; then the commit reaches what was read."""
    TP = namedtuple("TP", "topic partition")
    monkeypatch.setattr("gangwatch.streams.checkpoint.tp", TP)
    from gangwatch.streams.checkpoint import Checkpoint
    from gangwatch.streams.runner import Msg

    job = messages(scenario(nodes=1, seconds=0, silent=None, xid_node=None), TopicSettings())[0]
    runner = JobRunner(TopicSettings())
    t = TopicSettings()
    runner.on_batch([Msg(t.jobs, 0, 0, job[1], job[2]),
                     Msg(t.telemetry, 0, 0, b"j1", encode(Heartbeat(ts=T0 + 1.0, job="j1", rank=0))),
                     Msg(t.telemetry, 0, 1, b"j1", encode(Heartbeat(ts=T0 + 2.0, job="j1", rank=1)))])
    table, sink = Changelog(), Marked()
    read = {(t.jobs, 0): 1, (t.telemetry, 0): 2}
    cp = Checkpoint([sink], table, runner, SimpleNamespace(resume_points=lambda: {}), read, {},
                    lambda: {TP(*w) for w in read}, lambda tbl, on: setattr(tbl, "on_send", on) or True)
    commits = []

    async def faust_commit(offsets: dict) -> bool:
        commits.append({(k.topic, k.partition): v for k, v in offsets.items()})
        return True

    cp.install(lambda capped: faust_commit)

    async def run() -> None:
        sink.flushed = 1  # the batch's outputs are in the sink's queue
        cp.offer({"j1": runner.state_of("j1")})
        await cp.commit_read()
        assert not table and all(v == 0 for c in commits for v in c.values())  # nothing covered: no further than 0
        before = len(commits)
        sink.settled = 1
        cp.sinks_settled()
        assert cp.write_settled() == 1 and list(table) == [b"j1"]
        await cp.commit_read()
        assert len(commits) == before  # written, not yet on the broker
        table.sends[0].set_result(None)
        await cp.commit_read()
        assert commits[before:] == [{(t.jobs, 0): 1, (t.telemetry, 0): 2}]

    asyncio.run(run())


def test_an_input_without_a_committed_offset_resumes_from_the_saved_states_own_offsets(monkeypatch) -> None:
    """The group lost its offsets (expired) and the reset policy is `latest`: t:0 is read from the saved states of
    its jobs (j1 read t:0 up to 40 and owes 35; j2 up to 52), not from the log's end; t:1, whose jobs have no saved
    state, starts at its first message; t:2 keeps its committed offset whatever the states say."""
    from gangwatch.streams.jobstate import JobState

    TP = namedtuple("TP", "topic partition")
    g = WorkerIO(SimpleNamespace(), JobRunner(TopicSettings()), SimpleNamespace(resume_points=lambda: {}), {},
                 ("t",), (), [], False, None)
    g.runner.jobs["j1"] = JobState(offsets={"t:0": 40}, owed={"t:0": {(35, 0)}}, partition=0)
    g.runner.jobs["j2"] = JobState(offsets={"t:0": 52, "t:2": 3}, partition=0)
    g.runner.jobs["j3"] = JobState(offsets={"t:2": 3}, partition=2)
    g.started({TP("t", 2): 90}, [TP("t", 0), TP("t", 1), TP("t", 2)])
    assert g.next_offset == {("t", 0): 35, ("t", 2): 90} and g.holes == {("t", 0): 35}
    ev = lambda p, o: SimpleNamespace(message=SimpleNamespace(topic="t", partition=p, offset=o, key=b"j",  # noqa: E731
                                                              value=b"{}", timestamp=1.0))
    assert [(m.partition, m.offset) for m in g.in_order([ev(0, 900), ev(1, 77), ev(0, 35)])] == [(1, 77), (0, 35)]
    assert g.past_hole == {} and g.unknown_start == {("t", 1)}


def test_an_untested_faust_or_aiokafka_is_refused_in_one_line_unless_overridden() -> None:
    from gangwatch.streams.faust_adapter import UntestedFramework, check_versions

    installed = {"faust-streaming": "0.15.3", "aiokafka": "0.14.0"}
    check_versions(installed.__getitem__, env={})  # the tested series
    for dist, version in (("faust-streaming", "0.16.0"), ("aiokafka", "0.15.1"), ("faust-streaming", "0.150.0")):
        newer = {**installed, dist: version}
        with pytest.raises(UntestedFramework) as e:
            check_versions(newer.__getitem__, env={})
        said = str(e.value)
        assert said.startswith(f"{dist} {version} is installed") and "GANGWATCH_UNTESTED_FRAMEWORK=1" in said
        check_versions(newer.__getitem__, env={"GANGWATCH_UNTESTED_FRAMEWORK": "1"})  # at the user's risk


def test_faust_and_aiokafka_internals_are_touched_in_the_adapter_only() -> None:
    """Every private name of Faust, mode or aiokafka the worker uses is in streams/faust_adapter.py (issue 25)."""
    import re
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    internals = ("_ensure_consumer", "_ensure_producer", "_committed_offset", "_commit", "_create_worker_consumer",
                 "_fetch_max_wait_ms", "send_changelog", "call_thread", "_thread", "partitioner", "_paused_partitions",
                 "_buffered_partitions", "force_metadata_update")
    pattern = re.compile(r"(?<!self)\.(" + "|".join(internals) + r")\b")  # another object's, not one's own
    adapter = repo / "streams" / "faust_adapter.py"
    assert pattern.search(adapter.read_text())  # the list names what the adapter really touches
    files = [p for folder in ("streams", "sinks", "control", "gangwatch", "producers", "bench")
             for p in sorted((repo / folder).rglob("*.py"))]
    offenders = [f"{p.relative_to(repo)}:{n}: {line.strip()}"
                 for p in files if p != adapter for n, line in enumerate(p.read_text().splitlines(), 1)
                 if pattern.search(line) and not line.lstrip().startswith("#")]
    offenders += [f"{p.relative_to(repo)}: sets its own attribute on Faust's app" for p in files
                  if re.search(r"\bapp\.(?!monitor\b)\w+ = ", p.read_text())]  # the adapter's `attach` keeps what an
    # app has; `app.monitor` is Faust's public setter of the app's sensor (as its setup_prometheus_sensors uses it)
    assert not offenders, "\n".join(offenders)
