"""Oversized input is refused by configurable limits before it is parsed, and never loaded whole:
Kafka messages (the worker's decode path), JSONL lines (replay), py-spy text and flight-recorder pickles."""

from __future__ import annotations

import gzip
import io
import pickle
import tracemalloc
from pathlib import Path

import orjson
import pytest
from gangwatch.producers import dumps, flight
from gangwatch.schemas import DecodeError, Heartbeat, codec, decode, encode
from gangwatch.schemas.topics import TopicSettings
from gangwatch.streams import replay
from gangwatch.streams.runner import JobRunner, Msg

from gangwatch.cli import main

pytestmark = pytest.mark.unit

MiB = 1 << 20
JOB = b'{"kind":"job","v":1,"ts":1.0,"job":"j1","ranks":[{"rank":0,"node":"n0","gpu":0}]}'


def _hb(ts: float) -> bytes:
    return encode(Heartbeat(ts=ts, job="j1", rank=0, step=1))


def _no_parsing(monkeypatch) -> None:
    def refuse(data):  # noqa: ANN001
        raise AssertionError("an oversized message reached the JSON parser")

    monkeypatch.setattr(codec, "_loads", refuse)


# --- the codec: the one check every decode path goes through ----------------------------------------------------


def test_a_message_over_the_limit_is_one_error_and_is_not_parsed(monkeypatch):
    _no_parsing(monkeypatch)
    data = b'{"kind":"heartbeat"' + b" " * 2000 + b"}"
    [err] = decode(data, max_bytes=1000)
    assert isinstance(err, DecodeError)
    assert err.reason == f"message larger than 1000 bytes ({len(data)}): refused unread"
    assert err.raw.startswith('{"kind":"heartbeat"') and len(err.raw) <= 4096


def test_the_default_limit_is_the_module_setting(monkeypatch):
    monkeypatch.setattr(codec, "MAX_MESSAGE_BYTES", 64)
    assert isinstance(decode(_hb(1.0) + b" " * 64)[0], DecodeError)
    assert decode(_hb(1.0)) == [Heartbeat(ts=1.0, job="j1", rank=0, step=1)]
    assert decode(b"x" * 10 * MiB, max_bytes=20 * MiB)[0].reason.startswith("not valid JSON")  # raised per call


def test_the_raw_text_of_a_huge_message_is_cut_before_it_is_decoded():
    tracemalloc.start()
    try:
        data = b"\xff" * (32 * MiB)  # undecodable: decoding it whole would make a 96 MiB str of U+FFFD
        tracemalloc.reset_peak()
        held = tracemalloc.get_traced_memory()[0]
        [err] = decode(data)
        peak = tracemalloc.get_traced_memory()[1] - held
    finally:
        tracemalloc.stop()
    assert "larger than" in err.reason and len(err.raw) == 4096
    assert peak < 2 * MiB


@pytest.mark.parametrize("value, ok", [("", True), ("1048576", True), ("0", False), ("-5", False), ("1MiB", False),
                                       ("\u0661", False)])
def test_a_limit_from_the_environment(monkeypatch, value, ok):
    monkeypatch.setenv("GW_TEST_LIMIT", value)
    if ok:
        assert codec.size_limit("GW_TEST_LIMIT", 7) == (int(value) if value else 7)
    else:
        with pytest.raises(ValueError, match="GW_TEST_LIMIT must be a positive number of bytes"):
            codec.size_limit("GW_TEST_LIMIT", 7)


# --- the worker: a Kafka message over the limit goes to the DLQ, unparsed -------------------------------------


def test_the_worker_sends_an_oversized_message_to_the_dlq_unparsed(monkeypatch):
    t = TopicSettings()
    monkeypatch.setattr(codec, "MAX_MESSAGE_BYTES", 4096)
    big = b'{"kind":"heartbeat","v":1,"ts":2.0,"job":"j1","rank":0,"step":1,"pad":"' + b"a" * 8192 + b'"}'
    runner = JobRunner(t)
    res = runner.on_batch([Msg(t.telemetry, 0, 0, b"j1", big), Msg(t.jobs, 0, 1, b"j1", JOB)])
    [dead] = res.rejects
    assert dead.reason == f"message larger than 4096 bytes ({len(big)}): refused unread"
    assert (dead.topic, dead.partition, dead.offset) == (t.telemetry, 0, 0)
    dlq = [s for s in res.sends if s.topic == t.dlq]
    assert len(dlq) == 1 and orjson.loads(dlq[0].value)["reason"] == dead.reason


# --- replay: JSONL lines read in bounded pieces ----------------------------------------------------------------


class Recording(io.BytesIO):
    """A file that remembers the longest piece any one read returned."""

    longest = 0

    def readline(self, size: int | None = -1) -> bytes:  # type: ignore[override]
        line = super().readline(size)
        self.longest = max(self.longest, len(line))
        return line

    def __iter__(self):  # reading a whole line at a time is what must not happen
        raise AssertionError("lines iterated whole")


def test_bounded_lines_never_returns_more_than_the_limit_or_the_skip_chunk():
    data = b"short\n" + b"a" * (5 * MiB) + b"\nafter\n" + b"b" * 3000 + b"\n" + b"x" * 1000 + b"\nlast"
    f = Recording(data)
    got = list(replay.bounded_lines(f, 1000))
    assert [(len(line), size) for line, size in got] == [(5, 5), (1001, 5 * MiB), (5, 5), (1001, 3000),
                                                         (1000, 1000), (4, 4)]
    assert got[2][0] == b"after" and got[5][0] == b"last"
    assert f.longest <= MiB


def test_replay_rejects_an_oversized_line_with_its_reason_and_goes_on(tmp_path):
    src = tmp_path / "in.jsonl"
    big = b'{"kind":"heartbeat","v":1,"ts":1.5,"job":"j1","rank":0,"step":1,"pad":"' + b"z" * 5000 + b'"}'
    src.write_bytes(JOB + b"\n" + big + b"\n" + _hb(2.0) + b"\n")
    items = list(replay.InputFile(src, max_line_bytes=4096))
    assert [type(i.value).__name__ for i in items] == ["Job", "DecodeError", "Heartbeat"]
    err = items[1]
    assert err.line == 2 and err.value.reason == f"line larger than 4096 bytes ({len(big)}): refused unread"
    assert err.value.raw.startswith('{"kind":"heartbeat","v":1')

    summary = replay.run([src], tmp_path / "out", None)  # the default limit (16 MiB): all three pass
    assert (summary.records, summary.rejected) == (3, 0)


def test_replay_writes_the_oversized_line_to_rejected_jsonl(tmp_path, monkeypatch):
    monkeypatch.setattr(codec, "MAX_MESSAGE_BYTES", 4096)
    src = tmp_path / "in.jsonl"
    src.write_bytes(JOB + b"\n" + b"[" * 10_000 + b"\n" + _hb(2.0) + b"\n")
    summary = replay.run([src], tmp_path / "out", None)
    assert (summary.records, summary.rejected) == (2, 1)
    [dead] = [orjson.loads(x) for x in (tmp_path / "out" / "rejected.jsonl").read_bytes().splitlines()]
    assert dead["reason"] == "line larger than 4096 bytes (10000): refused unread"
    assert dead["line"] == 2 and dead["source"] == str(src)


def test_a_huge_line_in_a_gzip_file_is_never_held_whole(tmp_path):
    src = tmp_path / "in.jsonl.gz"
    with gzip.open(src, "wb") as f:
        f.write(JOB + b"\n")
        for _ in range(48):  # one 48 MiB line, compressed to a few hundred KiB
            f.write(b"a" * MiB)
        f.write(b"\n" + _hb(2.0) + b"\n")
    tracemalloc.start()
    try:
        items = list(replay.InputFile(src, max_line_bytes=MiB))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [type(i.value).__name__ for i in items] == ["Job", "DecodeError", "Heartbeat"]
    assert items[1].value.reason == f"line larger than {MiB} bytes ({48 * MiB}): refused unread"
    assert peak < 8 * MiB  # a line held whole would be 48 MiB


# --- dumps: refused by their size on disk ------------------------------------------------------------------------


def _sparse(path: Path, size: int) -> Path:
    with open(path, "wb") as f:
        f.truncate(size)  # no disk used; reading it would produce `size` zero bytes
    return path


def _peak(fn):  # noqa: ANN001
    tracemalloc.start()
    try:
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - returned for the test to look at
            err = e
        else:
            err = None
        return err, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_flight_dump_over_the_limit_is_refused_unread(tmp_path):
    path = _sparse(tmp_path / "rank0.pkl", 8 << 30)  # 8 GiB
    err, peak = _peak(lambda: flight.load_dump(path))
    assert isinstance(err, flight.FlightDumpError)
    assert str(err).startswith(f"dump larger than {flight.MAX_DUMP_BYTES} bytes ({8 << 30}): refused unread")
    assert peak < MiB
    small = tmp_path / "rank1.pkl"
    small.write_bytes(pickle.dumps({"entries": [], "pad": "p" * 4000}, protocol=2))
    assert flight.load_dump(small)["entries"] == []
    with pytest.raises(flight.FlightDumpError, match="larger than 1000 bytes"):
        flight.load_dump(small, max_bytes=1000)
    with pytest.raises(flight.FlightDumpError, match="larger than 1000 bytes"):
        flight.load_dump(small.read_bytes(), max_bytes=1000)


def test_the_dump_limit_defaults_to_64_mib():
    assert flight.MAX_DUMP_BYTES == 64 * MiB and flight.DUMP_LIMIT_ENV == "GANGWATCH_MAX_DUMP_BYTES"


def test_a_pyspy_dump_over_the_limit_is_refused_unread(tmp_path):
    path = _sparse(tmp_path / "dump_rank0.txt", 8 << 30)
    err, peak = _peak(lambda: dumps.read_pyspy(path))
    assert isinstance(err, ValueError) and "is larger than 67108864 bytes (8589934592): refused unread" in str(err)
    assert peak < MiB
    text = tmp_path / "ok_rank0.txt"
    text.write_text('Thread 0x7F (idle): "MainThread"\n    wait (threading.py:320)\n' + "x" * 2000)
    assert dumps.read_pyspy(text).startswith("Thread 0x7F")
    with pytest.raises(ValueError, match="larger than 1000 bytes"):
        dumps.read_text(text, "a py-spy dump", max_bytes=1000)


def test_ingest_refuses_a_folder_with_an_oversized_dump_saying_which(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(flight, "MAX_DUMP_BYTES", 1000)
    (tmp_path / "dump_rank0.txt").write_text('Thread 0x7F (idle): "MainThread"\n' + "x" * 5000)
    assert main(["ingest", "pyspy", str(tmp_path)]) != 0
    err = capsys.readouterr().err
    assert "dump_rank0.txt is larger than 1000 bytes" in err and "GANGWATCH_MAX_DUMP_BYTES" in err
