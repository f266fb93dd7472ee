"""The per-step buffer every step-scoring detector shares (fail-slow, slowdown, SDC).

`StepBuffer` gathers the per-rank values of each step into numpy arrays and
hands the step over (`Closed`) once it is complete, once most ranks are `lag`
steps further on, when more than `max_open` steps are open, or `lateness_s`
after its first record (`expire`). The two rules by count (most ranks further
on, too many steps open) wait `reorder_s` of event time after a step's first
record: sidecars send each rank's records in batches (the trainer client every
second), so live, one rank's next steps often arrive before another rank's
current one; read in event-time order (a replay) they do not. Within the
window a step sees the same ranks either way, so live and replay score the
same steps. `add_columns` is the batch path (`runs.StepColumns`), giving
exactly what feeding the same records one by one gives.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import numpy as np
from gangwatch.detectors.base import fill_missing
from gangwatch.detectors.config import BufferConfig
from gangwatch.detectors.floats import decode_floats, encode_floats
from gangwatch.detectors.runs import StepColumns
from gangwatch.schemas import Record

_BATCH_MIN_RUN = 16  # shorter runs of one step go through the per-record path (cheaper, same result)


@dataclass
class Closed:
    """One step handed over for scoring: per-rank arrays (index = rank)."""

    step: int
    ts: float  # event time at which the step closed
    epoch: int  # bumped by a rewind (the job went back to an earlier step)
    seen: np.ndarray
    vals: dict[str, np.ndarray]  # "f"/"nf" fields; NaN where missing
    present: dict[str, np.ndarray]  # "nf" fields: a value was reported
    codes: dict[str, np.ndarray]  # "c" fields: index into vocab, -1 missing
    vocab: dict[str, list[str]]


class _Slot:
    __slots__ = ("step", "first_ts", "count", "seen", "vals", "present", "codes", "index", "setters")

    def __init__(self, step: int, first_ts: float, size: int, fields: dict[str, str]) -> None:
        self.step, self.first_ts, self.count = step, first_ts, 0
        self.seen = np.zeros(size, dtype=bool)
        self.vals = {n: np.full(size, np.nan) for n, k in fields.items() if k != "c"}
        self.present = {n: np.zeros(size, dtype=bool) for n, k in fields.items() if k == "nf"}
        self.codes = {n: np.full(size, -1, dtype=np.int32) for n, k in fields.items() if k == "c"}
        self.index: dict[str, dict[str, int]] = {n: {} for n in self.codes}  # value -> code, in arrival order
        # per field, in `fields` order: (array, present array or None, vocabulary or None), for `StepBuffer.add`
        self.setters = tuple((self.codes[n], None, self.index[n]) if k == "c" else
                             (self.vals[n], self.present.get(n), None) for n, k in fields.items())

    def vocab(self) -> dict[str, list[str]]:
        return {n: list(idx) for n, idx in self.index.items()}


class StepBuffer:
    """Per-step arrays of selected `step` fields until each step can be scored.

    `fields` maps a Step attribute to its kind: "f" (float, None -> NaN), "nf"
    (float that may be NaN/Inf on purpose; kept apart from "missing") or "c"
    (a string such as a digest, stored as codes into a per-step vocabulary).
    A record for a step already closed is dropped; if most ranks send records
    for a step far behind (more than `max_open` steps), the job was rewound
    (restarted from a checkpoint): open steps are discarded and `epoch` bumps.

    The rules by count close a step only once it is `reorder_s` old (in the
    event time of the record that closes it): the most-ranks rule marks steps
    up to `lag_upto` as due, and they close when a later record (one that
    opens a step, or brings a step to most ranks) is that much newer; the
    crowding rule keeps up to `cap` steps open while the oldest is younger.
    A complete step closes at once, with every step before it.
    """

    def __init__(self, size: int, fields: dict[str, str], config: BufferConfig | None = None) -> None:
        self.size, self.fields, self.config = size, dict(fields), config or BufferConfig()
        self.names = tuple(self.fields)
        self._get = attrgetter(*self.names)
        self.need = max(1, math.ceil(self.config.close_frac * size))
        self.open: dict[int, _Slot] = {}
        self.closed_upto: int | None = None
        self.lag_upto: int | None = None  # steps up to this are due (most ranks moved on), once `reorder_s` old
        self.closed_ts = -math.inf  # event time of the latest close
        self.cap = max(self.config.max_open, min(64, self.config.reorder_cells // max(1, size)))
        self.epoch = self.dropped = 0
        self.votes: dict[int, int] = {}
        # with `late` a list, the rows of records that came after their step closed are kept there for the scorer
        # (step, rank, ts, row, their place in the batch being added: -1 one by one); None: dropped, as they are
        self.late: list[tuple[int, int, float, tuple[Any, ...], int]] | None = None
        self._at = -1

    # --- one record ---

    def _row(self, rec: Record) -> tuple[Any, ...]:
        row = self._get(rec)
        return row if len(self.names) > 1 else (row,)

    def add_record(self, rec: Record) -> list[Closed]:
        return self.add(rec.step, rec.rank, rec.ts, self._row(rec))

    def add(self, step: int, rank: int, ts: float, row: tuple[Any, ...]) -> list[Closed]:
        """Buffer one rank's values of one step (aligned with `fields`); return the steps this closed."""
        out: list[Closed] = []
        if not 0 <= rank < self.size:
            self.dropped += 1
            return out
        if self.closed_upto is not None and step <= self.closed_upto:
            self._late(step, ts)
            if self.late is not None:
                self.late.append((step, rank, ts, row, self._at))
            return out
        slot = self.open.get(step)
        if slot is None:
            out += self._close_due(ts)
            if len(self.open) >= self.config.max_open:
                oldest = min(self.open)
                if len(self.open) >= self.cap or self.open[oldest].first_ts + self.config.reorder_s <= ts:
                    out += self._close_through(oldest, ts)
            if self.closed_upto is not None and step <= self.closed_upto:
                self._late(step, ts)
                if self.late is not None:
                    self.late.append((step, rank, ts, row, self._at))
                return out
            slot = self.open[step] = _Slot(step, ts, self.size, self.fields)
        if slot.seen[rank]:
            self.dropped += 1
            return out
        slot.seen[rank] = True
        for (arr, present, vocab), v in zip(slot.setters, row, strict=True):
            if v is None:
                continue
            if vocab is not None:
                arr[rank] = vocab.setdefault(v, len(vocab))
            else:
                arr[rank] = v
                if present is not None:
                    present[rank] = True
        slot.count += 1
        if slot.count == self.need:
            out += self._due(step - self.config.lag, ts)
        if slot.count == self.size:
            out += self._close_through(step, ts)
        return out

    def _late(self, step: int, ts: float) -> None:
        self.dropped += 1
        if self.closed_upto is None or self.closed_upto - step <= self.config.max_open or ts < self.closed_ts:
            return  # a record sent late carries its step's time, older than the last close; a rewound job's are new
        n = self.votes[step] = self.votes.get(step, 0) + 1
        self.votes = self.votes if len(self.votes) <= 64 else {step: n}
        if n >= self.need:  # most ranks are back at an earlier step: a rewind
            self.open, self.votes, self.closed_upto, self.lag_upto, self.epoch = {}, {}, step, step, self.epoch + 1

    def _due(self, target: int, ts: float) -> list[Closed]:
        """Most ranks are past `target` + lag: steps up to `target` close once `reorder_s` old."""
        if self.lag_upto is None or target > self.lag_upto:
            self.lag_upto = target
        return self._close_due(ts)

    def _close_due(self, ts: float) -> list[Closed]:
        """Close, oldest first, the due steps that are `reorder_s` old at event time `ts`."""
        out: list[Closed] = []
        due, wait = self.lag_upto, self.config.reorder_s
        while due is not None and self.open:
            s = min(self.open)
            if s > due or self.open[s].first_ts + wait > ts:
                break
            out += self._close_through(s, ts)
        return out

    def _close_through(self, target: int, ts: float) -> list[Closed]:
        if self.closed_upto is None or target > self.closed_upto:
            self.closed_upto = target
        self.closed_ts = max(self.closed_ts, ts)
        out = []
        for s in sorted(s for s in self.open if s <= target):
            sl = self.open.pop(s)
            out.append(Closed(s, float(ts), self.epoch, sl.seen, sl.vals, sl.present, sl.codes, sl.vocab()))
        return out

    # --- a batch ---

    def add_columns(self, cols: StepColumns, at: list[int] | None = None) -> list[Closed]:
        """Buffer a batch; the same result as `add` for each record in order, vectorized per run of a step.
        With `at`, the position in `cols` of the record that closed each step returned is appended to it."""
        out: list[Closed] = []
        n = len(cols)
        if n == 0:
            return out
        steps, ranks, ts = cols.step, cols.rank, cols.ts
        cuts = np.flatnonzero(steps[1:] != steps[:-1]) + 1
        bounds = zip([0, *cuts.tolist()], [*cuts.tolist(), n], strict=True)
        cached = {name: (cols.objects(name) if k == "c" else cols.floats(name)) for name, k in self.fields.items()}
        for a, e in bounds:
            s = int(steps[a])
            late = self.closed_upto is not None and s <= self.closed_upto
            new = s not in self.open
            crowded = new and len(self.open) >= self.config.max_open
            behind = new and self.lag_upto is not None and s <= self.lag_upto  # may be late once due steps close
            if late or crowded or behind or e - a < _BATCH_MIN_RUN:
                for i in range(a, e):
                    self._at = i
                    got = self.add(s, int(ranks[i]), float(ts[i]), self._cached_row(cached, i))
                    if got:
                        out += got
                        if at is not None:
                            at += [i] * len(got)
            else:
                out += self._add_run(s, a, e, ranks, ts, cached, at)
        self._at = -1
        return out

    def _cached_row(self, cached: dict[str, Any], i: int) -> tuple[Any, ...]:
        return tuple(cached[nm][i] if k == "c" else (float(cached[nm][0][i]) if cached[nm][1][i] else None)
                     for nm, k in self.fields.items())

    def _add_run(self, s: int, a: int, e: int, ranks: np.ndarray, ts: np.ndarray,
                 cached: dict[str, Any], at: list[int] | None = None) -> list[Closed]:
        r = ranks[a:e]
        pos = np.flatnonzero((r >= 0) & (r < self.size))
        if pos.size == 0:
            self.dropped += e - a
            return []
        out: list[Closed] = []
        slot = self.open.get(s)
        if slot is None:  # as `add` for the run's first record: what is due closes, then the step opens
            i0 = a + int(pos[0])
            got = self._close_due(float(ts[i0]))
            out += got
            if at is not None:
                at += [i0] * len(got)
            slot = self.open[s] = _Slot(s, float(ts[i0]), self.size, self.fields)
        uniq, first = np.unique(r[pos], return_index=True)  # first record of each rank in this run ...
        fresh = ~slot.seen[uniq]  # ... not seen before, in arrival order
        firstpos = pos[first][fresh]
        order = np.argsort(firstpos, kind="stable")
        new_r, src = uniq[fresh][order], a + firstpos[order]
        self.dropped += (e - a) - new_r.size
        slot.seen[new_r] = True
        for name, kind in self.fields.items():
            if kind == "c":
                col, idx = cached[name], slot.index[name]
                vals, rk = [col[i] for i in src.tolist()], new_r
                if None in vals:
                    rk = new_r[np.array([v is not None for v in vals], dtype=bool)]
                    vals = [v for v in vals if v is not None]
                slot.codes[name][rk] = [idx.setdefault(v, len(idx)) for v in vals]
            else:
                vals, present = cached[name]
                slot.vals[name][new_r] = vals[src]
                if kind == "nf":
                    slot.present[name][new_r] = present[src]
        c0 = slot.count
        c1 = slot.count = c0 + new_r.size
        if c0 < self.need <= c1:
            i = int(src[self.need - c0 - 1])
            got = self._due(s - self.config.lag, float(ts[i]))
            out += got
            if at is not None:
                at += [i] * len(got)
        if c0 < self.size == c1:
            i = int(src[self.size - c0 - 1])
            got = self._close_through(s, float(ts[i]))
            out += got
            if at is not None:
                at += [i] * len(got)
        return out

    # --- time ---

    def expire(self, now: float) -> list[Closed]:
        """Close, oldest first, steps whose first record is `lateness_s` old (and all before them)."""
        out: list[Closed] = []
        deadline = -math.inf
        for s in sorted(self.open):
            deadline = max(deadline, self.open[s].first_ts + self.config.lateness_s)
            if deadline > now:
                break
            out += self._close_through(s, deadline)
        return out

    # --- state ---

    def state(self) -> dict[str, Any]:
        slots = []
        for s in sorted(self.open):
            sl = self.open[s]
            rk = np.flatnonzero(sl.seen)
            d: dict[str, Any] = {"step": s, "first_ts": sl.first_ts, "count": sl.count, "ranks": rk.tolist()}
            for name, kind in self.fields.items():
                if kind == "c":
                    d[name] = {"vocab": list(sl.index[name]), "codes": sl.codes[name][rk].tolist()}
                else:
                    d[name] = encode_floats(sl.vals[name][rk], sl.present[name][rk] if kind == "nf" else None)
            slots.append(d)
        return {"size": self.size, "closed_upto": self.closed_upto, "lag_upto": self.lag_upto,
                "closed_ts": self.closed_ts if math.isfinite(self.closed_ts) else None, "epoch": self.epoch,
                "dropped": self.dropped,
                "votes": [[k, v] for k, v in self.votes.items()], "open": slots}

    @staticmethod
    def upgrade_state(st: dict[str, Any], version: int) -> dict[str, Any]:
        """`state()` saved by job state `version`, in the shape of `version + 1` (see `DetectorBase.upgrade_state`).
        """
        if version == 2:  # (saved before the reorder window: a step was due once it closed)
            fill_missing(st, {"lag_upto": st["closed_upto"], "closed_ts": None})
        return st

    def load(self, st: dict[str, Any]) -> None:
        """Restore `state()` into this (empty) buffer of the same size and fields."""
        self.closed_upto, self.epoch, self.dropped = st["closed_upto"], st["epoch"], st["dropped"]
        self.lag_upto = st["lag_upto"]
        self.closed_ts = -math.inf if st["closed_ts"] is None else float(st["closed_ts"])
        self.votes = {int(k): int(v) for k, v in st["votes"]}
        for d in st["open"]:
            sl = _Slot(int(d["step"]), float(d["first_ts"]), self.size, self.fields)
            rk, sl.count = np.asarray(d["ranks"], dtype=np.int64), int(d["count"])
            sl.seen[rk] = True
            for name, kind in self.fields.items():
                if kind == "c":
                    sl.index[name].update({v: i for i, v in enumerate(d[name]["vocab"])})  # the dict `setters` holds
                    sl.codes[name][rk] = np.asarray(d[name]["codes"], dtype=np.int32)
                else:
                    vals, present = decode_floats(d[name])
                    sl.vals[name][rk] = vals
                    if kind == "nf":
                        sl.present[name][rk] = present
            self.open[sl.step] = sl
