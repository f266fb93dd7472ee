"""The run path (`Core.process_many`, `JobCore.process_many`, `Replay.feed_many`): the same outputs, in the same
order, as feeding the records one at a time, however the stream is cut (jobs interleaved: each job's)."""

from __future__ import annotations

import random

import orjson
import pytest
from gangwatch.producers.simulate import Fault, Scenario
from gangwatch.producers.simulate.emit import messages
from gangwatch.producers.simulate.suite import standard_suite
from gangwatch.schemas import (
    DecodeError,
    Framework,
    Heartbeat,
    Job,
    Ops,
    Outputs,
    RankInfo,
    Step,
    decode,
    encode,
    to_dict,
)
from gangwatch.schemas.columns import StepRows
from gangwatch.streams import replay
from gangwatch.triage.core import Core, JobCore

pytestmark = pytest.mark.unit

CUTS = (1, 3, 17, 300, 5000, 10**6)


def view(out: Outputs) -> list:
    return ([encode(f) for f in out.findings], [encode(a) for a in out.actions], [encode(i) for i in out.incidents],
            [str(e) for e in out.rejected])


def one_by_one(recs: list, core: Core) -> Outputs:
    out = Outputs()
    for r in recs:
        core.process(r, out)
    out.extend(core.finish())
    return out


def in_runs(recs: list, core: Core, seed: int) -> Outputs:
    rnd, out, i = random.Random(seed), Outputs(), 0
    while i < len(recs):
        n = rnd.choice(CUTS)
        core.process_many(recs[i:i + n], out)
        i += n
    out.extend(core.finish())
    return out


SCENARIOS = ("xid79_64", "node_loss_128", "thermal_10pct_64", "dataloader_hang_128", "sdc_128", "planned_stop_32",
             "healthy_slow_start_128")


@pytest.fixture(scope="module", params=SCENARIOS)
def scenario_records(request):
    sc = next(s for s in standard_suite("ci") if s.name == request.param)
    return [r for m in messages(sc) for r in decode(orjson.dumps(m)) if not isinstance(r, DecodeError)]


@pytest.mark.parametrize("seed", [0, 1])
def test_runs_give_what_records_give_on_the_standard_scenarios(scenario_records, seed):
    a, b = Core(), Core()
    want, got = one_by_one(scenario_records, a), in_runs(scenario_records, b, seed)
    assert want.findings, "the scenario finds something"
    assert view(want) == view(got)
    assert a.records == b.records and a.max_ts == b.max_ts and a.clock == b.clock
    assert {j: c.state() for j, c in a.jobs.items()} == {j: c.state() for j, c in b.jobs.items()}


T0 = 1_700_000_000.0


def messy() -> list:
    """Two jobs interleaved, ranks that never start or exit, a restart, out-of-range ranks, records of an unknown
    job, ops, a crash: every branch the run path hands back to the record path, and time jumps."""
    ranks = [RankInfo(rank=r, node=f"n{r // 4}", gpu=r % 4) for r in range(16)]
    recs: list = [Job(ts=T0, job="a", ranks=ranks, heartbeat_s=2.0),
                  Job(ts=T0, job="b", ranks=[RankInfo(rank=r, node=f"m{r // 4}", gpu=r % 4) for r in range(8)])]
    rnd = random.Random(7)
    for k in range(120):
        t = T0 + 1 + k * 0.4
        for r in range(18):
            if r == 5 and k > 60 or r == 3 and k < 10:
                continue  # rank 5 falls silent, rank 3 starts late
            ts = round(t + rnd.uniform(0, 0.3), 6)
            recs.append(Step(ts=ts, job="a", rank=r, step=k, step_s=0.4, compute_s=0.3 + (0.2 if r == 9 and k > 40
                                                                                        else 0.0),
                             comm_wait_s=0.1 if r != 9 or k <= 40 else 0.0, data_wait_s=0.0, loss=2.0 - k / 100,
                             grad_norm=1.0, replica_digest=f"d{k}"))
            if k % 5 == 0:
                recs.append(Heartbeat(ts=ts, job="a", rank=r, step=k))
            if r < 8 and k % 3 == 0:
                recs.append(Step(ts=ts, job="b", rank=r, step=k // 3, step_s=1.2))
        if k == 30:
            recs.append(Step(ts=t, job="zzz", rank=0, step=1, step_s=1.0))  # no job record: rejected
            recs.append(Ops(ts=t, type="maintenance", job="b", planned=True, until_ts=t + 5))
        if k == 70:
            recs.append(Framework(ts=t + 0.1, job="a", rank=12, type="exception", message="CUDA error"))
        if k == 90:
            recs.append(Job(ts=t + 0.2, job="b", ranks=[RankInfo(rank=r, node=f"m{r // 4}", gpu=r % 4)
                                                          for r in range(8)]))
    recs.sort(key=lambda r: r.ts)
    return recs


@pytest.mark.parametrize("silence", [True, False])
@pytest.mark.parametrize("seed", range(6))
def test_runs_give_what_records_give_on_a_messy_stream(seed, silence):
    recs = messy()
    a, b = Core(silence=silence), Core(silence=silence)
    want, got = one_by_one(recs, a), in_runs(recs, b, seed)
    assert want.findings and want.rejected
    assert view(want) == view(got)
    assert {j: c.state() for j, c in a.jobs.items()} == {j: c.state() for j, c in b.jobs.items()}


def per_job(out: Outputs) -> dict:
    jobs: dict = {}
    for name, items in (("findings", out.findings), ("actions", out.actions), ("incidents", out.incidents)):
        for x in items:
            jobs.setdefault((x.job, name), []).append(encode(x))
    return jobs


@pytest.mark.parametrize("seed", range(3))
def test_a_fleet_s_interleaved_jobs_in_runs_give_each_job_what_records_give(seed):
    """Jobs of a fleet interleave record by record; `Core.process_many` takes each job's records of one tick of
    the stream's time together. Each job's outputs are `process`'s, in its order, and so are the states; a node in
    no job (an idle node's agent) on the way changes nothing."""
    scs = [Scenario("f1", 5, tp=2, pp=1, dp=2, gpus_per_node=2, duration_s=200.0,
                    faults=(Fault("node_loss", 120.0, node="n001"),)),
           Scenario("f2", 6, tp=2, pp=1, dp=3, gpus_per_node=2, duration_s=200.0, first_node=10,
                    faults=(Fault("dataloader_hang", 90.0, rank=2),)),
           Scenario("f3", 7, tp=2, pp=1, dp=1, gpus_per_node=2, duration_s=200.0, first_node=20)]
    start = scs[0].start_ts
    idle = [{"kind": "gpu", "v": 1, "ts": start + 0.37 * k, "node": "n099", "gpu": 0, "util_pct": 0}
            for k in range(500)]
    msgs = sorted((m for sc in scs for m in messages(sc)), key=lambda m: m["ts"]) + idle
    msgs.sort(key=lambda m: m["ts"])
    recs = [r for m in msgs for r in decode(orjson.dumps(m)) if not isinstance(r, DecodeError)]
    a, b = Core(), Core()
    want, got = one_by_one(recs, a), in_runs(recs, b, seed)
    assert {j for j, _ in per_job(want)} == {"f1", "f2", "f3"} and want.actions
    assert per_job(want) == per_job(got)
    assert {j: c.state() for j, c in a.jobs.items()} == {j: c.state() for j, c in b.jobs.items()}


def test_a_job_core_takes_runs_too():
    recs = [r for r in messy() if getattr(r, "job", None) == "a"]
    a, b = JobCore(recs[0]), JobCore(recs[0])
    want, got = Outputs(), Outputs()
    for r in recs[1:]:
        a.process(r, want)
    for i in range(1, len(recs), 50):
        b.process_many(recs[i:i + 50], got)
    assert want.findings and view(want) == view(got) and a.state() == b.state()


def test_replay_in_runs_writes_what_replay_record_by_record_writes(tmp_path):
    lines = [encode(r) for r in messy()]
    lines[100:100] = [b"{not json", b'{"kind":"step","v":1,"ts":1}', b""]  # errors, in place
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"\n".join(lines) + b"\n")

    class OneByOne(replay.Replay):
        def feed_many(self, items):
            for item in items:
                self.feed(item)

    outs = {}
    for name, cls in (("one", OneByOne), ("runs", replay.Replay)):
        sink = replay.JsonlSink(tmp_path / name)
        rep = cls([sink])
        items = list(replay.InputFile(src))
        for i in range(0, len(items), 37):
            rep.feed_many(items[i:i + 37])
        s = rep.close()
        outs[name] = (s.records, s.rejected, s.findings, s.by_kind, s.by_type,
                      {p.name: p.read_bytes() for p in sorted((tmp_path / name).glob("*.jsonl"))})
    assert outs["one"][1] >= 3 and outs["one"][2] > 0
    assert outs["one"] == outs["runs"]


# --- steps as columns ---------------------------------------------------------------------------------


def spoiled(item: dict, rnd: random.Random) -> dict:
    """A step item changed in one way the columns must not take as it stands: the record path rejects it, or
    accepts it only after converting a value, or keeps something the columns cannot hold."""
    item = dict(item)
    how = rnd.randrange(12)
    if how == 0:
        item["step_s"] = -1.0  # below the minimum: rejected
    elif how == 1:
        item["rank"] = "3"  # a string: rejected
    elif how == 2:
        del item["ts"]  # required: rejected
    elif how == 3:
        item["ts"] = int(item["ts"])  # an integer time: accepted, as a float
    elif how == 4:
        item["loss"] = "NaN"  # a reported NaN: accepted, as a float
    elif how == 5:
        item["note"] = "hi"  # an unknown field: kept in `extra`
    elif how == 6:
        item["compute_s"] = None  # an explicit null: accepted as missing
    elif how == 7:
        item["job"] = "b"  # another job in the same batch
    elif how == 8:
        item["kind"] = "heartbeat"  # another kind
    elif how == 9:
        item["step"] = True  # a boolean: rejected
    elif how == 10:
        item["replica_digest"] = "x" * 300  # too long: rejected
    else:
        item["v"] = 2  # another version: rejected
    return item


def test_steps_as_columns_are_the_records_the_record_path_gives():
    rnd = random.Random(3)
    steps = [r for r in messy() if r.kind == "step"]
    seen = {"columns": 0, "records": 0}
    for _ in range(400):
        k = rnd.randrange(len(steps) - 9)
        items = [to_dict(r) for r in steps[k:k + rnd.choice([1, 2, 8, 9])] if r.job == "a"]
        if not items:
            continue
        for j in range(len(items)):
            if rnd.random() < 0.15:
                items[j] = spoiled(items[j], rnd)
        for j in range(len(items)):  # optional fields left out
            if rnd.random() < 0.2:
                items[j].pop(rnd.choice(["compute_s", "loss", "replica_digest", "grad_norm"]), None)
        msg = orjson.dumps({"kind": "batch", "v": 1, "ts": 1.0, "items": items})
        want, got = decode(msg), decode(msg, columns=True)
        if len(got) == 1 and type(got[0]) is StepRows:
            seen["columns"] += 1
            assert got[0].records() == want and [encode(r) for r in got[0].records()] == [encode(r) for r in want]
            assert [type(r.ts) for r in got[0].records()] == [type(r.ts) for r in want]
            assert got[0].job == want[0].job and len(got[0]) == len(want)
        else:
            seen["records"] += 1
            assert [v.to_dict() if type(v) is DecodeError else encode(v) for v in got] == \
                   [v.to_dict() if type(v) is DecodeError else encode(v) for v in want]
    assert min(seen.values()) > 50, seen


@pytest.mark.parametrize("throttle", [[], ["hw_slowdown"], ["x" * 256], ["x" * 257], [1], ["a"] * 64, ["a"] * 65,
                                      [None], "hw", None])
def test_a_list_of_strings_is_kept_as_parsed_only_when_the_full_check_keeps_it(throttle):
    from gangwatch.schemas.records import ID, Meta
    from gangwatch.schemas.validators import compile_base
    msg = orjson.dumps({"kind": "gpu", "v": 1, "ts": 1.0, "node": "n0", "gpu": 0, "throttle": throttle})
    got = decode(msg)[0]
    full = compile_base(list[ID], Meta(max_len=64))
    try:
        want = None if throttle is None else full(throttle, "throttle")
    except Exception:  # noqa: BLE001 - the full check's own rejection
        assert type(got) is DecodeError and got.field.startswith("throttle")
    else:
        assert got.throttle == want


def test_step_rows_split_where_time_moves():
    items = [to_dict(r) for r in messy() if r.kind == "step" and r.job == "a"][:40]
    rows = decode(orjson.dumps({"kind": "batch", "v": 1, "items": items}), columns=True)[0]
    head, tail = rows.split(15)
    assert head.records() + tail.records() == rows.records() and len(head) == 15


def in_batches(recs: list, rnd: random.Random) -> list[bytes]:
    """The records as lines: consecutive records of one kind and job in batches of random sizes, the rest one
    per line; some items spoiled, some lines not JSON."""
    lines, i = [], 0
    while i < len(recs):
        r = recs[i]
        n = 1
        while i + n < len(recs) and n < rnd.choice([1, 3, 8, 40]) and recs[i + n].kind == r.kind and \
                getattr(recs[i + n], "job", None) == getattr(r, "job", None):
            n += 1
        if n == 1 and rnd.random() < 0.5:
            lines.append(encode(r))
        else:
            items = [to_dict(x) for x in recs[i:i + n]]
            if rnd.random() < 0.1:
                j = rnd.randrange(len(items))
                items[j] = spoiled(items[j], rnd) if items[j]["kind"] == "step" else {"kind": "step"}
            lines.append(orjson.dumps({"kind": "batch", "v": 1, "ts": r.ts, "items": items}))
        if rnd.random() < 0.01:
            lines.append(b"{not json")
        i += n
    return lines


@pytest.mark.parametrize("seed", range(4))
def test_replay_of_steps_as_columns_writes_what_replay_record_by_record_writes(tmp_path, seed):
    rnd = random.Random(seed)
    recs = messy()
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"\n".join(in_batches(recs, rnd)) + b"\n")

    class OneByOne(replay.Replay):
        def feed_many(self, items):
            for item in items:
                self.feed(item)

    outs = {}
    for name, cls, columns in (("one", OneByOne, False), ("runs", replay.Replay, True)):
        sink = replay.JsonlSink(tmp_path / name)
        rep = cls([sink])
        items = list(replay.InputFile(src, columns=columns))
        if columns:
            assert sum(type(i.value) is StepRows for i in items) > 20
        i = 0
        while i < len(items):
            n = rnd.choice(CUTS)
            rep.feed_many(items[i:i + n])
            i += n
        s = rep.close()
        states = {j: c.state() for j, c in rep.core.jobs.items()}
        outs[name] = (s.records, s.rejected, s.findings, s.by_kind, s.by_type, s.first_ts, s.last_ts, states,
                      {p.name: p.read_bytes() for p in sorted((tmp_path / name).glob("*.jsonl"))})
    assert outs["one"][1] >= 3 and outs["one"][2] > 0
    assert outs["one"] == outs["runs"]


@pytest.mark.parametrize("seed", range(3))
def test_runs_of_step_rows_give_what_records_give_on_the_standard_scenarios(scenario_records, seed):
    rnd = random.Random(seed)
    pieces = [v for line in in_batches(scenario_records, rnd) for v in decode(line, columns=True)
              if type(v) is not DecodeError]
    recs = [r for v in pieces for r in (v.records() if type(v) is StepRows else (v,))]
    assert sum(type(v) is StepRows for v in pieces) > 10
    a, b = Core(), Core()
    want, got = one_by_one(recs, a), in_runs(pieces, b, seed)
    assert view(want) == view(got)
    assert a.records == b.records and a.max_ts == b.max_ts and a.clock == b.clock
    assert {j: c.state() for j, c in a.jobs.items()} == {j: c.state() for j, c in b.jobs.items()}


# --- reading lines in blocks ----------------------------------------------------------------------------


def readline_lines(fh, limit):
    """The reference: `bounded_lines` as it read, one `readline(limit + 1)` at a time."""
    while True:
        line = fh.readline(limit + 1)
        if not line:
            return
        if line.endswith(b"\n"):
            yield line[:-1], len(line) - 1
            continue
        if len(line) <= limit:
            yield line, len(line)
            continue
        head, size = line[:replay._HEAD_KEEP], len(line)
        while True:
            chunk = fh.readline(1 << 20)
            size += len(chunk)
            if not chunk or chunk.endswith(b"\n"):
                break
        yield head, size - (1 if chunk.endswith(b"\n") else 0)


@pytest.mark.parametrize("seed", range(20))
def test_lines_read_in_blocks_are_the_lines_read_one_by_one(seed, monkeypatch):
    import io
    rnd = random.Random(seed)
    monkeypatch.setattr(replay, "_BLOCK", rnd.choice([7, 64, 1000, 1 << 20]))
    limit = rnd.choice([5, 50, 999, 20_000])
    parts = [b"x" * rnd.choice([0, 1, limit - 1, limit, limit + 1, limit + 2, 3 * limit, 17_000, 40_000])
             + rnd.choice([b"", b"\r", b" "]) for _ in range(rnd.randint(0, 40))]
    data = b"\n".join(parts) + rnd.choice([b"", b"\n", b"\n\n"])
    assert list(replay.bounded_lines(io.BytesIO(data), limit)) == list(readline_lines(io.BytesIO(data), limit))


@pytest.mark.parametrize("cut", [0.0, 0.3, 0.5, 0.77, 0.99, 1.0])
def test_a_gzip_cut_short_stops_where_it_stopped(tmp_path, monkeypatch, cut):
    import gzip
    lines = [encode(r) for r in messy()]
    whole = gzip.compress(b"\n".join(lines) + b"\n")
    src = tmp_path / "in.jsonl.gz"
    src.write_bytes(whole[:max(10, int(len(whole) * cut))])

    def items():
        f = replay.InputFile(src)
        return [(i.line, i.ts, str(i.value) if isinstance(i.value, DecodeError) else encode(i.value)) for i in f]

    got = items()
    monkeypatch.setattr(replay, "bounded_lines", readline_lines)
    assert got == items()
