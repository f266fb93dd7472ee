"""Fuzzing every parser of outside input: nothing a sender or a file holds makes one raise.

Each parser gets 10,000 generated inputs in CI (a bounded run: each property has a
fixed example budget and no deadline per example; 1,000 on a developer's machine). A property
whose inputs are costly to generate is split into shards (`fuzz(shards=k)`: k tests of N/k
examples each, rounded up, every shard drawing from its own random seed), so that parallel
workers (pytest-xdist, as in CI) share it; the budget per parser stays N. The fuzzing is
CPU-bound and times nothing: it runs at a lower CPU priority (`NICE`, where the priority can be
restored after it), so that on a small machine it takes the cycles the live tests beside it
leave idle instead of slowing them. What a parser may do with garbage:
- `schemas.decode` (single records and batch envelopes): a record or a `DecodeError`
  with a reason, one entry per item, never an exception;
- the kernel-log parser: an event or nothing, never an exception;
- the py-spy parser: threads or none; `read_pyspy` refuses non-dumps with a ValueError
  that says why;
- the flight-recorder reader: a plain dict or `FlightDumpError`/`UnsafePickleError`
  with the reason; what it accepts always maps onto a `flight` record that decodes.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import threading

import orjson
import pytest
from gangwatch.detectors.stacks import parse_pyspy
from gangwatch.producers.flight import FlightDumpError, UnsafePickleError, load_dump, to_flight_record
from gangwatch.producers.kmsg import parse_line, parse_lines
from gangwatch.schemas import DecodeError, decode
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.unit

# 10,000 per parser in CI (CI=true), 1,000 elsewhere; GANGWATCH_FUZZ_CASES sets it
N = int(os.environ.get("GANGWATCH_FUZZ_CASES") or (10_000 if os.environ.get("CI") == "true" else 1_000))
# added to this thread's nice value while a property runs (only where it can be taken back: root); 0: none
NICE = int(os.environ.get("GANGWATCH_FUZZ_NICE") or 10)


def fuzz(shards: int = 1, cases: int = N):
    """`cases` examples of a property in `shards` tests of `ceil(cases / shards)` examples each (parameter
    `shard`), no deadline, no example database (each shard draws from its own seed)."""
    per_shard = -(-max(1, cases) // shards)
    budget = settings(max_examples=per_shard, deadline=None, suppress_health_check=list(HealthCheck),
                      database=None)

    def wrap(test):
        test = budget(test)
        if shards > 1:
            test = pytest.mark.parametrize("shard", range(shards))(test)
        return test

    return wrap


@pytest.fixture(autouse=True)
def _low_priority():
    """Lower this thread's CPU priority for one property; put it back afterwards (root only: others may not)."""
    if not NICE or not hasattr(os, "setpriority") or os.geteuid() != 0:
        yield
        return
    tid = threading.get_native_id()
    before = os.getpriority(os.PRIO_PROCESS, tid)
    os.setpriority(os.PRIO_PROCESS, tid, min(19, before + NICE))
    try:
        yield
    finally:
        os.setpriority(os.PRIO_PROCESS, tid, before)

# JSON-ish values: what a confused or hostile sender could put in a message
scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40))
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=8)
KINDS = ["job", "step", "heartbeat", "hw", "gpu", "framework", "stack", "flight", "ops", "recovery", "batch",
         "finding", "action", "incident", "nope"]
FIELDS = ["ts", "job", "rank", "step", "step_s", "node", "gpu", "ranks", "items", "type", "source", "code", "extra",
          "snapshot", "format", "entries", "dump", "heartbeat_s", "compute_s", "throttle"]
# up to 6 of the fields at once, any of them: a decoder stops at the first bad one, and a record drawing all 20
# cost Hypothesis three times the CPU (its draws, not the decoder, are what the fuzzing spends)
heads = st.fixed_dictionaries({"kind": st.sampled_from(KINDS), "v": st.sampled_from([1, 1, 1, 2, "1", None])})
records = st.builds(lambda head, rest: {**rest, **head}, heads,
                    st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=6))


def _check_decoded(out: list, *, empty_ok: bool = False) -> None:
    assert isinstance(out, list) and (out or empty_ok)
    for v in out:
        assert not isinstance(v, Exception)
        if isinstance(v, DecodeError):
            assert v.reason


@fuzz()
@given(st.binary(max_size=600))
def test_decode_takes_any_bytes(raw):
    _check_decoded(decode(raw))


@fuzz(shards=4)
@given(records)
def test_decode_takes_any_json_record(shard, obj):
    out = decode(json.dumps(obj))  # the stdlib writes what orjson refuses (huge ints, NaN)
    _check_decoded(out, empty_ok=obj["kind"] == "batch")  # an empty batch carries nothing to lose


@fuzz(shards=12)
@given(st.lists(records, max_size=4), json_values)
def test_decode_takes_any_batch_envelope(shard, items, ts):
    out = decode(json.dumps({"kind": "batch", "v": 1, "ts": ts, "items": items}))
    _check_decoded(out, empty_ok=not items)  # an empty batch carries nothing to lose
    # one entry per item (nothing dropped), or one error for an envelope that is itself bad
    assert len(out) == len(items) or (len(out) == 1 and isinstance(out[0], DecodeError) and out[0].kind == "batch")


kmsg_lines = st.one_of(
    st.text(max_size=300),
    st.builds(lambda pre, code, rest: f"{pre}NVRM: Xid (PCI:{rest[:12]}): {code}, {rest}",
              st.sampled_from(["", "[ 12.345] ", "<3>", "kernel: "]), st.integers(-5, 10**6), st.text(max_size=80)),
    st.builds(lambda rest: f"pcieport 0000:00:01.0: AER: {rest}", st.text(max_size=120)),
)


@fuzz()
@given(kmsg_lines)
def test_the_kernel_log_parser_takes_any_line(line):
    ev = parse_line(line)
    assert ev is None or ev.source


@fuzz(cases=N // 5)
@given(st.lists(kmsg_lines, max_size=30))
def test_the_kernel_log_parser_takes_any_sequence(lines):
    for ev in parse_lines(lines):
        assert ev.source


pyspy_text = st.one_of(
    st.text(max_size=400),
    st.lists(st.one_of(
        st.builds(lambda pid: f"Process {pid}: python train.py", st.integers(-3, 10**9)),
        st.builds(lambda tid, state, name: f'Thread {tid} ({state}): "{name}"',
                  st.one_of(st.integers(0, 2**64), st.text(max_size=8)), st.text(max_size=10), st.text(max_size=10)),
        st.builds(lambda f, file, n: f"    {f} ({file}:{n})", st.text(max_size=20), st.text(max_size=20),
                  st.integers(-5, 10**6)),
        st.text(max_size=60)), max_size=20).map("\n".join),
)


@fuzz(shards=2)
@given(pyspy_text)
def test_the_pyspy_parser_takes_any_text(shard, text):
    for t in parse_pyspy(text):
        assert isinstance(t.frames, (list, tuple))


# Pickled dumps are built from a drawn seed (Python's random, deterministic): Hypothesis drawing a nested value for
# each of 9 fields of 6 entries spent 20 ms per case, 500 times what reading the dump costs. A failure names its
# seed and protocol (Hypothesis prints them), which rebuild the same object.
EDGES = [None, True, False, 0, -1, 1, 2**31, -2**63 - 1, 2**64, 10**30, 0.0, -0.0, 1.5, float("nan"), float("inf"),
         float("-inf"), 1e308, "", "\x00", "é", "🙂", "nccl:all_reduce", "completed", "scheduled", b"", b"\xff\x00"]
ENTRY_FIELDS = ["profiling_name", "collective_seq_id", "p2p_seq_id", "process_group", "state", "input_sizes",
                "input_dtypes", "op_id", "record_id"]


def _scalar(rng: random.Random) -> object:
    r = rng.random()
    if r < 0.5:
        return rng.choice(EDGES)
    if r < 0.7:
        return rng.randint(-2**70, 2**70)
    if r < 0.8:
        return rng.uniform(-1e6, 1e6)
    if r < 0.9:
        return "".join(chr(rng.randint(0, 0x2FFF)) for _ in range(rng.randint(0, 12)))
    return rng.randbytes(rng.randint(0, 20))


def _value(rng: random.Random, depth: int = 0) -> object:
    """A scalar, or (up to 3 deep) a list, tuple or dict of values: anything a foreign pickle could hold."""
    if depth >= 3 or rng.random() < 0.6:
        return _scalar(rng)
    n, kind = rng.randint(0, 4), rng.randrange(3)
    items = [_value(rng, depth + 1) for _ in range(n)]
    if kind == 0:
        return items
    if kind == 1:
        return tuple(items)
    return {(_scalar(rng) if rng.random() < 0.3 else rng.choice(ENTRY_FIELDS)): v for v in items}


def _dump_like(seed: int) -> dict:
    """A dict shaped like a flight-recorder dump, or like nothing: its keys optional, its values anything."""
    rng = random.Random(seed)
    out: dict = {}
    if rng.random() < 0.8:
        out["entries"] = _value(rng) if rng.random() < 0.2 else [
            {f: (_value(rng) if rng.random() < 0.3 else _scalar(rng))
             for f in rng.sample(ENTRY_FIELDS, rng.randint(0, 9))} for _ in range(rng.randint(0, 6))]
    for key in ("pg_status", "pg_config", "version", "comm_lib_version"):
        if rng.random() < 0.4:
            out[key] = _value(rng)
    return out


def _flight_ok_or_refused(data: bytes) -> None:
    try:
        dump = load_dump(data)
    except (FlightDumpError, UnsafePickleError) as e:
        assert str(e)
        return
    try:
        rec = to_flight_record(dump, job="j", rank=0, snapshot="s", ts=1.0)
    except FlightDumpError as e:
        assert str(e)
        return
    [v] = decode(orjson.dumps(rec))
    assert not isinstance(v, DecodeError) or v.reason


@fuzz()
@given(st.binary(max_size=400))
def test_the_flight_reader_takes_any_bytes(data):
    _flight_ok_or_refused(data)


@fuzz(shards=2)
@given(st.integers(0, 2**64 - 1), st.integers(0, pickle.HIGHEST_PROTOCOL))
def test_the_flight_reader_takes_any_plain_pickle(shard, seed, protocol):
    _flight_ok_or_refused(pickle.dumps(_dump_like(seed), protocol=protocol))


def test_a_pickle_that_calls_code_is_refused_without_running_it(tmp_path):
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    with pytest.raises(UnsafePickleError):
        load_dump(pickle.dumps({"entries": [Evil()]}))
    assert not marker.exists()
