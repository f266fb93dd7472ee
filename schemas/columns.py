"""Step items as columns: `StepRows`, and the builder that fills one from a batch envelope's items.

`decode(..., columns=True)` (schemas/codec.py) offers a batch's items here first: when every item is a step of
one job that the record path accepts as it stands, they come back as one `StepRows`, with no record object per
item (the replay path's way through the core for step batches). A module of its own because it is a
specialisation of the record decoder that a reader of the decoder can skip: it builds on the codec's per-field
fast checks (`codec.fast_test`), and the codec reaches it only when asked for columns.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import typing
from collections.abc import Callable, Sequence
from typing import Any

from gangwatch.schemas.codec import fast_test, unwrap
from gangwatch.schemas.records import KINDS, VERSION, WIRE_NAMES, Record


class StepRows:
    """The `step` items of one batch envelope, as columns: no record object per item.

    What `decode(..., columns=True)` returns for a batch whose every item is a step of one job that the
    record path accepts as it stands (each value passes its field's fast check, no unknown fields): the
    values are exactly the ones the `Step` records would hold, and `record(i)` builds that record when a
    reader needs it (the few triage reads, a detector's record-by-record fallback).
    """

    __slots__ = ("job", "cols", "ts")

    def __init__(self, job: str, cols: dict[str, Sequence[Any]]) -> None:
        self.job = job
        self.cols = cols  # Step attribute -> one value per item (None where the item leaves it out)
        self.ts: Sequence[float] = cols["ts"]

    def __len__(self) -> int:
        return len(self.ts)

    def record(self, i: int) -> Record:
        """Item `i` as the `Step` record the record path gives for it."""
        return KINDS["step"](**{name: col[i] for name, col in self.cols.items()})

    def records(self) -> list[Record]:
        return [self.record(i) for i in range(len(self))]

    def split(self, k: int) -> tuple[StepRows, StepRows]:
        """(the first `k` items, the rest)."""
        head = {n: c[:k] for n, c in self.cols.items()}
        tail = {n: c[k:] for n, c in self.cols.items()}
        return StepRows(self.job, head), StepRows(self.job, tail)


@functools.cache
def compile_step_rows() -> Callable[[list], StepRows | None]:
    """The columnar builder of `step` items, generated from the `Step` annotations as the record builder is.

    It accepts an item only where the record builder's fast path would keep every value as it stands, so
    the columns hold exactly what the records would; anything else (a missing or null required field, a
    value that needs the full check, an unknown field, another kind, items of several jobs) gives None, and
    the envelope goes through the record path, which says what is wrong with it, if anything.

    Two functions: `rows`, item by item and field by field (optional fields may be left out), and in front
    of it `whole`, for the usual batch whose items carry every field: one `itemgetter` per item, the
    checks on its values, and the columns transposed at the end (anything else: `rows` decides).
    """
    cls = KINDS["step"]
    hints = typing.get_type_hints(cls, include_extras=True)
    env: dict[str, Any] = {"StepRows": StepRows, "VERSION": VERSION}
    head, names, wires, tests = ["def rows(items):"], [], [], []
    body = ["    for obj in items:",
            "        if type(obj) is not dict:",
            "            return None",
            "        get = obj.get",
            "        v = get('v')",
            "        if get('kind') != 'step' or type(v) is not int or v != VERSION:",
            "            return None",
            "        n = 2"]
    for i, f in enumerate(dataclasses.fields(cls)):
        if f.name in ("extra", "kind"):
            continue
        wire = WIRE_NAMES.get(f.name, f.name)
        base, meta, _ = unwrap(hints[f.name])
        fast = fast_test(base, meta, i, env)
        assert fast is not None, f"Step.{f.name} has no fast check"  # noqa: S101 - a bug in records.py
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        assert required or f.default is None, f"Step.{f.name}: only None defaults are columns"  # noqa: S101
        head.append(f"    c{i} = []; add{i} = c{i}.append")
        body.append(f"        v = get({wire!r})")
        if required:
            body += ["        if v is None or not (" + fast + "):", "            return None", "        n += 1"]
        else:
            body += ["        if v is not None:", "            if not (" + fast + "):", "                return None",
                     "            n += 1"]
        body.append(f"        add{i}(v)")
        names.append((f.name, f"c{i}"))
        wires.append(wire)
        tests.append(fast_test(base, meta, i, env, f"x{i}"))
    body += ["        if len(obj) != n:", "            return None"]  # unknown fields: the record path keeps them
    job = dict(names)["job"]
    tail = [f"    if not {job} or {job}.count({job}[0]) != len({job}):", "        return None",
            f"    return StepRows({job}[0], {{{', '.join(f'{n!r}: {c}' for n, c in names)}}})"]
    xs = [f"x{c[1:]}" for _, c in names]
    env["every"] = operator.itemgetter("kind", "v", *wires)
    whole = ["def whole(items):",
             "    out = []",
             "    add = out.append",
             "    for obj in items:",
             f"        if type(obj) is not dict or len(obj) != {len(wires) + 2}:",
             "            return rows(items)",
             "        try:",
             "            row = every(obj)",
             "        except KeyError:",
             "            return rows(items)",
             f"        kind, v, {', '.join(xs)} = row",
             "        if not (kind == 'step' and type(v) is int and v == VERSION and " + " and ".join(
                 f"({t})" for t in tests) + "):",
             "            return rows(items)",
             "        add(row)",
             "    if not out:",
             "        return None",
             f"    _, _, {', '.join(c for _, c in names)} = zip(*out)",
             f"    if {job}.count({job}[0]) != len({job}):",
             "        return None",
             f"    return StepRows({job}[0], {{{', '.join(f'{n!r}: {c}' for n, c in names)}}})"]
    exec(compile("\n".join(head + body + tail + whole), "<columns step>", "exec"), env)  # noqa: S102 - our own source
    return env["whole"]
