"""NVML samples of a node's GPUs as contract `gpu` records.

`sample_node(nvml, node, ts)` reads every GPU through an `Nvml` interface:
`RealNvml` wraps nvidia-ml-py (`pynvml`, imported lazily behind one lock), and
`FakeNvml` serves scripted values for tests. A metric the GPU does not support
(or that fails) is left out of its record rather than failing the sample; a
machine without the NVIDIA driver raises `NvmlUnavailable` with the reason.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

# NVML clock-event (throttle) reason bits -> the names the contract's `throttle` list uses
THROTTLE_BITS = {0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x20: "sw_thermal", 0x40: "hw_thermal",
                 0x80: "hw_power_brake"}
_NVLINK_LINKS = 18  # links probed per GPU (H100/H200 have 18)


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used here (no driver, no GPU); the message says why."""


class Nvml(Protocol):
    def count(self) -> int: ...

    def read(self, index: int) -> dict[str, Any]:
        """The `gpu` record fields of GPU `index` that could be read (temp_c, power_w, ...)."""

    def bus_id(self, index: int) -> str | None:
        """GPU `index`'s PCI bus id as NVML writes it (`00000000:3B:00.0`), None when unknown."""


def throttle_names(bits: int) -> list[str]:
    return [name for bit, name in sorted(THROTTLE_BITS.items()) if bits & bit]


def bus_key(bus_id: str) -> str:
    """A PCI bus id in one form whoever wrote it: `dddd:bb:ss` in lower case, the domain cut to its last four
    digits and the function dropped (NVML writes `00000000:3B:00.0`, the kernel's Xid lines `0000:3b:00`)."""
    head = bus_id.strip().lower().removeprefix("pci:").split(".")[0]
    parts = head.split(":")
    if len(parts) == 2:  # bus:slot without a domain
        parts = ["0000", *parts]
    return ":".join([parts[0][-4:].rjust(4, "0"), *parts[1:]])


def gpu_indices(nvml: Nvml) -> dict[str, int]:
    """PCI bus id (`bus_key`) -> GPU index, for naming the GPU of a kernel-log event by its bus id."""
    out = {}
    for i in range(nvml.count()):
        bus = nvml.bus_id(i)
        if bus:
            out[bus_key(bus)] = i
    return out


def sample_node(nvml: Nvml, node: str, ts: float) -> list[dict[str, Any]]:
    """One `gpu` record per GPU of the node at event time `ts`."""
    return [{"kind": "gpu", "v": 1, "ts": ts, "node": node, "gpu": i, **nvml.read(i)} for i in range(nvml.count())]


class RealNvml:
    """nvidia-ml-py behind the `Nvml` interface."""

    _lock = threading.Lock()
    _initialized = False

    def __init__(self) -> None:
        try:
            import pynvml  # nvidia-ml-py
        except ImportError as e:  # pragma: no cover - a dependency of the package
            raise NvmlUnavailable(f"nvidia-ml-py is not installed: {e}") from e
        self.nv = pynvml
        with RealNvml._lock:
            if not RealNvml._initialized:
                try:
                    pynvml.nvmlInit()
                except pynvml.NVMLError as e:
                    raise NvmlUnavailable(f"NVML cannot start here (no NVIDIA driver or GPU?): {e}") from e
                RealNvml._initialized = True

    def count(self) -> int:
        return self.nv.nvmlDeviceGetCount()

    def read(self, index: int) -> dict[str, Any]:
        nv = self.nv
        h = nv.nvmlDeviceGetHandleByIndex(index)
        out: dict[str, Any] = {}

        def put(name: str, fn: Callable[[], Any]) -> None:
            try:
                out[name] = fn()
            except nv.NVMLError:
                pass  # not supported on this GPU: leave the field out

        put("temp_c", lambda: float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)))
        put("power_w", lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0)
        put("sm_clock_mhz", lambda: float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)))
        put("util_pct", lambda: float(nv.nvmlDeviceGetUtilizationRates(h).gpu))
        put("throttle", lambda: throttle_names(_clock_event_reasons(nv, h)))
        put("ecc_sbe", lambda: int(nv.nvmlDeviceGetTotalEccErrors(h, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                                                                    nv.NVML_VOLATILE_ECC)))
        put("ecc_dbe", lambda: int(nv.nvmlDeviceGetTotalEccErrors(h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                                                    nv.NVML_VOLATILE_ECC)))
        put("remap_pending", lambda: bool(nv.nvmlDeviceGetRemappedRows(h)[2]))
        put("pcie_replay", lambda: int(nv.nvmlDeviceGetPcieReplayCounter(h)))
        crc = 0
        for link in range(_NVLINK_LINKS):
            try:
                crc += int(nv.nvmlDeviceGetNvLinkErrorCounter(h, link, nv.NVML_NVLINK_ERROR_DL_CRC_DATA))
            except nv.NVMLError:
                continue
        if crc:
            out["nvlink_crc"] = crc
        return out

    def bus_id(self, index: int) -> str | None:
        nv = self.nv
        try:
            bus = nv.nvmlDeviceGetPciInfo(nv.nvmlDeviceGetHandleByIndex(index)).busId
        except nv.NVMLError:
            return None
        return bus.decode() if isinstance(bus, bytes) else str(bus)


def _clock_event_reasons(nv: Any, handle: Any) -> int:
    """The active throttle-reason bits of a GPU, on old and new drivers alike.

    Drivers from R535 (and nvidia-ml-py 12.535) call it "clock event reasons"; older
    drivers only have the call under its first name, "clocks throttle reasons". The
    bits are the same.
    """
    try:
        return nv.nvmlDeviceGetCurrentClocksEventReasons(handle)
    except (AttributeError, nv.NVMLError_FunctionNotFound):  # an older nvidia-ml-py, or an older driver
        return nv.nvmlDeviceGetCurrentClocksThrottleReasons(handle)


@dataclass
class FakeNvml:
    """Scripted GPUs for tests: `gpus[i]` are the fields GPU i reports, `bus_ids[i]` its PCI bus id."""

    gpus: list[dict[str, Any]] = field(default_factory=list)
    bus_ids: list[str] = field(default_factory=list)

    def count(self) -> int:
        return len(self.gpus)

    def read(self, index: int) -> dict[str, Any]:
        return dict(self.gpus[index])

    def bus_id(self, index: int) -> str | None:
        return self.bus_ids[index] if index < len(self.bus_ids) else None
