"""Typed evidence: the `evidence` object of a `finding`, one frozen dataclass per shape.

A finding's `evidence` travels as a JSON object whose keys depend on what was
found. Each detector declares its shapes, beside itself, as subclasses of
`Evidence`: frozen, slotted, keyword-only dataclasses whose fields are the
object's keys in the order they are written, with the unit in the name where
there is one (`_s` seconds, `_ts` epoch seconds, `_frac`, `_per_s`, `_c`,
`_mhz`). Detectors build findings from them and triage reads them back through
them, so a key that is renamed on one side and not the other fails at once,
not silently.

- `ev.encode()`: the wire object. Every field is written, None as null, in
  declaration order; except a field declared with `absent()`, whose None means
  "not written at all" (a key only some findings of the shape carry).
- `Cls.decode(obj)`: one object back, strictly: every field without a default
  present, no key the class does not declare (`EvidenceMismatch` otherwise).
  Values are taken as they are (they came from `encode`).
- `Cls.fits(obj)`: whether `decode` would take it; a finding type with several
  shapes finds the one that wrote an object this way.

A field added to a shape later needs a default, so that evidence written before
(in a saved job state) still decodes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

_OMIT = "gangwatch.absent"


class EvidenceMismatch(ValueError):
    """An evidence object does not have the shape of the class it was read as."""


def absent() -> Any:
    """A field that is left out of the wire object when it is None (declare it with this as its default)."""
    return dataclasses.field(default=None, metadata={_OMIT: True})


@dataclasses.dataclass(frozen=True)
class Shape:
    """What `encode` / `decode` need to know of one evidence class, computed once."""

    names: tuple[str, ...]  # wire order
    required: frozenset[str]
    allowed: frozenset[str]
    omit: frozenset[str]


class Evidence:
    """Base of every evidence dataclass (declare subclasses `@dataclass(frozen=True, slots=True, kw_only=True)`)."""

    __slots__ = ()
    _shapes: ClassVar[dict[type, Shape]] = {}

    @classmethod
    def shape(cls) -> Shape:
        s = Evidence._shapes.get(cls)
        if s is None:
            if not dataclasses.is_dataclass(cls):
                raise TypeError(f"{cls.__name__} is not a dataclass")
            fields = dataclasses.fields(cls)
            s = Evidence._shapes[cls] = Shape(
                names=tuple(f.name for f in fields),
                required=frozenset(f.name for f in fields if f.default is dataclasses.MISSING
                                   and f.default_factory is dataclasses.MISSING),
                allowed=frozenset(f.name for f in fields),
                omit=frozenset(f.name for f in fields if f.metadata.get(_OMIT)),
            )
        return s

    def encode(self) -> dict[str, Any]:
        """The `evidence` object of the wire finding."""
        s = self.shape()
        out: dict[str, Any] = {}
        for name in s.names:
            v = getattr(self, name)
            if v is None and name in s.omit:
                continue
            out[name] = v
        return out

    @classmethod
    def fits(cls, obj: Mapping[str, Any]) -> bool:
        s = cls.shape()
        keys = obj.keys()
        return s.required <= keys and keys <= s.allowed

    @classmethod
    def decode(cls, obj: Mapping[str, Any]) -> Evidence:
        """`obj` as this class; `EvidenceMismatch` when a required key is missing or an unknown key is there."""
        if not cls.fits(obj):
            s = cls.shape()
            missing = sorted(s.required - obj.keys())
            unknown = sorted(obj.keys() - s.allowed)
            raise EvidenceMismatch(f"not {cls.__name__} evidence: " + "; ".join(
                x for x in (f"missing {missing}" if missing else "", f"unknown {unknown}" if unknown else "") if x))
        return cls(**obj)

    @classmethod
    def fields(cls) -> tuple[str, ...]:
        """The declared keys, in wire order."""
        return cls.shape().names
