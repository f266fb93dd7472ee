"""A job's batch items in the worker's runner (`streams.runner`): a consumed message (`Msg`), and an `Item`, one
record of a job or a node's envelope of them as columns (`StepRows`), with the event-time order the record path
gives (`in_order`) and the cuts the runner's hold makes (`cut`, `ts_at`).

Apart from the runner because it is how items are ordered and taken apart, which a reader of the runner's
batch and time logic can take as given (tests/unit/test_runner_rows.py holds it equal to the record path).
"""

from __future__ import annotations

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
    """One record in a job's batch, or several consecutive ones of one message as a `StepRows` whose times never
    go down: record k of the item has sequence number `seq` + k and place `idx` + k in its message. Sorts by
    (ts, seq) of its first record natively (seq is unique, so `rec` is never compared)."""

    ts: float
    seq: int
    rec: Record | StepRows
    msg: Msg
    idx: int = 0  # the first record's place in its message (a batch envelope holds many)
    n: int = 1  # records in the item


TS, N = attrgetter("ts"), attrgetter("n")


def last_of(it: Item) -> tuple[float, int]:
    """(ts, seq) of the item's last record."""
    return (it.rec.ts[-1], it.seq + it.n - 1) if it.n > 1 else (it.ts, it.seq)


def one_by_one(it: Item) -> list[Item]:
    """The item as one item per record."""
    rows = it.rec
    if type(rows) is not StepRows:
        return [it]
    return [Item(ts, it.seq + k, rec, it.msg, it.idx + k)
            for k, (ts, rec) in enumerate(zip(rows.ts, rows.records(), strict=True))]


def cut(it: Item, k: int) -> tuple[Item, Item]:
    """(the item's first `k` records, the rest), of an item of more than `k`."""
    head, tail = it.rec.split(k)
    return Item(it.ts, it.seq, head, it.msg, it.idx, k), Item(tail.ts[0], it.seq + k, tail, it.msg, it.idx + k,
                                                                it.n - k)


def in_order(items: list[Item]) -> list[Item]:
    """The items ordered so that their records, item after item, come in (ts, seq) order, the record path's: a
    `StepRows` item whose time span holds another item's record is taken apart, record by record, with the
    items it overlaps."""
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
            out += sorted(one for x in items[k:j] for one in one_by_one(x))
            done = j
    out += items[done:]
    return out


def ts_at(items: list[Item], k: int) -> float:
    """The time of record `k` (counting from 0) of the items, one after the other."""
    for it in items:
        if k < it.n:
            return it.rec.ts[k] if it.n > 1 else it.ts
        k -= it.n
    raise IndexError(k)


def is_job(it: Item) -> bool:
    return type(it.rec) is not StepRows and it.rec.kind == "job"
