"""Every incident class end to end: simulate a job with one injected fault, replay it, check the verdict.

Each scenario is small (64-128 ranks, a few minutes of event time) so the whole
file runs in well under a minute; `gangwatch eval` runs the larger standard suite.
"""

from __future__ import annotations

import orjson
import pytest
from gangwatch.producers.simulate import Fault, Noise, Scenario, write
from gangwatch.streams import replay

from gangwatch.evaluation.scoring import EVICTING

pytestmark = pytest.mark.fault


def run(tmp_path, sc: Scenario):
    stream, truth = write(sc, tmp_path)
    out = tmp_path / "out"
    replay.run([stream], out, None, progress=None)
    read = lambda name: [orjson.loads(x) for x in (out / name).read_bytes().splitlines()]  # noqa: E731
    incidents: dict[str, dict] = {}
    for inc in read("incidents.jsonl"):
        incidents[inc["id"]] = inc  # the latest version of each
    return read("findings.jsonl"), read("actions.jsonl"), list(incidents.values()), orjson.loads(truth.read_bytes())


def evicted(actions):
    return sorted({n for a in actions if a["type"] in EVICTING for n in a["nodes"]})


CASES = {
    # name: (fault, incident class, expected action types (subset), pp, dp)
    "xid79": (Fault("xid79", 80.0, node="n003", params={"gpu": 2}), "fail_stop", {"replace"}, 2, 4),
    "silent_node_loss": (Fault("node_loss", 80.0, node="n005"), "fail_stop", {"replace"}, 2, 4),
    "thermal_straggler": (Fault("thermal_straggler", 40.0, rank=21, magnitude=0.15), "fail_slow", {"replace"}, 2, 4),
    "intermittent_straggler": (Fault("intermittent_straggler", 40.0, rank=50, magnitude=0.3, params={"prob": 0.3}),
                               "fail_slow", {"replace", "degrade"}, 2, 4),
    "dataloader_hang": (Fault("dataloader_hang", 80.0, rank=29), "hang", {"collect_stacks", "replace"}, 4, 4),
    "sdc": (Fault("sdc", 60.0, rank=42), "sdc", {"rollback", "isolate", "dual_run"}, 2, 4),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_fault_gets_the_right_class_culprit_and_actions(tmp_path, name):
    fault, cls, action_types, pp, dp = CASES[name]
    sc = Scenario(name, seed=11, tp=8, pp=pp, dp=dp, duration_s=240.0, faults=(fault,))
    findings, actions, incidents, truth = run(tmp_path, sc)
    [culprit] = truth["faults"][0]["nodes"]
    onset = truth["faults"][0]["onset_ts"]
    [inc] = [i for i in incidents if i["detected_ts"] >= onset - 1.0]
    assert inc["class"] == cls
    assert culprit in inc["culprit_nodes"]
    assert inc["detected_ts"] - onset < 60.0  # the detect budget
    assert action_types & {a["type"] for a in actions}
    assert set(evicted(actions)) <= {culprit}  # nobody innocent
    if cls == "sdc":
        assert {"rollback", "isolate", "dual_run"} <= {a["type"] for a in actions}


def test_planned_stop_is_planned_and_evicts_nobody(tmp_path):
    sc = Scenario("planned", seed=12, tp=8, pp=2, dp=4, duration_s=300.0, faults=(
        Fault("planned_maintenance", 150.0, node="n002", params={"restart_after_s": 60.0}),))
    findings, actions, incidents, _ = run(tmp_path, sc)
    assert incidents and all(i["class"] == "planned" and i["planned"] for i in incidents)
    assert evicted(actions) == []


def test_healthy_hour_with_benign_noise_evicts_nobody(tmp_path):
    noise = Noise(jitter=0.015, ckpt_every_s=300.0, ckpt_s=8.0, loss_spike_prob=0.005, ecc_gpu_frac=0.05,
                  nic_flaps=2)
    sc = Scenario("healthy_hour", seed=13, tp=8, pp=2, dp=8, duration_s=3600.0, noise=noise, batch=True)
    findings, actions, incidents, truth = run(tmp_path, sc)
    assert truth["benign"]["checkpoints"] and truth["benign"]["nic_flaps"]  # the noise really happened
    assert actions == [] and incidents == []
    assert {f["type"] for f in findings} <= {"job_slowdown", "hw_fault"}  # checkpoints, flaps: no culprit
    assert all(f["evidence"]["severity"] == "precursor" for f in findings if f["type"] == "hw_fault")


def test_an_uneven_fleet_is_reported_and_nobody_is_evicted(tmp_path):
    """Ranks 4 % to 15 % slower than their stage from the first step: a difference, not a fault."""
    slower = {5: 0.04, 21: 0.08, 44: 0.15}
    sc = Scenario("uneven", seed=14, tp=8, pp=2, dp=4, duration_s=400.0,
                  faults=tuple(Fault("heterogeneous", 0.0, rank=r, magnitude=m) for r, m in slower.items()))
    findings, actions, incidents, _ = run(tmp_path, sc)
    assert actions == [] and incidents == []
    het = [f for f in findings if f["type"] == "heterogeneous"]
    assert sorted(f["rank"] for f in het) == sorted(slower)
    assert not [f for f in findings if f["type"] == "fail_slow"]


def test_a_hang_with_two_culprits_names_and_replaces_both(tmp_path):
    sc = Scenario("two_culprits", seed=15, tp=8, pp=4, dp=4, duration_s=220.0, peer_states=False,
                  faults=(Fault("dataloader_hang", 100.0, rank=45), Fault("pp_deadlock", 100.0, rank=74)))
    findings, actions, incidents, truth = run(tmp_path, sc)
    culprits = sorted(n for f in truth["faults"] for n in f["nodes"])
    [inc] = [i for i in incidents if i["class"] == "hang"]
    assert inc["culprit_nodes"] == culprits
    assert evicted(actions) == culprits
    assert [a["type"] for a in actions] == ["collect_stacks", "replace"]


def test_a_large_steady_straggler_from_the_first_step_is_decided_on_what_it_costs(tmp_path):
    """The shape of ByteDance's public straggler trace: one worker computes ~2.35x its stage peers from the start
    (more than half the job's time lost). Heterogeneous since the start, yet far too costly to live with: an
    incident, replaced (a spare exists), the cost in the reason; the other ranks untouched."""
    sc = Scenario("steady_straggler", seed=16, tp=8, pp=2, dp=4, duration_s=400.0,
                  faults=(Fault("heterogeneous", 0.0, rank=21, magnitude=1.35),))
    findings, actions, incidents, _ = run(tmp_path, sc)
    [het] = [f for f in findings if f["type"] == "heterogeneous"]
    assert het["rank"] == 21 and het["evidence"]["cost_frac"] - het["evidence"]["floor_frac"] >= 0.10
    [a] = [a for a in actions if a["type"] in EVICTING]
    assert (a["type"], a["nodes"]) == ("replace", [het["node"]]) and "longer" in a["reason"]
    assert [i["class"] for i in incidents] == ["fail_slow"]
