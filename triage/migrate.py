"""Saved job states of older versions, brought to today's shape in one place.

A job's saved state (`JobCore.state()`: keys v, watermark, max_ts, records, monitor, triage) carries its
version `v`. `JobCore.from_state` passes it through `migrate` first, so every `from_state` below it reads
today's shape only. A state without a version, of a version with no migration, or newer than this code is
refused with a `ValueError` naming the versions.

Adding a migration: when a change alters what a state holds (a key added, renamed or reshaped, a detector added),
raise `STATE_VERSION` by one and add to `MIGRATIONS` the function that turns a whole state of the version before
into one of the new version, setting `v`, and leaves its input unchanged. What a detector keeps is its own: the
function calls `_detectors`, and each detector of the catalog brings its part up to date in its `upgrade_state`
(`detectors.base.DetectorBase`); this module keeps the versions and what the rest of the state (triage) holds.
Then the `from_state` that read the old shape reads the new one only, and tests/data/states/ gets a state saved
by the version before (its README says how). The values a migration adds are written out in it, not taken from
today's classes, so it goes on making its version's shape when a later version changes them; where it needs a
detector's code (packing an old layout, the empty state of a detector for the job's topology), the tests of the
later migration, which start from literal old states, show whether both still fit together.

A detector's saved `config` is never migrated: `JobMonitor.from_state` replaces it with today's settings.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from gangwatch.detectors.base import SavedJob, fill_missing
from gangwatch.detectors.catalog import DEFAULT_DETECTORS

STATE_VERSION = 6

State = dict[str, Any]


def _detectors(state: State, version: int) -> None:
    """Each detector of the catalog brings its part of `state` (a copy, saved by `version`) to `version + 1`."""
    dets = state["monitor"]["detectors"]
    job = SavedJob(state["monitor"]["job"], state["watermark"])
    for cls in DEFAULT_DETECTORS:  # (a detector added in a version is appended: the order they were added in)
        det = cls.upgrade_state(dets.get(cls.name), version, job)
        if det is not None:
            dets[cls.name] = det


# --- version 2 -> 3 ------------------------------------------------------------------------------------------------
# Version 2 grew without a version change; a state saved as version 2 can lack any of what follows (and of what its
# detectors add: the link-error and life detectors, ...), or hold the GPUs and links of the hardware and link-error
# detectors unpacked (issue 11 packed them per node).

_TRIAGE = {"spares_reported": None, "kept": {}, "replacing": [], "restarting": None, "life": None, "run_ts": None,
           "loops": {}, "shadow": [], "shadow_ops": None, "watch": None, "precedents": [], "acted": []}
_TIMELINE = {"restarts": [], "resolution": None, "attempts": 0, "signature": None, "withdrawn": [], "shadow": False,
             "awaiting": None, "proof": None, "rungs": []}


def _v2_to_v3(old: State) -> State:
    state = copy.deepcopy(old)
    _detectors(state, 2)
    tri = state["triage"]
    fill_missing(tri, _TRIAGE)
    for timeline in ([tri["incident"]] if tri["incident"] else []) + tri["waiting"]:
        fill_missing(timeline, _TIMELINE)
    state["v"] = 3
    return state


# --- version 3 -> 4 ------------------------------------------------------------------------------------------------
# Issue 34 (time you can trust): the `clocks` detector (node clock offsets, the job's own time), and what fail-stop
# keeps to tell a silent rank the gang's steps show alive from a dead one (arrivals, steps, telemetry gaps): all of
# it the detectors' own.


def _v3_to_v4(old: State) -> State:
    state = copy.deepcopy(old)
    _detectors(state, 3)
    state["v"] = 4
    return state


# --- version 4 -> 5 ------------------------------------------------------------------------------------------------
# Issue 42 (one truth whatever the weather): the clock counts heartbeats and nodes' steps, the hang detector keeps
# its stall clock and the job's time apart, fail-stop says when the job ended by silence, and an incident names the
# node swapped to tell a node from code. (Version 4 states were saved both without these, by stop 40, and with
# them, by later commits that added them without a version change: either restores.)


def _v4_to_v5(old: State) -> State:
    state = copy.deepcopy(old)
    _detectors(state, 4)
    tri = state["triage"]
    for timeline in ([tri["incident"]] if tri["incident"] else []) + tri["waiting"]:
        fill_missing(timeline, {"swapped": []})  # no node swapped (from_dict's default)
    state["v"] = 5
    return state


# --- version 5 -> 6 ------------------------------------------------------------------------------------------------
# Issue 42: the clock keeps each node's wall clock against its monotonic clock (`detectors/clocksteps.py`).


def _v5_to_v6(old: State) -> State:
    state = copy.deepcopy(old)
    _detectors(state, 5)
    state["v"] = 6
    return state


# version N -> the function that turns a state of version N into one of version N + 1
MIGRATIONS: dict[int, Callable[[State], State]] = {2: _v2_to_v3, 3: _v3_to_v4, 4: _v4_to_v5, 5: _v5_to_v6}
OLDEST = min(MIGRATIONS)


def migrate(state: State) -> State:
    """`state`, a job state saved by this or an older version, in today's shape (`STATE_VERSION`); `state`
    itself when it is of today's version, else a new one (`state` is not changed)."""
    v = state.get("v")
    if v == STATE_VERSION:
        return state
    known = f"this gangwatch restores job state versions {OLDEST} to {STATE_VERSION}"
    if "v" not in state:
        raise ValueError(f"a job state without a version (\"v\") cannot be restored: {known}")
    if type(v) is int and v > STATE_VERSION:
        raise ValueError(f"job state version {v} is newer than this gangwatch's ({STATE_VERSION}): {known}; "
                         "restore it with the version that saved it or a later one")
    if type(v) is not int or v not in MIGRATIONS:
        raise ValueError(f"job state version {v!r} cannot be restored: {known}")
    for n in range(v, STATE_VERSION):
        state = MIGRATIONS[n](state)
    return state
