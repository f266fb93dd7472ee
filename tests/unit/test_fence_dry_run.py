"""A dry run of the fencing adapters needs no cluster (issue 36): `slurm apply --from FILE` on a host without
`scontrol`, `kubernetes apply --from FILE` without a kubeconfig, say what a real run would do and exit 0; the fleet
breaker, which needs the cluster's node count, is said not checked. A real run (`--act`) still refuses to go on."""

from __future__ import annotations

import pytest
from gangwatch.schemas import Action, encode

from gangwatch.cli import main
from tests.helpers import need_module

pytestmark = pytest.mark.unit


@pytest.fixture
def actions(tmp_path, monkeypatch):
    """Two fencing actions and a rollback in a file; PATH holds no scontrol, no cluster is configured."""
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    for var in ("GANGWATCH_SLURM_FLEET_NODES", "GANGWATCH_KUBERNETES_FLEET_NODES", "GANGWATCH_SCONTROL"):
        monkeypatch.delenv(var, raising=False)
    path = tmp_path / "actions.jsonl"
    recs = [Action(id="a-1", ts=1_800_000_000.0, job="train-7", incident="i-1", type="replace", nodes=["n005"],
                   reason="Xid 79"),
            Action(id="a-2", ts=1_800_000_060.0, job="train-7", incident="i-2", type="rollback", nodes=[],
                   reason="sdc"),
            Action(id="a-3", ts=1_800_000_120.0, job="train-8", incident="i-3", type="isolate",
                   nodes=["n007", "n008"], reason="fail-slow")]
    path.write_bytes(b"".join(encode(r) + b"\n" for r in recs))
    return path


def test_slurm_dry_run_without_scontrol_says_what_it_would_drain(actions, tmp_path, capsys, caplog):
    state = tmp_path / "slurm.jsonl"
    assert main(["slurm", "apply", "--from", str(actions), "--state", str(state)]) == 0
    cap = capsys.readouterr()
    for node in ("n005", "n007", "n008"):
        assert f"{node}: would drain it unless" in cap.out and f"scontrol update NodeName={node} State=DRAIN" in cap.out
    assert "No such file or directory: 'scontrol'" in cap.out and "a real run reads it first" in cap.out
    assert "rollback: nothing for slurm to do" in cap.out
    assert "the fleet breaker was not checked" in cap.out and "a real run counts them first" in cap.out
    warned = [r for r in caplog.records if "the fleet breaker was not checked" in r.getMessage()]
    assert len(warned) == 1  # said once, not per action
    assert not [r for r in caplog.records if r.levelname == "ERROR"] and "ERROR" not in cap.out
    assert not state.exists()  # a dry run writes nothing


def test_slurm_dry_run_with_a_fleet_size_checks_the_breaker_without_scontrol(actions, tmp_path, capsys):
    rc = main(["slurm", "apply", "--from", str(actions), "--state", str(tmp_path / "s.jsonl"),
               "--fleet-nodes", "20"])  # limit max(2, 5 % of 20) = 2: the third node trips it (for this run only)
    out = capsys.readouterr().out
    assert rc == 1 and "refused by the fleet breaker" in out and "not checked" not in out
    assert not (tmp_path / "s.breaker.json").exists()


def test_slurm_real_run_without_scontrol_still_fails(actions, tmp_path, capsys):
    rc = main(["slurm", "apply", "--from", str(actions), "--state", str(tmp_path / "s.jsonl"), "--act",
               "--fleet-nodes", "100", "--retries", "0"])
    assert rc == 5 and "could not read the node" in capsys.readouterr().out


def test_slurm_resume_dry_run_without_scontrol(actions, tmp_path, capsys):
    assert main(["slurm", "resume", "n005", "--repaired", "RMA 1", "--state", str(tmp_path / "s.jsonl")]) == 0
    out = capsys.readouterr().out
    assert "n005: would resume it if gangwatch drained it" in out and "dry run: nothing was changed" in out


def test_kubernetes_dry_run_without_a_cluster(actions, tmp_path, capsys):
    need_module("kubernetes", "the Kubernetes adapter (the `kubernetes` extra)")
    state = tmp_path / "k.jsonl"
    assert main(["kubernetes", "apply", "--from", str(actions), "--state", str(state)]) == 0
    out = capsys.readouterr().out
    assert "n007: would cordon it and taint it gangwatch.io/fault=isolate:NoSchedule" in out
    assert "no Kubernetes API to talk to" in out and "the fleet breaker was not checked" in out
    assert not state.exists()
    # a real run needs the cluster: one line, before anything is read
    assert main(["kubernetes", "apply", "--from", str(actions), "--state", str(state), "--act"]) == 2
    cap = capsys.readouterr()
    assert "error: no Kubernetes API to talk to" in cap.err and cap.out == ""
