"""NVML samples become contract `gpu` records; a machine without a GPU says so clearly."""

from __future__ import annotations

import orjson
import pytest
from gangwatch.detectors.hardware import HardwareDetector
from gangwatch.detectors.topology import Topology
from gangwatch.producers.nvml import (
    FakeNvml,
    NvmlUnavailable,
    RealNvml,
    bus_key,
    gpu_indices,
    sample_node,
    throttle_names,
)
from gangwatch.schemas import Gpu, Job, RankInfo, decode

pytestmark = pytest.mark.unit


def test_throttle_bits_become_contract_names():
    assert throttle_names(0x20 | 0x40) == ["sw_thermal", "hw_thermal"]
    assert throttle_names(0) == []


def test_samples_decode_and_feed_the_hardware_detector():
    nvml = FakeNvml([{"temp_c": 70.0, "power_w": 600.0, "throttle": []},
                     {"temp_c": 91.0, "power_w": 450.0, "sm_clock_mhz": 1100.0, "throttle": throttle_names(0x40)}])
    recs = [r for d in sample_node(nvml, "n003", 100.0) for r in decode(orjson.dumps(d))]
    assert [type(r) for r in recs] == [Gpu, Gpu] and [r.gpu for r in recs] == [0, 1]
    topo = Topology.from_job(Job(ts=0.0, job="j", ranks=[RankInfo(rank=g, node="n003", gpu=g) for g in range(2)]))
    det = HardwareDetector(topo)
    found = [f for r in recs for f in det.observe(r)]
    assert {(f.gpu, f.evidence["name"]) for f in found} == {(1, "THROTTLE:hw_thermal"), (1, "HIGH_TEMPERATURE")}


def test_without_a_driver_nvml_is_unavailable_with_a_reason():
    try:
        RealNvml()
    except NvmlUnavailable as e:
        assert "NVML" in str(e)
    else:
        pytest.skip("this machine has a working NVIDIA driver (see the gpu-marked test)")


@pytest.mark.gpu
def test_real_gpus_sample_into_valid_records():
    nvml = RealNvml()
    recs = sample_node(nvml, "local", 1.0)
    assert recs, "no GPU visible"
    for d in recs:
        [r] = decode(orjson.dumps(d))
        assert isinstance(r, Gpu) and r.temp_c is not None and r.power_w is not None
    indices = gpu_indices(nvml)  # every GPU has a bus id, in the kernel's form
    assert sorted(indices.values()) == list(range(len(recs))), indices
    assert all(len(k) == 10 and k.count(":") == 2 for k in indices), indices


@pytest.mark.parametrize("written, key", [("00000000:3B:00.0", "0000:3b:00"), ("0000:3b:00", "0000:3b:00"),
                                          ("PCI:0000:3B:00.0", "0000:3b:00"), ("3b:00", "0000:3b:00"),
                                          ("00000001:07:00.1", "0001:07:00")])
def test_bus_ids_written_by_nvml_and_the_kernel_meet(written, key):
    assert bus_key(written) == key
