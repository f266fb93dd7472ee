"""Temporary folders are removed by the process that made them, and only those (issue 36): the worker's own Faust
data directory when none was given, a drill's work folder after a drill that passed."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from gangwatch.streams import worker
from gangwatch.streams.worker_settings import WorkerSettings

from gangwatch.cli import drill as drill_cli
from gangwatch.cli import main

pytestmark = pytest.mark.unit


@pytest.fixture
def tmpdir_here(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_the_worker_removes_the_data_directory_it_made_and_keeps_one_given(tmpdir_here, monkeypatch):
    seen = []

    def fake_run(s, sinks, loglevel):
        seen.append(Path(s.datadir))
        assert Path(s.datadir).is_dir() and Path(s.datadir).parent == tmpdir_here
        raise SystemExit(0)  # how Faust's worker ends

    monkeypatch.setattr(worker, "_run_app", fake_run)
    monkeypatch.setattr(worker.threading, "Thread", lambda **kw: type("T", (), {"start": lambda self: None})())
    with pytest.raises(SystemExit):
        worker.run(WorkerSettings(), create=False)
    assert seen and not seen[0].exists()
    given = tmpdir_here / "mine"
    given.mkdir()
    (given / "keep").write_text("x")
    with pytest.raises(SystemExit):
        worker.run(WorkerSettings(datadir=str(given)), create=False)
    assert seen[1] == given and (given / "keep").exists()


@pytest.mark.parametrize("passed", [True, False])
def test_a_drill_removes_its_own_folder_only_when_it_passed(tmpdir_here, monkeypatch, capsys, passed):
    made = []

    def fake_drill(args, spec, live, budgets, workdir):
        workdir.mkdir(parents=True, exist_ok=True)  # as drill_live.run does
        (workdir / "worker.log").write_text("log")
        made.append(workdir)
        return passed

    monkeypatch.setattr(drill_cli, "_drill", fake_drill)
    monkeypatch.setattr("gangwatch.cli.services.wait_for_kafka", lambda *a: None)
    assert main(["drill", "--faults", "1", "--seed", "3"]) == (0 if passed else 8)
    assert made[0].parent == tmpdir_here and made[0].exists() is not passed
    assert ("kept in" in capsys.readouterr().err) is not passed
    given = tmpdir_here / "given"
    main(["drill", "--faults", "1", "--seed", "3", "--workdir", str(given)])
    assert (given / "worker.log").exists()  # a folder given is never removed
