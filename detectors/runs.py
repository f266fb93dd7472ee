"""The run machinery: what `JobMonitor` hands the detectors in one go, and the batch path they read it by.

`RecordRun` is consecutive records of one job during which its event time does not move, grouped by kind once;
a detector's `observe_run` reads it (`observe_each`, its record path on each record of its kinds, is the
default). `StepColumns` is a batch of `step` records as columns, which the step scorers share: it gives exactly
what feeding the same records one by one gives. `ranks_and_times` reads (rank, ts) of a run's steps and
heartbeats without building their records.

Nothing here imports the detector kit (`detectors.base`): the kit imports this.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Callable, Sequence
from operator import attrgetter, itemgetter
from typing import Any

import numpy as np
from gangwatch.schemas import Finding, Record
from gangwatch.schemas.columns import StepRows


class StepColumns:
    """A batch of `step` records as columns, shared by the detectors it is fed to.

    `StepColumns(records)` extracts each field lazily, once; `from_arrays`
    takes arrays as they come (a simulator) and `from_lists` the decoder's
    columns (`StepRows`), with no record objects at all. Numeric fields are
    (values, present): a missing value is NaN and not present, a NaN that was
    reported is NaN and present.
    """

    def __init__(self, recs: Sequence[Record] = ()) -> None:
        self.recs: list[Record] | None = [r for r in recs if r.kind == "step"]
        n = len(self.recs)
        self.ts = np.fromiter(map(attrgetter("ts"), self.recs), dtype=np.float64, count=n)
        self.step = np.fromiter(map(attrgetter("step"), self.recs), dtype=np.int64, count=n)
        self.rank = np.fromiter(map(attrgetter("rank"), self.recs), dtype=np.int64, count=n)
        self._lists: Callable[[str], list[Any]] | None = None
        self._floats: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._objects: dict[str, list[Any]] = {}

    @classmethod
    def from_arrays(cls, ts: Any, step: Any, rank: Any, *, strings: dict[str, list[str | None]] | None = None,
                    **floats: Any) -> StepColumns:
        """Columns from arrays of equal length: a numeric field is an array (NaN = missing) or a
        (values, present) pair; `strings` holds lists of str or None (replica_digest)."""
        cols = cls()
        cols.recs = None
        cols.ts = np.asarray(ts, dtype=np.float64)
        cols.step, cols.rank = np.asarray(step, dtype=np.int64), np.asarray(rank, dtype=np.int64)
        cols._objects.update(strings or {})
        for name, v in floats.items():
            vals, present = v if isinstance(v, tuple) else (v, None)
            vals = np.asarray(vals, dtype=np.float64)
            cols._floats[name] = (vals, ~np.isnan(vals) if present is None else np.asarray(present, bool))
        return cols

    @classmethod
    def from_lists(cls, lists: Callable[[str], list[Any]]) -> StepColumns:
        """Columns of the values `lists(attribute)` gives, one per record as a `Step` holds it (None where
        missing); each field is read once, when first asked for."""
        cols = cls()
        cols.recs, cols._lists = None, lists
        cols.ts = np.array(lists("ts"), dtype=np.float64)
        cols.step, cols.rank = np.array(lists("step"), dtype=np.int64), np.array(lists("rank"), dtype=np.int64)
        return cols

    def __len__(self) -> int:
        return len(self.ts)

    def _raw(self, name: str) -> list[Any]:
        if self.recs is not None:
            return list(map(attrgetter(name), self.recs))
        return self._lists(name) if self._lists is not None else [None] * len(self)

    def floats(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(values, present) of a numeric field."""
        if name not in self._floats:
            raw = self._raw(name)
            vals = np.array(raw, dtype=np.float64)
            present = np.ones(len(raw), dtype=bool)
            nan = np.flatnonzero(np.isnan(vals))  # None, or a NaN that was reported
            present[nan] = [raw[i] is not None for i in nan.tolist()]
            self._floats[name] = (vals, present)
        return self._floats[name]

    def objects(self, name: str) -> list[Any]:
        """A string field as a list (None where missing)."""
        if name not in self._objects:
            self._objects[name] = self._raw(name)
        return self._objects[name]


class RecordRun:
    """Consecutive records of one job during which its event time does not move, grouped by kind once.

    The run path of the detectors (`observe_run`) reads it: each detector gets the records of
    its kinds at once, and the step scorers share one `StepColumns` of the run's step records.
    The run may hold `StepRows` (a batch of steps, and maybe heartbeats, as the decoder's columns): their items
    take one position each like any record, `record(i)` builds an item's record only when it is read, and
    `lists` reads a field of the run's steps or heartbeats from the columns as they are.
    """

    def __init__(self, recs: Sequence[Record | StepRows]) -> None:
        self.pieces = recs
        self.recs: list[Record | None] = []  # the record at each position (None: an item of a StepRows, unbuilt)
        self.by_kind: dict[str, list[int]] = {}
        self._rows: list[tuple[int, StepRows]] = []  # (position of its first item, StepRows)
        out, by_kind = self.recs, self.by_kind
        for r in recs:
            if type(r) is StepRows:
                start = len(out)
                self._rows.append((start, r))
                out += [None] * len(r)
                if r.beats is None:
                    by_kind.setdefault("step", []).extend(range(start, len(out)))
                    continue
                for kind, at in (("step", r.steps_at), ("heartbeat", r.beats_at)):
                    if at:
                        by_kind.setdefault(kind, []).extend(map(start.__add__, at))
                continue
            pos = by_kind.get(r.kind)
            if pos is None:
                by_kind[r.kind] = [len(out)]
            else:
                pos.append(len(out))
            out.append(r)
        self._steps: StepColumns | None = None

    def __len__(self) -> int:
        return len(self.recs)

    def record(self, i: int) -> Record:
        """The record at position `i` (of a `StepRows`, every record of it is built at once: a reader of one
        record of a run, a detector's record-by-record fallback, usually reads its neighbours too)."""
        rec = self.recs[i]
        if rec is None:
            start, rows = self._rows[bisect.bisect_right(self._rows, i, key=itemgetter(0)) - 1]
            self.recs[start:start + len(rows)] = rows.records()
            rec = self.recs[i]
        return rec

    def positions(self, kinds: frozenset[str] | set[str]) -> list[int]:
        """Positions of the records of `kinds`, in order."""
        present = [self.by_kind[k] for k in kinds if k in self.by_kind]
        if len(present) == 1:
            return present[0]
        return sorted(i for pos in present for i in pos)

    def steps(self) -> StepColumns:
        """The run's step records as columns (`by_kind["step"]` gives their positions in the run)."""
        if self._steps is None:
            if not self._rows:
                recs = self.recs
                self._steps = StepColumns([recs[i] for i in self.by_kind.get("step", ())])
            else:  # (of the pieces, not of the run: the run holding its columns holding it would be a cycle)
                self._steps = StepColumns.from_lists(functools.partial(_lists_of, self.pieces, "step"))
        return self._steps

    def lists(self, kind: str, name: str) -> list[Any]:
        """Attribute `name` of every record of `kind` in the run, in order: the decoder's columns as they are
        (steps and heartbeats), and the attribute of each record between them."""
        if not self._rows:
            return list(map(attrgetter(name), map(self.recs.__getitem__, self.by_kind.get(kind, ()))))
        return _lists_of(self.pieces, kind, name)


def _lists_of(pieces: Sequence[Record | StepRows], kind: str, name: str) -> list[Any]:
    """`RecordRun.lists` of a run of these pieces."""
    out: list[Any] = []
    for r in pieces:
        if type(r) is StepRows:
            if kind == "step":
                out += r.cols[name]
            elif kind == "heartbeat" and r.beats is not None:
                out += r.beats[name]
        elif r.kind == kind:
            out.append(getattr(r, name))
    return out


def ranks_and_times(run: RecordRun, kinds: frozenset[str]) -> tuple[np.ndarray, np.ndarray]:
    """(rank, ts) of the run's records of `kinds` (steps and heartbeats), in run order: steps from the run's
    columns, other records from their attributes."""
    parts = []  # (positions, ranks, times) per kind
    for kind in kinds:
        pos = run.by_kind.get(kind)
        if not pos:
            continue
        if kind == "step":
            cols = run.steps()
            parts.append((pos, cols.rank, cols.ts))
        else:
            parts.append((pos, np.array(run.lists(kind, "rank"), dtype=np.int64),
                          np.array(run.lists(kind, "ts"), dtype=np.float64)))
    if len(parts) == 1:
        return parts[0][1], parts[0][2]
    order = np.argsort(np.concatenate([p[0] for p in parts]), kind="stable")
    return np.concatenate([p[1] for p in parts])[order], np.concatenate([p[2] for p in parts])[order]


def observe_each(det: Any, run: RecordRun) -> list[tuple[int, list[Finding]]]:
    """A detector's run path by its record path: `observe` on each record of its kinds, in order."""
    record, out = run.record, []
    for i in run.positions(det.kinds):
        found = det.observe(record(i))
        if found:
            out.append((i, found))
    return out
