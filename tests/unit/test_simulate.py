"""The telemetry simulator: determinism, contract validity, synchronous physics, fault evidence, ground truth."""

from __future__ import annotations

import dataclasses
import gzip
import json
import re
from collections import Counter, defaultdict
from functools import cache

import numpy as np
import orjson
import pytest
from gangwatch.producers.simulate import (
    BENIGN_KINDS,
    FAULT_CLASS,
    FAULT_KINDS,
    PRECURSOR_KINDS,
    Fault,
    Noise,
    Scenario,
    generate,
    messages,
    simulate,
    standard_suite,
    truth,
    write,
)
from gangwatch.schemas import DecodeError, decode

pytestmark = pytest.mark.unit

# 64 ranks: tp 8 x pp 2 x dp 4, nodes n000..n007; rank = node * 8 + gpu
SMALL = dict(tp=8, pp=2, dp=4, duration_s=200.0)


def sc_(name: str, *faults: Fault, seed: int = 7, **kw) -> Scenario:
    return Scenario(name, seed, **{**SMALL, **kw}, faults=faults)


@cache
def recs_of(sc: Scenario) -> tuple:
    return tuple(generate(sc))


def by_kind(recs, kind):
    return [r for r in recs if r["kind"] == kind]


HEALTHY = sc_("healthy", duration_s=300.0)
THERMAL = sc_("thermal", Fault("thermal_straggler", 40.0, rank=21, magnitude=0.10, params={"ramp_s": 20.0}))
XID = sc_("xid", Fault("xid79", 100.0, node="n003", params={"gpu": 2}))
NODE_LOSS = sc_("loss", Fault("node_loss", 100.0, node="n005"))
HANG = sc_("hang", Fault("dataloader_hang", 100.0, rank=13))
DEADLOCK = sc_("deadlock", Fault("pp_deadlock", 100.0, rank=35))
SDC = sc_("sdc", Fault("sdc", 60.0, rank=42, params={"anomaly_after_s": 60.0}))
NIC = sc_("nic", Fault("nic_degradation", 60.0, node="n002", magnitude=0.3), duration_s=240.0)
INTERMITTENT = sc_("intermittent", Fault("intermittent_straggler", 30.0, rank=50, magnitude=0.2))
PLANNED = sc_("planned", Fault("planned_maintenance", 120.0, node="n006", params={"restart_after_s": 30.0}),
              duration_s=260.0, batch=True)
ALL = [HEALTHY, THERMAL, XID, NODE_LOSS, HANG, DEADLOCK, SDC, NIC, INTERMITTENT, PLANNED]
# odd shapes: no tensor / pipeline parallelism; a node spanning several stages and replicas
ODD = [
    Scenario("flat_dp", 3, tp=1, pp=1, dp=16, duration_s=120.0, faults=[Fault("dataloader_hang", 50.0, rank=9)]),
    Scenario("tp2", 4, tp=2, pp=4, dp=2, duration_s=120.0, faults=[Fault("node_loss", 50.0, node="n001")]),
    Scenario("tp2_pp", 5, tp=2, pp=4, dp=2, duration_s=120.0, faults=[Fault("pp_deadlock", 50.0, rank=3)],
             abort_on_timeout=True, noise=Noise(enabled=False)),
]


# --- determinism ---------------------------------------------------------------------------------


def test_same_seed_same_bytes_and_different_seed_differs(tmp_path):
    sc = sc_("det", Fault("xid79", 80.0, node="n001"), Fault("thermal_straggler", 30.0, rank=3), duration_s=160.0,
             batch=True)
    a = write(sc, tmp_path / "a")
    b = write(sc, tmp_path / "b")
    assert a[0].name == "det.jsonl.gz" and a[1].name == "det.truth.json"
    assert a[0].read_bytes() == b[0].read_bytes()
    assert a[1].read_bytes() == b[1].read_bytes()
    c = write(dataclasses.replace(sc, seed=8), tmp_path / "c")
    assert c[0].read_bytes() != a[0].read_bytes()
    assert list(generate(sc)) == list(generate(sc))


def test_written_file_is_jsonl_with_batches_and_matching_truth(tmp_path):
    stream, truth_path = write(PLANNED, tmp_path)
    lines = gzip.decompress(stream.read_bytes()).splitlines()
    msgs = [orjson.loads(x) for x in lines]
    assert msgs[0]["kind"] == "job"
    batches = [m for m in msgs if m["kind"] == "batch"]
    assert batches and all(m["v"] == 1 and m["items"] for m in batches)
    for m in batches:
        assert {i["kind"] for i in m["items"]} == {"step"}
        assert m["ts"] == max(i["ts"] for i in m["items"])
        assert len({i["rank"] // 8 for i in m["items"]}) == 1  # one node per batch
    assert not [m for m in msgs if m["kind"] == "step"]
    unpacked = sorted(i["ts"] for m in batches for i in m["items"])
    assert unpacked == sorted(r["ts"] for r in recs_of(PLANNED) if r["kind"] == "step")
    assert [m["ts"] for m in msgs] == sorted(m["ts"] for m in msgs)
    assert json.loads(truth_path.read_text()) == json.loads(json.dumps(truth(PLANNED)))


# --- contract ------------------------------------------------------------------------------------


@pytest.mark.parametrize("sc", ALL + ODD, ids=lambda s: s.name)
def test_every_record_decodes_in_time_order(sc):
    recs = recs_of(sc)
    assert recs[0]["kind"] == "job"
    prev = -1.0
    for rec in recs:
        out = decode(orjson.dumps(rec))
        assert len(out) == 1 and not isinstance(out[0], DecodeError), (out[0], rec)
        assert out[0].kind == rec["kind"]
        assert rec["ts"] >= prev
        prev = rec["ts"]
        assert sc.start_ts <= rec["ts"] < sc.end_ts


def test_batch_messages_decode():
    sc = sc_("batched", Fault("sdc", 30.0, rank=9), duration_s=60.0, batch=True)
    n = 0
    for msg in messages(sc):
        for rec in decode(orjson.dumps(msg)):
            assert not isinstance(rec, DecodeError), rec
            n += 1
    assert n == len(recs_of(sc))


def test_job_record_rank_mapping():
    job = recs_of(HEALTHY)[0]
    assert job["heartbeat_s"] == 5.0 and len(job["ranks"]) == 64
    for r in job["ranks"]:
        rank = r["rank"]
        assert r["node"] == f"n{rank // 8:03d}" and r["gpu"] == rank % 8
        assert (r["tp"], r["pp"], r["dp"]) == (rank % 8, rank // 8 % 2, rank // 16)


# --- physics -------------------------------------------------------------------------------------


def steps_table(recs):
    table = defaultdict(dict)
    for r in by_kind(recs, "step"):
        table[r["step"]][r["rank"]] = r
    return table


def test_synchronous_physics_and_straggler_signature():
    recs = recs_of(THERMAL)
    table = steps_table(recs)
    onset_done = THERMAL.start_ts + 40.0 + 20.0  # ramp complete
    ckpt = {c["step"] for c in truth(THERMAL)["benign"]["checkpoints"]}
    assert ckpt
    late = [s for s, rows in table.items() if min(r["ts"] for r in rows.values()) > onset_done + 2 and s not in ckpt]
    early = [s for s, rows in table.items() if 15 < s and max(r["ts"] for r in rows.values()) < THERMAL.start_ts + 40]
    assert len(late) > 50 and len(early) > 10
    for rows in table.values():
        assert len(rows) == 64
        step_s = {r["step_s"] for r in rows.values()}
        assert len(step_s) == 1  # synchronous: every rank reports the same step time
        ss = step_s.pop()
        for r in rows.values():
            total = r["compute_s"] + r["comm_wait_s"] + r["data_wait_s"]
            assert total == pytest.approx(ss, abs=5e-6)
            assert r["comm_wait_s"] > 0.1  # collective cost after the last arrival
        assert ss == pytest.approx(max(r["compute_s"] + r["data_wait_s"] for r in rows.values()) +
                                   min(r["comm_wait_s"] for r in rows.values()), abs=5e-6)
    stage0 = [k for k in range(64) if k // 8 % 2 == 0]  # rank 21: tp 5, pp 0, dp 1
    for s in late:  # against the peers of its pipeline stage: most compute, least waiting
        rows = table[s]
        assert max(stage0, key=lambda k: rows[k]["compute_s"]) == 21
        assert min(stage0, key=lambda k: rows[k]["comm_wait_s"]) == 21
    assert np.mean([max(table[s], key=lambda k: table[s][k]["compute_s"]) == 21 for s in late]) > 0.9
    # ~10% slower than its stage peers once throttled, about even before
    ratio_late = np.median([table[s][21]["compute_s"] / np.median([table[s][k]["compute_s"]
                            for k in range(64) if k // 8 % 2 == 0 and k != 21]) for s in late])
    ratio_early = np.median([table[s][21]["compute_s"] / np.median([table[s][k]["compute_s"]
                             for k in range(64) if k // 8 % 2 == 0 and k != 21]) for s in early])
    assert ratio_late == pytest.approx(1.10, abs=0.02) and ratio_early == pytest.approx(1.0, abs=0.02)


def test_pipeline_stages_have_different_baselines_and_warmup_is_slow():
    table = steps_table(recs_of(HEALTHY))
    stage_med = [np.median([r["compute_s"] for s in range(20, 80) for r in table[s].values()
                            if r["rank"] // 8 % 2 == p]) for p in (0, 1)]
    assert stage_med[1] > stage_med[0] * 1.02  # last stage (output layer, loss) computes more
    steady = np.median([table[s][0]["step_s"] for s in range(30, 100)])
    assert table[0][0]["step_s"] > 2.5 * steady  # warm-up
    assert 0.9 < steady < 1.2


def test_checkpoint_saves_slow_every_rank():
    t = truth(HEALTHY)
    ckpts = t["benign"]["checkpoints"]
    assert len(ckpts) == 2  # at 120 s and 240 s
    table = steps_table(recs_of(HEALTHY))
    steady = np.median([table[s][0]["step_s"] for s in range(30, 100)])
    for c in ckpts:
        rows = table[c["step"]].values()
        assert all(r["compute_s"] > steady + 4.0 for r in rows)  # everybody slow: nobody is guilty


def test_heartbeats_without_noise_are_exactly_periodic():
    recs = recs_of(sc_("quiet", noise=Noise.off(), duration_s=60.0))
    for rank in (0, 17, 63):
        ts = np.array([h["ts"] for h in by_kind(recs, "heartbeat") if h["rank"] == rank])
        assert np.allclose(np.diff(ts), 5.0, atol=2e-6) and 0 < ts[0] - recs[0]["ts"] <= 5.0


def test_slow_launch_spreads_first_heartbeats_and_the_first_step_waits_for_the_last_rank():
    sc = sc_("slow", duration_s=200.0, launch_s=120.0)
    recs = recs_of(sc)
    first = {}
    for h in by_kind(recs, "heartbeat"):
        first.setdefault(h["rank"], h["ts"] - sc.start_ts)
    up = np.array(sorted(first.values()))
    assert len(up) == 64 and up.min() < 20.0 and 100.0 < up.max() <= 125.0  # up within launch_s + a period
    first_step = min(r["ts"] for r in by_kind(recs, "step")) - sc.start_ts
    assert first_step > up.max() - 5.0 + sc.startup_s
    assert truth(sc)["launch_s"] == 120.0


def test_heartbeat_cadence():
    recs = recs_of(HEALTHY)
    per_rank = defaultdict(list)
    for r in by_kind(recs, "heartbeat"):
        per_rank[r["rank"]].append(r)
    assert sorted(per_rank) == list(range(64))
    gaps = []
    for hbs in per_rank.values():
        ts = np.array([h["ts"] for h in hbs])
        gaps += np.diff(ts).tolist()
        assert len(ts) == pytest.approx(300 / 5, abs=1)
        steps = [h.get("step", -1) for h in hbs]
        assert steps == sorted(steps) and steps[-1] > 200
    # a heartbeat thread is never early, a little late every time, and now and then held up by a pause
    gaps = np.array(gaps)
    assert gaps.min() >= 5.0 - 1e-6 and np.median(gaps) < 5.01
    assert 0 < (gaps > 5.1).sum() < 0.05 * len(gaps) and gaps.max() <= 5.0 + HEALTHY.noise.hb_pause_s + 0.1
    # the heartbeat's step is the rank's last completed step
    last_end = {}
    for r in by_kind(recs, "step"):
        last_end.setdefault(r["rank"], []).append((r["ts"], r["step"]))
    hb = per_rank[5][30]
    done = [s for ts, s in last_end[5] if ts <= hb["ts"] - 0.01]
    assert hb["step"] in (done[-1], done[-1] + 1)


def test_gpu_samples_cadence_and_fields():
    gpus = by_kind(recs_of(HEALTHY), "gpu")
    per = defaultdict(list)
    for g in gpus:
        per[(g["node"], g["gpu"])].append(g["ts"])
    assert len(per) == 64
    for ts in per.values():
        assert np.allclose(np.diff(ts), 10.0, atol=2e-6)
    active = [g for g in gpus if g["ts"] > HEALTHY.start_ts + 30 and g["util_pct"] > 90]
    assert len(active) > 0.7 * len([g for g in gpus if g["ts"] > HEALTHY.start_ts + 30])
    assert all(g["throttle"] == [] and g["ecc_dbe"] == 0 for g in gpus)
    ecc = truth(HEALTHY)["benign"]["ecc_sbe_gpus"]
    assert ecc
    node, gpu = ecc[0]
    series = [g["ecc_sbe"] for g in gpus if (g["node"], g["gpu"]) == (node, gpu)]
    assert series == sorted(series) and series[-1] > series[0]  # correctable ECC ticks up


def test_benign_nic_flap_recovers():
    hw = by_kind(recs_of(HEALTHY), "hw")
    assert [h["message"].rsplit(": ", 1)[1] for h in hw] == ["Link down", "Link up"]
    assert hw[0]["node"] == hw[1]["node"] and hw[0]["source"] == "nic"
    assert 0 < hw[1]["ts"] - hw[0]["ts"] < 10


# --- fail-stop -----------------------------------------------------------------------------------


def test_node_loss_goes_silent_and_job_stalls():
    recs = recs_of(NODE_LOSS)
    t_f = NODE_LOSS.start_ts + 100.0
    dead = set(range(40, 48))  # n005
    after = [r for r in recs if r["ts"] >= t_f]
    assert not [r for r in after if r.get("rank") in dead and r["kind"] in ("heartbeat", "step", "stack", "flight")]
    assert not [r for r in after if r.get("node") == "n005"]
    assert not [r for r in recs if r["kind"] == "hw" and r["node"] == "n005"]
    assert not [r for r in after if r["kind"] == "step" and r["ts"] > t_f + 2]  # no more progress
    live_hb = {r["rank"] for r in after if r["kind"] == "heartbeat" and r["ts"] > NODE_LOSS.end_ts - 10}
    assert live_hb == set(range(64)) - dead  # the living keep beating
    stuck = {r["step"] for r in after if r["kind"] == "heartbeat" and r["ts"] > t_f + 10}
    assert len(stuck) == 1
    tos = [r for r in recs if r["kind"] == "framework" and r["type"] == "nccl_timeout"]
    assert len(tos) > 40
    assert all(t_f + 60 <= r["ts"] < t_f + 66 for r in tos)
    assert {r["pg"] for r in tos} <= {"dp", "tp", "pp"} and not dead & {r["rank"] for r in tos}
    assert len({r["peer"] for r in tos}) > 5  # naming many (mostly innocent) peers


def test_xid79_event_and_dead_gpu():
    recs = recs_of(XID)
    t_f = XID.start_ts + 100.0
    xids = [r for r in recs if r["kind"] == "hw" and r["source"] == "xid"]
    assert len(xids) == 1
    x = xids[0]
    assert (x["node"], x["gpu"], x["code"], x["ts"]) == ("n003", 2, 79, t_f)
    assert re.fullmatch(r"NVRM: Xid \(PCI:0000:[0-9a-f]{2}:00\): 79, pid=\d+, name=python, "
                        r"GPU has fallen off the bus\.", x["message"])
    culprit = 3 * 8 + 2
    assert [r["type"] for r in recs if r["kind"] == "framework" and r["rank"] == culprit] == ["exception"]
    assert not [r for r in recs if r.get("rank") == culprit and r["kind"] == "heartbeat" and r["ts"] > t_f + 3]
    assert not [r for r in recs if r["kind"] == "gpu" and (r["node"], r["gpu"]) == ("n003", 2) and r["ts"] >= t_f]
    assert [r for r in recs if r["kind"] == "gpu" and (r["node"], r["gpu"]) == ("n003", 3) and r["ts"] >= t_f + 20]
    mates = {r["rank"] for r in recs if r["kind"] == "heartbeat" and r["ts"] > XID.end_ts - 10}
    assert mates == set(range(64)) - {culprit}


# --- hangs ---------------------------------------------------------------------------------------


def sweep(recs):
    stacks = by_kind(recs, "stack")
    flights = by_kind(recs, "flight")
    assert stacks and len({s["snapshot"] for s in stacks}) == 1
    assert {f["snapshot"] for f in flights} == {stacks[0]["snapshot"]}
    return {s["rank"]: s for s in stacks}, {f["rank"]: f for f in flights}


def test_dataloader_hang_stack_sweep_and_flight_recorder():
    recs = recs_of(HANG)
    t_f = HANG.start_ts + 100.0
    stacks, flights = sweep(recs)
    assert sorted(stacks) == list(range(64)) == sorted(flights)  # everyone is alive
    assert all(t_f + 15 < s["ts"] < t_f + 30 for s in stacks.values())
    culprit = stacks[13]["dump"]
    assert "_get_data (torch/utils/data/dataloader.py:" in culprit and "recv" in culprit
    assert "all_reduce" not in culprit
    for rank, s in stacks.items():
        lines = s["dump"].splitlines()
        assert re.fullmatch(r'Thread 0x[0-9A-F]+ \((active|idle)\): "MainThread"', lines[3])
        assert all(x.startswith("    ") and re.fullmatch(r"    \S.* \(\S+:\d+\)", x) for x in lines[4:]
                   if not x.startswith("Thread"))
        if rank != 13:
            assert "all_reduce (torch/distributed/distributed_c10d.py:2501)" in s["dump"] or "_communicate" in s["dump"]
    sigs = Counter(s["dump"].split('"MainThread"\n')[1].split("Thread ")[0] for s in stacks.values())
    assert sigs.most_common()[-1][1] == 1  # the culprit's call path is unique
    # flight recorder: the culprit never enqueued the collective its tp peers started
    mine = {g["desc"]: g for g in flights[13]["groups"]}
    peer = {g["desc"]: g for g in flights[12]["groups"]}
    tp_c, tp_p = mine["TENSOR_MODEL_PARALLEL_GROUP"], peer["TENSOR_MODEL_PARALLEL_GROUP"]
    assert tp_c["pg"] == tp_p["pg"] and 13 in tp_p["ranks"]
    assert tp_p["last_started"] > tp_c["last_enqueued"] and tp_p["last_completed"] == tp_c["last_completed"]
    assert not [e for e in flights[13]["entries"] if e["state"] != "completed"]
    # other replicas wait in the gradient all_reduce the culprit's replica never enqueued
    dpg = {g["desc"]: g for g in flights[29]["groups"]}["DATA_PARALLEL_GROUP"]
    assert 13 in dpg["ranks"] and dpg["last_started"] > mine["DATA_PARALLEL_GROUP"]["last_enqueued"]
    # heartbeats continue from every rank, the culprit included; no progress
    late_hb = [r for r in recs if r["kind"] == "heartbeat" and r["ts"] > t_f + 60]
    assert {r["rank"] for r in late_hb} == set(range(64)) and len({r["step"] for r in late_hb}) == 1
    # the culprit's GPU idles while the others spin in NCCL
    late_gpu = [g for g in by_kind(recs, "gpu") if g["ts"] > t_f + 5]
    assert all(g["util_pct"] == 0 for g in late_gpu if (g["node"], g["gpu"]) == ("n001", 5))
    assert all(g["util_pct"] == 100 for g in late_gpu if (g["node"], g["gpu"]) != ("n001", 5))
    tos = [r for r in recs if r["kind"] == "framework" and r["type"] == "nccl_timeout"]
    assert tos and 13 not in {r["rank"] for r in tos}


def test_pp_deadlock_culprit_in_a_different_collective():
    recs = recs_of(DEADLOCK)
    stacks, flights = sweep(recs)
    culprit = stacks[35]["dump"]
    assert "broadcast (torch/distributed/distributed_c10d.py" in culprit
    assert sum("broadcast (" in s["dump"] for s in stacks.values()) == 1
    # rank 35: tp 3, pp 0, dp 2 -> its pipeline peer 43 waits to receive from it (point-to-point, stage 0)
    assert "recv_forward" in stacks[43]["dump"]
    e_c = [e for e in flights[35]["entries"] if e["state"] == "started"]
    e_p = [e for e in flights[43]["entries"] if e["state"] == "started"]
    assert len(e_c) == 1 and len(e_p) == 1
    assert e_c[0]["pg"] == e_p[0]["pg"] and (e_c[0]["op"], e_c[0].get("p2p")) == ("broadcast", None)
    assert (e_p[0]["op"], e_p[0]["p2p"], e_p[0]["peer"]) == ("recv", True, 0)
    pp_group = {g["desc"]: g for g in flights[35]["groups"]}["PIPELINE_MODEL_PARALLEL_GROUP"]
    assert pp_group["last_enqueued"] == 0 == e_c[0]["seq"]  # its first collective there: nobody else calls it
    assert {g["desc"]: g for g in flights[43]["groups"]}["PIPELINE_MODEL_PARALLEL_GROUP"]["last_enqueued"] == -1


def test_flat_peer_states_put_everyone_in_the_gradient_allreduce():
    sc = sc_("flat", Fault("dataloader_hang", 80.0, rank=13), duration_s=120.0, peer_states=False)
    stacks, _ = sweep(recs_of(sc))
    others = {s["dump"].split('"MainThread"\n')[1].split("Thread ")[0] for r, s in stacks.items() if r != 13}
    assert len(others) == 1 and "all_reduce" in others.pop()


def test_abort_on_timeout_silences_everyone():
    sc = sc_("abort", Fault("node_loss", 60.0, node="n001"), duration_s=180.0, abort_on_timeout=True)
    recs = recs_of(sc)
    t_out = sc.start_ts + 60.0 + 60.0
    assert not [r for r in recs if r["kind"] == "heartbeat" and r["ts"] > t_out + 10]
    assert len([r for r in recs if r["kind"] == "framework" and r["type"] == "exit"]) == 56


# --- fail-slow and SDC ---------------------------------------------------------------------------


def test_thermal_gpu_samples_show_throttling():
    gpus = [g for g in by_kind(recs_of(THERMAL), "gpu") if (g["node"], g["gpu"]) == ("n002", 5)]
    hot = [g for g in gpus if g["ts"] > THERMAL.start_ts + 40 + 20]
    cool = [g for g in gpus if g["ts"] < THERMAL.start_ts + 40]
    assert hot and cool
    assert all(g["temp_c"] >= 88 and "hw_thermal" in g["throttle"] and g["sm_clock_mhz"] <= 1815 for g in hot)
    assert all(g["temp_c"] < 85 and g["throttle"] == [] for g in cool)
    bmc = [h for h in by_kind(recs_of(THERMAL), "hw") if h["source"] == "bmc"]
    assert len(bmc) == 1 and bmc[0]["node"] == "n002" and bmc[0]["gpu"] == 5


def test_intermittent_straggler_is_slow_in_some_steps():
    table = steps_table(recs_of(INTERMITTENT))
    after = [s for s, rows in table.items() if rows[50]["ts"] > INTERMITTENT.start_ts + 32]
    slowest = [max(table[s], key=lambda k: table[s][k]["compute_s"]) == 50 for s in after]
    share = sum(slowest) / len(slowest)
    assert 0.2 < share < 0.45


def test_nic_degradation_slows_comm_and_logs():
    recs = recs_of(NIC)
    table = steps_table(recs)
    t_f = NIC.start_ts + 60.0
    before = [s for s, rows in table.items() if 20 < s and rows[0]["ts"] < t_f]
    after = [s for s, rows in table.items() if rows[0]["ts"] > t_f + 2]
    cw = lambda steps: np.median([np.median([r["comm_wait_s"] for r in table[s].values()]) for s in steps])  # noqa
    assert cw(after) > cw(before) * 1.2
    node = range(16, 24)
    cs = lambda steps, ranks: np.median([table[s][k]["compute_s"] for s in steps for k in ranks])  # noqa
    assert cs(after, node) > cs(after, range(0, 8)) * 1.03
    hw = [h for h in by_kind(recs, "hw") if h["source"] == "nic" and h["node"] == "n002"]
    assert hw and hw[0]["ts"] == t_f and len(hw) >= 5


def test_sdc_digest_minority():
    recs = recs_of(SDC)
    t = truth(SDC)
    onset = t["faults"][0]["onset_step"]
    table = steps_table(recs)
    assert 0 < onset < max(table)
    for s, rows in table.items():
        shards = defaultdict(list)
        for r in rows.values():
            shards[(r["rank"] % 8, r["rank"] // 8 % 2)].append((r["replica_digest"], r["rank"]))
        for key, members in shards.items():
            counts = Counter(d for d, _ in members)
            if s >= onset and key == (42 % 8, 42 // 8 % 2):
                assert len(counts) == 2 and min(counts.values()) == 1
                odd = next(rk for d, rk in members if counts[d] == 1)
                assert odd == 42
            else:
                assert len(counts) == 1
    digests = {table[s][0]["replica_digest"] for s in table}
    assert len(digests) == len(table)  # changes every step
    # corruption surfaces later in loss / grad-norm (job-wide)
    g = np.array([table[s][0]["grad_norm"] for s in sorted(table)])
    spike = int(np.argmax(g))
    assert g[spike] > 10 * np.median(g) and table[sorted(table)[spike]][0]["ts"] > SDC.start_ts + 120


def test_loss_decreases_slowly():
    table = steps_table(recs_of(HEALTHY))
    s = sorted(table)
    early = np.mean([table[k][0]["loss"] for k in s[20:40]])
    late = np.mean([table[k][0]["loss"] for k in s[-20:]])
    assert late < early and len({table[s[50]][r]["loss"] for r in range(64)}) == 1


# --- planned -------------------------------------------------------------------------------------


def test_planned_maintenance_ops_stop_and_restart():
    recs = recs_of(PLANNED)
    t_f = PLANNED.start_ts + 120.0
    ops = by_kind(recs, "ops")
    assert len(ops) == 1 and ops[0]["planned"] is True and ops[0]["node"] == "n006" and ops[0]["ts"] < t_f
    jobs = by_kind(recs, "job")
    assert len(jobs) == 2
    nodes = lambda j: {r["node"] for r in j["ranks"]}  # noqa
    assert nodes(jobs[0]) - nodes(jobs[1]) == {"n006"} and nodes(jobs[1]) - nodes(jobs[0]) == {"n008"}
    exits = [r for r in by_kind(recs, "framework") if r["type"] == "exit"]
    assert len(exits) == 64 and all(r["ts"] > t_f for r in exits)
    t = truth(PLANNED)
    f = t["faults"][0]
    assert f["class"] == "planned" and f["planned"] and f["replacement"] == "n008"
    steps = sorted({r["step"] for r in by_kind(recs, "step")})
    assert steps == list(range(steps[0], steps[-1] + 1))  # resumed from the checkpointed step
    gap = [r["ts"] for r in recs if r["kind"] == "heartbeat" and f["stop_ts"] + 3 < r["ts"] < f["restart_ts"]]
    assert not gap
    assert not [r for r in by_kind(recs, "gpu") if r["node"] == "n006" and r["ts"] > f["stop_ts"] + 3]
    assert [r for r in by_kind(recs, "gpu") if r["node"] == "n008"]
    assert not by_kind(recs, "stack") and not [r for r in by_kind(recs, "framework") if r["type"] != "exit"]


# --- ground truth --------------------------------------------------------------------------------


def test_truth_content():
    assert truth(HEALTHY)["faults"] == [] and truth(HEALTHY)["healthy"] is True
    for sc in ALL[1:]:
        t = truth(sc)
        assert t["healthy"] is False and len(t["faults"]) == 1
        f, inj = t["faults"][0], sc.faults[0]
        assert f["kind"] == inj.kind and f["class"] == FAULT_CLASS[inj.kind]
        assert f["onset_ts"] == sc.start_ts + inj.at_s
        if inj.node:
            assert f["nodes"] == [inj.node]
        if inj.rank is not None:
            assert f["ranks"] == [inj.rank] and f["nodes"] == [f"n{inj.rank // 8:03d}"]
        json.dumps(t)
    t = truth(NODE_LOSS)
    assert t["faults"][0]["ranks"] == list(range(40, 48)) and t["stall"]["step"] == t["faults"][0]["onset_step"]
    assert t["last_step"] == t["stall"]["step"] - 1
    assert truth(XID)["faults"][0]["gpus"] == [["n003", 2]]
    assert {FAULT_CLASS[k] for k in FAULT_KINDS} == {"fail_stop", "fail_slow", "hang", "sdc", "planned", None}
    assert {k for k in FAULT_KINDS if FAULT_CLASS[k] is None} == PRECURSOR_KINDS | BENIGN_KINDS  # no incident


def test_validation_errors():
    with pytest.raises(ValueError):
        Fault("meteor", 10.0, node="n001")
    with pytest.raises(ValueError):
        Fault("xid79", 10.0)
    with pytest.raises(ValueError):
        simulate(sc_("bad", Fault("xid79", 10.0, node="n099")))
    with pytest.raises(ValueError):
        simulate(sc_("bad", Fault("xid79", 10.0, node="n001", rank=3)))
    with pytest.raises(ValueError):
        simulate(sc_("bad", Fault("xid79", 50.0, node="n001"), Fault("sdc", 60.0, rank=3)))
    with pytest.raises(ValueError):
        Scenario("bad", 1, tp=3, pp=1, dp=1)


def test_noise_off_is_regular():
    sc = sc_("quiet", noise=Noise.off(), duration_s=60.0)
    table = steps_table(recs_of(sc))
    assert len({r["step_s"] for rows in table.values() for r in rows.values()}) == 1
    assert not by_kind(recs_of(sc), "hw")


# --- suite ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", ["ci", "full"])
def test_standard_suite_covers_every_kind(size):
    suite = standard_suite(size)
    assert len(suite) >= 20 and len({s.name for s in suite}) == len(suite)
    kinds = Counter(f.kind for s in suite for f in s.faults)
    # every kind that interrupts the job is scored; precursors open no incident, so there is nothing to score
    assert set(kinds) == set(FAULT_KINDS) - PRECURSOR_KINDS and all(n >= 2 for n in kinds.values())
    assert sum(1 for s in suite if not s.faults) >= 3
    ranks = [s.n_ranks for s in suite]
    if size == "full":
        assert min(ranks) >= 128 and max(ranks) == 2048
        assert any(s.duration_s >= 3600 and not s.faults for s in suite)
    else:
        assert max(ranks) <= 512
    for s in suite:
        plan = simulate(s)  # physics only: every scenario resolves and runs
        t = truth(s)
        for f in t["faults"]:
            if f["kind"] in ("sdc",) or not f["stall"]:
                assert f["onset_step"] is not None, (s.name, f)
        assert plan.segments[0].steps.size > 50


# --- uneven fleets, switches, hangs with several culprits --------------------------------------------


def test_a_heterogeneous_rank_is_steadily_slower_from_its_first_step_and_nothing_else_happens():
    sc = sc_("het", Fault("heterogeneous", 0.0, rank=21, magnitude=0.08), duration_s=120.0)
    plan = simulate(sc)
    seg = plan.segments[0]
    stage = plan.topo.pp == plan.topo.pp[21]
    ratio = seg.compute[:, 21] / np.median(seg.compute[:, stage], axis=1)
    assert np.median(ratio[:5]) == pytest.approx(1.08, abs=0.02) and np.median(ratio) == pytest.approx(1.08, abs=0.01)
    t = truth(sc)
    assert not t["healthy"] and t["faults"][0]["class"] is None and t["stall"] is None
    recs = recs_of(sc)  # its hardware says nothing: nothing is broken
    assert not [r for r in by_kind(recs, "hw") if r["node"] == "n002"]
    assert not [g for g in by_kind(recs, "gpu") if (g["node"], g["gpu"]) == ("n002", 5) and g["throttle"]]


def test_the_job_record_names_each_ranks_switch():
    sc = sc_("sw", duration_s=30.0, nodes_per_switch=2)
    [job] = by_kind(recs_of(sc), "job")
    assert {(r["node"], r["switch"]) for r in job["ranks"]} >= {("n000", "sw00"), ("n001", "sw00"), ("n002", "sw01")}
    assert "switch" not in by_kind(recs_of(sc_("nosw", duration_s=30.0)), "job")[0]["ranks"][0]


def test_two_hangs_at_once_are_one_stall_with_two_culprits():
    sc = sc_("two", Fault("dataloader_hang", 80.0, rank=13), Fault("pp_deadlock", 80.0, rank=34),
             duration_s=140.0, peer_states=False)
    plan = simulate(sc)
    stop = plan.stop
    assert {f.rank for f in stop.faults} == {13, 34}
    t = truth(sc)
    assert [f["onset_step"] for f in t["faults"]] == [stop.step, stop.step]
    stacks, flights = sweep(recs_of(sc))
    assert "dataloader" in stacks[13]["dump"] and "broadcast (" in stacks[34]["dump"]
    # rank 34 (stage 0)'s pipeline neighbour 42 waits to receive from it: a point-to-point entry naming stage 0
    [wait] = [e for e in flights[42]["entries"] if e.get("p2p") and e["state"] == "started"]
    assert (wait["op"], wait["peer"]) == ("recv", 0)
    with pytest.raises(ValueError, match="same at_s"):
        simulate(sc_("bad", Fault("dataloader_hang", 80.0, rank=13), Fault("xid79", 80.0, node="n005"),
                     duration_s=140.0))
    with pytest.raises(ValueError, match="different ranks"):
        simulate(sc_("bad2", Fault("dataloader_hang", 80.0, rank=13), Fault("pp_deadlock", 80.0, rank=13),
                     duration_s=140.0))
