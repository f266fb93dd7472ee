"""The trainer client's spool: in order, bounded (oldest lost first, and counted), surviving the process."""

from __future__ import annotations

import pytest
from gangwatch.producers.trainer.spool import Spool

pytestmark = pytest.mark.unit


def drain(spool: Spool) -> list:
    out = []
    while (msg := spool.peek()) is not None:
        out.append(msg)
        spool.pop()
    return out


def test_messages_come_back_in_order_and_sent_segments_are_deleted(tmp_path):
    spool = Spool(tmp_path, max_bytes=1 << 20)
    msgs = [("gw.telemetry", k, b'{"kind":"batch","n":%d}' % k) for k in range(5)]
    for m in msgs[:3]:
        spool.append(m)
    assert spool.peek() == msgs[0]
    spool.pop()
    for m in msgs[3:]:  # appended while the first segment is half sent
        spool.append(m)
    assert drain(spool) == msgs[1:]
    assert not spool and not list(tmp_path.iterdir())


def test_a_full_spool_loses_its_oldest_segment_and_counts_its_records(tmp_path):
    spool = Spool(tmp_path, max_bytes=8192)  # segments of 4 KiB
    value = b"x" * 1000
    lost = sum(spool.append(("t", 3, value)) for _ in range(30))
    kept = drain(spool)
    assert 0 < len(kept) < 30 and lost == 3 * (30 - len(kept))
    assert spool.bytes == 0


def test_the_unsent_part_of_a_half_sent_segment_is_what_is_lost(tmp_path):
    spool = Spool(tmp_path, max_bytes=8192)
    spool.append(("t", 5, b"a" * 1000))
    spool.peek()
    spool.pop()  # sent: not lost when its segment goes
    lost = sum(spool.append(("t", 1, b"b" * 1000)) for _ in range(12))
    assert lost == 12 - len(drain(spool))  # the 5 records already sent are not counted


def test_a_new_spool_on_the_same_directory_resumes_the_backlog_before_its_own(tmp_path):
    old = Spool(tmp_path)
    old.append(("t", 1, b"old-1"))
    old.append(("t", 1, b"old-2"))
    old.peek()
    old.pop()  # old-1 was sent; the process exits before old-2
    old.close()
    new = Spool(tmp_path)
    new.append(("t", 1, b"new"))
    assert [v for _, _, v in drain(new)] == [b"old-2", b"new"]


def test_after_a_crash_the_sent_part_of_the_oldest_segment_goes_again(tmp_path):
    old = Spool(tmp_path)
    old.append(("t", 1, b"old-1"))
    old.append(("t", 1, b"old-2"))
    old.peek()
    old.pop()  # killed now: no close()
    assert [v for _, _, v in drain(Spool(tmp_path))] == [b"old-1", b"old-2"]  # at least once


def test_damaged_lines_from_a_crash_are_skipped(tmp_path):
    (tmp_path / "000000000001.spool").write_bytes(b"garbage\nt 1 good-1\nalso garbage\nt 1 good-2\nt 1 torn-with")
    (tmp_path / "notes.txt").write_text("not a segment")
    spool = Spool(tmp_path)
    assert [v for _, _, v in drain(spool)] == [b"good-1", b"good-2"]
    assert not list(tmp_path.glob("*.spool"))


def test_a_segment_removed_behind_its_back_is_skipped(tmp_path):
    spool = Spool(tmp_path, max_bytes=8192)
    for k in range(12):
        spool.append(("t", 1, b"%d" % k + b"x" * 1000))
    first = sorted(tmp_path.glob("*.spool"))[0]
    first.unlink()
    values = [v for _, _, v in drain(spool)]
    assert values and values == sorted(values, key=lambda v: int(v.rstrip(b"x")))
    assert not spool
