"""Hardware detector: real kernel logs end to end, Xid storms, NIC flap vs down, NVML episodes, state."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gangwatch.detectors.hardware import HardwareDetector
from gangwatch.detectors.topology import Topology
from gangwatch.producers.kmsg import parse_line, parse_lines, to_hw_record
from gangwatch.schemas import Gpu, Hw, Job, RankInfo, decode_obj

from tests.helpers import drive

pytestmark = pytest.mark.unit

T0 = 1_000.0
XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."


def topo(nodes=2, per_node=8) -> Topology:
    ranks = [RankInfo(rank=n * per_node + g, node=f"n{n:03d}", gpu=g) for n in range(nodes) for g in range(per_node)]
    return Topology.from_job(Job(ts=T0, job="j", ranks=ranks))


def run(det, recs, tail=120.0):
    return drive(det, recs, tail)


def hw_records(lines, node="n001", t0=T0, dt=0.01):
    """Kernel-log lines -> parsed events -> contract `hw` records, one every `dt` seconds."""
    recs = []
    for i, ev in enumerate(parse_lines(lines)):
        rec = decode_obj(to_hw_record(ev, node=node, ts=t0 + i * dt))
        assert isinstance(rec, Hw), rec
        recs.append(rec)
    return recs


def read_log(real_data: Path, name: str) -> list[str]:
    path = real_data / "kmsg" / name
    if not path.is_file():
        pytest.fail(f"real kernel log {path} missing from the shared test material")
    return path.read_text().splitlines()


def xid(ts, code=79, node="n001", gpu=3, message=XID79) -> Hw:
    return Hw(ts=ts, node=node, source="xid", code=code, gpu=gpu, message=message)


def nic(ts, line, node="n001") -> Hw:
    """A NIC line as the kernel prints it, through the kmsg parser and the contract decoder."""
    ev = parse_line(line)
    assert ev is not None and ev.source == "nic", line
    rec = decode_obj(to_hw_record(ev, node=node, ts=ts))
    assert isinstance(rec, Hw), rec
    return rec


def gpu(ts, node="n001", g=3, **kw) -> Gpu:
    base = {"temp_c": 65.0, "sm_clock_mhz": 1980.0, "throttle": [], "ecc_sbe": 0, "ecc_dbe": 0}
    return Gpu(ts=ts, node=node, gpu=g, **{**base, **kw})


def sev(f):
    return f.evidence["severity"]


# --- real kernel logs end to end -------------------------------------------------------------


def test_real_h100_xid119_log_is_one_fatal_finding(real_data: Path) -> None:
    recs = hw_records(read_log(real_data, "h100-xid119.log"))
    assert len(recs) == 5
    found = run(HardwareDetector(topo()), recs)
    assert len(found) == 1
    [f] = found
    assert (f.type, f.node, sev(f), f.evidence["code"], f.evidence["count"]) == ("hw_fault", "n001", "fatal", 119, 5)
    assert f.evidence["source"] == "xid" and f.evidence["name"] == "GSP_RPC_TIMEOUT"
    assert f.ts == pytest.approx(T0 + 2.0)  # reported when the storm window closes
    assert f.evidence["message"].startswith("NVRM: Xid (PCI:0000:9b:00): 119")
    assert f.rank is None and f.gpu is None  # the producer did not map the PCI id to a GPU


def test_real_xid13_xid43_storm_is_evidence_only(real_data: Path) -> None:
    recs = hw_records(read_log(real_data, "xid13-xid43-storm.log"))
    found = run(HardwareDetector(topo()), recs)
    assert found, "application-side Xids are evidence, not nothing"
    assert {sev(f) for f in found} == {"evidence"}  # no fatal verdict for application-side errors
    assert sorted((f.evidence["code"], f.evidence["count"]) for f in found) == [(13, 16), (43, 1)]
    assert all(f.type == "hw_fault" and f.node == "n001" for f in found)


def test_real_benign_kmsg_has_no_finding(real_data: Path) -> None:
    lines = read_log(real_data, "benign-kmsg.log")
    assert hw_records(lines) == []
    det = HardwareDetector(topo())
    assert det.advance(T0 + 3600) == []


# --- Xid storms -------------------------------------------------------------------------------


def test_xid79_storm_is_one_fatal_finding_with_count() -> None:
    # 500 copies spread over 1.996 s: all inside the 2 s storm window
    recs = [xid(T0 + i * 0.004) for i in range(500)]
    found = run(HardwareDetector(topo()), recs)
    assert len(found) == 1
    [f] = found
    assert (sev(f), f.evidence["code"], f.evidence["count"], f.score) == ("fatal", 79, 500, 1.0)
    assert f.ts == pytest.approx(T0 + 2.0)


def test_xid_storm_longer_than_window_is_still_one_finding() -> None:
    recs = [xid(T0 + i * 0.006) for i in range(500)]  # 500 copies over 3 s
    found = run(HardwareDetector(topo()), recs)
    assert len(found) == 1 and sev(found[0]) == "fatal"
    # the count is what was known when the finding was made (copies inside the window)
    in_window = sum(1 for r in recs if r.ts < T0 + 2.0)
    assert found[0].evidence["count"] == in_window


def test_storm_count_does_not_depend_on_advance_cadence() -> None:
    recs = [xid(T0 + i * 0.006) for i in range(500)]
    a = run(HardwareDetector(topo()), recs)
    det = HardwareDetector(topo())
    b = []
    for rec in recs:
        b += det.observe(rec)  # a watermark that lags: advance only at the end
    b += det.advance(recs[-1].ts) + det.advance(recs[-1].ts + 120)
    assert a == b and len(a) == 1


def test_storm_is_not_lost_when_advance_lags_past_quiet_period() -> None:
    first = [xid(T0 + i * 0.1) for i in range(5)]
    later = [xid(T0 + 200 + i * 0.1) for i in range(3)]
    det = HardwareDetector(topo())
    found = []
    for rec in first + later:
        found += det.observe(rec)
    found += det.advance(T0 + 400)
    assert sorted(f.evidence["count"] for f in found) == [3, 5]
    assert found == run(HardwareDetector(topo()), first + later, tail=200)


def test_same_xid_after_quiet_period_is_a_second_finding() -> None:
    det = HardwareDetector(topo())
    first = run(det, [xid(T0 + i * 0.01) for i in range(10)])
    # absorbed copies keep the storm open; after 60 s of silence it is over
    second = run(det, [xid(T0 + 300 + i * 0.01) for i in range(4)])
    assert [f.evidence["count"] for f in first] == [10]
    assert [f.evidence["count"] for f in second] == [4]
    assert second[0].id != first[0].id and second[0].ts == pytest.approx(T0 + 302.0)


def test_copies_inside_the_quiet_period_extend_the_storm() -> None:
    recs = [xid(T0 + i * 10.0) for i in range(20)]  # one copy every 10 s for 190 s: one long storm
    found = run(HardwareDetector(topo()), recs)
    assert len(found) == 1 and found[0].evidence["count"] == 1


def test_distinct_codes_and_gpus_are_distinct_storms() -> None:
    recs = sorted([xid(T0 + i * 0.01, gpu=3) for i in range(10)] + [xid(T0 + i * 0.01, gpu=5) for i in range(7)]
                  + [xid(T0 + i * 0.01, code=48, gpu=3) for i in range(2)], key=lambda r: r.ts)
    found = run(HardwareDetector(topo()), recs)
    assert sorted((f.gpu, f.evidence["code"], f.evidence["count"]) for f in found) == [(3, 48, 2), (3, 79, 10),
                                                                                       (5, 79, 7)]
    assert {sev(f) for f in found} == {"fatal"}


def test_unknown_xid_code_is_evidence_not_fatal() -> None:
    found = run(HardwareDetector(topo()), [xid(T0, code=999, message="NVRM: Xid (PCI:0000:3b:00): 999, new code")])
    assert len(found) == 1
    assert (sev(found[0]), found[0].evidence["name"], found[0].evidence["code"]) == ("evidence", "UNKNOWN", 999)
    assert found[0].score < 1.0


def test_ignorable_xid_code_makes_no_finding() -> None:
    # Xid 63 is a memory retirement event (evidence); Xid 106 is an SMBPBI test message (ignored)
    found = run(HardwareDetector(topo()), [xid(T0, code=106), xid(T0 + 0.1, code=63)])
    assert [(f.evidence["code"], sev(f)) for f in found] == [(63, "evidence")]


def test_finding_rank_comes_from_node_and_gpu_via_topology() -> None:
    t = topo(nodes=2, per_node=8)
    [f] = run(HardwareDetector(t), [xid(T0, node="n001", gpu=3)])
    assert (f.node, f.gpu, f.rank) == ("n001", 3, 11)
    [g] = run(HardwareDetector(t), [xid(T0, node="n009", gpu=3)])  # a node outside the job
    assert (g.node, g.gpu, g.rank) == ("n009", 3, None)


# --- NIC ---------------------------------------------------------------------------------------


def test_nic_down_then_up_is_one_flap_precursor() -> None:
    recs = [nic(T0, "mlx5_core 0000:17:00.0 ens1np0: Link down"),
            nic(T0 + 5, "mlx5_core 0000:17:00.0 ens1np0: Link up")]
    found = run(HardwareDetector(topo()), recs)
    assert len(found) == 1
    [f] = found
    assert (sev(f), f.evidence["name"], f.evidence["down_s"], f.node) == ("precursor", "NIC_FLAP", 5.0, "n001")
    assert f.ts == pytest.approx(T0 + 5)


def test_nic_down_for_good_is_fatal() -> None:
    det = HardwareDetector(topo())
    assert det.observe(nic(T0, "mlx5_core 0000:17:00.0 ens1np0: Link down")) == []
    assert det.advance(T0 + 29.9) == []
    found = det.advance(T0 + 31)
    assert len(found) == 1
    [f] = found
    assert (sev(f), f.evidence["name"], f.node, f.score) == ("fatal", "NIC_DOWN", "n001", 1.0)
    assert f.ts == pytest.approx(T0 + 30)
    assert det.advance(T0 + 600) == []  # reported once
    # the link coming back after the outage is not a flap (a precursor) on top of the fatal outage
    assert det.observe(nic(T0 + 700, "mlx5_core 0000:17:00.0 ens1np0: Link up")) == []


def test_nodes_that_leave_the_job_are_forgotten() -> None:
    """A new job record without n000: its GPUs' counters and its NIC outage go; n001's stay and still count."""
    det = HardwareDetector(topo())
    drive(det, [gpu(T0, node=n, ecc_dbe=0) for n in ("n000", "n001")] +
          [nic(T0 + 1, "mlx5_core 0000:17:00.0 ens1np0: Link down", node=n) for n in ("n000", "n001")], tail=0)
    det.set_topology(Topology.from_job(Job(ts=T0 + 2, job="j", ranks=[RankInfo(rank=0, node="n001", gpu=3)])))
    assert list(det.gpus) == ["n001"]
    assert [(f.node, f.evidence["name"]) for f in det.advance(T0 + 40)] == [("n001", "NIC_DOWN")]
    assert [(f.node, f.evidence["name"]) for f in det.observe(gpu(T0 + 41, node="n001", ecc_dbe=1))] == [
        ("n001", "ECC_DBE")]


def test_two_nics_of_one_node_are_told_apart() -> None:
    # ens1np0 goes down for good while ens2np0 flaps: the flap must not clear the other link
    recs = [nic(T0, "mlx5_core 0000:17:00.0 ens1np0: Link down"),
            nic(T0 + 1, "mlx5_core 0000:3b:00.0 ens2np0: Link down"),
            nic(T0 + 3, "mlx5_core 0000:3b:00.0 ens2np0: Link up")]
    found = run(HardwareDetector(topo()), recs, tail=60)
    assert sorted((f.evidence["name"], sev(f)) for f in found) == [("NIC_DOWN", "fatal"), ("NIC_FLAP", "precursor")]
    [flap] = [f for f in found if f.evidence["name"] == "NIC_FLAP"]
    assert "ens2np0" in flap.evidence["message"] and flap.evidence["down_s"] == 2.0


@pytest.mark.parametrize("down, up", [
    ("eth0: Link is Down", "eth0: Link is Up 100000 Mbps Full Duplex"),
    ("bnxt_en 0000:3b:00.0 ens2f0np0: NIC Link is Down", "bnxt_en 0000:3b:00.0 ens2f0np0: NIC Link is Up, 100000 Mbps"),
    ("bond0: link status definitely down for interface eth1, disabling it",
     "bond0: link status definitely up for interface eth1, 25000 Mbps full duplex"),
])
def test_nic_link_words_of_common_drivers(down, up) -> None:
    found = run(HardwareDetector(topo()), [nic(T0, down), nic(T0 + 2, up)])
    assert [(f.evidence["name"], sev(f)) for f in found] == [("NIC_FLAP", "precursor")]


def test_nic_transmit_timeout_is_not_a_link_down() -> None:
    # NETDEV WATCHDOG says nothing about the link state: it must never turn into NIC_DOWN
    line = "NETDEV WATCHDOG: eth0 (mlx5_core): transmit queue 3 timed out"
    found = run(HardwareDetector(topo()), [nic(T0, line)], tail=120)
    assert all(f.evidence["name"] != "NIC_DOWN" and sev(f) != "fatal" for f in found)


# --- NVML samples --------------------------------------------------------------------------------


def test_thermal_throttle_is_one_degraded_finding_per_episode() -> None:
    flags = [[]] * 5 + [["hw_thermal"]] * 10 + [[]] * 5 + [["hw_thermal", "sw_power_cap"]] * 10
    recs = [gpu(T0 + i, throttle=f) for i, f in enumerate(flags)]
    found = run(HardwareDetector(topo()), recs)
    assert [(sev(f), f.evidence["name"], f.ts) for f in found] == [
        ("degraded", "THROTTLE:hw_thermal", T0 + 5), ("degraded", "THROTTLE:hw_thermal", T0 + 20)]
    assert found[0].id != found[1].id
    assert (found[0].node, found[0].gpu, found[0].rank) == ("n001", 3, 11)


def test_throttle_does_not_rearm_before_enough_clean_samples() -> None:
    flags = [["hw_thermal"]] * 3 + [[]] * 2 + [["hw_thermal"]] * 3  # only 2 clean samples in between
    found = run(HardwareDetector(topo()), [gpu(T0 + i, throttle=f) for i, f in enumerate(flags)])
    assert len(found) == 1


def test_power_cap_throttle_is_not_degraded() -> None:
    recs = [gpu(T0 + i, throttle=["sw_power_cap", "gpu_idle"]) for i in range(10)]
    assert run(HardwareDetector(topo()), recs) == []


def test_ecc_dbe_increment_is_fatal() -> None:
    recs = [gpu(T0 + i, ecc_dbe=0) for i in range(3)] + [gpu(T0 + 3, ecc_dbe=1)] + \
           [gpu(T0 + 4 + i, ecc_dbe=1) for i in range(5)]
    found = run(HardwareDetector(topo()), recs)
    assert [(sev(f), f.evidence["name"], f.ts) for f in found] == [("fatal", "ECC_DBE", T0 + 3)]


def test_nonzero_ecc_counter_at_first_sample_is_only_a_baseline() -> None:
    recs = [gpu(T0 + i, ecc_dbe=2, ecc_sbe=5000) for i in range(5)]
    assert run(HardwareDetector(topo()), recs) == []


def test_ecc_sbe_burst_is_precursor_and_trickle_is_nothing() -> None:
    trickle = [gpu(T0 + i, ecc_sbe=i * 5) for i in range(10)]  # 5 per sample: below the burst
    assert run(HardwareDetector(topo()), trickle) == []
    burst = [gpu(T0 + i, ecc_sbe=0) for i in range(3)] + [gpu(T0 + 3, ecc_sbe=250)]
    found = run(HardwareDetector(topo()), burst)
    assert [(sev(f), f.evidence["name"]) for f in found] == [("precursor", "ECC_SBE_BURST")]


def test_high_temperature_is_precursor() -> None:
    assert run(HardwareDetector(topo()), [gpu(T0 + i, temp_c=86.5) for i in range(5)]) == []
    found = run(HardwareDetector(topo()), [gpu(T0 + i, temp_c=t) for i, t in enumerate([80, 85, 87, 89, 90])])
    assert [(sev(f), f.evidence["name"], f.evidence["temp_c"], f.ts) for f in found] == [
        ("precursor", "HIGH_TEMPERATURE", 87.0, T0 + 2)]


def test_gpus_have_independent_episodes() -> None:
    recs = sorted([gpu(T0 + i, g=g, throttle=["hw_slowdown"]) for i in range(5) for g in (0, 1)],
                  key=lambda r: (r.ts, r.gpu))
    found = run(HardwareDetector(topo()), recs)
    assert sorted((f.gpu, f.rank) for f in found) == [(0, 8), (1, 9)]


# --- state and determinism ---------------------------------------------------------------------------


def mixed_stream():
    recs = [xid(T0 + i * 0.01) for i in range(50)]
    recs += [gpu(T0 + i, g=2, throttle=["hw_thermal"] if 10 <= i < 20 or 40 <= i < 45 else [],
                 ecc_sbe=0 if i < 30 else 500, temp_c=90 if i == 33 else 70) for i in range(60)]
    recs += [nic(T0 + 12, "mlx5_core 0000:17:00.0 ens1np0: Link down"),
             nic(T0 + 15, "mlx5_core 0000:17:00.0 ens1np0: Link up"),
             nic(T0 + 20, "mlx5_core 0000:3b:00.0 ens2np0: Link down")]
    recs += [xid(T0 + 30 + i * 0.5, code=13, gpu=1) for i in range(8)]
    recs += [xid(T0 + 200 + i * 0.01) for i in range(3)]
    return sorted(recs, key=lambda r: r.ts)


def test_state_round_trip_mid_stream_yields_identical_later_findings() -> None:
    t = topo()
    recs = mixed_stream()
    for cut in (5, len(recs) // 3, len(recs) // 2, len(recs) - 5):
        det = HardwareDetector(t)
        first = run(det, recs[:cut], tail=0)
        snap = json.loads(json.dumps(det.state()))  # the state is a JSON-able value
        clone = HardwareDetector.from_state(snap, t)
        assert run(det, recs[cut:]) == run(clone, recs[cut:])
        assert first + run(HardwareDetector.from_state(snap, t), recs[cut:]) == run(HardwareDetector(t), recs)


def test_state_snapshot_is_not_changed_by_later_records() -> None:
    t = topo()
    recs = mixed_stream()
    det = HardwareDetector(t)
    run(det, recs[:40], tail=0)
    snap = det.state()
    frozen = json.dumps(snap, sort_keys=True)
    run(det, recs[40:])
    assert json.dumps(snap, sort_keys=True) == frozen


def test_findings_are_deterministic() -> None:
    recs = mixed_stream()
    a = run(HardwareDetector(topo()), recs)
    b = run(HardwareDetector(topo()), recs)
    assert a == b and [f.id for f in a] == [f.id for f in b]
    assert len({f.id for f in a}) == len(a)  # ids are distinct
    assert sorted((f.evidence["name"], sev(f)) for f in a) == sorted([
        ("ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "fatal"), ("ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "fatal"),
        ("ROBUST_CHANNEL_GR_EXCEPTION / ROBUST_CHANNEL_GR_ERROR_SW_NOTIFY", "evidence"),
        ("THROTTLE:hw_thermal", "degraded"), ("THROTTLE:hw_thermal", "degraded"), ("ECC_SBE_BURST", "precursor"),
        ("HIGH_TEMPERATURE", "precursor"), ("NIC_FLAP", "precursor"), ("NIC_DOWN", "fatal")])
