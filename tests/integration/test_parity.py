"""The Faust worker on the real broker against replay: same scenario in, same findings, actions, incidents out.

Each test makes its own topics (a unique prefix) and consumer group, publishes
contract records with kafka-python the way sidecars do (`topic_for`, batch
envelopes), runs `gangwatch worker` in a subprocess with the fast settings of
docs/design.md, and polls the output topics and the group's committed offsets
until a condition holds or a deadline passes.

What is equal, honestly: the worker sorts every batch by event time and holds
records of a job until its `job` record arrives, so a backlog of job-keyed
records (here `gw.jobs` + `gw.telemetry`, produced before the worker starts)
gives exactly replay's outputs however the topics interleave. Node events take
one more hop (re-keyed by job through `by-job`): in a backlog, the jobs agent
may already be past a node event's time when it arrives. The parity test
therefore publishes the Xid after the worker has consumed everything before it
and the rest after the Xid was consumed: live order, where the hop is faster
than the gap between records. `--no-silence` keeps the pauses from counting as
silence (replay has no wall clock either); `test_silence_*` checks the timer.

Several jobs (`test_several_jobs_*`): three jobs interleaved on the topics, with
a fail-stop, an Xid (a node event), and a topology change followed by a fail-stop,
published whole before the worker starts, so every input including the node-event
hop is read as a backlog at full speed. Each job's outputs equal replay's, in order,
also with the worker SIGKILLed halfway while it holds records of jobs whose slower
inputs it has not read up to their time (`test_several_jobs_*_killed_halfway`): no
offset is committed past a record no saved state has processed, so its replacement
reads them again.

Handover: a worker killed after its offsets were committed (`test_restart_*`)
or mid-stream with a second worker in the group (`test_two_workers_*`) is
replaced from the changelogs with the same results; in the second case outputs
are compared after dropping repeats of an id (outputs are at least once).
"""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from pathlib import Path

import orjson
import pytest
from gangwatch.schemas import decode
from gangwatch.schemas.topics import TopicSettings
from gangwatch.streams import replay
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from tests.integration.kafkakit import (
    T0,
    assignments,
    caught_up,
    group_members,
    messages,
    produce,
    read_all,
    scenario,
    wait_for,
    worker_args,
    write_jsonl,
)

pytestmark = pytest.mark.integration

PARTITIONS = 4
DEADLINE = 90.0
# How long the scenarios' jobs run: 3 s past the hang their stall makes (its threshold, 20 s after the stall at
# 19 s). A timeout due within the input's last `lateness_s` (1 s) is replay's alone: replay's end of input reaches
# the last record's time, a live worker (`--no-silence`) stays `lateness_s` behind it. 40 s put the hang 16 ms
# from that edge, on one side or the other as the hang's clock moved by the last rank's step.
SECONDS = 42


def replay_outputs(tmp_path: Path, msgs) -> dict[str, list]:
    src = write_jsonl(tmp_path / "scenario.jsonl", msgs)
    replay.run([src], tmp_path / "replay", None, progress=None)
    out = {}
    for name in ("findings", "actions", "incidents", "rejected"):
        out[name] = [orjson.loads(line) for line in (tmp_path / "replay" / f"{name}.jsonl").read_bytes().splitlines()]
    return out


def kafka_outputs(bootstrap: str, t: TopicSettings) -> dict[str, list]:
    got = read_all(bootstrap, [t.findings, t.actions, t.incidents, t.dlq])
    return {"findings": got[t.findings], "actions": got[t.actions], "incidents": got[t.incidents], "dlq": got[t.dlq]}


def records(values) -> list:
    """Decoded records of (key, value) messages, checked to be keyed by their job."""
    out = []
    for key, value in values:
        [rec] = decode(value)
        assert key == rec.job.encode()
        out.append(rec)
    return out


def as_records(dicts) -> list:
    return [decode(orjson.dumps(d))[0] for d in dicts]


def assert_same(bootstrap: str, t: TopicSettings, expected: dict[str, list], *, by_id: bool = False) -> None:
    """Same records in the same order; `by_id`: after dropping repeats of an id (outputs are at least once:
    a worker killed between delivering a batch's outputs and saving its state has them re-sent, same ids)."""
    got = kafka_outputs(bootstrap, t)
    for name in ("findings", "actions", "incidents"):
        recs = records(got[name])
        if by_id:
            seen: set = set()
            recs = [r for r in recs if not ((r.id, r.ts) in seen or seen.add((r.id, r.ts)))]
        assert recs == as_records(expected[name]), name
    assert got["dlq"] == [] and expected["rejected"] == []


def counts_reached(bootstrap: str, t: TopicSettings, expected: dict[str, list]) -> bool:
    got = kafka_outputs(bootstrap, t)
    return all(len(got[k]) >= len(expected[k]) for k in ("findings", "actions", "incidents"))


# --- parity --------------------------------------------------------------------------


def test_worker_matches_replay(kafka_bootstrap, topics, unique, tmp_path, workers):
    recs = scenario(seconds=SECONDS)  # 4 x 4 ranks, 1 s heartbeats; n001 silent at 20 s, n002 Xid 79 at 30.5 s
    msgs = messages(recs, topics)
    expected = replay_outputs(tmp_path, msgs)
    assert [f["type"] for f in expected["findings"]] == ["fail_stop", "hw_fault", "hang"]
    assert [a["type"] for a in expected["actions"]] == ["replace", "escalate"]

    [xid_at] = [i for i, (topic, _, _) in enumerate(msgs) if topic == topics.node_events]
    before, xid, after = msgs[:xid_at], msgs[xid_at], msgs[xid_at + 1:]
    produce(kafka_bootstrap, before)  # a backlog on gw.jobs + gw.telemetry, in any interleaving
    w = workers(*worker_args(kafka_bootstrap, unique, topics, "--no-silence"))
    wait_for(lambda: caught_up(kafka_bootstrap, unique, topics.job_inputs), DEADLINE, "the backlog consumed", proc=w)

    produce(kafka_bootstrap, [xid])
    rekeyed = replace(topics, app=unique).by_job  # the worker's own (its app id's) re-keying topic
    wait_for(lambda: read_all(kafka_bootstrap, [rekeyed])[rekeyed] != [], DEADLINE,
             "the Xid re-keyed by job", proc=w)
    wait_for(lambda: caught_up(kafka_bootstrap, unique, [topics.node_events, rekeyed]), DEADLINE,
             "the Xid consumed", proc=w)

    produce(kafka_bootstrap, after)
    wait_for(lambda: counts_reached(kafka_bootstrap, topics, expected), DEADLINE, "the expected outputs", proc=w)
    wait_for(lambda: caught_up(kafka_bootstrap, unique, topics.inputs), DEADLINE, "all input consumed", proc=w)
    assert_same(kafka_bootstrap, topics, expected)  # nothing missing, nothing extra, same order


def test_restart_resumes_from_the_changelog(kafka_bootstrap, topics, unique, tmp_path, workers):
    recs = scenario(seconds=SECONDS, xid_node=None)  # job-keyed only: exact parity even as a backlog
    msgs = messages(recs, topics)
    expected = replay_outputs(tmp_path, msgs)
    assert expected["findings"] and expected["findings"][0]["ts"] > 1_700_000_021.0
    cut = next(i for i, m in enumerate(msgs) if orjson.loads(m[2])["ts"] >= 1_700_000_015.0)

    produce(kafka_bootstrap, msgs[:cut])
    first = workers(*worker_args(kafka_bootstrap, unique, topics, "--no-silence"))
    wait_for(lambda: caught_up(kafka_bootstrap, unique, topics.job_inputs), DEADLINE, "the first half consumed",
             proc=first)
    assert kafka_outputs(kafka_bootstrap, topics)["findings"] == []
    first.kill()  # no goodbye: the group notices after the session timeout

    # the job's state is on the changelog partition of the job's input partition
    changelog = f"{unique}-core-state-changelog"
    saved = read_all(kafka_bootstrap, [changelog])[changelog]
    assert saved and {k for k, _ in saved} == {b"j1"}
    assert partition_of(kafka_bootstrap, changelog, b"j1") == partition_of(kafka_bootstrap, topics.telemetry, b"j1")

    second = workers(*worker_args(kafka_bootstrap, unique, topics, "--no-silence"))
    produce(kafka_bootstrap, msgs[cut:])  # the job record is behind the committed offsets: only state knows it
    wait_for(lambda: counts_reached(kafka_bootstrap, topics, expected), DEADLINE + 30, "the remaining outputs",
             proc=second)
    wait_for(lambda: caught_up(kafka_bootstrap, unique, topics.job_inputs), DEADLINE, "all input consumed",
             proc=second)
    assert_same(kafka_bootstrap, topics, expected)


def test_two_workers_share_the_work_and_one_dies_mid_stream(kafka_bootstrap, topics, unique, tmp_path, workers):
    recs = scenario(seconds=SECONDS)
    msgs = messages(recs, topics)
    expected = replay_outputs(tmp_path, msgs)
    first = workers(*worker_args(kafka_bootstrap, unique, topics, "--no-silence"))
    second = workers(*worker_args(kafka_bootstrap, unique, topics, "--no-silence"))
    wait_for(lambda: group_members(kafka_bootstrap, unique) == 2, DEADLINE, "both workers in the group", proc=second)

    [xid_at] = [i for i, (topic, _, _) in enumerate(msgs) if topic == topics.node_events]
    produce(kafka_bootstrap, msgs[:xid_at])
    wait_for(lambda: caught_up(kafka_bootstrap, unique, topics.job_inputs), DEADLINE, "the backlog consumed",
             proc=second)
    produce(kafka_bootstrap, [msgs[xid_at]])
    rekeyed = replace(topics, app=unique).by_job  # the worker's own (its app id's) re-keying topic
    wait_for(lambda: read_all(kafka_bootstrap, [rekeyed])[rekeyed] != [], DEADLINE,
             "the Xid re-keyed by job", proc=second)
    wait_for(lambda: caught_up(kafka_bootstrap, unique, [topics.node_events, rekeyed]), DEADLINE,
             "the Xid consumed", proc=second)

    rest = msgs[xid_at + 1:]
    produce(kafka_bootstrap, rest[:len(rest) // 2])
    first.kill()  # mid-stream, unannounced: whatever it held moves to the other worker via the changelogs
    produce(kafka_bootstrap, rest[len(rest) // 2:])
    wait_for(lambda: counts_reached(kafka_bootstrap, topics, expected), DEADLINE + 30, "the expected outputs",
             proc=second)
    wait_for(lambda: caught_up(kafka_bootstrap, unique, topics.inputs), DEADLINE, "all input consumed", proc=second)
    assert_same(kafka_bootstrap, topics, expected, by_id=True)  # replayed input skipped: nothing seen twice


def partition_of(bootstrap: str, topic: str, key: bytes) -> int:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        end = consumer.end_offsets(tps)
        found = set()
        for tp in tps:
            if end[tp]:
                consumer.assign([tp])
                consumer.seek_to_beginning(tp)
                for batch in consumer.poll(timeout_ms=2000, max_records=end[tp]).values():
                    found |= {tp.partition for m in batch if m.key == key}
        [p] = found
        return p
    finally:
        consumer.close()


def test_a_job_waits_for_node_events_a_killed_worker_was_routing(kafka_bootstrap, topics, unique, tmp_path,
                                                                 workers):
    """A group of two workers: the job's partition is one's (the job worker), its nodes' node-events partitions
    the other's (the router worker). The router worker is killed; the Xid that explains a rank that dies 0.1 s
    later is sent while nobody reads its partition, and the rest of the job at once, as a backlog. The job
    worker holds the job where the router's last mark left it (streams/marks.py) until the group gives it the
    partition and it routes the Xid itself: replay's decision, id included. Without the marks it ran the job to
    the end, and decided without the Xid, before the group noticed the death (its session timeout)."""
    from gangwatch.streams.faust_adapter import partition_of as key_partition
    from gangwatch.streams.marks import is_mark

    job_worker = workers(*worker_args(kafka_bootstrap, unique, topics, "--no-silence"))
    router_worker = workers(*worker_args(kafka_bootstrap, unique, topics, "--no-silence"))
    own: dict[int, set] = {}
    wait_for(lambda: len(own.update(assignments(kafka_bootstrap, unique)) or own) == 2, DEADLINE,
             "both workers in the group", proc=router_worker)
    p_job = key_partition(b"j1", PARTITIONS)
    if (topics.telemetry, p_job) in own[router_worker.proc.pid]:  # (which worker got what is the group's choice)
        job_worker, router_worker = router_worker, job_worker
    routed = sorted(p for t, p in own[router_worker.proc.pid] if t == topics.node_events)
    assert routed, own
    names = iter(n for n in (f"x{k:03d}" for k in range(10_000)) if key_partition(n.encode(), PARTITIONS) in routed)
    node = {f"n{i:03d}": next(names) for i in range(4)}
    recs = [dataclasses.replace(r, ranks=[dataclasses.replace(ri, node=node[ri.node]) for ri in r.ranks])
            if r.kind == "job" else dataclasses.replace(r, node=node[r.node]) if r.kind == "hw" else r
            for r in scenario(seconds=SECONDS, silent=None, xid_node="n002", xid_at=30.5)
            if not (r.ts > T0 + 30.6 and (getattr(r, "rank", None) == 9 or r.kind == "step"))]
    msgs = messages(recs, topics)
    expected = replay_outputs(tmp_path, msgs)
    assert [(a["type"], a["nodes"]) for a in expected["actions"]] == [("replace", [node["n002"]])]

    [xid_at] = [i for i, (topic, _, _) in enumerate(msgs) if topic == topics.node_events]
    produce(kafka_bootstrap, msgs[:xid_at])
    rekeyed = replace(topics, app=unique).by_job
    wait_for(lambda: caught_up(kafka_bootstrap, unique, topics.job_inputs), DEADLINE, "the backlog consumed",
             proc=job_worker)
    wait_for(lambda: any(k == b"j1" and is_mark(v) for k, v in read_all(kafka_bootstrap, [rekeyed])[rekeyed]),
             DEADLINE, "the router worker's marks for j1", proc=router_worker)
    router_worker.kill()
    produce(kafka_bootstrap, msgs[xid_at:])
    wait_for(lambda: counts_reached(kafka_bootstrap, topics, expected), DEADLINE + 30, "the expected outputs",
             proc=job_worker)
    wait_for(lambda: caught_up(kafka_bootstrap, unique, topics.inputs), DEADLINE, "all input consumed",
             proc=job_worker)
    assert_same(kafka_bootstrap, topics, expected, by_id=True)


# --- silence ---------------------------------------------------------------------------


def test_silence_fires_missed_heartbeats_when_nothing_arrives(kafka_bootstrap, topics, unique, tmp_path, workers):
    # n001 stops at 29 s, the input ends at 30 s: within the input, nobody has been silent 2 periods yet
    recs = scenario(seconds=30, silent_at=29.0, xid_node=None)
    msgs = messages(recs, topics)
    expected = replay_outputs(tmp_path, msgs)
    assert expected["findings"] == []  # the end of a file is not silence
    produce(kafka_bootstrap, msgs)
    w = workers(*worker_args(kafka_bootstrap, unique, topics, "--tick", "0.2"))
    wait_for(lambda: kafka_outputs(kafka_bootstrap, topics)["findings"] != [], DEADLINE,
             "a finding from the silence timer", proc=w)
    first = records(kafka_outputs(kafka_bootstrap, topics)["findings"])[0]
    assert (first.type, first.node) == ("fail_stop", "n001")
    # replay (no wall clock) found nothing: this one was fired by the timer, within 2 periods + 1 s of n001's
    # last beat (2 periods + 0.5 s, on the detector's 0.5 s event-time grid)
    last = max(r.ts for r in recs if r.kind == "heartbeat" and r.rank // 4 == 1)
    assert last + 2.5 <= first.ts <= last + 3.0


# --- dead letters -------------------------------------------------------------------------


def test_bad_messages_go_to_the_dlq_with_where_they_came_from(kafka_bootstrap, topics, unique, workers):
    recs = scenario(seconds=3, silent=None, xid_node=None)
    good = messages(recs, topics)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    for topic, key, value in good:
        producer.send(topic, key=key, value=value)
    garbage = producer.send(topics.telemetry, key=b"j1", value=b"\x00\x01 not json").get(30)
    invalid = producer.send(topics.telemetry, key=b"j1",
                            value=b'{"kind":"heartbeat","v":1,"ts":1700000002.5,"job":"j1","rank":-3}').get(30)
    producer.flush()
    producer.close()

    w = workers(*worker_args(kafka_bootstrap, unique, topics, "--no-silence"))
    wait_for(lambda: len(read_all(kafka_bootstrap, [topics.dlq])[topics.dlq]) >= 2, DEADLINE, "two dead letters",
             proc=w)
    dead = sorted((orjson.loads(v) for _, v in read_all(kafka_bootstrap, [topics.dlq])[topics.dlq]),
                  key=lambda d: d["offset"])
    for d, meta in zip(dead, (garbage, invalid), strict=True):
        assert d["topic"] == topics.telemetry and d["source"] == topics.telemetry
        assert (d["partition"], d["offset"]) == (meta.partition, meta.offset)
        assert d["reason"]
    assert dead[1]["field"] == "rank" and dead[1]["kind"] == "heartbeat"
    wait_for(lambda: caught_up(kafka_bootstrap, unique, topics.job_inputs), DEADLINE, "all input consumed", proc=w)
    assert kafka_outputs(kafka_bootstrap, topics)["findings"] == []  # the good records ran, quietly


# --- several jobs, as a backlog -------------------------------------------------------------------


def several_jobs(seconds: int = SECONDS + 3) -> list:
    """Three jobs on their own nodes, interleaved in one stream: j1 loses n001 at 20 s; j2 gets a fatal Xid 79 on
    n012 9.5 s before the end (35.5 s; a node event, re-keyed by job through `by-job`); j3 stays healthy but is
    restarted at 15 s on a new node (a second job record: a topology change) and then loses it at 22 s, its gang
    hung at 41 s (4 s before the end: see SECONDS). Every
    fault is decided within its own job's records (the worker runs with `--no-silence`: no wall clock moves a
    job). All three last `seconds`: replay's one watermark would move a job that ended early past its end."""
    import dataclasses

    from gangwatch.schemas import Job

    def moved(recs: list, job: str, first_node: int) -> list:
        out = []
        for r in recs:
            if isinstance(r, Job):
                r = dataclasses.replace(r, job=job, ranks=[
                    dataclasses.replace(ri, node=f"n{int(ri.node[1:]) + first_node:03d}") for ri in r.ranks])
            elif r.kind == "hw":
                r = dataclasses.replace(r, node=f"n{int(r.node[1:]) + first_node:03d}")
            else:
                r = dataclasses.replace(r, job=job)
            out.append(r)
        return out

    j1 = moved(scenario(seconds=seconds, silent="n001", xid_node=None), "j1", 0)
    j2 = moved(scenario(seconds=seconds, silent=None, xid_node="n002", xid_at=seconds - 9.5), "j2", 10)
    j3 = moved(scenario(seconds=seconds, nodes=2, silent=None, xid_node=None), "j3", 20)
    [first] = [r for r in j3 if r.kind == "job"]
    restart = dataclasses.replace(first, ts=first.ts + 15.0004, ranks=[
        dataclasses.replace(ri, node="n029" if ri.node == "n021" else ri.node) for ri in first.ranks])
    silent_from = first.ts + 22.0  # n029 dies: its ranks fall silent, and the gang waits for them (no more steps)
    j3 = [r for r in j3 if not (r.ts >= silent_from and (r.kind == "step" or (r.kind == "heartbeat" and r.rank >= 4)))]
    return sorted([*j1, *j2, *j3, restart], key=lambda r: r.ts)


def by_job(values) -> dict[str, list]:
    out: dict[str, list] = {}
    for rec in records(values):
        out.setdefault(rec.job, []).append(rec)
    return out


def assert_same_per_job(bootstrap: str, t: TopicSettings, expected: dict[str, list], *, by_id: bool = False) -> None:
    """Each job's outputs equal replay's, in the same order (jobs interleave differently across partitions)."""
    got = kafka_outputs(bootstrap, t)
    for name in ("findings", "actions", "incidents"):
        mine = by_job(got[name])
        if by_id:
            mine = {j: [r for i, r in enumerate(rs) if (r.id, r.ts) not in {(q.id, q.ts) for q in rs[:i]}]
                    for j, rs in mine.items()}
        want: dict[str, list] = {}
        for rec in as_records(expected[name]):
            want.setdefault(rec.job, []).append(rec)
        assert mine == want, name
    assert got["dlq"] == [] and expected["rejected"] == []


def test_several_jobs_as_a_backlog_match_replay(kafka_bootstrap, topics, unique, tmp_path, workers):
    """Everything, node events included, is on the topics before the worker starts: read at full speed, the
    inputs run at different speeds, and the worker must still give replay's outputs job by job."""
    msgs = messages(several_jobs(), topics)
    expected = replay_outputs(tmp_path, msgs)
    cases = {(f["job"], f["type"], f.get("node")) for f in expected["findings"]}
    assert {("j1", "fail_stop", "n001"), ("j2", "hw_fault", "n012"), ("j3", "fail_stop", "n029")} <= cases, cases
    produce(kafka_bootstrap, msgs)
    w = workers(*worker_args(kafka_bootstrap, unique, topics, "--no-silence"))
    wait_for(lambda: counts_reached(kafka_bootstrap, topics, expected), DEADLINE, "the expected outputs", proc=w)
    wait_for(lambda: caught_up(kafka_bootstrap, unique, topics.inputs), DEADLINE, "all input consumed", proc=w)
    assert_same_per_job(kafka_bootstrap, topics, expected)


def test_several_jobs_match_replay_with_the_worker_killed_halfway(kafka_bootstrap, topics, unique, tmp_path,
                                                                    workers):
    """The same backlog, longer (one record per message), and the worker SIGKILLed as soon as its first job state
    is on the state changelog (about a second into the backlog, long before the end): it holds records of jobs
    whose inputs it has not read up to their time, and has acknowledged them to Faust. A new worker resumes from
    the committed offsets, which never pass a record no saved state has processed, and gives replay's outputs
    job by job (outputs are at least once: compared after dropping repeats of an id).

    The kill waits for a saved state, not for an output: how far each job got by a wall-clock moment depends on
    which partitions Faust happened to fetch first (seen: a job's outputs held back until every input was read,
    then all three jobs' outputs within half a second)."""
    msgs = messages(several_jobs(seconds=400), topics, batch=1)
    expected = replay_outputs(tmp_path, msgs)
    assert {f["job"] for f in expected["findings"]} == {"j1", "j2", "j3"}
    produce(kafka_bootstrap, msgs)
    first = workers(*worker_args(kafka_bootstrap, unique, topics, "--no-silence", "--batch-max", "20"))
    probe = KafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=None)
    changelog = f"{unique}-core-state-changelog"  # the worker makes it when it starts

    def saved() -> bool:
        parts = probe.partitions_for_topic(changelog)
        return bool(parts) and sum(probe.end_offsets([TopicPartition(changelog, p) for p in parts]).values()) > 0

    try:
        wait_for(saved, DEADLINE, "the first saved state", every=0.02, proc=first)
    finally:
        probe.close()
    first.kill()  # no goodbye: what it held in memory is gone
    halfway = kafka_outputs(kafka_bootstrap, topics)
    assert any(len(halfway[name]) < len(expected[name]) for name in ("findings", "actions", "incidents")), \
        "the first worker finished before it was killed: nothing left to resume"

    second = workers(*worker_args(kafka_bootstrap, unique, topics, "--no-silence"))
    wait_for(lambda: counts_reached(kafka_bootstrap, topics, expected), DEADLINE + 30, "the expected outputs",
             proc=second)
    wait_for(lambda: caught_up(kafka_bootstrap, unique, topics.inputs), DEADLINE, "all input consumed", proc=second)
    assert_same_per_job(kafka_bootstrap, topics, expected, by_id=True)
