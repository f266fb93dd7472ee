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
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
from gangwatch.schemas.records import KINDS, VERSION, WIRE_NAMES, Meta, Record

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
_INT_MIN, _INT_MAX = -(2**63), 2**63 - 1
_NONFINITE = {"nan": math.nan, "infinity": math.inf, "inf": math.inf, "-infinity": -math.inf, "-inf": -math.inf}


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


class _Invalid(Exception):
    def __init__(self, path: str, reason: str) -> None:
        self.path, self.reason = path, reason


Check = Callable[[Any, str], Any]


# --- compiling validators from annotations -----------------------------------------


def unwrap(tp: Any) -> tuple[Any, Meta, bool]:
    """Split an annotation into (base type, constraints, optional?)."""
    optional = False
    meta = Meta()
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        optional = len(args) < len(typing.get_args(tp))
        tp = args[0]
        origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        tp, *extras = typing.get_args(tp)
        meta = next((e for e in extras if isinstance(e, Meta)), meta)
    return tp, meta, optional


def _type_name(v: Any) -> str:
    return "null" if v is None else {dict: "object", list: "array", str: "string", bool: "boolean"}.get(
        type(v), "number")


def _compile(tp: Any) -> Check:
    base, meta, optional = unwrap(tp)
    check = _compile_base(base, meta)
    if not optional:
        return check

    def opt(v: Any, path: str) -> Any:
        return None if v is None else check(v, path)

    return opt


def _compile_base(base: Any, meta: Meta) -> Check:  # noqa: C901 - one branch per JSON type
    if base is float:
        lo, nonfinite = meta.minimum, meta.allow_nonfinite

        def check_float(v: Any, path: str) -> float:
            t = type(v)
            if t is float or t is int:
                f = float(v)
            elif nonfinite and t is str and v.lower() in _NONFINITE:
                return _NONFINITE[v.lower()]
            else:
                raise _Invalid(path, f"expected a number, got {_type_name(v)}")
            if not math.isfinite(f):
                if nonfinite:
                    return f
                raise _Invalid(path, "NaN or infinity is not allowed here")
            if lo is not None and f < lo:
                raise _Invalid(path, f"must be >= {lo:g}, got {f:g}")
            return f

        return check_float
    if base is int:
        lo = meta.minimum

        def check_int(v: Any, path: str) -> int:
            if type(v) is not int:
                if type(v) is float and v.is_integer() and math.isfinite(v):
                    v = int(v)
                else:
                    raise _Invalid(path, f"expected an integer, got {_type_name(v)}")
            if not _INT_MIN <= v <= _INT_MAX:
                raise _Invalid(path, "integer out of the 64-bit range")
            if lo is not None and v < lo:
                raise _Invalid(path, f"must be >= {lo:g}, got {v}")
            return v

        return check_int
    if base is str:
        enum, max_len = (frozenset(meta.enum) if meta.enum else None), meta.max_len

        def check_str(v: Any, path: str) -> str:
            if type(v) is not str:
                raise _Invalid(path, f"expected a string, got {_type_name(v)}")
            if len(v) > max_len:
                raise _Invalid(path, f"string longer than {max_len} characters ({len(v)})")
            if enum is not None and v not in enum:
                raise _Invalid(path, f"must be one of {sorted(enum)}, got {v[:64]!r}")
            return v

        return check_str
    if base is bool:

        def check_bool(v: Any, path: str) -> bool:
            if type(v) is not bool:
                raise _Invalid(path, f"expected true or false, got {_type_name(v)}")
            return v

        return check_bool
    origin = typing.get_origin(base)
    if origin is list:
        item = _compile(typing.get_args(base)[0])
        max_len = meta.max_len

        def check_list(v: Any, path: str) -> list:
            if type(v) is not list:
                raise _Invalid(path, f"expected an array, got {_type_name(v)}")
            if len(v) > max_len:
                raise _Invalid(path, f"array longer than {max_len} items ({len(v)})")
            return [item(x, f"{path}[{i}]") for i, x in enumerate(v)]

        return check_list
    if origin is dict:
        value_type = typing.get_args(base)[1]
        value = None if value_type is Any else _compile(value_type)

        def check_dict(v: Any, path: str) -> dict:
            if type(v) is not dict:
                raise _Invalid(path, f"expected an object, got {_type_name(v)}")
            return v if value is None else {k: value(x, f"{path}.{k}") for k, x in v.items()}

        return check_dict
    if dataclasses.is_dataclass(base):
        build = _compile_record(base)

        def check_obj(v: Any, path: str) -> Any:
            if type(v) is not dict:
                raise _Invalid(path, f"expected an object, got {_type_name(v)}")
            return build(v, path)

        return check_obj
    raise TypeError(f"unsupported annotation {base!r}")  # a bug in records.py, not bad input


def _compile_record(cls: type) -> Callable[[dict, str], Any]:
    """A builder for `cls`: Python source generated once per class, then compiled.

    Each field gets an inline fast path for the common case (a finite float, an
    in-range int, a short string) and falls back to the full check otherwise, so
    validation costs little more than constructing the record.
    """
    hints = typing.get_type_hints(cls, include_extras=True)
    env: dict[str, Any] = {"cls": cls, "_Invalid": _Invalid, "_missing": _missing}
    body = ["def build(obj, path):", "    get = obj.get", "    n = 0"]
    names: list[str] = []
    wires: list[str] = []
    for i, f in enumerate(dataclasses.fields(cls)):
        if f.name in ("extra", "kind"):
            continue
        wire = WIRE_NAMES.get(f.name, f.name)
        base, meta, _ = unwrap(hints[f.name])
        env[f"chk{i}"] = _compile_base(base, meta)
        where = f"(path + {'.' + wire!r} if path else {wire!r})"
        body.append(f"    v = get({wire!r})")
        body.append("    if v is None:")
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            body.append(f"        _missing(obj, {wire!r}, path)")
        elif f.default_factory is not dataclasses.MISSING:
            env[f"dflt{i}"] = f.default_factory
            body.append(f"        v = dflt{i}()")
        else:
            env[f"dflt{i}"] = f.default
            body.append(f"        v = dflt{i}")
        body.append("    else:")
        body.append("        n += 1")
        fast = fast_test(base, meta, i, env)
        if fast:
            body.append(f"        if not ({fast}):")
            body.append(f"            v = chk{i}(v, {where})")
        else:
            body.append(f"        v = chk{i}(v, {where})")
        body.append(f"    f{i} = v")
        names.append(f"{f.name}=f{i}")
        wires.append(wire)
    env["known"] = frozenset(wires) | {"kind", "v"}
    envelope = 2 if "kind" in cls.__dataclass_fields__ else 0  # top-level records carry kind and v
    setters = _slot_setters(cls, names)
    if setters is None:
        body.append(f"    if len(obj) > n + {envelope}:")
        body.append("        extra = {k: x for k, x in obj.items() if k not in known}")
        body.append(f"        if extra: return cls({', '.join(names + ['extra=extra'])})")
        body.append(f"    return cls({', '.join(names)})")
    else:  # what cls(...) does, without its keyword call and frozen-attribute path: each slot set directly
        env.update(setters[0])
        body.append(f"    if len(obj) > n + {envelope}:")
        body.append("        extra = {k: x for k, x in obj.items() if k not in known} or new_extra()")
        body.append("    else:")
        body.append("        extra = new_extra()")
        body.append("    rec = new(cls)")
        body.extend(f"    {line}" for line in setters[1])
        body.append("    return rec")
    exec(compile("\n".join(body), f"<builder {cls.__name__}>", "exec"), env)  # noqa: S102 - our own source
    return env["build"]


def _slot_setters(cls: type, names: list[str]) -> tuple[dict[str, Any], list[str]] | None:
    """For a slotted dataclass whose `__init__` only stores its fields (no `__post_init__`): the names a
    builder needs and its lines setting every slot of `rec` as that `__init__` would (from `f{i}`, `extra`,
    and the defaults of fields not in `__init__`). None for any other class: the builder calls it."""
    fields = dataclasses.fields(cls)
    if "__slots__" not in cls.__dict__ or hasattr(cls, "__post_init__") or fields[-1].name not in ("extra", "kind"):
        return None
    given = dict(n.split("=") for n in names)  # field -> f{i}
    env: dict[str, Any] = {"new": object.__new__}
    lines = []
    for f in fields:
        env[f"set_{f.name}"] = cls.__dict__[f.name].__set__
        if f.name == "extra":
            if f.default_factory is not dict:  # type: ignore[comparison-overlap]
                return None
            env["new_extra"] = dict
            lines.append("set_extra(rec, extra)")
        elif f.name in given:
            lines.append(f"set_{f.name}(rec, {given[f.name]})")
        elif not f.init and f.default is not dataclasses.MISSING:
            env[f"const_{f.name}"] = f.default
            lines.append(f"set_{f.name}(rec, const_{f.name})")
        else:
            return None
    return env, lines


def fast_test(base: Any, meta: Meta, i: int, env: dict[str, Any], v: str = "v") -> str | None:
    """An inline expression true when the value named `v` certainly passes the check as it stands (None: no
    fast path)."""
    if base is float:
        lo = -1e308 if meta.minimum is None else meta.minimum
        return f"type({v}) is float and {lo!r} <= {v} < 1e308"  # False for NaN and infinities
    if base is int:
        lo = _INT_MIN if meta.minimum is None else int(meta.minimum)
        return f"type({v}) is int and {lo} <= {v} <= {_INT_MAX}"
    if base is str:
        test = f"type({v}) is str and len({v}) <= {meta.max_len}"
        if meta.enum:
            env[f"enum{i}"] = frozenset(meta.enum)
            test += f" and {v} in enum{i}"
        return test
    if base is bool:
        return f"type({v}) is bool"
    if typing.get_origin(base) is list:  # a list of plain strings (GPU throttle reasons, nodes): kept as parsed
        item, item_meta, optional = unwrap(typing.get_args(base)[0])
        if item is str and not optional and not item_meta.enum:
            return (f"type({v}) is list and (not {v} or len({v}) <= {meta.max_len} and "
                    f"all(type(x) is str and len(x) <= {item_meta.max_len} for x in {v}))")
    return None


def _missing(obj: dict, wire: str, path: str) -> None:
    raise _Invalid(f"{path}.{wire}" if path else wire, "required field is " + ("null" if wire in obj else "missing"))


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


class _Builders(dict):
    """kind -> its builder, compiled on first use (a process that never decodes a kind never compiles it)."""

    def __missing__(self, kind: str) -> Callable[[dict, str], Any]:
        build = self[kind] = _compile_record(KINDS[kind])
        return build


_BUILDERS: dict[str, Callable[[dict, str], Any]] = _Builders()


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
        return [DecodeError(f"expected a JSON object, got {_type_name(obj)}", raw=_raw_text(data))]
    kind = obj.get("kind")
    if kind != "batch":
        v = obj.get("v")
        if type(kind) is str and type(v) is int and v == VERSION and kind in KINDS:  # the common case first
            try:
                return [_BUILDERS[kind](obj, "")]
            except (_Invalid, RecursionError):
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
    builders = _BUILDERS
    for i, item in enumerate(items):
        if type(item) is dict:  # the common case first: a valid record of a known kind (else the checks below)
            kind, v = item.get("kind"), item.get("v")
            if type(kind) is str and type(v) is int and v == VERSION and kind in KINDS:
                try:
                    out.append(builders[kind](item, ""))
                    continue
                except (_Invalid, RecursionError):
                    pass
        if type(item) is not dict:
            out.append(DecodeError(f"expected an object, got {_type_name(item)}", f"items[{i}]", index=i,
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
        return DecodeError("missing or non-string `kind`", _join(path, "kind"))
    if not batch and kind not in KINDS:
        return DecodeError(f"unknown kind {kind[:64]!r}", _join(path, "kind"))
    v = obj.get("v")
    if type(v) is not int or v != VERSION:
        return DecodeError(f"unsupported version {v!r:.32}; this reader speaks v{VERSION}", _join(path, "v"), kind)
    ts = obj.get("ts")
    if batch and ts is not None and (type(ts) not in (int, float) or not math.isfinite(ts)):
        return DecodeError("`ts` must be a finite number", _join(path, "ts"), kind)
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
        return _BUILDERS[kind](obj, "")
    except _Invalid as e:
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
