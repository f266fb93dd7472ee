"""Saved job states of older versions, brought to today's shape in one place.

A job's saved state (`JobCore.state()`: keys v, watermark, max_ts, records, monitor, triage) carries its
version `v`. `JobCore.from_state` passes it through `migrate` first, so every `from_state` below it reads
today's shape only. A state without a version, of a version with no migration, or newer than this code is
refused with a `ValueError` naming the versions.

Adding a migration: when a change alters what a state holds (a key added, renamed or reshaped, a detector added),
raise `STATE_VERSION` by one and add to `MIGRATIONS` the function that turns a whole state of the version before
into one of the new version, setting `v`, and leaves its input unchanged. Then the `from_state` that read the
old shape reads the new one only, and tests/data/states/ gets a state saved by the version before (its README
says how). The values a migration adds are written out in it, not taken from today's classes, so it goes on
making its version's shape when a later version changes them; where it needs a detector's code (packing an old
layout, the empty state of a detector for the job's topology), the tests of the later migration, which start
from literal old states, show whether both still fit together.

A detector's saved `config` is never migrated: `JobMonitor.from_state` replaces it with today's settings.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from gangwatch.detectors.failslow import FailSlowDetector
from gangwatch.detectors.hardware import gpus_from_gpu_last
from gangwatch.detectors.life import JobLifeDetector
from gangwatch.detectors.linkerrors import LinkErrorDetector, nodes_from_links
from gangwatch.detectors.topology import Topology
from gangwatch.schemas.codec import decode_obj

STATE_VERSION = 4

State = dict[str, Any]

# --- version 2 -> 3 ------------------------------------------------------------------------------------------------
# Version 2 grew without a version change; a state saved as version 2 can lack any of what follows, or hold the
# GPUs and links of the hardware and link-error detectors unpacked (issue 11 packed them per node).

_FAILSTOP = {"peer_lost_ts": None, "lost_peer": [], "crashed": {}, "clean": {}, "reported": {}, "late_s": {},
             "stepped": True}  # (a job saved before `stepped` was kept was past start-up)
_HANG = {"stopped_ts": None, "paused": [], "longest": {}}
_FLIGHT_VIEW = {"waits_on": [], "p2p": [], "collectives": {}}
_TRIAGE = {"spares_reported": None, "kept": {}, "replacing": [], "restarting": None, "life": None, "run_ts": None,
           "loops": {}, "shadow": [], "shadow_ops": None, "watch": None, "precedents": [], "acted": []}
_TIMELINE = {"restarts": [], "resolution": None, "attempts": 0, "signature": None, "withdrawn": [], "shadow": False,
             "awaiting": None, "proof": None, "rungs": []}
_STEP_BUFFERS = ("failslow", "slowdown", "sdc")  # detectors whose `buffer` is a steps.StepBuffer
# fail-slow's state from before it calibrated: what it keeps (the rest, baselines of another kind, starts afresh)
_FAILSLOW_KEPT = frozenset({"config", "buffer", "epoch", "warm", "hist", "in_episode", "flag_ts", "clean_run"})


def _fill(d: dict[str, Any], defaults: dict[str, Any]) -> None:
    for k, v in defaults.items():
        if k not in d:
            d[k] = copy.deepcopy(v)


def _v2_to_v3(old: State) -> State:
    state = copy.deepcopy(old)
    dets = state["monitor"]["detectors"]
    topo = Topology.from_job(decode_obj(state["monitor"]["job"]))
    if "linkerrors" not in dets:
        dets["linkerrors"] = LinkErrorDetector(topo).state()
    if "life" not in dets:  # the job record's `starting`, long past, is not reported again
        dets["life"] = {**JobLifeDetector(topo).state(), "pending": []}
    hw, links = dets["hardware"], dets["linkerrors"]
    if "gpu_last" in hw:
        hw["gpus"] = gpus_from_gpu_last(hw.pop("gpu_last"))
    if "links" in links:
        links["nodes"] = nodes_from_links(links.pop("links"))
    for name in _STEP_BUFFERS:
        buf = dets[name]["buffer"]
        _fill(buf, {"lag_upto": buf["closed_upto"], "closed_ts": None})  # (saved before the reorder window: a step
        # was due once it closed)
    _failslow(dets["failslow"], topo)
    _fill(dets["failstop"], _FAILSTOP)
    hang = dets["hang"]
    _fill(hang, {**_HANG, "reports": int(hang["reported"])})
    _fill(dets["sdc"], {"last_agree": [-1] * dets["sdc"]["buffer"]["size"]})
    for sweep in dets["flight"]["pending"].values():
        for _, view in sweep["views"]:
            _fill(view, _FLIGHT_VIEW)
    tri = state["triage"]
    _fill(tri, _TRIAGE)
    for timeline in ([tri["incident"]] if tri["incident"] else []) + tri["waiting"]:
        _fill(timeline, _TIMELINE)
    state["v"] = 3
    return state


def _failslow(fs: dict[str, Any], topo: Topology) -> None:
    """Fail-slow's state in today's shape: one saved before calibration has its baselines learnt again; one saved
    before `calib_ts` was kept has it unknown (judged at once: it calibrated long ago)."""
    if "calib" not in fs or "flag_ts" not in fs:
        empty = FailSlowDetector(topo).state()
        if "calib" not in fs:
            fs.update({k: v for k, v in empty.items() if k not in _FAILSLOW_KEPT})
        _fill(fs, {"flag_ts": empty["flag_ts"]})
    _fill(fs, {"calib_ts": None, "het_wait": False})


# --- version 3 -> 4 ------------------------------------------------------------------------------------------------
# Issue 34 (time you can trust): the `clocks` detector (node clock offsets, the job's own time), and what fail-stop
# keeps to tell a silent rank the gang's steps show alive from a dead one (arrivals, steps, telemetry gaps).

# nothing learned: `newest` comes with the next records
_CLOCKS = {"config": {}, "newest": {}, "nodes": {}, "refs": {}, "open": {}, "top": -1, "touched": [],
           "checked": {}}


def _v3_to_v4(old: State) -> State:
    state = copy.deepcopy(old)
    dets = state["monitor"]["detectors"]
    size = len(state["monitor"]["job"]["ranks"])
    if "clocks" not in dets:
        dets["clocks"] = copy.deepcopy(_CLOCKS)
    # a saved job's arrivals are not known: its ranks count as arrived when last seen (as before: by their times)
    _fill(dets["failstop"], {"now": state["watermark"], "arrived": [None] * size, "last_step": [-1] * size,
                             "step_ts": [None] * size, "milestones": [], "gap_since": {}, "gap_said": [],
                             "lag_since": {}})
    _fill(dets["life"], {"moved_ts": None, "top_step": -1, "failed_step": -1})  # (a move's time not known)
    _fill(dets["sdc"], {"ballots": {}})  # no vote kept: records of steps voted before the save count no more
    state["v"] = 4
    return state


# version N -> the function that turns a state of version N into one of version N + 1
MIGRATIONS: dict[int, Callable[[State], State]] = {2: _v2_to_v3, 3: _v3_to_v4}
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
