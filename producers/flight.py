"""Read PyTorch NCCL/Gloo flight-recorder dumps safely and map them onto `flight` records.

A dump (``torch._C._distributed_c10d._dump_nccl_trace()`` / ``_dump_fr_trace()``,
pickle format 2.x) is a plain dict::

    {"version": "2.10", "comm_lib_version": "...",
     "pg_config": {pg_name: {"name": .., "desc": .., "ranks": "[0, 1, 2, 3]"}},
     "pg_status": {pg_name: {"last_enqueued_collective": 13, "last_started_collective": -1,
                             "last_completed_collective": 12}},
     "entries": [{"collective_seq_id": 13, "p2p_seq_id": 0, "is_p2p": False,
                  "process_group": (pg_name, pg_desc), "profiling_name": "nccl:all_reduce",
                  "state": "scheduled", "input_sizes": [[18696]], "input_dtypes": ["Float"], ...}]}

Only plain data: the pickles hold dicts, lists, tuples, strings, ints, bools and
None, and never refer to a class or function. So the unpickler admits *no*
global at all: a pickle that names any callable (``os.system``, ``builtins.open``,
a custom class) is rejected before anything is called.

Real dumps do not key `pg_config` and `pg_status` alike: PyTorch keys `pg_status`
by the recorder's `pg_id` (a group's uid on that rank), `pg_config` and the
entries by the group's name (Gloo's default group: "" in `pg_config`, "0" in
`pg_status` and the entries; a Megatron rank's TP group: "35" in `pg_config`,
"5" in `pg_status`). Each status key is named by the entries (`pg_id` ->
`process_group[0]`), else by pairing the sorted status keys with the sorted
config names when that agrees with the entries (`_status_names`); a group's
description comes from its entries when the config has none.
"""

from __future__ import annotations

import io
import os
import pickle
import re
from typing import Any

from gangwatch.schemas.codec import size_limit
from gangwatch.schemas.collectives import op_name, p2p_peer
from gangwatch.schemas.records import FLIGHT_STATES

DUMP_LIMIT_ENV = "GANGWATCH_MAX_DUMP_BYTES"
# The largest dump file read (a flight-recorder pickle, a py-spy dump, a kernel log): larger ones are refused by
# their size on disk, before a byte is read. `load_dump(max_bytes=)` overrides it.
MAX_DUMP_BYTES = size_limit(DUMP_LIMIT_ENV, 64 * 1024 * 1024)
_INT_RE = re.compile(r"-?\d+")
_ID_MAX = 256  # the contract's limit on ids (pg, desc, op)


class FlightDumpError(ValueError):
    """The bytes are not a usable flight-recorder dump."""


class UnsafePickleError(pickle.UnpicklingError):
    """The pickle refers to a class or function; refused without calling anything."""


class _PlainDataUnpickler(pickle.Unpickler):
    """An unpickler that builds only builtin containers and scalars.

    `find_class` is the single door through which a pickle reaches code
    (GLOBAL, STACK_GLOBAL, INST and EXT opcodes all go through it; REDUCE, OBJ
    and NEWOBJ need what it returns), so refusing every name here means a
    pickle cannot call anything.
    """

    def find_class(self, module: str, name: str) -> Any:
        raise UnsafePickleError(
            f"refused: the dump refers to {module[:100]}.{name[:100]}; a flight-recorder dump holds only "
            "plain data (dict, list, tuple, str, int, float, bool, None)")

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickleError("refused: the dump uses persistent ids")


def read_bounded(path: str | os.PathLike[str], limit: int, what: str | None = None) -> bytes:
    """The bytes of a file of at most `limit` bytes: a larger one is refused by its size on disk, unread, and
    never read past the limit (it may grow meanwhile). `what` names it in the error (default: "<path> is")."""
    name = what or f"{path} is"
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise FlightDumpError(f"{name} larger than {limit} bytes ({size}): refused unread "
                                  f"({DUMP_LIMIT_ENV} raises the limit)")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise FlightDumpError(f"{name} larger than {limit} bytes: refused")
    return data


def load_dump(src: str | os.PathLike[str] | bytes | bytearray | memoryview,
              max_bytes: int | None = None) -> dict[str, Any]:
    """Parse a flight-recorder dump (the pickle bytes, or a path to them) into its dict; a JSON dump (PyTorch's
    `_dump_nccl_trace_json`, or a pickle converted with `json.dump`) is read as the same dict.

    Raises `UnsafePickleError` for a pickle that names any class or function
    (nothing is executed), and `FlightDumpError` for anything else that is not
    a dump: not a pickle, not a dict, no `entries` list, larger than `max_bytes`
    (default `MAX_DUMP_BYTES`: 64 MiB, or `GANGWATCH_MAX_DUMP_BYTES`). A file is
    measured before it is read, and never read past the limit.
    """
    limit = MAX_DUMP_BYTES if max_bytes is None else max_bytes
    if isinstance(src, (bytes, bytearray, memoryview)):
        if len(src) > limit:
            raise FlightDumpError(f"dump larger than {limit} bytes ({len(src)}): refused unread")
        data = bytes(src)
    else:
        data = read_bounded(src, limit, "dump")
    try:
        obj = _json_dump(data) if data.lstrip()[:1] == b"{" else _PlainDataUnpickler(io.BytesIO(data)).load()
    except UnsafePickleError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, KeyError, IndexError,
            MemoryError, RecursionError, UnicodeDecodeError, OverflowError) as e:
        raise FlightDumpError(f"not a readable flight-recorder pickle: {type(e).__name__}: {str(e)[:200]}") from e
    if not isinstance(obj, dict):
        raise FlightDumpError(f"a flight-recorder dump is a dict, got {type(obj).__name__}")
    if not isinstance(obj.get("entries", []), list):
        raise FlightDumpError("a flight-recorder dump needs an `entries` list")
    return obj


def _json_dump(data: bytes) -> Any:
    import json

    try:
        return json.loads(data)
    except ValueError as e:
        raise FlightDumpError(f"not a readable flight-recorder JSON dump: {str(e)[:200]}") from e


# --- mapping onto the contract ------------------------------------------------------------


_I64 = range(-(2**63), 2**63)  # what the wire (JSON via orjson) carries


def _int(v: Any, default: int | None = -1) -> int | None:
    return v if type(v) is int and v in _I64 else default


def _ranks(v: Any) -> list[int]:
    """Member ranks from a config value: a list, or its string form ``"[0, 1, 2, 3]"``."""
    if isinstance(v, (list, tuple)):
        return [x for x in v if type(x) is int and 0 <= x < 2**63]
    if isinstance(v, str):
        return [int(x) for x in _INT_RE.findall(v) if int(x) >= 0]
    return []


def _numel(sizes: Any) -> int | None:
    """Total elements over all input tensors; None when the sizes are not readable."""
    if not isinstance(sizes, (list, tuple)):
        return None
    total = 0
    for shape in sizes:
        if not isinstance(shape, (list, tuple)) or not all(type(d) is int for d in shape):
            return None
        n = 1
        for d in shape:
            n *= d
        total += n
    return total if total in _I64 else None


def _pg_of(entry: dict[str, Any]) -> tuple[str, str | None]:
    """(pg name, pg desc) of an entry: its `process_group` pair, else its `pg_id`."""
    pg = entry.get("process_group")
    if isinstance(pg, (list, tuple)) and pg:
        desc = pg[1] if len(pg) > 1 and isinstance(pg[1], str) and pg[1] else None
        return str(pg[0])[:_ID_MAX], desc
    return str(entry.get("pg_id", "?"))[:_ID_MAX], None


def _entry(e: dict[str, Any]) -> dict[str, Any] | None:
    if not isinstance(e, dict):
        return None
    pg, _ = _pg_of(e)
    p2p = e.get("is_p2p") is True
    seq = _int(e.get("p2p_seq_id") if p2p else e.get("collective_seq_id"), default=None)
    if seq is None:
        return None
    raw_name = e.get("profiling_name")
    raw_name = raw_name if isinstance(raw_name, str) else "unknown"
    state = e.get("state")
    out: dict[str, Any] = {"seq": seq, "op": op_name(raw_name), "pg": pg,
                           "state": state if state in FLIGHT_STATES else "scheduled"}
    size = _numel(e.get("input_sizes"))
    if size is not None:
        out["size"] = size
    dtypes = e.get("input_dtypes")
    if isinstance(dtypes, (list, tuple)) and dtypes:
        out["dtype"] = ",".join(dict.fromkeys(str(d) for d in dtypes))[:_ID_MAX]
    out["profiling_name"] = raw_name[:_ID_MAX]
    if p2p:
        out["p2p"] = True
        peer = p2p_peer(raw_name)
        if peer is not None:
            out["peer"] = peer
    if state not in FLIGHT_STATES:
        out["raw_state"] = str(state)[:_ID_MAX]
    return out


_UINT_RE = re.compile(r"[0-9]+")


def _entry_pg_names(raw_entries: list[Any]) -> dict[str, str]:
    """The recorder's `pg_id` of each process group this rank's entries name, to that group's name
    (`process_group[0]`); an id seen with two names is left out."""
    seen: dict[str, set[str]] = {}
    for e in raw_entries:
        if not isinstance(e, dict):
            continue
        pid, pg = e.get("pg_id"), e.get("process_group")
        if type(pid) in (int, str) and isinstance(pg, (list, tuple)) and pg:
            seen.setdefault(str(pid)[:_ID_MAX], set()).add(str(pg[0])[:_ID_MAX])
    return {pid: next(iter(names)) for pid, names in seen.items() if len(names) == 1}


def _status_names(keys: list[str], names: list[str], by_id: dict[str, str]) -> dict[str, str]:
    """The group name of each `pg_status` key; a key that cannot be named is left out.

    PyTorch keys `pg_status` by the recorder's `pg_id` (the process group's uid on this rank, counted per
    rank), while `pg_config` and the entries' `process_group` use the group's name (global across ranks): in
    NVIDIA's Megatron dumps (FR 2.9) rank 0's TP group is status "5" and config "35", and "5" on rank 2 is
    another group. So, in this order:

    1. an entry that carries both gives the key's name (its `pg_id` -> `process_group[0]`);
    2. when status and config hold as many groups and all their keys are integers, the i-th smallest status
       key is the i-th smallest config name (uids and names both count up in creation order), provided this
       agrees with every pair the entries gave;
    3. a key that is itself a config name not yet claimed is that group, when nothing showed an id unlike
       its name (ids equal to the names: one group per rank, or a job that made every group on every rank);
       in a dump keyed by local ids only "0" is, the default group, made first on every rank;
    4. one key left and one config name left: each other;
    5. any other key is its own name when nothing showed an id unlike its name; in a dump keyed by local ids
       it names no group and is dropped: its counters would form a group without members that means
       something else on every rank.
    """
    out = {k: by_id[k] for k in keys if k in by_id}
    taken = set(out.values())
    if len(taken) < len(out):  # two ids claim one name: trust neither
        dup = {n for n in taken if sum(v == n for v in out.values()) > 1}
        out = {k: n for k, n in out.items() if n not in dup}
        taken -= dup
    id_keyed = any(k != n for k, n in out.items())
    if (len(keys) == len(names) and all(_UINT_RE.fullmatch(x) for x in keys + names)
            and len(out) < len(keys)):
        pos = dict(zip(sorted(keys, key=int), sorted(names, key=int), strict=True))
        if all(pos[k] == n for k, n in out.items()):
            for k in keys:
                if k not in out and pos[k] not in taken:
                    out[k] = pos[k]
                    taken.add(pos[k])
                    id_keyed = id_keyed or k != pos[k]
    for k in keys:
        if k not in out and k in names and k not in taken and (not id_keyed or k == "0"):
            out[k] = k
            taken.add(k)
    left = [k for k in keys if k not in out]
    free = [n for n in names if n not in taken]
    if len(left) == 1 and len(free) == 1:
        out[left[0]] = free[0]
    elif not id_keyed:
        out.update((k, k) for k in left if k not in taken)
    return out


def _groups(dump: dict[str, Any], entry_desc: dict[str, str], by_id: dict[str, str]) -> list[dict[str, Any]]:
    status = dump.get("pg_status") if isinstance(dump.get("pg_status"), dict) else {}
    config = dump.get("pg_config") if isinstance(dump.get("pg_config"), dict) else {}
    status = {str(k)[:_ID_MAX]: v for k, v in status.items() if isinstance(v, dict)}
    named = [next((str(n)[:_ID_MAX] for n in (key, cfg.get("name")) if n not in (None, "")), None)
             for key, cfg in config.items() if isinstance(cfg, dict)]
    names = list(dict.fromkeys(n for n in named if n is not None))
    to_name = _status_names(list(status), names, by_id)
    status = {to_name[k]: v for k, v in status.items() if k in to_name}
    # pair each config item with a pg name: its key or its `name`, else the one status name left
    configs: dict[str, dict[str, Any]] = {}
    unnamed: list[dict[str, Any]] = []
    for key, cfg in config.items():
        if not isinstance(cfg, dict):
            continue
        names = [str(n)[:_ID_MAX] for n in (key, cfg.get("name")) if n not in (None, "")]
        hit = next((n for n in names if n in status), None) or (names[0] if names else None)
        if hit is None:
            unnamed.append(cfg)
        else:
            configs[hit] = cfg
    left = [k for k in status if k not in configs]
    if len(unnamed) == 1 and len(left) == 1:
        configs[left[0]] = unnamed[0]
    out = []
    for pg in sorted(set(status) | set(configs) | set(entry_desc), key=lambda p: (len(p), p)):
        cfg, st = configs.get(pg, {}), status.get(pg, {})
        desc = cfg.get("desc") if isinstance(cfg.get("desc"), str) and cfg.get("desc") else entry_desc.get(pg)
        group: dict[str, Any] = {
            "pg": pg[:_ID_MAX], "ranks": _ranks(cfg.get("ranks")),
            "last_enqueued": _int(st.get("last_enqueued_collective")),
            "last_started": _int(st.get("last_started_collective")),
            "last_completed": _int(st.get("last_completed_collective")),
        }
        if desc:
            group["desc"] = desc[:_ID_MAX]
        out.append(group)
    return out


def to_flight_record(
    dump: dict[str, Any], *, job: str, rank: int, snapshot: str, ts: float, max_entries: int = 4096,
) -> dict[str, Any]:
    """The contract `flight` record (a JSON-able dict) of one rank's flight-recorder dump.

    `groups` come from `pg_status` (last enqueued / started / completed collective
    sequence ids, -1 when unknown) and `pg_config` (member ranks, description);
    `entries` keep the last `max_entries` recorded operations with their
    per-group sequence id (`p2p_seq_id` for point-to-point ones, marked
    ``"p2p": true`` with the other end's index in the group as ``peer`` when
    the op's name gives it), normalized op name, process group, state, total input
    elements (`size`) and input dtypes. `ts` is the event time in seconds.
    """
    raw_entries = dump.get("entries") or []
    if not isinstance(raw_entries, list):
        raise FlightDumpError("a flight-recorder dump needs an `entries` list")
    entry_desc: dict[str, str] = {}
    for e in raw_entries:
        if isinstance(e, dict):
            pg, desc = _pg_of(e)
            if desc:
                entry_desc.setdefault(pg, desc)
    entries = [x for x in map(_entry, raw_entries[-max_entries:] if max_entries > 0 else []) if x is not None]
    rec: dict[str, Any] = {
        "kind": "flight", "v": 1, "ts": float(ts), "job": job, "rank": int(rank), "snapshot": snapshot,
        "groups": _groups(dump, entry_desc, _entry_pg_names(raw_entries)), "entries": entries,
    }
    version = dump.get("version")
    if isinstance(version, str):
        rec["fr_version"] = version[:64]
    lib = dump.get("comm_lib_version")
    if isinstance(lib, str) and lib:
        rec["comm_lib_version"] = lib[:64]
    return rec
