"""Decode and encode wire-contract v1 messages.

`decode(data)` takes one message (bytes or str: a Kafka value or a JSONL line) and
returns a list: one record, or one per item of a `batch`, and a `DecodeError` value
in place of every part that fails validation. It never raises on bad input and
never drops anything silently: every item is either a record or an error.

Validators are compiled once per kind from the dataclass annotations in
`schemas.records`, so the contract is written down in exactly one place.

Batches of steps decoded as columns (`decode(..., columns=True)` -> `StepRows`) are
built in `schemas.columns`, from the same per-field fast checks (`fast_test`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
from gangwatch.schemas.records import KINDS, VERSION, WIRE_NAMES, Record
from gangwatch.schemas.validators import BUILDERS, Invalid, join_path, type_name, unwrap

if TYPE_CHECKING:
    from gangwatch.schemas.columns import StepRows

MESSAGE_LIMIT_ENV = "GANGWATCH_MAX_MESSAGE_BYTES"


def size_limit(env_name: str, default: int) -> int:
    """A byte limit from the environment variable `env_name` (a positive integer), else `default`."""
    value = os.environ.get(env_name, "").strip()
    if not value:
        return default
    if not value.isascii() or not value.isdigit() or int(value) <= 0:
        raise ValueError(f"{env_name} must be a positive number of bytes, got {value!r}")
    return int(value)


# The largest Kafka message value or JSONL line decoded (the producers' own limit: the trainer client and the
# worker send batches of up to 16 MiB); longer ones are refused unparsed. `decode(max_bytes=)` overrides it.
MAX_MESSAGE_BYTES = size_limit(MESSAGE_LIMIT_ENV, 16 * 1024 * 1024)
MAX_BATCH_ITEMS = 1_000_000
_RAW_KEEP = 4096  # characters of the offending message kept in an error


@dataclass(frozen=True, slots=True)
class DecodeError:
    """Why one message (or one item of a batch) was rejected.

    `field` is a dotted path into the message (e.g. ``items[3].rank``), empty when the
    whole message is at fault; `raw` is the offending text as it came (an item of a batch:
    re-encoded from what was parsed), cut to a few KiB.
    """

    reason: str
    field: str = ""
    kind: str | None = None
    index: int | None = None
    raw: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"reason": self.reason, "field": self.field, "kind": self.kind, "index": self.index, "raw": self.raw}

    def __str__(self) -> str:
        where = f" at {self.field}" if self.field else ""
        return f"{self.kind or 'message'}{where}: {self.reason}"


# --- decode ------------------------------------------------------------------------


def _raw_text(data: bytes | str) -> str:
    """The start of the message as text: only its first bytes are decoded, however long it is."""
    text = data[:_RAW_KEEP] if isinstance(data, str) else data[:_RAW_KEEP * 4].decode("utf-8", "replace")
    return text[:_RAW_KEEP]


def oversized(size: int, limit: int, what: str = "message") -> DecodeError:
    """The error for a message, line or file of `size` bytes over `limit`: refused before it is parsed."""
    return DecodeError(f"{what} larger than {limit} bytes ({size}): refused unread", "", None)


def _loads(data: bytes | str) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        # orjson rejects the NaN / Infinity tokens that Python's json writes; accept them
        # here and let field validation decide where non-finite numbers are allowed.
        return json.loads(data, parse_int=_int64)


def _int64(text: str) -> int | float:
    """An integer beyond 64 bits becomes a float, as JavaScript reads it (an infinity when too long even for a
    float): orjson cannot write it back, and in a field that must be an integer it fails that field's check,
    for its own record only (not a whole batch)."""
    value = int(text)
    if -(1 << 63) <= value < (1 << 64):
        return value
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


@functools.cache
def _column_builder(heartbeats: bool) -> Callable[[list], StepRows | None]:
    """What `decode(columns=True)` offers a batch's items to (imported on first use: columns imports this module)."""
    from gangwatch.schemas.columns import compile_mixed_rows, compile_step_rows

    return compile_mixed_rows() if heartbeats else compile_step_rows()


def decode(data: bytes | str, max_bytes: int | None = None, *, columns: bool = False,
           heartbeats: bool = False) -> list[Record | DecodeError | StepRows]:
    """Decode one message into records; errors come back as `DecodeError` values, in place.

    A message longer than `max_bytes` (default `MAX_MESSAGE_BYTES`, from `GANGWATCH_MAX_MESSAGE_BYTES`) is one
    error, `message larger than N bytes`, checked before any parsing. With `columns`, a batch of steps of
    one job that are valid as they stand comes back as one `StepRows` (the same records, as columns); with
    `heartbeats` too, a batch of such steps and heartbeats of one job, in their order.
    """
    limit = MAX_MESSAGE_BYTES if max_bytes is None else max_bytes
    if len(data) > limit:
        return [dataclasses.replace(oversized(len(data), limit), raw=_raw_text(data))]
    try:
        obj = _loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        return [DecodeError(f"not valid JSON: {str(e)[:200]}", raw=_raw_text(data))]
    if type(obj) is not dict:
        return [DecodeError(f"expected a JSON object, got {type_name(obj)}", raw=_raw_text(data))]
    kind = obj.get("kind")
    if kind != "batch":
        v = obj.get("v")
        if type(kind) is str and type(v) is int and v == VERSION and kind in KINDS:  # the common case first
            try:
                return [BUILDERS[kind](obj, "")]
            except (Invalid, RecursionError):
                pass
        return [decode_obj(obj, raw=_raw_text(data))]
    head = _check_envelope(obj, "", batch=True)
    if head is not None:
        return [dataclasses.replace(head, raw=_raw_text(data))]
    items = obj.get("items")
    if type(items) is not list:
        return [DecodeError("a batch needs an `items` array", "items", "batch", raw=_raw_text(data))]
    if len(items) > MAX_BATCH_ITEMS:
        return [DecodeError(f"batch larger than {MAX_BATCH_ITEMS} items", "items", "batch", raw=_raw_text(data))]
    if columns:
        rows = _column_builder(heartbeats)(items)
        if rows is not None:
            return [rows]
    out: list[Record | DecodeError | StepRows] = []
    builders = BUILDERS
    for i, item in enumerate(items):
        if type(item) is dict:  # the common case first: a valid record of a known kind (else the checks below)
            kind, v = item.get("kind"), item.get("v")
            if type(kind) is str and type(v) is int and v == VERSION and kind in KINDS:
                try:
                    out.append(builders[kind](item, ""))
                    continue
                except (Invalid, RecursionError):
                    pass
        if type(item) is not dict:
            out.append(DecodeError(f"expected an object, got {type_name(item)}", f"items[{i}]", index=i,
                                   raw=_raw_text(orjson.dumps(item, option=orjson.OPT_SERIALIZE_NUMPY))))
            continue
        rec = decode_obj(item, index=i)
        if item.get("kind") == "batch" and not isinstance(rec, DecodeError):
            rec = DecodeError("a batch cannot contain a batch", f"items[{i}].kind", "batch", i)
        out.append(rec)
    return out


def _check_envelope(obj: dict, path: str, batch: bool = False) -> DecodeError | None:
    kind = obj.get("kind")
    if type(kind) is not str:
        return DecodeError("missing or non-string `kind`", join_path(path, "kind"))
    if not batch and kind not in KINDS:
        return DecodeError(f"unknown kind {kind[:64]!r}", join_path(path, "kind"))
    v = obj.get("v")
    if type(v) is not int or v != VERSION:
        return DecodeError(f"unsupported version {v!r:.32}; this reader speaks v{VERSION}", join_path(path, "v"), kind)
    ts = obj.get("ts")
    if batch and ts is not None and (type(ts) not in (int, float) or not math.isfinite(ts)):
        return DecodeError("`ts` must be a finite number", join_path(path, "ts"), kind)
    return None


def decode_obj(obj: dict, index: int | None = None, raw: str | None = None) -> Record | DecodeError:
    """Validate one already-parsed JSON object (one record, not a batch); an error keeps `raw` (the text it
    came as), else the object encoded again."""
    kind, v = obj.get("kind"), obj.get("v")
    if type(kind) is not str or type(v) is not int or v != VERSION or kind not in KINDS:  # else: no error
        head = _check_envelope(obj, "")
        if head is not None:
            return dataclasses.replace(head, index=index, raw=_raw_obj(obj) if raw is None else raw)
    try:
        return BUILDERS[kind](obj, "")
    except Invalid as e:
        path = f"items[{index}].{e.path}" if index is not None else e.path
        return DecodeError(e.reason, path, kind, index, _raw_obj(obj) if raw is None else raw)
    except RecursionError:
        return DecodeError("nested too deeply", "", kind, index, raw or "")


def _raw_obj(obj: dict) -> str:
    try:
        return orjson.dumps(obj).decode()[:_RAW_KEEP]
    except (TypeError, orjson.JSONEncodeError):  # a value orjson cannot write, or nested deeper than it goes
        try:
            return repr(obj)[:_RAW_KEEP]
        except RecursionError:
            return ""


# --- encode ------------------------------------------------------------------------


def _encoder(cls: type) -> Callable[[Any], dict]:
    plan = []  # (attr, wire, omit when None)
    for f in dataclasses.fields(cls):
        if f.name in ("extra", "kind"):
            continue
        plan.append((f.name, WIRE_NAMES.get(f.name, f.name), f.default is None))
    kind = cls.__dataclass_fields__["kind"].default if "kind" in cls.__dataclass_fields__ else None

    def to_dict(rec: Any) -> dict:
        out: dict[str, Any] = {"kind": kind, "v": VERSION} if kind else {}
        for attr, wire, omit_none in plan:
            v = getattr(rec, attr)
            if v is None and omit_none:
                continue
            out[wire] = _plain(v)
        if rec.extra:
            for k, v in rec.extra.items():
                out.setdefault(k, v)
        return out

    return to_dict


def _plain(v: Any) -> Any:
    t = type(v)
    if t is float:
        return v if math.isfinite(v) else ("NaN" if v != v else ("Infinity" if v > 0 else "-Infinity"))
    if t is list:
        return [_plain(x) for x in v]
    enc = _ENCODERS.get(t)  # a record, or a record's part (RankInfo, ...): every dataclass of the contract
    return v if enc is None else enc(v)


_ENCODERS: dict[type, Callable[[Any], dict]] = {}
for _cls in list(KINDS.values()):
    _ENCODERS[_cls] = _encoder(_cls)
    for _hint in typing.get_type_hints(_cls, include_extras=True).values():
        _inner = typing.get_args(unwrap(_hint)[0])
        if _inner and dataclasses.is_dataclass(unwrap(_inner[0])[0]):
            _ENCODERS[unwrap(_inner[0])[0]] = _encoder(unwrap(_inner[0])[0])


def to_dict(rec: Record) -> dict[str, Any]:
    """The wire form of a record as a plain dict (kind and v first)."""
    return _ENCODERS[type(rec)](rec)


def encode(rec: Record) -> bytes:
    """One record as one compact JSON message (no trailing newline)."""
    return orjson.dumps(to_dict(rec))


def encode_batch(recs: list[Record], ts: float) -> bytes:
    """Several records packed in one `batch` message."""
    return orjson.dumps({"kind": "batch", "v": VERSION, "ts": ts, "items": [to_dict(r) for r in recs]})
