"""Benign noise drawn up front (NIC flaps, ECC-ticking GPUs) and the loss / grad-norm curves."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gangwatch.producers.simulate.placement import Topology, rng
from gangwatch.producers.simulate.scenario import Scenario


@dataclass(frozen=True)
class Flap:
    """A NIC link that goes down and comes back: benign, the job only hiccups."""

    node: int
    nic: int
    down_ts: float
    up_ts: float


@dataclass(frozen=True)
class Benign:
    flaps: tuple[Flap, ...]
    ecc_gpus: np.ndarray  # flat GPU ids (node * G + gpu) whose correctable-ECC counter ticks up
    ecc_start: np.ndarray  # int, counter value of every base GPU at the start
    pcie_replay: np.ndarray  # int, constant small replay counts of every base GPU


def plan_benign(sc: Scenario, topo: Topology) -> Benign:
    nz = sc.noise
    n_gpus = topo.n
    r = rng(sc.seed, "benign")
    flaps = []
    for _ in range(nz.nic_flaps if nz.enabled else 0):
        down = sc.start_ts + sc.duration_s * float(r.uniform(0.15, 0.85))
        dur = float(r.uniform(*nz.flap_s))
        flaps.append(Flap(int(r.integers(topo.n_nodes)), int(r.integers(topo.G)), down, down + dur))
    n_ecc = max(1, round(nz.ecc_gpu_frac * n_gpus)) if nz.enabled and nz.ecc_gpu_frac > 0 else 0
    ecc = np.sort(r.choice(n_gpus, size=min(n_ecc, n_gpus), replace=False)) if n_ecc else np.zeros(0, np.int64)
    ecc_start = np.zeros(n_gpus, np.int64)
    if n_ecc:
        ecc_start[ecc] = r.integers(0, 40, size=len(ecc))
    pcie = np.zeros(n_gpus, np.int64)
    if nz.enabled:
        few = r.random(n_gpus) < 0.01
        pcie[few] = r.integers(1, 4, size=int(few.sum()))
    return Benign(tuple(sorted(flaps, key=lambda f: f.down_ts)), ecc, ecc_start, pcie)


def loss_curve(steps: np.ndarray) -> np.ndarray:
    """Slowly decreasing language-model loss."""
    return 1.9 + 4.2 / np.sqrt(1.0 + steps / 150.0)


def grad_curve(steps: np.ndarray) -> np.ndarray:
    return 0.22 + 1.1 / np.sqrt(1.0 + steps / 80.0)


def decaying(steps: np.ndarray, at: np.ndarray, amp: np.ndarray, tau: float) -> np.ndarray:
    """Sum of exponentially decaying bumps of height `amp` starting at steps `at`."""
    out = np.zeros(len(steps))
    for a, h in zip(at.tolist(), amp.tolist(), strict=True):
        d = steps - a
        m = d >= 0
        out[m] += h * np.exp(-d[m] / tau)
    return out
