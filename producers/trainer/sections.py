"""Timing the sections of a step (`compute`, `comm_wait`, `data_wait`, or any name).

    with client.section("compute"):
        loss = model(batch).sum()
        loss.backward()

Each section name has one reusable timer object, so entering one costs two
clock reads and a dict update (no allocation). Time of the same name adds up
within a step (forward and backward in two blocks, micro-batches); a name
cannot be open twice at once, and sections belong to the training thread.

On CPU a section is wall clock (`time.perf_counter`). With CUDA timing
(`TrainerClient(cuda=True)`) a section records a pair of CUDA events on the
current stream instead, because the host only *launches* GPU work: the time
the GPU spent is known only when the events have completed. The training
thread never waits for that: the pairs travel with the step, and the sending
thread asks `Event.query()` and reads `elapsed_time` once the GPU got there.
`data_wait` is always wall clock: it is the host waiting for its data loader.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

CudaPair = tuple[str, Any, Any]  # (section name, start event, end event)


class CpuSection:
    """A wall-clock timer that adds its time to `totals[name]` on exit (the client empties `totals` per step)."""

    __slots__ = ("name", "_totals", "_timer", "_t0")

    def __init__(self, name: str, totals: dict[str, float], timer: Callable[[], float]) -> None:
        self.name, self._totals, self._timer, self._t0 = name, totals, timer, 0.0

    def __enter__(self) -> CpuSection:
        self._t0 = self._timer()
        return self

    def __exit__(self, *exc: object) -> None:
        totals = self._totals
        totals[self.name] = totals.get(self.name, 0.0) + self._timer() - self._t0


class CudaSection:
    """A pair of CUDA events around the section, appended to `pairs` (the client empties it per step)."""

    __slots__ = ("name", "_pairs", "_events", "_start")

    def __init__(self, name: str, pairs: list[CudaPair], events: EventPool) -> None:
        self.name, self._pairs, self._events, self._start = name, pairs, events, None

    def __enter__(self) -> CudaSection:
        self._start = self._events.take()
        self._start.record()
        return self

    def __exit__(self, *exc: object) -> None:
        end = self._events.take()
        end.record()
        self._pairs.append((self.name, self._start, end))


class EventPool:
    """Timing-enabled CUDA events, reused once resolved (creating one per section would cost more)."""

    def __init__(self, make: Callable[[], Any] | None = None) -> None:
        if make is None:
            import torch

            make = lambda: torch.cuda.Event(enable_timing=True)
        self._make = make
        self._free: deque = deque()

    def take(self) -> Any:
        try:
            return self._free.pop()
        except IndexError:
            return self._make()

    def give_back(self, pairs: list[CudaPair]) -> None:
        for _, start, end in pairs:
            self._free.append(start)
            self._free.append(end)


def resolve(pairs: list[CudaPair], wait: bool = False) -> dict[str, float] | None:
    """Seconds per section name once every pair has completed; None while the GPU is still behind.

    `wait=True` synchronizes on the events instead (only when closing: the step loop is over).
    """
    for _, _, end in pairs:
        if wait:
            end.synchronize()
        elif not end.query():
            return None
    totals: dict[str, float] = {}
    for name, start, end in pairs:
        totals[name] = totals.get(name, 0.0) + start.elapsed_time(end) / 1000.0
    return totals
