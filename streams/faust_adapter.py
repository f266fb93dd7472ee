"""The one place gangwatch reaches into Faust's and aiokafka's internals, and the versions that was tested with.

Faust (faust-streaming) is the worker's framework and is used through its public API everywhere else. A few
needs have no public API in faust-streaming 0.15 and aiokafka 0.14; each is a function here that names the
behaviour it works around, so that it goes when the library no longer needs it:

- `cap_fetch_wait`: the consumer's fetch wait, fixed at 1.5 s by Faust, capped (a busy partition behind idle ones);
- `seek_uncommitted` / `seek_to_committed`: the seek back to the committed offsets also for partitions committed
  at 0 or never, and where each input's reading starts, told to the worker's I/O half;
- `wrap_commit`: the commits capped at what saved states cover (`streams.checkpoint.Checkpoint.install`);
- `watch_changelog_sends`: when a job's saved state is on the broker, not just in the producer's buffer;
- `aiokafka_consumer`, `aiokafka_producer`, `committed_offset`: aiokafka's own objects under Faust's driver;
- `not_fetching`: the partitions Faust leaves unfetched on purpose (paused, or their buffer full);
- `ChangelogsNotYet`: aiokafka's start-up ERROR lines about the changelog topics Faust is still creating;
- `NormalStates`: Faust's ERROR and WARNING lines about states that are normal for this worker, said as INFO;
- `partition_of`: the producers' partitioner (murmur2), for the jobs of our partitions.

`check_versions` runs when a worker starts: an untested Faust or aiokafka is refused in one line (the pins in
pyproject.toml keep pip from installing one), unless GANGWATCH_UNTESTED_FRAMEWORK=1 says to run anyway.
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Awaitable, Callable, Container, Mapping
from importlib import metadata
from typing import Any

# distribution -> the release series tested with (the leading parts of a version)
TESTED = {"faust-streaming": ("0.15",), "aiokafka": ("0.14",)}  # pyproject.toml pins the same
OVERRIDE_ENV = "GANGWATCH_UNTESTED_FRAMEWORK"


class UntestedFramework(RuntimeError):
    """An installed Faust or aiokafka this adapter was not tested with."""


def check_versions(version: Callable[[str], str] = metadata.version, env: Mapping[str, str] | None = None) -> None:
    """Refuse, in one line, a Faust or aiokafka of a series not in `TESTED`; GANGWATCH_UNTESTED_FRAMEWORK=1 lets
    it run (at the user's risk: these internals may have moved)."""
    env = os.environ if env is None else env
    for dist, series in TESTED.items():
        got = version(dist)
        if not any(got == s or got.startswith(s + ".") for s in series):
            if env.get(OVERRIDE_ENV, "") in ("1", "true", "yes"):
                continue
            pins = " or ".join(f"{s}.x" for s in series)
            raise UntestedFramework(f"{dist} {got} is installed, but the worker reaches into its internals and was "
                                    f"tested with {pins} only: install that (pip install -e '.[worker]' keeps to "
                                    f"the pins), or set {OVERRIDE_ENV}=1 to run it anyway")


# app -> the worker's I/O half (`WorkerIO`): what the patched seek tells where each input's reading starts
_WORKERIO: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def attach(app: Any, workerio: Any) -> None:
    """Make `workerio` the I/O half of `app`: the adapter's seek back (`seek_uncommitted`) reports to it."""
    _WORKERIO[app] = workerio


def attached(app: Any) -> Any:
    """The I/O half `attach` gave `app` (None: none)."""
    return _WORKERIO.get(app)


def partition_of(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner (aiokafka's and the Java client's: murmur2) gives `key`."""
    from aiokafka.partitioner import murmur2

    return (murmur2(key) & 0x7FFFFFFF) % partitions


class ChangelogsNotYet(logging.Filter):
    """Start-up noise off: aiokafka's ERROR `Topic <app id>-...-changelog not found in cluster metadata`.

    A new worker logs it 12-17 times while Faust creates its tables' changelog topics
    (the clients ask for their metadata before the topics exist): nothing is wrong, so
    until `done()` (the producer knows the changelog topics) that one message, for this
    app's changelog topics only, is demoted to DEBUG (shown with `--loglevel debug`).
    After `done()` the filter is gone: the same line later means a topic went missing.
    """

    MESSAGE = "Topic %s not found in cluster metadata"  # aiokafka/cluster.py, logger aiokafka.cluster

    def __init__(self, app_id: str, logger: str = "aiokafka.cluster") -> None:
        super().__init__()
        self.prefix = f"{app_id}-"
        self.logger = logging.getLogger(logger)
        self.demoted = 0
        self.logger.addFilter(self)

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        if not (record.msg == self.MESSAGE and record.levelno > logging.DEBUG and len(args) == 1
                and str(args[0]).startswith(self.prefix) and str(args[0]).endswith("-changelog")):
            return True
        self.demoted += 1
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return self.logger.isEnabledFor(logging.DEBUG)

    def done(self) -> None:
        self.logger.removeFilter(self)  # (again: nothing)


class NormalStates(logging.Filter):
    """Faust's ERROR (and one WARNING) lines for states that are normal for this worker, said as INFO in words
    that say why (DEBUG for the changelog ones), for this app's topics only; every other line untouched:

    - `Stream has not started processing TP(...)` (faust.transport.drivers.aiokafka, after
      `stream_processing_timeout`): a partition whose stream has taken no record since the worker started. The
      worker reads inputs in batches and holds commits at what saved states cover, so an idle partition, or one
      whose only records are before the commit point, looks like this;
    - `Aiokafka has not sent fetch request for TP(<app id>-...-changelog, ...)`: a table's changelog is read
      only to recover a state, never fetched afterwards;
    - `Ignoring missing topic: '<app id>-...-changelog'` (faust.assignor.partition_assignor, a WARNING): a
      rebalance before Faust has created its tables' changelog topics.
    """

    LOGGERS = ("faust.transport.drivers.aiokafka", "faust.assignor.partition_assignor")
    IDLE = "Stream has not started processing %r (started %s)."  # faust: SLOW_PROCESSING_STREAM_IDLE_SINCE_START
    NO_FETCH = "Aiokafka has not sent fetch request for %r since start (started %s)"
    MISSING = "Ignoring missing topic: %r"
    SAID_IDLE = "partition %r: no record taken since the worker started (%s); normal while it has no new input"

    def __init__(self, app_id: str, prefix: str) -> None:
        super().__init__()
        self.app_id, self.prefix = app_id, prefix
        self.loggers = [logging.getLogger(name) for name in self.LOGGERS]
        for logger in self.loggers:
            logger.addFilter(self)

    def _changelog(self, topic: str) -> bool:
        return topic.startswith(f"{self.app_id}-") and topic.endswith("-changelog")

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        msg = str(record.msg)
        if not args or record.levelno < logging.WARNING:
            return True
        topic = str(getattr(args[0], "topic", args[0]))
        if self.IDLE in msg and topic.startswith(self.prefix):
            record.msg, record.args = self.SAID_IDLE, (args[0], args[1])
            return self._demote(record, logging.INFO)
        if (self.NO_FETCH in msg or self.MISSING in msg) and self._changelog(topic):
            return self._demote(record, logging.DEBUG)
        return True

    def _demote(self, record: logging.LogRecord, level: int) -> bool:
        record.levelno, record.levelname = level, logging.getLevelName(level)
        return record.name is None or logging.getLogger(record.name).isEnabledFor(level)

    def close(self) -> None:
        for logger in self.loggers:
            logger.removeFilter(self)


def aiokafka_consumer(app: Any) -> Any:
    """The aiokafka consumer under Faust's consumer thread (created if not yet)."""
    return app.consumer._thread._ensure_consumer()


def aiokafka_producer(app: Any) -> Any:
    """The aiokafka producer under Faust's producer (created if not yet)."""
    return app.producer._ensure_producer()


def committed_offset(app: Any, tp: Any) -> int | None:
    """What Faust's consumer last read back as the group's committed offset of `tp` (None: none)."""
    return app.consumer._committed_offset.get(tp)


def not_fetching(app: Any) -> set[Any]:
    """Input partitions Faust does not fetch now on purpose: paused, or their buffer full until the agents take
    what is in it (faust-streaming 0.15: `Consumer._paused_partitions`, `_buffered_partitions`)."""
    consumer = app.consumer
    return set(getattr(consumer, "_paused_partitions", ())) | set(getattr(consumer, "_buffered_partitions", ()))


def wrap_commit(app: Any, capped: Callable[[Mapping[Any, int]], Awaitable[bool]]) -> Callable[..., Any]:
    """Route Faust's commits through `capped`; returns Faust's own commit, which `capped` calls with what it
    allows (ThreadDelegateConsumer._commit in faust-streaming 0.15)."""
    consumer = app.consumer
    own = consumer._commit
    consumer._commit = capped
    return own


def watch_changelog_sends(table: Any, on_send: Callable[[Any], None]) -> bool:
    """Call `on_send(future)` with the future of each changelog message `table` sends (resolved once the broker
    has it); False for a plain mapping, which has no changelog."""
    send = getattr(table, "send_changelog", None)
    if send is None:
        return False

    def send_changelog(*args: Any, **kwargs: Any) -> Any:
        fut = send(*args, **kwargs)
        on_send(fut)
        return fut

    table.send_changelog = send_changelog
    return True


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
    the worker's workerio where each input's reading starts."""
    from faust.transport.drivers import aiokafka as driver

    async def seek_back(self: Any) -> Mapping[Any, int | None]:
        app = self.consumer.app
        committed, starts = await self.call_thread(seek_to_committed, self._ensure_consumer(),
                                                   app.conf.consumer_auto_offset_reset, app.tables.changelog_topics)
        workerio = attached(app)  # the worker's I/O half: where each input's reading starts
        if workerio is not None:
            workerio.started(starts, committed)
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
