"""Step items as columns: `StepRows`, and the builders that fill one from a batch envelope's items.

`decode(..., columns=True)` (schemas/codec.py) offers a batch's items here first: when every item is a step of
one job that the record path accepts as it stands, they come back as one `StepRows`, with no record object per
item (the replay path's way through the core for step batches). With `heartbeats=True` too, a batch of such
steps and heartbeats of one job (as a node sidecar sends them) is one `StepRows` as well (the worker's way).
A module of its own because it is a specialisation of the record decoder that a reader of the decoder can
skip: it builds on the codec's per-field fast checks (`validators.fast_test`), and the codec reaches it only when
asked for columns.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import operator
import typing
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from gangwatch.schemas.records import KINDS, VERSION, WIRE_NAMES, Record
from gangwatch.schemas.validators import fast_test, slot_setters, unwrap


class StepRows:
    """The `step` items of one batch envelope as columns, and the `heartbeat` items among them when the decoder
    was asked for those: no record object per item.

    What `decode(..., columns=True)` returns for a batch whose every item is a step of one job that the
    record path accepts as it stands (each value passes its field's fast check, no unknown fields); with
    `heartbeats=True`, also for a batch of such steps and heartbeats of one job. The values are exactly the
    ones the records would hold. The items keep their order: item `i` is a step or a heartbeat as it was in
    the envelope (`steps_at`, `beats_at`), `ts` holds every item's time in that order, and `record(i)` builds
    item `i`'s record when a reader needs it (the few triage reads, a detector's record-by-record fallback).
    """

    __slots__ = ("job", "cols", "ts", "beats", "steps_at", "beats_at")

    def __init__(self, job: str, cols: dict[str, Sequence[Any]], beats: dict[str, Sequence[Any]] | None = None,
                 steps_at: Sequence[int] = (), beats_at: Sequence[int] = (), ts: Sequence[float] = ()) -> None:
        self.job = job
        self.cols = cols  # Step attribute -> one value per step item (None where the item leaves it out)
        self.beats = beats  # Heartbeat attribute -> one value per heartbeat item; None: every item is a step
        # with `beats`: the places of the step items and of the heartbeat items among all items, ascending
        self.steps_at, self.beats_at = steps_at, beats_at
        self.ts: Sequence[float] = cols["ts"] if beats is None else ts  # every item's time, in item order

    def __len__(self) -> int:
        return len(self.ts)

    def record(self, i: int) -> Record:
        """Item `i` as the record the record path gives for it."""
        if self.beats is None:
            return _makers()["step"](*(col[i] for col in self.cols.values()))
        at = self.steps_at
        j = bisect.bisect_left(at, i)  # steps before item i
        if j < len(at) and at[j] == i:
            return _makers()["step"](*(col[j] for col in self.cols.values()))
        return _makers()["heartbeat"](*(col[i - j] for col in self.beats.values()))

    def records(self) -> list[Record]:
        """Every item's record, in item order."""
        make = _makers()
        steps = list(map(make["step"], *self.cols.values()))
        if self.beats is None:
            return steps
        out: list[Any] = [None] * len(self)
        for i, rec in zip(self.steps_at, steps, strict=True):
            out[i] = rec
        for i, rec in zip(self.beats_at, map(make["heartbeat"], *self.beats.values()), strict=True):
            out[i] = rec
        return out

    def counts(self) -> dict[str, int]:
        """Items by kind (kinds it has none of left out)."""
        steps = len(self.cols["ts"])
        return {kind: n for kind, n in (("step", steps), ("heartbeat", len(self) - steps)) if n}

    def split(self, k: int) -> tuple[StepRows, StepRows]:
        """(the first `k` items, the rest)."""
        if self.beats is None:
            return (StepRows(self.job, {n: c[:k] for n, c in self.cols.items()}),
                    StepRows(self.job, {n: c[k:] for n, c in self.cols.items()}))
        j = bisect.bisect_left(self.steps_at, k)  # steps among the first k items
        return (self._part(slice(None, j), slice(None, k - j), 0, slice(None, k)),
                self._part(slice(j, None), slice(k - j, None), k, slice(k, None)))

    @classmethod
    def merged(cls, parts: Sequence[StepRows]) -> StepRows:
        """The items of `parts` (of one job) as one `StepRows` in time order: a stable sort of their items, one
        part after the other, by time (items of equal time keep the order they had in `parts`)."""
        ts = [t for p in parts for t in p.ts]
        return cls._taken(parts, ts, sorted(range(len(ts)), key=ts.__getitem__))

    def shifted(self, by: Sequence[float]) -> StepRows:
        """These items with `by[i]` taken out of item i's time (a node's clock correction)."""
        ts = [t - b for t, b in zip(self.ts, by, strict=True)]
        if self.beats is None:
            return StepRows(self.job, {**self.cols, "ts": ts})
        steps = {**self.cols, "ts": [ts[i] for i in self.steps_at]}
        beats = {**self.beats, "ts": [ts[i] for i in self.beats_at]}
        return StepRows(self.job, steps, beats, self.steps_at, self.beats_at, ts)

    def column(self, name: str) -> list[Any]:
        """Field `name` of every item, in item order (None where an item has no such field or leaves it out)."""
        steps = self.cols.get(name, [None] * len(self.cols["ts"]))
        if self.beats is None:
            return list(steps)
        out: list[Any] = [None] * len(self)
        for i, v in zip(self.steps_at, steps, strict=True):
            out[i] = v
        for i, v in zip(self.beats_at, self.beats.get(name, [None] * len(self.beats_at)), strict=True):
            out[i] = v
        return out

    def in_time_order(self) -> tuple[StepRows, list[int]]:
        """(these items sorted by time, stably; the place here of each of its items)."""
        order = sorted(range(len(self.ts)), key=self.ts.__getitem__)
        return StepRows._taken([self], self.ts, order), order

    @classmethod
    def _taken(cls, parts: Sequence[StepRows], ts: Sequence[float], order: list[int]) -> StepRows:
        """Item `order[k]` of the parts' items (one part after the other; `ts` their times) as item k."""
        job = parts[0].job
        if all(p.beats is None for p in parts):
            return cls(job, {name: _take(_chained(parts, "cols", name), order) for name in parts[0].cols})
        where: list[int] = []  # per item of the parts in turn: its place among their steps, or ~ among heartbeats
        s = b = 0
        for p in parts:
            if p.beats is None:
                where += range(s, s + len(p))
                s += len(p)
                continue
            w = [0] * len(p)
            for k, i in enumerate(p.steps_at, s):
                w[i] = k
            for k, i in enumerate(p.beats_at, b):
                w[i] = ~k
            where += w
            s, b = s + len(p.steps_at), b + len(p.beats_at)
        steps_at: list[int] = []
        beats_at: list[int] = []
        step_order: list[int] = []
        beat_order: list[int] = []
        for pos, w in enumerate(map(where.__getitem__, order)):
            if w >= 0:
                steps_at.append(pos)
                step_order.append(w)
            else:
                beats_at.append(pos)
                beat_order.append(~w)
        names = next(p for p in parts if p.beats is not None)
        cols = {name: _take(_chained(parts, "cols", name), step_order) for name in names.cols}
        beats = {name: _take(_chained(parts, "beats", name), beat_order) for name in names.beats}
        return cls(job, cols, beats, steps_at, beats_at, _take(ts, order))

    def _part(self, steps: slice, beats: slice, start: int, items: slice) -> StepRows:
        """The items `items` (from `start`) of these mixed rows: their steps `steps` and heartbeats `beats`."""
        cols = {n: c[steps] for n, c in self.cols.items()}
        beats_at = self.beats_at[beats]
        if not beats_at:  # steps only
            return StepRows(self.job, cols)
        return StepRows(self.job, cols, {n: c[beats] for n, c in self.beats.items()},
                        [p - start for p in self.steps_at[steps]], [p - start for p in beats_at], self.ts[items])


def _chained(parts: Sequence[StepRows], which: str, name: str) -> list[Any]:
    """Column `name` of the parts' steps (`which` "cols") or heartbeats ("beats"), one part after the other."""
    out: list[Any] = []
    for p in parts:
        got = getattr(p, which)
        if got is not None:
            out += got[name]
    return out


def _take(values: Sequence[Any], order: list[int]) -> Sequence[Any]:
    """`values` at the places `order` gives, in that order."""
    return operator.itemgetter(*order)(values) if len(order) > 1 else [values[i] for i in order]


@functools.cache
def _makers() -> dict[str, Callable[..., Record]]:
    """kind -> a function of the column values of one item (in field order) giving its record, as the record
    builder sets it (each slot directly: no keyword call, no frozen-attribute path)."""
    out = {}
    for kind in ("step", "heartbeat"):
        cls = KINDS[kind]
        fields = [f.name for f in dataclasses.fields(cls) if f.name not in ("extra", "kind")]
        env, lines = slot_setters(cls, [f"{n}={n}" for n in fields])
        env["cls"] = cls
        src = [f"def make({', '.join(fields)}):", "    extra = new_extra()", "    rec = new(cls)",
               *(f"    {line}" for line in lines), "    return rec"]
        exec(compile("\n".join(src), f"<columns make {kind}>", "exec"), env)  # noqa: S102 - our own source
        out[kind] = env["make"]
    return out


class _Column(NamedTuple):
    """One field of a kind held as a column."""

    name: str  # the attribute
    wire: str  # its name on the wire
    required: bool
    test: Callable[[str], str]  # the fast check of the value named by its argument, as an expression


def _columns(kind: str, env: dict[str, Any]) -> list[_Column]:
    """The fields of `kind`'s records as columns (every one but `extra` and `kind`), in field order; their
    fast checks' names go into `env`."""
    cls = KINDS[kind]
    hints = typing.get_type_hints(cls, include_extras=True)
    out = []
    for i, f in enumerate(dataclasses.fields(cls)):
        if f.name in ("extra", "kind"):
            continue
        base, meta, _ = unwrap(hints[f.name])
        key = 1000 * list(KINDS).index(kind) + i  # names the check's constants in `env` apart from other kinds'
        assert fast_test(base, meta, key, env) is not None, f"{kind}.{f.name} has no fast check"  # noqa: S101
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        assert required or f.default is None, f"{kind}.{f.name}: only None defaults are columns"  # noqa: S101
        out.append(_Column(f.name, WIRE_NAMES.get(f.name, f.name), required,
                           functools.partial(fast_test, base, meta, key, env)))
    return out


def _item_checks(cols: list[_Column], prefix: str, indent: str) -> list[str]:
    """Lines that check one item's value of each column (read through `get`) and append it to the column's
    list (`add{prefix}{j}`), counting the values present in `n`; the function returns None on a value the
    fast check does not pass (or a required one missing)."""
    lines = []
    for j, c in enumerate(cols):
        lines.append(f"{indent}v = get({c.wire!r})")
        if c.required:
            lines += [f"{indent}if v is None or not ({c.test('v')}):", f"{indent}    return None", f"{indent}n += 1"]
        else:
            lines += [f"{indent}if v is not None:", f"{indent}    if not ({c.test('v')}):",
                      f"{indent}        return None", f"{indent}    n += 1"]
        lines.append(f"{indent}add{prefix}{j}(v)")
    return lines


def _opens(cols: list[_Column], prefix: str) -> list[str]:
    return [f"    {prefix}{j} = []; add{prefix}{j} = {prefix}{j}.append" for j in range(len(cols))]


def _as_dict(cols: list[_Column], prefix: str) -> str:
    return "{" + ", ".join(f"{c.name!r}: {prefix}{j}" for j, c in enumerate(cols)) + "}"


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
    env: dict[str, Any] = {"StepRows": StepRows, "VERSION": VERSION}
    cols = _columns("step", env)
    job = f"c{[c.name for c in cols].index('job')}"
    rows = ["def rows(items):", *_opens(cols, "c"),
            "    for obj in items:",
            "        if type(obj) is not dict:",
            "            return None",
            "        get = obj.get",
            "        v = get('v')",
            "        if get('kind') != 'step' or type(v) is not int or v != VERSION:",
            "            return None",
            "        n = 2",
            *_item_checks(cols, "c", "        "),
            "        if len(obj) != n:",  # unknown fields: the record path keeps them
            "            return None",
            f"    if not {job} or {job}.count({job}[0]) != len({job}):",
            "        return None",
            f"    return StepRows({job}[0], {_as_dict(cols, 'c')})"]
    env["every"] = operator.itemgetter("kind", "v", *(c.wire for c in cols))
    xs = [f"c{j}" for j in range(len(cols))]
    whole = ["def whole(items):",
             "    out = []",
             "    add = out.append",
             "    for obj in items:",
             f"        if type(obj) is not dict or len(obj) != {len(cols) + 2}:",
             "            return rows(items)",
             "        try:",
             "            row = every(obj)",
             "        except KeyError:",
             "            return rows(items)",
             f"        kind, v, {', '.join(xs)} = row",
             "        if not (kind == 'step' and type(v) is int and v == VERSION and " + " and ".join(
                 f"({c.test(x)})" for c, x in zip(cols, xs, strict=True)) + "):",
             "            return rows(items)",
             "        add(row)",
             "    if not out:",
             "        return None",
             f"    _, _, {', '.join(xs)} = zip(*out)",
             f"    if {job}.count({job}[0]) != len({job}):",
             "        return None",
             f"    return StepRows({job}[0], {_as_dict(cols, 'c')})"]
    exec(compile("\n".join(rows + whole), "<columns step>", "exec"), env)  # noqa: S102 - our own source
    return env["whole"]


# Fewer items than this in a batch of steps and heartbeats: records. A `StepRows` pays for itself over many
# records; the worker takes a small batch apart anyway when its time span overlaps another's (trainer clients
# send one per rank), and building its columns first would cost more than its records alone.
MIN_MIXED = 16


@functools.cache
def compile_mixed_rows() -> Callable[[list], StepRows | None]:
    """The columnar builder of `step` and `heartbeat` items of one job (in any order), with the same rule as
    `compile_step_rows`: an item is taken only where the record builder's fast path would keep every value as
    it stands, else None (the record path decides). A batch without a heartbeat gives the `StepRows`
    `compile_step_rows` gives; one of fewer than `MIN_MIXED` items gives None.

    Two ways, as there: `mixed`, item by item and field by field, and in front of it one function per shape
    (the set of fields the batch's steps carry, and its heartbeats'), compiled when first met: each item of the
    shape read with one `itemgetter`, its values checked, and the columns transposed at the end; an item of
    another shape, or a value that fails a fast check, and `mixed` decides.
    """
    env: dict[str, Any] = {"StepRows": StepRows, "VERSION": VERSION}
    steps, beats = _columns("step", env), _columns("heartbeat", env)
    sjob, bjob = (f"{p}{[c.name for c in cs].index('job')}" for p, cs in (("s", steps), ("b", beats)))
    sts, bts = (f"{p}{[c.name for c in cs].index('ts')}" for p, cs in (("s", steps), ("b", beats)))
    lines = ["def mixed(items):", *_opens(steps, "s"), *_opens(beats, "b"),
             "    steps_at = []; beats_at = []",
             "    for i, obj in enumerate(items):",
             "        if type(obj) is not dict:",
             "            return None",
             "        get = obj.get",
             "        kind = get('kind'); v = get('v')",
             "        if type(v) is not int or v != VERSION:",
             "            return None",
             "        n = 2",
             "        if kind == 'step':",
             *_item_checks(steps, "s", "            "),
             "            steps_at.append(i)",
             "        elif kind == 'heartbeat':",
             *_item_checks(beats, "b", "            "),
             "            beats_at.append(i)",
             "        else:",
             "            return None",
             "        if len(obj) != n:",  # unknown fields: the record path keeps them
             "            return None",
             f"    job = {sjob}[0] if {sjob} else {bjob}[0] if {bjob} else None",
             f"    if not job or {sjob}.count(job) != len({sjob}) or {bjob}.count(job) != len({bjob}):",
             "        return None",
             "    if not beats_at:",
             f"        return StepRows(job, {_as_dict(steps, 's')})",
             "    ts = [None] * len(items)",
             f"    for i, t in zip(steps_at, {sts}, strict=True):",
             "        ts[i] = t",
             f"    for i, t in zip(beats_at, {bts}, strict=True):",
             "        ts[i] = t",
             f"    return StepRows(job, {_as_dict(steps, 's')}, {_as_dict(beats, 'b')}, steps_at, beats_at, ts)"]
    exec(compile("\n".join(lines), "<columns mixed>", "exec"), env)  # noqa: S102 - our own source
    mixed = env["mixed"]
    shaped = functools.lru_cache(maxsize=64)(functools.partial(_compile_shape, steps, beats, mixed))
    known = {kind: frozenset({"kind", "v", *(c.wire for c in cols)}) for kind, cols in (("step", steps),
                                                                                          ("heartbeat", beats))}

    def rows(items: list) -> StepRows | None:
        if len(items) < MIN_MIXED:
            return None
        keys: dict[str, frozenset[str] | None] = {"step": None, "heartbeat": None}
        for obj in items:
            if type(obj) is not dict:
                return None
            kind = obj.get("kind")
            if keys.get(kind, 0) is None:
                keys[kind] = frozenset(obj)
                if not keys[kind] <= known[kind]:  # an unknown field: the record path keeps it
                    return None
                if keys["step"] is not None and keys["heartbeat"] is not None:
                    break
        fast = shaped(keys["step"], keys["heartbeat"])
        return mixed(items) if fast is None else fast(items)

    return rows


def _compile_shape(steps: list[_Column], beats: list[_Column], mixed: Callable[[list], StepRows | None],
                   step_keys: frozenset[str] | None, beat_keys: frozenset[str] | None) -> Callable | None:
    """The builder of batches whose steps carry exactly the fields `step_keys` and whose heartbeats `beat_keys`
    (known fields only; None: the batch has none), falling back to `mixed`; None where such items cannot all be
    taken (a required field missing): `mixed` decides."""
    env: dict[str, Any] = {"StepRows": StepRows, "VERSION": VERSION, "mixed": mixed}
    loop = ["def fast(items):", "    srows = []; brows = []; sat = []; bat = []; ts = []; add_ts = ts.append",
            "    add_srow = srows.append; add_brow = brows.append; add_sat = sat.append; add_bat = bat.append",
            "    for i, obj in enumerate(items):",
            "        if type(obj) is not dict:",
            "            return None",
            "        n = len(obj)"]
    tail: list[str] = []
    built: dict[str, str] = {}  # kind -> its columns as a dict expression
    sizes = set()
    for kind, cols, keys, p in (("step", steps, step_keys, "s"), ("heartbeat", beats, beat_keys, "b")):
        if keys is None:
            continue
        wires = {c.wire: c for c in cols}
        if "v" not in keys or any(c.required and c.wire not in keys for c in cols):
            return None
        order = sorted(keys)
        env[f"{p}get"] = operator.itemgetter(*order)
        xs = [f"{p}x{j}" for j in range(len(order))]
        at = dict(zip(order, xs, strict=True))
        tests = [f"{at['kind']} == {kind!r}", f"type({at['v']}) is int", f"{at['v']} == VERSION",
                 *(f"({wires[w].test(at[w])})" for w in order if w not in ("kind", "v"))]
        loop += [f"        {'if' if not sizes else 'elif'} n == {len(keys)}:",
                 "            try:",
                 f"                row = {p}get(obj)",
                 "            except KeyError:",
                 "                return mixed(items)",
                 f"            {', '.join(xs)}, = row",
                 f"            if not ({' and '.join(tests)}):",
                 "                return mixed(items)",
                 f"            add_{p}row(row)",
                 f"            add_{p}at(i)",
                 f"            add_ts({at['ts']})"]
        sizes.add(len(keys))
        pos = {w: j for j, w in enumerate(order)}
        tail += [f"    {p}cols = list(zip(*{p}rows)) or [()] * {len(order)}",
                 f"    {p}none = (None,) * len({p}rows)",
                 f"    {p}job = {p}cols[{pos['job']}]",
                 f"    if {p}job.count(job) != len({p}job):",
                 "        return None"]
        built[kind] = "{" + ", ".join(f"{c.name!r}: " + (f"{p}cols[{pos[c.wire]}]" if c.wire in pos else f"{p}none")
                                      for c in cols) + "}"
    if len(sizes) < len(built) or not built:  # a step and a heartbeat of one size: told apart by `mixed`
        return None
    loop += ["        else:", "            return mixed(items)",
             "    if not ts:", "        return None",
             "    job = items[0]['job']",
             "    if not job:", "        return None"]
    if "heartbeat" not in built:
        end = [f"    return StepRows(job, {built['step']})"]
    else:
        step_cols = built["step"] if "step" in built else \
            "{" + ", ".join(f"{c.name!r}: ()" for c in steps) + "}"
        end = [f"    return StepRows(job, {step_cols}, {built['heartbeat']}, sat, bat, ts)"]
    src = loop + tail + end
    exec(compile("\n".join(src), "<columns shape>", "exec"), env)  # noqa: S102 - our own source
    return env["fast"]
