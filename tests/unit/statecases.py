"""A small job's records for the saved-state tests: 2 nodes x 2 GPUs, one rank each, one pipeline stage.

`records(lo, hi)` gives training steps [lo, hi) with what the nodes report meanwhile, in event-time order (the
job record first when `lo` is 0). Everything is a plain function of the step number, so any code version makes
the same records: tests/data/states/make_old_state.py feeds steps [0, SAVED) to an old version and saves its
state; the tests feed the rest to today's code. Along the way:

- rank 2 (GPU 0 of n1) computes 30 % longer from step `SLOW_FROM` on: a straggler (whose node
  today's code replaces before the save);
- GPU 1 of n0 replays PCIe packets at 2/s from the start (a degrading link), GPU 0 of n1 from `SLOW_FROM` on,
  GPU 0 of n0 from `LATE_LINK` on (after the save);
- GPU 0 of n1 gets 200 correctable ECC errors between two samples at step 40 and throttles (hw_thermal) from
  step 85 on; GPU 1 of n1 runs at 90 C at steps 50 and 150.

Only `gangwatch.schemas` is used, whose record types every version shares.
"""

from __future__ import annotations

from collections.abc import Iterator

from gangwatch.schemas import Gpu, Heartbeat, Job, RankInfo, Record, Step

JOB = "mig"
NODES = ("n0", "n1")
START = 10.0  # event time of step 0; the job record is at 0
SAVED = 100  # the saved states hold steps [0, SAVED)
SLOW_FROM = 70
LATE_LINK = 130
END = 200  # the tests run the job to here
SAMPLE_EVERY = 5  # steps between two NVML samples of a GPU (and between heartbeats)


def job() -> Job:
    ranks = [RankInfo(rank=2 * n + g, node=node, gpu=g) for n, node in enumerate(NODES) for g in range(2)]
    return Job(ts=0.0, job=JOB, ranks=ranks, heartbeat_s=5.0)


def _compute(rank: int, step: int) -> float:
    jitter = ((rank * 7 + step * 13) % 11 - 5) / 250  # deterministic, within +-2 %
    return 0.7 * (1 + jitter) * (1.3 if rank == 2 and step >= SLOW_FROM else 1.0)


def _gpu(node: int, gpu: int, step: int, ts: float) -> Gpu:
    sample = step // SAMPLE_EVERY
    link = {(0, 1): 0, (1, 0): SLOW_FROM, (0, 0): LATE_LINK}.get((node, gpu))
    hot = (node, gpu) == (1, 1) and step in (50, 150)
    return Gpu(ts=ts, node=NODES[node], gpu=gpu, temp_c=90.0 if hot else 60.0,
               ecc_sbe=200 if (node, gpu) == (1, 0) and step >= 40 else 0,
               throttle=["hw_thermal"] if (node, gpu) == (1, 0) and step >= 85 else [],
               pcie_replay=10 * sample if link is not None and step >= link else 0, nvlink_crc=0)


def records(lo: int, hi: int) -> Iterator[Record]:
    if lo == 0:
        yield job()
    for step in range(lo, hi):
        ts = START + step
        computes = [_compute(r, step) for r in range(4)]
        step_s = max(computes) + 0.3
        for r, c in enumerate(computes):
            yield Step(ts=ts + 0.01 * r, job=JOB, rank=r, step=step, step_s=step_s, compute_s=c,
                       comm_wait_s=step_s - c)
        if step % SAMPLE_EVERY == 0:
            for r in range(4):
                yield Heartbeat(ts=ts + 0.5, job=JOB, rank=r, step=step)
            for n in range(2):
                for g in range(2):
                    yield _gpu(n, g, step, ts + 0.6)
