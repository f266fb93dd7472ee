"""JSON Schema (draft 2020-12) export of contract v1, generated from `schemas.records`.

For consumers in other languages: `gangwatch schema export DIR` writes one file per kind.
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any

import orjson
from gangwatch.schemas.records import KINDS, VERSION, WIRE_NAMES, Meta
from gangwatch.schemas.validators import unwrap

_DRAFT = "https://json-schema.org/draft/2020-12/schema"


def _schema_of(tp: Any) -> dict[str, Any]:
    base, meta, optional = unwrap(tp)
    s = _base_schema(base, meta)
    return {"anyOf": [s, {"type": "null"}]} if optional else s


def _base_schema(base: Any, meta: Meta) -> dict[str, Any]:
    if base is float:
        s: dict[str, Any] = {"type": "number"}
        if meta.allow_nonfinite:
            s = {"anyOf": [s, {"enum": ["NaN", "Infinity", "-Infinity"]}]}
    elif base is int:
        s = {"type": "integer"}
    elif base is str:
        s = {"type": "string", "maxLength": meta.max_len}
        if meta.enum:
            s["enum"] = list(meta.enum)
    elif base is bool:
        s = {"type": "boolean"}
    elif typing.get_origin(base) is list:
        s = {"type": "array", "items": _schema_of(typing.get_args(base)[0]), "maxItems": meta.max_len}
    elif typing.get_origin(base) is dict:
        s = {"type": "object"}
    elif dataclasses.is_dataclass(base):
        return object_schema(base)
    else:
        raise TypeError(f"unsupported annotation {base!r}")
    if meta.minimum is not None and base in (int, float):
        s["minimum"] = meta.minimum
    return s


def object_schema(cls: type) -> dict[str, Any]:
    """The JSON Schema of one record or nested value class."""
    hints = typing.get_type_hints(cls, include_extras=True)
    props: dict[str, Any] = {}
    required: list[str] = []
    kind = cls.__dataclass_fields__["kind"].default if "kind" in cls.__dataclass_fields__ else None
    if kind:
        props["kind"] = {"const": kind}
        props["v"] = {"const": VERSION}
        required += ["kind", "v"]
    for f in dataclasses.fields(cls):
        if f.name in ("extra", "kind"):
            continue
        wire = WIRE_NAMES.get(f.name, f.name)
        props[wire] = _schema_of(hints[f.name])
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            required.append(wire)
    out: dict[str, Any] = {"type": "object", "properties": props, "required": required,
                           "additionalProperties": True}
    if cls.__doc__:
        out["description"] = cls.__doc__.strip().splitlines()[0]
    return out


def batch_schema() -> dict[str, Any]:
    return {
        "type": "object", "description": "Packaging of many records in one message.",
        "properties": {"kind": {"const": "batch"}, "v": {"const": VERSION}, "ts": {"type": "number"},
                       "items": {"type": "array", "items": {"type": "object"}}},
        "required": ["kind", "v", "items"], "additionalProperties": True,
    }


def export(directory: Path) -> list[Path]:
    """Write `<kind>.schema.json` for every kind (and the batch envelope) into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    schemas = {kind: object_schema(cls) for kind, cls in KINDS.items()} | {"batch": batch_schema()}
    for kind, schema in schemas.items():
        doc = {"$schema": _DRAFT, "$id": f"https://gangwatch.dev/schema/v{VERSION}/{kind}.schema.json",
               "title": f"gangwatch v{VERSION} {kind}", **schema}
        path = directory / f"{kind}.schema.json"
        path.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")
        written.append(path)
    return written
