"""What the worker holds for each job (`JobState`), and how that is saved and restored.

`JobRunner` (streams/runner.py) keeps one `JobState` per job: its core, the input offsets it has read, the
records it holds or owes. `pack_state` turns one into the value saved in the worker's state table, `cover_of`
reads what a saved value covers without unpacking it, and `unpack_state` brings a job back after a rebalance
or crash. Apart from the runner because this is the saved-state format and its bookkeeping, which a reader of
the runner's batch and time logic can take as given.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import orjson
from gangwatch.triage.budgets import CoreConfig
from gangwatch.triage.core import JobCore

if TYPE_CHECKING:
    from gangwatch.streams.items import Item


class Coverage(NamedTuple):
    """What one saved state of a job covers, per input ("topic:partition"): every record of the job below
    `next` except those at or above `low` that the state lists as not processed yet (held, or waiting for the
    job record). Small, and readable without unpacking the state (`cover_of`)."""

    next: dict[str, int]
    low: dict[str, int]


NOTHING_SAVED = Coverage({}, {})


@dataclass
class JobState:
    """Everything the worker holds for one job: its core and what it has already seen.

    `offsets` ("topic:partition" -> next offset after the job's newest record read there)
    are saved in the same value as the core, so a partition read again after a rebalance
    or crash is skipped instead of observed twice. Records read but not processed yet
    (`held`: ahead of the job's slowest input, see `JobRunner`; `pending`: waiting for the
    job record) are saved by position (offset, place in the message) as owed; a state
    restored with owed positions keeps them in `owed` until they are read again, and then
    processes them as new. Positions, not a high-water mark: records are released in
    event-time order, which within one partition need not be offset order (a record held
    at offset 5 while offset 9 was processed). `seen` de-duplicates node events, which the
    router may re-publish at new offsets: digest -> event time, kept for `runner.SEEN_S`.
    `written` is what the newest state written to the table covers, `first` the first
    offset read at an input no written state covers yet: together they say where reading
    must resume for this job (`uncovered`).
    """

    core: JobCore | None = None
    offsets: dict[str, int] = field(default_factory=dict)
    seen: dict[str, float] = field(default_factory=dict)
    owed: dict[str, set[tuple[int, int]]] = field(default_factory=dict)
    written: Coverage = NOTHING_SAVED
    first: dict[str, int] = field(default_factory=dict)
    partition: int = -1  # the job's partition number (the same on every job-keyed topic)
    arrived: float | None = None  # wall clock of the newest batch processed
    held: list[Item] = field(default_factory=list)  # in the order records go to the core (see `runner.Item`)
    pending: list[Item] = field(default_factory=list)  # no job record yet; in order too
    pending_since: float | None = None

    def unprocessed(self) -> dict[str, set[tuple[int, int]]]:
        """Positions of the records read (now or by an earlier worker) that the core has not processed."""
        out = {where: set(pos) for where, pos in self.owed.items()}
        for it in (*self.held, *self.pending):
            offset = it.msg.offset
            out.setdefault(f"{it.msg.topic}:{it.msg.partition}", set()).update((offset, idx) for idx in it.at())
        return out

    def uncovered(self) -> dict[str, int]:
        """Per input, the lowest offset holding a record of this job that no written state has processed:
        what the written state lists as owed, and everything read at an input since that state was taken."""
        out = dict(self.written.low)
        for where, nxt in self.offsets.items():
            was = self.written.next.get(where)
            if was is None or nxt > was:
                start = self.first.get(where, nxt) if was is None else was
                out[where] = min(out.get(where, start), start)
        return out


class Taken(NamedTuple):
    """A job's state as taken on the event loop (`take_state`), not yet compressed (`seal`)."""

    head: bytes  # its `Coverage`, one line of JSON
    body: bytes  # the state, JSON


def pack_state(st: JobState) -> bytes:
    """A job's saved state as a table value: its `Coverage` as one line of JSON, then the state as JSON,
    zlib-compressed (a 2,048-rank job: ~150 KB -> ~15 KB). A job whose `job` record has not been processed
    yet has no core: its state is only what it read and owes.

    Records read but not processed yet are listed by position (`owed`: "topic:partition" -> [[offset, place,
    place...], ...]) and their digests stay in `seen`: a worker that takes over processes them when it reads
    them again, and skips a copy the router re-published meanwhile.
    """
    return seal(take_state(st))


def take_state(st: JobState) -> Taken:
    """The first half of `pack_state`: what reads the job (it must not change meanwhile), as bytes."""
    owed = st.unprocessed()
    cover = Coverage(st.offsets, {where: min(pos)[0] for where, pos in owed.items() if pos})
    by_offset = {where: _group(pos) for where, pos in owed.items() if pos}
    body = {"core": None if st.core is None else st.core.state(), "offsets": st.offsets, "owed": by_offset,
            "seen": st.seen}
    return Taken(orjson.dumps(cover._asdict()), orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY))


def seal(taken: Taken) -> bytes:
    """The second half: compress. It reads only bytes and zlib lets go of the GIL, so the worker runs it in a
    thread, off its event loop (a 100k-rank job's state: ~0.1 s of compression)."""
    return taken.head + b"\n" + zlib.compress(taken.body, 1)


def _group(positions: set[tuple[int, int]]) -> list[list[int]]:
    places: dict[int, list[int]] = {}
    for offset, idx in sorted(positions):
        places.setdefault(offset, []).append(idx)
    return [[offset, *idx] for offset, idx in places.items()]


def cover_of(value: bytes) -> Coverage:
    """What a saved state covers, read from its first line only."""
    head = orjson.loads(value[:value.index(b"\n")])
    return Coverage(head["next"], head["low"])


def unpack_state(value: bytes, config: CoreConfig) -> JobState:
    """A saved job, running with today's `config` (settings are never read back from state)."""
    cut = value.index(b"\n")
    obj = orjson.loads(zlib.decompress(value[cut + 1:]))
    owed = {where: {(e[0], i) for e in entries for i in e[1:]} for where, entries in (obj.get("owed") or {}).items()}
    core = None if obj["core"] is None else JobCore.from_state(obj["core"], config)
    return JobState(core, dict(obj["offsets"]), dict(obj["seen"]), owed, cover_of(value))
