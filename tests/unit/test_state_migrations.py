"""Saved job states of older versions (triage/migrate.py): literal states that old commits saved
(tests/data/states/, its README says which and how) restore in today's shape, hold what they held, and the job
goes on as if it had never been saved; versions this code cannot restore are refused."""

from __future__ import annotations

import copy
import json
import math
from dataclasses import fields
from functools import cache
from typing import Any

import numpy as np
import orjson
import pytest
from gangwatch.detectors.catalog import typed
from gangwatch.detectors.hardware import HardwareDetector, gpus_from_gpu_last
from gangwatch.detectors.linkerrors import LinkErrorDetector, nodes_from_links
from gangwatch.schemas import Outputs, to_dict
from gangwatch.triage.core import JobCore
from gangwatch.triage.incident import Timeline
from gangwatch.triage.migrate import MIGRATIONS, OLDEST, STATE_VERSION, migrate

from tests.helpers import DATA, drive
from tests.unit import statecases as cases
from tests.unit.test_hardware import T0, gpu, topo
from tests.unit.test_linkerrors import cumulative, samples

pytestmark = pytest.mark.unit

FIRST = "v2-8cb065a-first"  # before the linkerrors and life detectors, fail-slow calibration, packed GPUs
UNPACKED = "v2-e6707b1-unpacked"  # GPUs and link counters not packed per node yet, no life detector
LIFE = "v2-8541d69-life"  # no reorder window in step buffers, no fail-slow calib_ts, het_wait, flag_ts
LAST = "v2-d1b59a4-last"  # no hang reports
V3 = "v3-3a78664-last"  # no clocks detector, no fail-stop arrivals, steps nor telemetry gaps
V4_STOP40 = "v4-5bf14e6-stop40"  # no clock heartbeat counts, no hang first_ts nor now, no fail-stop silent_end
V4_STOP48 = "v4-8efac49-stop48"  # the same version grown: no fail-stop silent_end
V5 = "v5-7eee59d-stop49"  # no clock steps seen by the nodes' monotonic clocks
OLD = (FIRST, UNPACKED, LIFE, LAST, V3, V4_STOP40, V4_STOP48, V5)
STEP_BUFFERS = ("failslow", "slowdown", "sdc")


def saved(name: str) -> dict[str, Any]:
    return orjson.loads((DATA / "states" / f"{name}.json").read_bytes())


def outputs(core: JobCore, lo: int, hi: int) -> dict[str, list[dict[str, Any]]]:
    """What the job makes of the steps [lo, hi) of the test job, by kind of output."""
    out = Outputs()
    for rec in cases.records(lo, hi):
        core.process(rec, out)
    return {kind: [to_dict(x) for x in getattr(out, kind)] for kind in ("findings", "actions", "incidents", "life")}


@cache
def never_saved() -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """Today's core on the test job: its state after the saved steps, and what it makes of the steps after."""
    recs = cases.records(0, cases.SAVED)
    core = JobCore(next(recs))
    for rec in recs:
        core.process(rec)
    return core.state(), outputs(core, cases.SAVED, cases.END)


def restored(name: str) -> JobCore:
    return JobCore.from_state(saved(name))


def detector(core: JobCore, name: str) -> Any:
    [det] = [d for d in core.monitor.detectors if d.name == name]
    return det


def without_configs(state: dict[str, Any]) -> dict[str, Any]:
    """`state` as JSON, less the detectors' settings (a restored job runs with today's)."""
    state = orjson.loads(orjson.dumps(state, option=orjson.OPT_SERIALIZE_NUMPY))
    for det in state["monitor"]["detectors"].values():
        del det["config"]
    return state


def shape(state: dict[str, Any]) -> dict[str, Any]:
    """The keys of a job state, of each detector's state, of each step buffer, of triage and of its incidents."""
    dets, tri = state["monitor"]["detectors"], state["triage"]
    return {"state": sorted(state), "detectors": {name: sorted(d) for name, d in dets.items()},
            "buffers": {name: sorted(dets[name]["buffer"]) for name in STEP_BUFFERS}, "triage": sorted(tri),
            "incidents": [sorted(t) for t in [tri["incident"], *tri["waiting"]] if t]}


# --- versions ---------------------------------------------------------------------------------------------------


def test_migrations_go_one_version_at_a_time_up_to_today_each_from_a_literal_state():
    assert sorted(MIGRATIONS) == list(range(OLDEST, STATE_VERSION))
    olds = [saved(name) for name in OLD]
    assert {s["v"] for s in olds} == set(MIGRATIONS)  # every version a migration starts from has a saved state
    for s in olds:
        assert MIGRATIONS[s["v"]](s)["v"] == s["v"] + 1


def test_a_state_of_today_is_not_migrated():
    state, _ = never_saved()
    assert state["v"] == STATE_VERSION
    assert migrate(state) is state


KNOWN = f"this gangwatch restores job state versions {OLDEST} to {STATE_VERSION}"


@pytest.mark.parametrize(("v", "says"), [
    (99, f"job state version 99 is newer than this gangwatch's ({STATE_VERSION}): {KNOWN}; restore it with the "
         "version that saved it or a later one"),
    (OLDEST - 1, f"job state version {OLDEST - 1} cannot be restored: {KNOWN}"),
    (str(STATE_VERSION), f"job state version '{STATE_VERSION}' cannot be restored: {KNOWN}"),
    (None, f'a job state without a version ("v") cannot be restored: {KNOWN}'),
])
def test_a_version_this_code_cannot_restore_is_refused_saying_which_it_can(v, says):
    state = {k: val for k, val in saved(LAST).items() if k != "v"}
    if v is not None:
        state["v"] = v
    with pytest.raises(ValueError) as err:
        JobCore.from_state(state)
    assert str(err.value) == says


# --- the old states ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", OLD)
def test_an_old_state_restores_in_todays_shape_holding_what_was_migrated(name):
    old = saved(name)
    kept = copy.deepcopy(old)
    state = migrate(old)
    assert old == kept  # the saved value is not changed
    assert state["v"] == STATE_VERSION
    got, todays = shape(state), shape(never_saved()[0])
    incidents, _ = got.pop("incidents"), todays.pop("incidents")
    assert incidents and all(keys == sorted(f.name for f in fields(Timeline)) for keys in incidents)
    assert got == todays
    assert without_configs(JobCore.from_state(old).state()) == without_configs(state)  # nothing lost restoring


@pytest.mark.parametrize("name", [FIRST, UNPACKED])
def test_gpus_saved_unpacked_hold_their_counters_and_conditions(name):
    old = saved(name)["monitor"]["detectors"]["hardware"]["gpu_last"]["n1|0"]
    assert old == {"active": {"throttle": 0}, "counters": {"ecc_sbe": 200, "nvlink_crc": 0, "pcie_replay": 190}}
    gpus = detector(restored(name), "hardware").state()["gpus"]
    n1 = gpus["n1"]
    r = n1["gpus"].index(0)
    assert (n1["counters"][r], n1["known"][r]) == ([0, 200, 190, 0], [False, True, True, True])  # ecc_dbe, ecc_sbe,
    # pcie_replay, nvlink_crc (ECC_DBE never sampled)
    assert n1["active"][r] == [0, -1, -1, -1, -1, -1, -1]  # throttled in the newest sample, nothing else active
    assert gpus == never_saved()[0]["monitor"]["detectors"]["hardware"]["gpus"]


def test_link_counters_saved_per_counter_hold_their_last_sample_and_bad_intervals():
    old = saved(UNPACKED)["monitor"]["detectors"]["linkerrors"]["links"]["n0|1|pcie_replay"]
    assert (old["ts"], old["value"], old["episode"]) == (105.6, 190, True)
    links = detector(restored(UNPACKED), "linkerrors")
    n0 = links.nodes["n0"]
    i = n0.index(1, 0)  # GPU 1's pcie_replay
    assert (n0.ts[i], n0.value[i], bool(n0.episode[i])) == (105.6, 190, True)
    assert [t for _, t, _ in n0.bad[i]] == [t for t, _, bad in old["recent"] if bad]
    assert links.state()["nodes"] == never_saved()[0]["monitor"]["detectors"]["linkerrors"]["nodes"]


@pytest.mark.parametrize("name", [FIRST, UNPACKED, LIFE])
def test_step_buffers_saved_before_the_reorder_window_have_every_closed_step_due(name):
    core = restored(name)
    for det_name in STEP_BUFFERS:
        buf = detector(core, det_name).buf
        assert buf.lag_upto == buf.closed_upto == saved(name)["monitor"]["detectors"][det_name]["buffer"]["closed_upto"]
        assert buf.closed_ts == -math.inf


def test_fail_slow_saved_before_calibration_learns_its_baselines_again_keeping_its_windows():
    old = saved(FIRST)["monitor"]["detectors"]["failslow"]
    fs = detector(restored(FIRST), "failslow")
    assert (fs.calib, fs.first_step, fs.nbase.tolist()) == (0, -1, [0, 0, 0, 0])
    assert (fs.hist.tolist(), fs.in_episode.tolist(), fs.clean_run.tolist()) == (
        old["hist"], old["in_episode"], old["clean_run"])


def test_fail_slow_saved_before_calib_ts_was_kept_judges_at_once():
    fs = detector(restored(LIFE), "failslow")
    assert fs.calib == saved(LIFE)["monitor"]["detectors"]["failslow"]["calib"] == 30  # calibrated
    assert math.isnan(fs.calib_ts) and not fs.het_wait
    assert np.isnan(fs.flag_ts).all()  # no run of flagged steps going on


def test_detectors_and_fields_a_job_did_not_have_start_as_new():
    first = restored(FIRST)
    assert detector(first, "linkerrors").nodes == {}
    assert detector(first, "life").current == "starting"
    assert detector(first, "hang").reports == int(detector(first, "hang").reported)
    assert detector(first, "failstop").stepped
    unpacked = restored(UNPACKED)
    [waiting] = unpacked.triage.waiting  # the replaced straggler's incident
    assert (waiting.id, waiting.restarts, waiting.attempts, waiting.rungs) == (
        "i-e81c5ecddd6cd8e3", ["a-0a55362c84c607f9"], 0, [])
    assert unpacked.triage.life is None and unpacked.triage.acted == []


def test_a_flight_sweep_saved_before_wait_for_graphs_restores_with_none():
    # none of the saved states was in the middle of a sweep: the last one, given a rank's view as the first
    # version 2 saved it
    state = saved(LAST)
    old_view = {"has_groups": False, "groups": {}, "entries": {}}
    state["monitor"]["detectors"]["flight"]["pending"] = {"s1": {"first_ts": 99.0, "last_ts": 99.0,
                                                                 "views": [[0, old_view]]}}
    new_view = {**old_view, "waits_on": [], "p2p": [], "collectives": {}}
    assert migrate(state)["monitor"]["detectors"]["flight"]["pending"]["s1"]["views"] == [[0, new_view]]
    flight = detector(JobCore.from_state(state), "flight")
    assert flight.state()["pending"]["s1"]["views"] == [[0, new_view]]  # today's flight saves just that


# --- and the job goes on ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [LIFE, LAST, V3, V4_STOP40, V4_STOP48, V5])
def test_a_restored_job_goes_on_as_if_never_saved(name):
    got, want = outputs(restored(name), cases.SAVED, cases.END), never_saved()[1]
    assert got == want
    assert [f["type"] for f in want["findings"]] == ["hw_fault", "link_errors", "hw_fault"]


def test_a_version_3_job_restores_with_nothing_learned_of_its_clocks_and_arrivals_as_unknown():
    core = restored(V3)
    clocks, failstop = detector(core, "clocks"), detector(core, "failstop")
    assert not clocks.skewed and clocks.refs == {} and clocks.now() == -math.inf
    assert core.now() == core.monitor.topo.ts  # the job record's time until a record is heard
    assert np.isneginf(failstop.arrived).all() and (failstop.last_step == -1).all() and failstop.gap_since == {}
    assert failstop.now == saved(V3)["watermark"]


def test_a_job_saved_before_the_life_detector_goes_on_the_same_its_first_step_moving_it_to_running():
    got, want = outputs(restored(UNPACKED), cases.SAVED, cases.END), never_saved()[1]
    assert {k: v for k, v in got.items() if k != "life"} == {k: v for k, v in want.items() if k != "life"}
    assert [(f["evidence"]["previous"], f["evidence"]["state"]) for f in got["life"]] == [("starting", "running")]


def test_the_first_version_2_job_goes_on_deciding_its_open_incident_with_its_hardware_as_it_was():
    core = restored(FIRST)
    open_incident = core.triage.incident.id
    got, want = outputs(core, cases.SAVED, cases.END), never_saved()[1]
    hardware = [f for f in got["findings"] if f["type"] == "hw_fault"]
    assert hardware == [f for f in want["findings"] if f["type"] == "hw_fault"]
    assert [(a["type"], a["nodes"], a["incident"]) for a in got["actions"]] == [("replace", ["n1"], open_incident)]


# --- a detector's state from before issue 11, packed by the helpers the migration uses ---------------------------

# The hardware detector's state after the 7 first samples of `HW_RECS`, GPUs unpacked: GPU 3 throttled and hot
# until a sample ago, its SBE counter at 12; GPU 4's row remap pending.
HW_STATE = {
    "config": {"storm_window_s": 2.0, "quiet_s": 60.0, "nic_flap_s": 30.0, "temp_precursor_c": 87.0,
               "sbe_burst": 100, "pcie_replay_surge": 100, "nvlink_crc_surge": 100, "clean_samples": 3},
    "storms": {}, "nic_down": {},
    "gpu_last": {"n001|3": {"active": {"throttle": 1, "temp": 1}, "counters": {"ecc_dbe": 0, "ecc_sbe": 12}},
                 "n001|4": {"active": {"remap": 0}, "counters": {"ecc_dbe": 0, "ecc_sbe": 0}}},
}
HW_RECS = [gpu(T0, ecc_sbe=10), gpu(T0, g=4), gpu(T0 + 1, throttle=["hw_thermal"], ecc_sbe=10), gpu(T0 + 1, g=4),
           gpu(T0 + 2, throttle=["hw_thermal"], temp_c=88.0, ecc_sbe=10), gpu(T0 + 2, g=4, remap_pending=True),
           gpu(T0 + 3, ecc_sbe=12),
           # after the save: GPU 3 throttles again before it re-armed, then after; its SBE counter jumps
           gpu(T0 + 4, throttle=["hw_thermal"], ecc_sbe=112), gpu(T0 + 4, g=4, remap_pending=True),
           *[gpu(T0 + 5 + i, ecc_sbe=112) for i in range(3)], gpu(T0 + 8, throttle=["hw_thermal"], ecc_sbe=112)]


def test_hardware_gpus_packed_from_gpu_last_continue_the_same():
    t = topo()
    state = {k: v for k, v in HW_STATE.items() if k != "gpu_last"}
    restored_hw = HardwareDetector.from_state({**state, "gpus": gpus_from_gpu_last(HW_STATE["gpu_last"])}, t)
    later = drive(restored_hw, HW_RECS[7:], 120.0)
    assert later == drive(HardwareDetector(t), HW_RECS, 120.0)[3:]  # as if it had never stopped
    assert [(f.gpu, f.evidence["name"], f.ts) for f in later] == [
        (3, "ECC_SBE_BURST", T0 + 4), (3, "THROTTLE:hw_thermal", T0 + 8)]
    again = HardwareDetector.from_state(json.loads(json.dumps(restored_hw.state())), t)
    assert again.state() == restored_hw.state()


# The link-error detector's state after the 6 first samples of `LINK_RECS`, links unpacked: GPU 5 of n000 had two
# bad NVLink intervals of 2, GPU 3 of n001 one bad PCIe interval of 2.
LINK_STATE = {
    "config": {"pcie_replay_per_s": 8 / 60, "nvlink_crc_per_s": 100.0, "hits": 3, "window": 5,
               "rearm_intervals": 10},
    "links": {"n000|5|nvlink_crc": {"ts": 1020.0, "value": 10000, "recent": [[1000.0, 0, True], [1010.0, 5000, True]],
                                    "clean": 0, "episode": False},
              "n001|3|pcie_replay": {"ts": 1020.0, "value": 12, "recent": [[1000.0, 0, False], [1010.0, 0, True]],
                                     "clean": 0, "episode": False}},
}
LINK_RECS = sorted(samples(cumulative([0, 12, 0, 12, 12, 12])) +
                   samples(cumulative([5000] * 3), counter="nvlink_crc", gpu=5, node="n000"),
                   key=lambda r: (r.ts, r.node))


def test_link_counters_packed_from_links_continue_the_same():
    t = topo()
    state = {"config": LINK_STATE["config"], "nodes": nodes_from_links(LINK_STATE["links"])}
    restored_links = LinkErrorDetector.from_state(state, t)
    later = drive(restored_links, LINK_RECS[6:])
    assert later == drive(LinkErrorDetector(t), LINK_RECS)  # as if it had never stopped
    assert [(f.node, f.gpu, typed(f).evidence.onset_ts, typed(f).evidence.intervals_over) for f in later] == [
        ("n000", 5, T0, 3), ("n001", 3, T0 + 10.0, 3)]
    again = LinkErrorDetector.from_state(orjson.loads(orjson.dumps(restored_links.state())), t)
    assert again.state() == restored_links.state()
