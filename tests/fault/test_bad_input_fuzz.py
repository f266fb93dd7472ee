"""The bad-input fuzz through `gangwatch replay` (issue 24): 10,000 mutated lines, then 2,000 good ones.

Every mutation makes its line invalid in one way (a value of the wrong type or beyond 64 bits, a line cut
short, bytes that are not UTF-8 or not JSON, nesting too deep, an unknown kind or job, a bad batch envelope), so
each costs exactly one rejected line, never the run: the good lines after them are all replayed, and every
bad one is in rejected.jsonl and in the (chDB) store, with its raw line.
"""

from __future__ import annotations

import random

import orjson
import pytest

from gangwatch.cli import main

pytestmark = pytest.mark.fault

T0 = 1_767_225_600.0
RANKS = 8
BAD, GOOD = 10_000, 2_000
BIG = (2**70, -(2**70), 2**64, 2**63, -(2**63) - 1)  # beyond what an Int64 column holds


def good_records(n: int) -> list[dict]:
    """A job's steps and heartbeats, `n` of them in event-time order."""
    out: list[dict] = []
    step = 0
    while len(out) < n:
        for r in range(RANKS):
            ts = T0 + 1.0 + step + r * 0.01
            out.append({"kind": "step", "v": 1, "ts": ts, "job": "fz", "rank": r, "step": step, "step_s": 1.0,
                        "compute_s": 0.8, "comm_wait_s": 0.1, "data_wait_s": 0.05, "loss": 2.0, "grad_norm": 1.0})
            out.append({"kind": "heartbeat", "v": 1, "ts": ts + 0.001, "job": "fz", "rank": r, "step": step})
        step += 1
    return out[:n]


def _with(rec: dict, key: str, text: str) -> bytes:
    """`rec` as JSON with the value of `key` replaced by the raw JSON text `text`."""
    marker = "\x00MUTATED\x00"
    return orjson.dumps({**rec, key: marker}).replace(orjson.dumps(marker), text.encode())


def mutate(rng: random.Random, rec: dict) -> bytes:
    """One line that no reader may take as a record (and that holds no newline and is not blank)."""
    line = orjson.dumps(rec)
    how = rng.randrange(11)
    if how == 0:  # an integer field beyond 64 bits
        return _with(rec, rng.choice(["step", "rank"]), str(rng.choice(BIG)))
    if how == 1:  # the same, with a NaN elsewhere on the line (the slower JSON reader takes it)
        return _with({**rec, "loss": "NaN"}, "rank", str(rng.choice(BIG))).replace(b'"NaN"', b"NaN")
    if how == 2:  # an integer too long for a float
        return _with(rec, "step", "1" + "0" * rng.randrange(309, 2000)).replace(b'"step":', b'"loss":NaN,"step":')
    if how == 3:  # a value of the wrong type in a required field
        key, text = rng.choice([("ts", '"soon"'), ("ts", "1e999"), ("job", "42"), ("rank", "-3"), ("rank", "1.5"),
                                ("rank", "true"), ("kind", "[]"), ("v", "2"), ("rank", "null"), ("job", "{}")])
        return _with(rec, key, text)
    if how == 4:  # cut short
        return line[:rng.randrange(1, len(line) - 1)]
    if how == 5:  # random bytes
        return b"\xff" + bytes(rng.choice([b for b in range(256) if b != 10]) for _ in range(rng.randrange(1, 300)))
    if how == 6:  # a string that is not UTF-8
        return line.replace(b'"fz"', b'"f\xff\xfe"', 1)
    if how == 7:  # nested too deeply
        depth = rng.randrange(1000, 5000)
        return _with(rec, "rank", "[" * depth + "]" * depth)
    if how == 8:  # a kind nobody speaks
        return _with(rec, "kind", f'"telemetry{rng.randrange(100)}"')
    if how == 9:  # a job nobody started, at an event time beyond 64 bits (refused by its time, before the core)
        return _with({**rec, "job": "gone"}, "ts", str(rng.choice(BIG[:3])))
    return b'{"kind":"batch","v":1,"ts":%d,"items":%s}' % (rng.randrange(10**9), rng.choice([b'"x"', b"7", b"{}"]))


def test_bad_lines_cost_one_rejected_line_each_never_the_run(tmp_path, capsys):
    rng = random.Random(24)
    job = {"kind": "job", "v": 1, "ts": T0, "job": "fz", "heartbeat_s": 5.0,
           "ranks": [{"rank": r, "node": f"n{r // 4:03d}", "gpu": r % 4} for r in range(RANKS)]}
    good = good_records(GOOD)
    bad = [mutate(rng, rng.choice(good)) for _ in range(BAD)]
    lines = [orjson.dumps(job), *bad, *(orjson.dumps(r) for r in good)]
    path = tmp_path / "fuzz.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    out = tmp_path / "o"

    code = main(["replay", str(path), "--out", str(out)])
    stdout, err = capsys.readouterr()
    assert code == 0, err
    gone = sum(b'"job":"gone"' in line for line in bad)  # records that decode, at a time no file holds: refused
    assert gone and f"replayed  {1 + GOOD:,} records" in stdout and f"rejected  {BAD:,}" in stdout

    rejected = [orjson.loads(x) for x in (out / "rejected.jsonl").read_bytes().splitlines()]
    assert [r["line"] for r in rejected] == list(range(2, BAD + 2))  # each bad line once, in order
    for r, raw in zip(rejected, bad, strict=True):  # the raw line kept, not a re-encoding of what was parsed
        if b'"job":"gone"' in raw:  # refused by its time: the record it was, and why
            assert orjson.loads(r["raw"]) == orjson.loads(raw) and "plausible range" in r["reason"], r
        else:
            assert r["raw"] == raw[:16384].decode("utf-8", "replace")[:4096], r

    query = "SELECT count() AS n, uniqExact(line) AS lines, min(line) AS lo, max(line) AS hi FROM gw_rejected"
    assert main(["store", "query", query, "--out", str(out), "--format", "jsonl"]) == 0
    assert orjson.loads(capsys.readouterr()[0]) == {"n": BAD, "lines": BAD, "lo": 2, "hi": BAD + 1}
