"""Watching a flight-recorder dump directory: new complete dumps (real pickles) become `flight` records."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from gangwatch.producers.agent.flightdir import FlightWatcher
from gangwatch.producers.agent.procs import RankProcess
from gangwatch.schemas import Flight, decode_obj

from tests.helpers import data_path

pytestmark = pytest.mark.unit

NOW = 1_800_000_000.0  # the watcher's wall clock in these tests; files get modification times around it


def write_dump(directory: Path, name: str, rank: int, written_at: float) -> Path:
    """A real rank's pickle copied in as PyTorch would have written it, `written_at` being its mtime."""
    path = directory / name
    shutil.copyfile(data_path(f"flight-recorder/gloo-dataloader-hang-4ranks/rank{rank}.pkl"), path)
    os.utime(path, (written_at, written_at))
    return path


@pytest.fixture
def fr(tmp_path) -> Path:
    d = tmp_path / "fr"
    d.mkdir()
    return d


def ranks_of(fr: Path, job: str = "j1") -> list[RankProcess]:
    return [RankProcess(pid=100 + r, job=job, rank=r, fr_prefix=str(fr / "nccl_trace_rank_")) for r in range(4)]


def test_new_dumps_are_published_once_they_have_settled_and_old_ones_are_not(fr):
    write_dump(fr, "nccl_trace_rank_0", 0, NOW - 3600)  # an old dump, there before the agent
    watcher = FlightWatcher(fr, processes=lambda: ranks_of(fr), settle_s=2.0)
    for r in range(4):
        write_dump(fr, f"nccl_trace_rank_{r}", r, NOW - 0.5)  # a hang's dumps, just written
    assert watcher.poll(NOW) == []  # maybe still being written
    recs = [decode_obj(r) for r in watcher.poll(NOW + 2.0)]
    assert all(isinstance(r, Flight) for r in recs)
    assert [(r.job, r.rank) for r in recs] == [("j1", 0), ("j1", 1), ("j1", 2), ("j1", 3)]
    assert {r.snapshot for r in recs} == {f"fr-{int((NOW - 0.5) // 60) * 60}"}  # one snapshot: the minute
    assert recs[0].ts == NOW - 0.5
    # the real dumps: rank 3 never enqueued collective 13 of the default group, the others did
    last = {r.rank: max(e.seq for e in r.entries if not e.extra.get("p2p")) for r in recs}
    assert last == {0: 13, 1: 13, 2: 13, 3: 12}
    assert watcher.poll(NOW + 10.0) == []  # published once


def test_a_rewritten_dump_is_published_again(fr):
    watcher = FlightWatcher(fr, processes=lambda: ranks_of(fr))
    write_dump(fr, "nccl_trace_rank_2", 2, NOW - 10)
    assert len(watcher.poll(NOW)) == 1
    write_dump(fr, "nccl_trace_rank_2", 3, NOW + 50)  # the next hang overwrites it
    assert [r["rank"] for r in watcher.poll(NOW + 60)] == [2]


def test_the_writer_is_looked_up_when_the_dump_appears_and_remembered_after_it_exits(fr):
    alive = ranks_of(fr, job="torn-down")
    watcher = FlightWatcher(fr, processes=lambda: alive)
    write_dump(fr, "nccl_trace_rank_1", 1, NOW)
    assert watcher.poll(NOW + 0.1) == []
    alive = []  # the job is torn down seconds after its dumps
    assert [(r["job"], r["rank"]) for r in watcher.poll(NOW + 5)] == [("torn-down", 1)]


def test_without_the_prefix_the_rank_number_ending_the_name_and_the_one_local_job_say_whose_it_is(fr):
    procs = [RankProcess(pid=7, job="j2", rank=3)]  # no TORCH_FR_DUMP_TEMP_FILE in its environment
    watcher = FlightWatcher(fr, processes=lambda: procs)
    write_dump(fr, "rank3.pkl", 3, NOW - 10)
    write_dump(fr, "rank2.pkl", 2, NOW - 10)  # no local rank 2: nobody's
    assert [(r["job"], r["rank"]) for r in watcher.poll(NOW)] == [("j2", 3)]


def test_the_sweep_asked_for_the_job_names_the_snapshot(fr):
    watcher = FlightWatcher(fr, processes=lambda: ranks_of(fr),
                            sweep_of=lambda job, now: "a-77" if job == "j1" else None)
    write_dump(fr, "nccl_trace_rank_0", 0, NOW - 10)
    assert [r["snapshot"] for r in watcher.poll(NOW)] == ["a-77"]


def test_a_file_that_is_no_dump_is_skipped_and_the_watcher_goes_on(fr, caplog):
    watcher = FlightWatcher(fr, processes=lambda: ranks_of(fr))
    (fr / "nccl_trace_rank_0").write_bytes(b"\x80\x04not a pickle at all")
    os.utime(fr / "nccl_trace_rank_0", (NOW - 10, NOW - 10))
    write_dump(fr, "nccl_trace_rank_1", 1, NOW - 10)
    assert [r["rank"] for r in watcher.poll(NOW)] == [1]
    assert "nccl_trace_rank_0" in caplog.text and "not read" in caplog.text


def test_from_start_publishes_the_dumps_already_there_and_a_missing_directory_is_waited_for(tmp_path):
    fr = tmp_path / "later"
    watcher = FlightWatcher(fr, processes=lambda: ranks_of(fr), from_start=True)
    assert watcher.poll(NOW) == []
    fr.mkdir()
    write_dump(fr, "nccl_trace_rank_0", 0, NOW - 3600)
    assert FlightWatcher(fr, processes=lambda: ranks_of(fr), from_start=True).poll(NOW) != []
    assert [r["rank"] for r in watcher.poll(NOW)] == [0]
