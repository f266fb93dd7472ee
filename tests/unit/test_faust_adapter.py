"""The adapter's eager delivery (`faust_adapter.eager_wait_first`): the consumer's `wait_first` as mode's, except
that a callback finishing in its first step is done at once, with no task; one that waits is carried on by mode's
own `wait_first`, so a suspended flow still wins, cancels it, and its exceptions still reach the caller."""

from __future__ import annotations

import asyncio
import warnings

import pytest
from gangwatch.streams.faust_adapter import eager_wait_first
from mode import Service

pytestmark = pytest.mark.unit


class Consumer(Service):
    """A service as Faust's consumer is one: `_stopped`, `_crashed`, mode's `wait_first`."""


def run(coro):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a coroutine left never awaited would warn
        return asyncio.run(coro)


def test_a_callback_that_does_not_wait_is_delivered_at_once_and_the_other_never_runs():
    seen = []

    async def callback():
        seen.append("callback")
        return 7

    async def suspended():
        seen.append("suspend flow")  # never: the callback won before anything was scheduled

    async def main():
        c = Consumer()
        later = asyncio.get_running_loop().call_soon(seen.append, "the loop turned")
        tasks = len(asyncio.all_tasks())
        got = await eager_wait_first(c, callback(), suspended())
        assert len(asyncio.all_tasks()) == tasks and seen == ["callback"]  # before the loop turned once
        later.cancel()
        return got

    got = run(main())
    assert (got.results, got.stopped, seen) == ([7], False, ["callback"])


def test_a_callback_that_waits_is_finished_by_the_original_with_its_result():
    order = []

    async def main():
        c, go = Consumer(), asyncio.Event()

        async def callback():
            order.append("first step")
            await go.wait()
            order.append("rest")
            return "delivered"

        async def release():
            order.append("released")
            go.set()

        waiting = eager_wait_first(c, callback(), asyncio.Event().wait())
        asyncio.get_running_loop().call_soon(lambda: asyncio.ensure_future(release()))
        return await waiting

    got = run(main())
    assert got.results == ["delivered"] and order == ["first step", "released", "rest"]


def test_a_suspended_flow_wins_over_a_waiting_callback_which_is_cancelled():
    cleaned = []

    async def main():
        c, suspend = Consumer(), asyncio.Event()

        async def callback():
            try:
                await asyncio.Event().wait()  # a full queue that never drains
            finally:
                cleaned.append("cancelled")

        waiting = asyncio.ensure_future(eager_wait_first(c, callback(), suspend.wait()))
        await asyncio.sleep(0)
        suspend.set()
        got = await waiting
        await asyncio.sleep(0)  # the cancelled rest runs its finally
        return got

    got = run(main())
    assert got.results == [True] and cleaned == ["cancelled"]


@pytest.mark.parametrize("waits", [False, True], ids=["at once", "after waiting"])
def test_the_callbacks_exception_reaches_the_caller(waits):
    async def main():
        c = Consumer()

        async def callback():
            if waits:
                await asyncio.sleep(0)
            raise ValueError("bad message")

        await eager_wait_first(c, callback(), asyncio.Event().wait())

    with pytest.raises(ValueError, match="bad message"):
        run(main())


def test_a_stopped_consumer_and_an_event_go_to_the_original():
    async def main():
        c = Consumer()
        ready = asyncio.Event()
        ready.set()
        first = await eager_wait_first(c, ready)  # an event: mode's own path
        c._stopped.set()
        ran = []

        async def callback():
            ran.append(1)

        second = await eager_wait_first(c, callback())
        return first, second, ran

    first, second, ran = run(main())
    assert first.done == [first.done[0]] and not first.stopped
    assert second.stopped  # as mode answers once stopped (it may or may not have run the callback)
