"""The agent's kernel-log follower: tail -F on a file, folding across reads, /dev/kmsg, real logs."""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path

import pytest
from gangwatch.producers.agent.kernel import FollowFile, Journal, KernelLog, KmsgDevice, KmsgFolder, open_source
from gangwatch.producers.kmsg import parse_lines
from gangwatch.schemas import Hw, decode_obj

from tests.helpers import data_path, missing

pytestmark = pytest.mark.unit

AER_HEAD = "pcieport 0000:00:01.0: AER: Corrected error received: 0000:01:00.0"
AER_DETAIL = "nvidia 0000:01:00.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)"


def real_lines(name: str) -> list[str]:
    return data_path(f"kmsg/{name}").read_text().splitlines()


def append(path: Path, lines: list[str]) -> None:
    with open(path, "a") as f:
        f.write("".join(line + "\n" for line in lines))


# --- following a file ---------------------------------------------------------------------------


def test_a_file_is_followed_from_its_end_and_an_unfinished_line_waits(tmp_path):
    log = tmp_path / "kern.log"
    append(log, ["old line, before the agent"])
    follow = FollowFile(log)
    assert follow.read_lines() == []
    append(log, ["one", "two"])
    with open(log, "a") as f:
        f.write("thr")
    assert follow.read_lines() == ["one", "two"]
    with open(log, "a") as f:
        f.write("ee\n")
    assert follow.read_lines() == ["three"]
    assert follow.read_lines() == []


def test_rotation_reads_the_rest_of_the_old_file_then_the_new_one_from_its_start(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text("")
    follow = FollowFile(log)
    append(log, ["a1"])
    assert follow.read_lines() == ["a1"]
    append(log, ["a2"])  # written just before the rotation, not yet read
    log.rename(tmp_path / "kern.log.1")
    assert follow.read_lines() == ["a2"]  # between the rename and the new file: the old one is kept
    append(log, ["b1", "b2"])
    assert follow.read_lines() == ["b1", "b2"]
    append(tmp_path / "kern.log.1", ["late write to the old file"])
    append(log, ["b3"])
    assert follow.read_lines() == ["b3"]


def test_truncation_in_place_starts_over(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text("")
    follow = FollowFile(log)
    append(log, ["a long line before the truncation", "and another"])
    assert len(follow.read_lines()) == 2
    log.write_text("")  # copytruncate
    append(log, ["fresh"])
    assert follow.read_lines() == ["fresh"]


def test_a_file_that_appears_later_is_read_from_its_start(tmp_path):
    log = tmp_path / "not-yet.log"
    follow = FollowFile(log)
    assert follow.read_lines() == []
    append(log, ["first", "second"])
    assert follow.read_lines() == ["first", "second"]


def test_from_start_reads_what_is_already_there(tmp_path):
    log = tmp_path / "kern.log"
    append(log, ["already there"])
    assert FollowFile(log, from_start=True).read_lines() == ["already there"]


# --- folding across reads -------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["h100-xid119.log", "xid13-xid43-storm.log", "benign-kmsg.log"])
@pytest.mark.parametrize("chunk", [1, 2, 5, 17, 1000])
def test_lines_fed_in_pieces_give_the_events_of_the_whole_log(name, chunk):
    lines = real_lines(name)
    folder = KmsgFolder(quiet_s=2.0)
    got = []
    for i in range(0, len(lines), chunk):
        got += folder.feed(lines[i:i + chunk], now=0.0)  # no time passes: every report stays open
    assert got == parse_lines(lines)


def test_the_xid119_dump_split_over_two_reads_folds_into_its_xid():
    lines = real_lines("h100-xid119.log")
    folder = KmsgFolder()
    first = folder.feed(lines[:10], now=0.0)  # the headline and the start of its firmware dump
    rest = folder.feed(lines[10:37], now=0.5)  # the rest of the dump and the call trace
    assert [(e.source, e.code) for e in first] == [("xid", 119)]
    assert rest == []


def test_a_line_that_is_an_event_alone_folds_into_the_xid_read_before_it():
    xid79 = "[ 1.0] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."
    nvlink = "[ 1.0] NVRM: GPU at PCI:0000:3b:00: NVLink: fatal error detected on link 3"
    folder = KmsgFolder()
    assert [(e.source, e.code) for e in folder.feed([xid79], now=0.0)] == [("xid", 79)]
    assert folder.feed([nvlink], now=0.2) == []  # the same report, arriving in the next read
    assert [e.source for e in KmsgFolder().feed([nvlink], now=0.0)] == ["nvlink"]  # alone, it is an event


def test_a_report_closes_after_a_quiet_period():
    folder = KmsgFolder(quiet_s=2.0)
    assert [e.source for e in folder.feed([AER_HEAD], now=10.0)] == ["pcie"]
    assert folder.feed([AER_DETAIL], now=11.0) == []  # within the quiet period: the report's detail
    assert [e.source for e in folder.feed([AER_HEAD], now=20.0)] == ["pcie"]
    later = folder.feed([AER_DETAIL], now=23.0)  # after it: a line of its own
    assert [(e.source, e.severity_hint) for e in later] == [("pcie", "corrected")]


def test_an_unrelated_line_ends_a_report():
    folder = KmsgFolder()
    folder.feed([AER_HEAD], now=0.0)
    assert folder.feed(["usb 1-1: new high-speed USB device number 2"], now=0.1) == []
    assert [e.source for e in folder.feed([AER_DETAIL], now=0.2)] == ["pcie"]


# --- the collector ----------------------------------------------------------------------------------


def test_the_collector_turns_appended_real_lines_into_hw_records_across_a_rotation(tmp_path):
    log = tmp_path / "kern.log"
    append(log, real_lines("benign-kmsg.log"))  # before the agent: not reported
    clock = iter(range(1000))
    collector = KernelLog(FollowFile(log), "n007", timer=lambda: next(clock) * 0.1)
    assert collector.poll(1.0) == []
    storm, h100 = real_lines("xid13-xid43-storm.log"), real_lines("h100-xid119.log")
    append(log, storm[:7])
    recs = collector.poll(2.0)
    append(log, storm[7:] + h100[:12])
    log.rename(tmp_path / "kern.log.1")
    append(log, h100[12:])
    recs += collector.poll(3.0)
    typed = [decode_obj(r) for r in recs]
    assert all(isinstance(r, Hw) and r.node == "n007" for r in typed)
    expected = parse_lines(storm) + parse_lines(h100)
    assert [(r.source, r.code, r.message) for r in typed] == [(e.source, e.code, e.message) for e in expected]
    assert [r.code for r in typed if r.source == "xid"].count(119) == 5
    collector.close()


def fake_journalctl(tmp_path: Path, body: str) -> str:
    """An executable standing in for journalctl: records its arguments, then runs `body`."""
    script = tmp_path / "journalctl"
    script.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/args\n{body}\n')
    script.chmod(0o755)
    return str(script)


def read_until(source, count: int, timeout: float = 10.0) -> list[str]:
    """Poll a line source until it gave `count` lines (a subprocess writes them when it gets to it)."""
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while len(lines) < count and time.monotonic() < deadline:
        lines += source.read_lines()
        time.sleep(0.01)
    return lines


def test_journalctl_output_is_read_without_blocking_from_its_end(tmp_path):
    xid = "2025-02-23T16:24:18+0000 gpu-node-7 kernel: NVRM: Xid (PCI:0000:9b:00): 79, pid=1, name=python, off the bus"
    journal = Journal(command=fake_journalctl(tmp_path, f"echo '{xid}'\nprintf 'partial'\nexec sleep 60"))
    try:
        assert read_until(journal, 1) == [xid]
        assert journal.read_lines() == []  # "partial" waits for its end of line, and nothing blocks
        assert (tmp_path / "args").read_text().split() == ["-k", "-f", "-o", "short-iso", "--no-pager", "-n", "0"]
        [event] = parse_lines([xid])
        assert (event.source, event.code) == ("xid", 79)
    finally:
        journal.close()


def test_journalctl_that_exits_is_reported_once(tmp_path, caplog):
    journal = Journal(from_start=True, command=fake_journalctl(tmp_path, "echo 'No journal files were found.' >&2\n"
                                                                         "exit 1"))
    with caplog.at_level(logging.WARNING, "gangwatch.agent"):
        deadline = time.monotonic() + 10
        while "journalctl exited" not in caplog.text and time.monotonic() < deadline:
            journal.read_lines()
            time.sleep(0.01)
        journal.read_lines()
    assert caplog.text.count("journalctl exited (status 1) No journal files were found.") == 1
    assert "-n all" in (tmp_path / "args").read_text()
    journal.close()


def test_open_source_names():
    assert open_source("off") is None
    follow = open_source("/some/where/kern.log")
    assert isinstance(follow, FollowFile) and follow.what == "/some/where/kern.log"


# --- /dev/kmsg -------------------------------------------------------------------------------------


def test_the_real_dev_kmsg_gives_prefixed_records_without_blocking():
    try:
        device = KmsgDevice(from_start=True)
    except OSError as e:
        missing(f"/dev/kmsg is not readable here: {e.strerror}")
    try:
        lines = device.read_lines()
        assert lines, "the kernel ring buffer is never empty after boot"
        assert all(re.match(r"\d+,\d+,\d+,[^;]*;", line) for line in lines), lines[:3]
        assert not any(line.startswith(" ") for line in lines)  # device metadata lines are dropped
        device.read_lines()  # nothing new: returns at once
    finally:
        device.close()
    tail = KmsgDevice()  # from the end: only what the kernel writes from now on
    try:
        assert len(tail.read_lines()) < len(lines)
    finally:
        tail.close()
