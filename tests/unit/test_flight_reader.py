"""The flight-recorder reader names each `pg_status` counter set by its group.

PyTorch keys `pg_status` by the recorder's `pg_id` (a process group's uid on
that rank), while `pg_config` and every entry's `process_group` use the
group's name; in many-group jobs (Megatron's TP/PP/DP/EP groups) the two
differ, and an id may even equal another group's name. The dumps here are
made in the test: plain dicts of the shape PyTorch pickles (FR 2.9), with
made-up content.
"""

from __future__ import annotations

import pickle
from typing import Any

from gangwatch.producers.flight import load_dump, to_flight_record


def _status(enq: int, done: int) -> dict[str, int]:
    return {"last_enqueued_collective": enq, "last_started_collective": -1, "last_completed_collective": done}


def _entry(pg_id: int, name: str, desc: str, seq: int, state: str = "completed") -> dict[str, Any]:
    return {"record_id": seq, "pg_id": pg_id, "process_group": (name, desc), "thread_name": "main",
            "thread_id": "1", "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq,
            "profiling_name": "nccl:all_reduce", "time_created_ns": 1, "input_sizes": [[8]],
            "input_dtypes": ["Float"], "output_sizes": [[8]], "output_dtypes": ["Float"], "state": state,
            "time_discovered_started_ns": None, "time_discovered_completed_ns": None, "retired": False,
            "timeout_ms": 600000, "is_p2p": False}


def _groups(dump: dict[str, Any]) -> dict[str, tuple[str | None, list[int], int, int]]:
    rec = to_flight_record(load_dump(pickle.dumps(dump, protocol=2)), job="j", rank=0, snapshot="s", ts=1.0)
    return {g["pg"]: (g.get("desc"), g["ranks"], g["last_enqueued"], g["last_completed"]) for g in rec["groups"]}


def _rank0_dump() -> dict[str, Any]:
    # rank 0 of 4 made groups in this order: world (name "0", id 0), a DP group (name "5", id 1), a TP group
    # (name "12", id 5: rank 0 also made, and was left out of, groups between) and an EP group (name "17", id 6)
    return {
        "version": "2.9", "nccl_version": "2.21.5",
        "pg_config": {
            "0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"},
            "5": {"name": "5", "desc": "DATA_PARALLEL_GROUP", "ranks": "[0, 2]"},
            "12": {"name": "12", "desc": "TENSOR_MODEL_PARALLEL_GROUP", "ranks": "[0, 1]"},
            "17": {"name": "17", "desc": "EXPERT_MODEL_PARALLEL_GROUP", "ranks": "[0, 1, 2, 3]"},
        },
        "pg_status": {"0": _status(40, 40), "1": _status(120, 120), "5": _status(9003, 9001), "6": _status(77, 76)},
        "entries": [_entry(5, "12", "TENSOR_MODEL_PARALLEL_GROUP", s) for s in range(8994, 9002)]
        + [_entry(5, "12", "TENSOR_MODEL_PARALLEL_GROUP", s, "scheduled") for s in (9002, 9003)]
        + [_entry(6, "17", "EXPERT_MODEL_PARALLEL_GROUP", 77, "scheduled")],
    }


def test_pg_status_keyed_by_local_ids_comes_out_keyed_by_group_name():
    groups = _groups(_rank0_dump())
    assert groups == {
        "0": ("default_pg", [0, 1, 2, 3], 40, 40),
        "5": ("DATA_PARALLEL_GROUP", [0, 2], 120, 120),  # id 1: no entries, the sorted pairing names it
        "12": ("TENSOR_MODEL_PARALLEL_GROUP", [0, 1], 9003, 9001),  # id 5, by its entries (not group "5")
        "17": ("EXPERT_MODEL_PARALLEL_GROUP", [0, 1, 2, 3], 77, 76),  # id 6, by its entry
    }


def test_the_sorted_pairing_is_not_trusted_when_the_entries_contradict_it():
    dump = _rank0_dump()
    # rank 0 of another job: id 1 is the TP group, so uids do not follow the names' order here
    dump["entries"] = [_entry(1, "12", "TENSOR_MODEL_PARALLEL_GROUP", 120, "scheduled")]
    groups = _groups(dump)
    # the default group is "0" on every rank; ids 5 and 6 are left unnamed ("5" is also a group's name, by
    # chance): their counters are dropped, not put on group "5" nor made groups without members
    assert groups == {
        "0": ("default_pg", [0, 1, 2, 3], 40, 40),
        "5": ("DATA_PARALLEL_GROUP", [0, 2], -1, -1),
        "12": ("TENSOR_MODEL_PARALLEL_GROUP", [0, 1], 120, 120),
        "17": ("EXPERT_MODEL_PARALLEL_GROUP", [0, 1, 2, 3], -1, -1),
    }


def test_hashed_group_names_are_named_by_the_entries_and_a_lone_leftover_by_elimination():
    dump = {
        "version": "2.9",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"},
                      "a1b2": {"name": "a1b2", "desc": "split_tp", "ranks": "[0, 1]"},
                      "c3d4": {"name": "c3d4", "desc": "split_dp", "ranks": "[0, 1]"}},
        "pg_status": {"0": _status(3, 3), "1": _status(10, 9), "2": _status(5, 5)},
        "entries": [_entry(1, "a1b2", "split_tp", 10, "scheduled")],
    }
    groups = _groups(dump)
    assert groups == {"0": ("default_pg", [0, 1], 3, 3), "a1b2": ("split_tp", [0, 1], 10, 9),
                      "c3d4": ("split_dp", [0, 1], 5, 5)}


def test_status_keyed_by_name_reads_as_before():
    dump = _rank0_dump()
    dump["pg_status"] = {"0": _status(40, 40), "5": _status(120, 120), "12": _status(9003, 9001),
                         "17": _status(77, 76)}
    for e in dump["entries"]:
        e["pg_id"] = int(e["process_group"][0])
    assert _groups(dump) == _groups(_rank0_dump())
