"""Real telemetry of one H200 (tests/data/gpu/README.md): an agent's NVML samples and kernel log, three small jobs.

The spool file is replayed as it is, in its order (`batch` envelopes, each rank's records in large late batches,
heartbeats before their job's `job` record), through the replay runtime; the truths its README states must hold.
"""

from __future__ import annotations

import gzip

import orjson
import pytest
from gangwatch.detectors.catalog import typed
from gangwatch.schemas import EVICTING_ACTIONS, decode
from gangwatch.streams import replay

pytestmark = pytest.mark.fault

SPOOL = "gpu/h200-agent-and-3-jobs.jsonl.gz"


@pytest.fixture(scope="module")
def h200(real_data, tmp_path_factory):
    """(what the file holds, unpacked; findings, actions, latest version of each incident, jobs, rejected)."""
    path = real_data / SPOOL
    records = [item for line in gzip.open(path) for item in orjson.loads(line)["items"]]
    out = tmp_path_factory.mktemp("h200")
    replay.run([path], out, None, progress=None)
    read = lambda name: [orjson.loads(x) for x in (out / name).read_bytes().splitlines()]  # noqa: E731
    incidents = {i["id"]: i for i in read("incidents.jsonl")}
    return records, read("findings.jsonl"), read("actions.jsonl"), list(incidents.values()), read("jobs.jsonl"), \
        read("rejected.jsonl")


def _typed(finding: dict):
    (f,) = decode(orjson.dumps(finding))
    return typed(f)


def test_nvml_samples_at_full_load_and_power_cap_raise_nothing(h200):
    records, findings, actions, *_ = h200
    gpu = [r for r in records if r["kind"] == "gpu"]
    capped = [r for r in gpu if r["power_w"] >= 680 and "sw_power_cap" in (r.get("throttle") or ())]
    idle = [r for r in gpu if r["power_w"] < 100]
    assert len(capped) >= 10 and len(idle) >= 10  # the file does hold both
    assert min(r["sm_clock_mhz"] for r in capped) >= 1400
    # the agent's node is gpu-n1: nothing it sampled is held against it; only the Xid of gpujob3 (below) names it
    # (a telemetry gap is about the spool's delivery, not the GPU)
    assert [(f["type"], f["job"]) for f in findings if f["node"] == "gpu-n1" and f["type"] != "telemetry_gap"] == [
        ("hw_fault", "gpujob3")]
    assert not any("gpu-n1" in a["nodes"] for a in actions)


def test_a_clean_job_finishes_with_nothing_else(h200):
    records, findings, actions, incidents, jobs, _ = h200
    assert sum(1 for r in records if r["kind"] == "step" and r["job"] == "gpujob1") == 600
    # no fault; the spool's batches did hold its ranks' records back longer than its silence timeout (twice its
    # heartbeat period and a half): each node's delivery lag is an operator's ticket, nothing more
    mine = [f for f in findings if f["job"] == "gpujob1"]
    assert {f["type"] for f in mine} <= {"telemetry_gap"}
    assert all(f["evidence"]["cause"] == "delivery lag" and f["evidence"]["lag_s"] < 15 for f in mine)
    assert len({f["node"] for f in mine}) == len(mine)  # one a node
    assert not any(_typed(f).incident_class for f in mine)
    assert [a for a in actions if a["job"] == "gpujob1"] == []
    assert [i for i in incidents if i["job"] == "gpujob1"] == []
    assert [j["evidence"]["state"] for j in jobs if j["job"] == "gpujob1"] == ["starting", "running", "finished"]


def test_sdc_suspect_is_gpu_n2_by_two_of_three_and_the_post_mortem_names_it(h200):
    """Rank 1 (gpu-n2) holds a changed weight from step 80: ranks 0 and 2 agree against it. The job ends seconds
    after the finding, before any decision: the incident still names the suspect (nothing is done about it)."""
    _, findings, actions, incidents, *_ = h200
    sdc = [f for f in findings if f["type"] == "sdc_suspect"]
    assert [(f["job"], f["rank"], f["node"]) for f in sdc] == [("gpujob2", 1, "gpu-n2")]
    ev = sdc[0]["evidence"]
    assert (ev["replicas"], ev["agree"], ev["minority_ranks"]) == (3, 2, [1])
    assert _typed(sdc[0]).verdict
    (inc,) = [i for i in incidents if i["job"] == "gpujob2"]
    assert (inc["class"], inc["culprit_nodes"], inc["evicted_nodes"]) == ("sdc", ["gpu-n2"], [])
    assert inc["resolution"] == "job_finished" and sdc[0]["id"] in inc["findings"]
    assert not [a for a in actions if a["job"] == "gpujob2" and a["type"] in EVICTING_ACTIONS]


def test_sdc_is_found_at_the_step_it_began(h200):
    """Each rank's steps reached the spool in batches spanning ~8 s, far from event order: the mismatch at step 80
    arrives after its step was voted on by the replica that came first; it votes late and is found there, at step
    80, not at the next digest all three sent in time (step 140)."""
    _, findings, *_ = h200
    (sdc,) = [f for f in findings if f["type"] == "sdc_suspect"]
    assert sdc["evidence"]["step"] == 80


def test_a_device_side_assert_is_rank_2s_software_failure_and_its_xid_43_is_evidence(h200):
    records, findings, actions, incidents, jobs, _ = h200
    (xid,) = [r for r in records if r["kind"] == "hw"]
    assert (xid["code"], xid["node"], xid["process"]) == (43, "gpu-n1", "python")
    crash = [f for f in findings if f["job"] == "gpujob3" and f["type"] == "fail_stop"]
    assert [(f["rank"], f["node"], f["evidence"]["cause"]) for f in crash] == [(2, "gpu-n3", "exception")]
    assert "device-side assert" in crash[0]["evidence"]["message"] and _typed(crash[0]).software
    (hw,) = [f for f in findings if f["type"] == "hw_fault"]
    assert (hw["evidence"]["code"], hw["evidence"]["severity"]) == (43, "evidence")
    t = _typed(hw)
    assert not t.verdict and t.incident_class is None  # it opens nothing and names no GPU on its own
    assert not any("gpu-n1" in i["culprit_nodes"] for i in incidents)
    assert [j["evidence"]["state"] for j in jobs if j["job"] == "gpujob3"][-1] == "failed"


def test_nobody_is_evicted_and_early_heartbeats_wait_for_their_job_record(h200):
    """Three ranks sharing one healthy GPU: no eviction anywhere. The heartbeats spooled before their job's `job`
    record (another spool) are held until it comes, not refused: nothing is rejected."""
    records, _, actions, _, _, rejected = h200
    assert not [a for a in actions if a["type"] in EVICTING_ACTIONS]
    first_job = {}
    for i, r in enumerate(records):
        if r["kind"] == "job":
            first_job.setdefault(r["job"], i)
    assert sum(1 for i, r in enumerate(records) if r["kind"] == "heartbeat" and i < first_job[r["job"]]) == 9
    assert rejected == []
