"""GPU samples from NVML every few seconds, as `gpu` records (producers/nvml.py does the reading).

NVML needs no privilege. On a machine without the NVIDIA driver, or where NVML
sees no GPU, `open_nvml` says so once in the log and returns None: the agent
then runs without this collector. DCGM is not used.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from gangwatch.producers.nvml import Nvml, NvmlUnavailable, sample_node

log = logging.getLogger("gangwatch.agent")


def open_nvml(factory: Callable[[], Nvml]) -> Nvml | None:
    """NVML from `factory` (normally `RealNvml`), or None with the reason in the log."""
    try:
        nvml = factory()
        count = nvml.count()
    except NvmlUnavailable as e:
        log.warning("no GPU samples: %s; the other collectors run", e)
        return None
    if not count:
        log.warning("no GPU samples: NVML sees no GPU; the other collectors run")
        return None
    log.info("sampling %d GPUs through NVML", count)
    return nvml


class GpuSampler:
    """The GPU collector: one `gpu` record per GPU of `node` every `every_s` seconds."""

    name = "GPU samples"

    def __init__(self, nvml: Nvml, node: str, every_s: float) -> None:
        self.nvml, self.node, self.every_s = nvml, node, every_s

    def poll(self, now: float) -> list[dict[str, Any]]:
        return sample_node(self.nvml, self.node, now)

    def close(self) -> None:
        """NVML stays initialised for the life of the process."""
