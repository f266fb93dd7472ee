"""A job's batch items in the worker's runner (`streams.runner`): a consumed message (`Msg`), and an `Item`, one
record of a job or a node's envelope of them as columns (`StepRows`), with the event-time order the record path
gives (`in_order`) and the cuts the runner's hold makes (`cut`, `ts_at`).

Apart from the runner because it is how items are ordered and taken apart, which a reader of the runner's
batch and time logic can take as given (tests/unit/test_runner_rows.py holds it equal to the record path).
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter
from typing import NamedTuple

from gangwatch.schemas import Record
from gangwatch.schemas.columns import StepRows


class Msg(NamedTuple):
    """One consumed Kafka message: where it came from and its bytes."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: float = 0.0  # the Kafka message timestamp, seconds



class Item(NamedTuple):
    """One record in a job's batch, or several of one message as a `StepRows` whose times never go down: record k
    of the item has sequence number `seq` + k and place `idx` + k in its message (`places[k]` where the message's
    records were sorted by time: `item_of`). Sorts by (ts, seq) of its first record natively (seq is unique, so
    `rec` is never compared).

    Its times are the job's: each record's stamped time less `shift`, what the job's clock takes out of its
    node's (`JobCore.read_shift`, known when the item was read; 0 before the job started). Ordered and held by
    stamped times, a node whose clock runs a minute ahead would be read a minute after its peers' records of
    the same moment, late, as it never arrived."""

    ts: float
    seq: int
    rec: Record | StepRows
    msg: Msg
    idx: int = 0  # the first record's place in its message (a batch envelope holds many)
    n: int = 1  # records in the item
    places: tuple[int, ...] | None = None  # each record's place in its message, where not idx, idx + 1, ...
    shift: float = 0.0  # stamped time - the job's time, of each of its records
    keyed: bool = True  # its times are the job's (False: read before the job's core was there, stamped times)

    def time(self, k: int) -> float:
        """The job's time of the item's record `k`."""
        return self.rec.ts[k] - self.shift if self.n > 1 else self.ts

    def at(self) -> Sequence[int]:
        """The places of the item's records in their message, in item order."""
        return self.places if self.places is not None else range(self.idx, self.idx + self.n)


TS, SEQ, N = attrgetter("ts"), attrgetter("seq"), attrgetter("n")


def last_of(it: Item) -> tuple[float, int]:
    """(ts, seq) of the item's last record."""
    return (it.rec.ts[-1] - it.shift, it.seq + it.n - 1) if it.n > 1 else (it.ts, it.seq)


def item_of(rows: StepRows, seq: int, msg: Msg) -> Item:
    """A message's `StepRows` (its records numbered from `seq`) as one item, sorted by time if it is not (a node
    agent packs its ranks' records in the order they came): its places in the message go with it. Not `keyed`
    yet."""
    ts = rows.ts
    if list(ts) == sorted(ts):
        return Item(ts[0], seq, rows, msg, 0, len(ts), None, 0.0, False)
    rows, order = rows.in_time_order()
    return Item(rows.ts[0], seq, rows, msg, order[0], len(order), tuple(order), 0.0, False)


def keyed(it: Item, shifts: Sequence[float]) -> list[Item]:
    """The item in the job's time, its records read `shifts` earlier than stamped (one per record): one item
    where they are all one, else one per record (nodes whose clocks differ, or one that stepped)."""
    first = shifts[0]
    if all(sh == first for sh in shifts):
        return [it._replace(ts=(it.rec.ts[0] if it.n > 1 else it.rec.ts) - first, shift=first, keyed=True)]
    return [one._replace(ts=one.ts - sh, shift=sh, keyed=True)
            for one, sh in zip(one_by_one(it._replace(shift=0.0)), shifts, strict=True)]


def one_by_one(it: Item) -> list[Item]:
    """The item as one item per record."""
    rows = it.rec
    if type(rows) is not StepRows:
        return [it]
    return [Item(ts - it.shift, it.seq + k, rec, it.msg, at, 1, None, it.shift, it.keyed)
            for k, (ts, rec, at) in enumerate(zip(rows.ts, rows.records(), it.at(), strict=True))]


def cut(it: Item, k: int) -> tuple[Item, Item]:
    """(the item's first `k` records, the rest), of an item of more than `k`."""
    head, tail = it.rec.split(k)
    places = it.places
    return (Item(it.ts, it.seq, head, it.msg, it.idx, k, places and places[:k], it.shift, it.keyed),
            Item(tail.ts[0] - it.shift, it.seq + k, tail, it.msg, it.at()[k], it.n - k, places and places[k:],
                 it.shift, it.keyed))


def in_order(items: list[Item], merge: bool = False) -> list[Item]:
    """The items ordered so that their records, item after item, come in (ts, seq) order, the record path's: a
    `StepRows` item whose time span holds another item's record is taken apart, record by record, with the
    items it overlaps. With `merge`, such items that are all `StepRows` become one (`merged`) instead: for
    items that go to the core now, whose places in their messages no longer matter."""
    items.sort()
    several = [k for k, size in enumerate(map(N, items)) if size > 1]  # only these span a time
    if not several:
        return items
    out: list[Item] = []
    done, n = 0, len(items)  # items[:done] are placed
    for k in several:
        if k < done:
            continue
        top, j = last_of(items[k]), k + 1
        while j < n and (items[j].ts, items[j].seq) < top:
            top = max(top, last_of(items[j]))
            j += 1
        if j > k + 1:
            out += items[done:k]
            group = items[k:j]
            if merge and all(type(x.rec) is StepRows and (x.shift, x.keyed) == (group[0].shift, group[0].keyed)
                             for x in group):
                out.append(merged(group))
            else:
                out += sorted(one for x in group for one in one_by_one(x))
            done = j
    out += items[done:]
    return out


def merged(group: list[Item]) -> Item:
    """`StepRows` items (in order, of one `shift`) as one, its records in (ts, seq) order. It stands for records
    of several messages: its `seq`, `msg` and `idx` are its first item's, which say nothing of its other
    records."""
    rows = StepRows.merged([x.rec for x in sorted(group, key=SEQ)])  # of equal times, the first read first
    first = group[0]
    return Item(rows.ts[0] - first.shift, first.seq, rows, first.msg, first.idx, len(rows), None, first.shift,
                first.keyed)


def ts_at(items: list[Item], k: int) -> float:
    """The time of record `k` (counting from 0) of the items, one after the other."""
    for it in items:
        if k < it.n:
            return it.time(k)
        k -= it.n
    raise IndexError(k)


def is_job(it: Item) -> bool:
    return type(it.rec) is not StepRows and it.rec.kind == "job"
