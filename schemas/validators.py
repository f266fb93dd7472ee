"""Validators compiled from the records' type annotations: one fast check per field, one builder per kind.

`unwrap` reads an annotation (its base type, its `Meta` bounds, whether it is optional); `compile_record`
turns a record class into a function from a decoded JSON object to the record (or `Invalid` with the
path and reason); `BUILDERS` compiles them on first use. The codec (`gangwatch.schemas.codec`) decodes
through these, and the column decoder (`gangwatch.schemas.columns`) builds on `fast_test` and
`slot_setters` for its own generated code.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable
from typing import Any

from gangwatch.schemas.records import KINDS, WIRE_NAMES, Meta

INT_MIN, INT_MAX = -(2**63), 2**63 - 1  # JSON integers are int64 on the wire

_NONFINITE = {"nan": math.nan, "infinity": math.inf, "inf": math.inf, "-infinity": -math.inf, "-inf": -math.inf}


class Invalid(Exception):
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


def type_name(v: Any) -> str:
    return "null" if v is None else {dict: "object", list: "array", str: "string", bool: "boolean"}.get(
        type(v), "number")


def compile_check(tp: Any) -> Check:
    base, meta, optional = unwrap(tp)
    check = compile_base(base, meta)
    if not optional:
        return check

    def opt(v: Any, path: str) -> Any:
        return None if v is None else check(v, path)

    return opt


def compile_base(base: Any, meta: Meta) -> Check:  # noqa: C901 - one branch per JSON type
    if base is float:
        lo, nonfinite = meta.minimum, meta.allow_nonfinite

        def check_float(v: Any, path: str) -> float:
            t = type(v)
            if t is float or t is int:
                f = float(v)
            elif nonfinite and t is str and v.lower() in _NONFINITE:
                return _NONFINITE[v.lower()]
            else:
                raise Invalid(path, f"expected a number, got {type_name(v)}")
            if not math.isfinite(f):
                if nonfinite:
                    return f
                raise Invalid(path, "NaN or infinity is not allowed here")
            if lo is not None and f < lo:
                raise Invalid(path, f"must be >= {lo:g}, got {f:g}")
            return f

        return check_float
    if base is int:
        lo = meta.minimum

        def check_int(v: Any, path: str) -> int:
            if type(v) is not int:
                if type(v) is float and v.is_integer() and math.isfinite(v):
                    v = int(v)
                else:
                    raise Invalid(path, f"expected an integer, got {type_name(v)}")
            if not INT_MIN <= v <= INT_MAX:
                raise Invalid(path, "integer out of the 64-bit range")
            if lo is not None and v < lo:
                raise Invalid(path, f"must be >= {lo:g}, got {v}")
            return v

        return check_int
    if base is str:
        enum, max_len = (frozenset(meta.enum) if meta.enum else None), meta.max_len

        def check_str(v: Any, path: str) -> str:
            if type(v) is not str:
                raise Invalid(path, f"expected a string, got {type_name(v)}")
            if len(v) > max_len:
                raise Invalid(path, f"string longer than {max_len} characters ({len(v)})")
            if enum is not None and v not in enum:
                raise Invalid(path, f"must be one of {sorted(enum)}, got {v[:64]!r}")
            return v

        return check_str
    if base is bool:

        def check_bool(v: Any, path: str) -> bool:
            if type(v) is not bool:
                raise Invalid(path, f"expected true or false, got {type_name(v)}")
            return v

        return check_bool
    origin = typing.get_origin(base)
    if origin is list:
        item = compile_check(typing.get_args(base)[0])
        max_len = meta.max_len

        def check_list(v: Any, path: str) -> list:
            if type(v) is not list:
                raise Invalid(path, f"expected an array, got {type_name(v)}")
            if len(v) > max_len:
                raise Invalid(path, f"array longer than {max_len} items ({len(v)})")
            return [item(x, f"{path}[{i}]") for i, x in enumerate(v)]

        return check_list
    if origin is dict:
        value_type = typing.get_args(base)[1]
        value = None if value_type is Any else compile_check(value_type)

        def check_dict(v: Any, path: str) -> dict:
            if type(v) is not dict:
                raise Invalid(path, f"expected an object, got {type_name(v)}")
            return v if value is None else {k: value(x, f"{path}.{k}") for k, x in v.items()}

        return check_dict
    if dataclasses.is_dataclass(base):
        build = compile_record(base)

        def check_obj(v: Any, path: str) -> Any:
            if type(v) is not dict:
                raise Invalid(path, f"expected an object, got {type_name(v)}")
            return build(v, path)

        return check_obj
    raise TypeError(f"unsupported annotation {base!r}")  # a bug in records.py, not bad input


def compile_record(cls: type) -> Callable[[dict, str], Any]:
    """A builder for `cls`: Python source generated once per class, then compiled.

    Each field gets an inline fast path for the common case (a finite float, an
    in-range int, a short string) and falls back to the full check otherwise, so
    validation costs little more than constructing the record.
    """
    hints = typing.get_type_hints(cls, include_extras=True)
    env: dict[str, Any] = {"cls": cls, "Invalid": Invalid, "missing_field": missing_field}
    body = ["def build(obj, path):", "    get = obj.get", "    n = 0"]
    names: list[str] = []
    wires: list[str] = []
    for i, f in enumerate(dataclasses.fields(cls)):
        if f.name in ("extra", "kind"):
            continue
        wire = WIRE_NAMES.get(f.name, f.name)
        base, meta, _ = unwrap(hints[f.name])
        env[f"chk{i}"] = compile_base(base, meta)
        where = f"(path + {'.' + wire!r} if path else {wire!r})"
        body.append(f"    v = get({wire!r})")
        body.append("    if v is None:")
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            body.append(f"        missing_field(obj, {wire!r}, path)")
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
    setters = slot_setters(cls, names)
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


def slot_setters(cls: type, names: list[str]) -> tuple[dict[str, Any], list[str]] | None:
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
        lo = INT_MIN if meta.minimum is None else int(meta.minimum)
        return f"type({v}) is int and {lo} <= {v} <= {INT_MAX}"
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


def missing_field(obj: dict, wire: str, path: str) -> None:
    raise Invalid(f"{path}.{wire}" if path else wire, "required field is " + ("null" if wire in obj else "missing"))


def join_path(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


class Builders(dict):
    """kind -> its builder, compiled on first use (a process that never decodes a kind never compiles it)."""

    def __missing__(self, kind: str) -> Callable[[dict, str], Any]:
        build = self[kind] = compile_record(KINDS[kind])
        return build


BUILDERS: dict[str, Callable[[dict, str], Any]] = Builders()
