"""Workarounds for Faust 0.15 and aiokafka, patched onto Faust's consumer when a worker's app is made.

`make_app` (streams/worker.py) calls `cap_fetch_wait` and `seek_uncommitted` before it creates the app; the
coroutine `seek_to_committed` is what the patched seek runs, a plain function so that it can be tested without
a broker. Apart from the worker because these reach into Faust's and aiokafka's internals: each names the
library behaviour it works around, and goes when the library no longer needs it.
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from typing import Any


def cap_fetch_wait(ms: int) -> None:
    """Cap the consumer's fetch wait (Faust 0.15 passes fetch_max_wait_ms=1500 to aiokafka, fixed).

    aiokafka does not re-fetch a partition whose records are still buffered, so the next
    fetch of a busy partition can sit behind a fetch of idle ones that the broker holds
    for the whole wait: a worker busy on one hot partition then idles ~1.5 s per cycle
    (measured: 1k messages/s instead of 3k). Patched on the consumer Faust creates.
    """
    from faust.transport.drivers import aiokafka as driver

    cls = driver.AIOKafkaConsumerThread
    orig = getattr(cls, "_gangwatch_orig_create", None) or cls._create_worker_consumer

    def create(self: Any, transport: Any) -> Any:
        consumer = orig(self, transport)
        consumer._fetch_max_wait_ms = ms  # read when the consumer starts its fetcher
        return consumer

    cls._gangwatch_orig_create = orig
    cls._create_worker_consumer = create


def seek_uncommitted() -> None:
    """Make Faust's seek back to the committed offsets reach every input partition (`seek_to_committed`), and tell
    the worker's glue where each input's reading starts."""
    from faust.transport.drivers import aiokafka as driver

    async def seek_back(self: Any) -> Mapping[Any, int | None]:
        app = self.consumer.app
        committed, starts = await self.call_thread(seek_to_committed, self._ensure_consumer(),
                                                   app.conf.consumer_auto_offset_reset, app.tables.changelog_topics)
        glue = getattr(app, "gangwatch", None)  # the worker's I/O half: where each input's reading starts
        if glue is not None:
            glue.started(starts, committed)
        return committed

    driver.AIOKafkaConsumerThread.seek_to_committed = seek_back


async def seek_to_committed(consumer: Any, reset: str,
                            skip: Container[str]) -> tuple[dict[Any, int | None], dict[Any, int]]:
    """aiokafka's `seek_to_committed`, also for the partitions committed at offset 0 or not at all; returns the
    committed offsets (what Faust reads back) and where reading starts on each partition, where that is known.

    aiokafka seeks only the partitions whose committed offset is above 0 and leaves the others where the fetcher
    is. Faust drops what it fetched for a partition not active yet, or still queued for an agent when a rebalance
    starts, and counts on this seek to read it again: a partition committed at 0 (commits capped at its first
    record) or never (a new group) stayed past those records, which were never delivered; a restarted worker then
    held its jobs forever, waiting for an input it could not read (the release point, `JobRunner`). Such a
    partition goes back to the first record the log keeps (never committed: only under the earliest reset
    policy; latest leaves it be, and where it starts is not known). `skip`: topics Faust positions itself (the
    tables' changelogs)."""
    committed = await consumer.seek_to_committed()
    starts = {tp: offset for tp, offset in committed.items()
              if tp.topic not in skip and offset is not None and offset > 0}
    first = [tp for tp, offset in committed.items()
             if tp.topic not in skip and tp not in starts and (offset == 0 or reset == "earliest")]
    if first:
        for tp, offset in (await consumer.beginning_offsets(first)).items():
            consumer.seek(tp, offset)
            starts[tp] = offset
    return committed, starts
