"""The reconciler's work queue: dedup, per-key serialisation, delayed adds, retry with backoff."""

from __future__ import annotations

import asyncio

import pytest

from fleetpilot.operator import workqueue


def test_a_key_added_many_times_is_queued_once() -> None:
    async def go() -> list[str]:
        queue: workqueue.WorkQueue[str] = workqueue.WorkQueue()
        for key in ("a", "b", "a", "a", "b", "c"):
            queue.add(key)
        assert len(queue) == 3
        return [await queue.get() for _ in range(3)]

    assert asyncio.run(go()) == ["a", "b", "c"]


def test_a_key_in_progress_is_not_handed_out_again_but_runs_once_more_after_done() -> None:
    async def go() -> None:
        queue: workqueue.WorkQueue[str] = workqueue.WorkQueue()
        queue.add("a")
        key = await queue.get()
        queue.add("a")
        queue.add("a")  # both fold into one more pass
        queue.add("b")
        assert await queue.get() == "b"  # "a" is not given to a second worker
        second = asyncio.create_task(queue.get())
        await asyncio.sleep(0)
        assert not second.done()
        queue.done(key)
        assert await asyncio.wait_for(second, 1) == "a"
        queue.done("a")
        queue.done("b")
        assert queue.idle()

    asyncio.run(go())


def test_two_workers_never_hold_the_same_key() -> None:
    """Many adds of few keys by many workers: at no moment is a key held twice, and every add is served."""
    holders: dict[str, int] = {}
    overlaps = 0
    passes = 0

    async def worker(queue: workqueue.WorkQueue[str]) -> None:
        nonlocal overlaps, passes
        while True:
            key = await queue.get()
            holders[key] = holders.get(key, 0) + 1
            overlaps += holders[key] > 1
            await asyncio.sleep(0.001)
            holders[key] -= 1
            passes += 1
            queue.done(key)

    async def go() -> None:
        queue: workqueue.WorkQueue[str] = workqueue.WorkQueue()
        workers = [asyncio.create_task(worker(queue)) for _ in range(4)]
        for i in range(200):
            queue.add(f"k{i % 3}")
            await asyncio.sleep(0)
        while not queue.idle():
            await asyncio.sleep(0.001)
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)

    asyncio.run(go())
    assert overlaps == 0
    assert 3 <= passes < 200  # adds folded together, and each key was looked at


def test_add_after_keeps_the_earliest_wake_up() -> None:
    async def go() -> list[str]:
        queue: workqueue.WorkQueue[str] = workqueue.WorkQueue()
        queue.add_after("late", 0.2)
        queue.add_after("soon", 5.0)
        queue.add_after("soon", 0.05)  # earlier: replaces the 5 s timer
        queue.add_after("late", 10.0)  # later: the 0.2 s timer stays
        first = await asyncio.wait_for(queue.get(), 2)
        second = await asyncio.wait_for(queue.get(), 2)
        return [first, second]

    assert asyncio.run(go()) == ["soon", "late"]


@pytest.mark.parametrize(("failures", "expected"), [(1, 0.5), (2, 1.0), (3, 2.0), (8, 60.0), (20, 60.0)])
def test_backoff_doubles_from_the_base_up_to_the_cap(failures: int, expected: float) -> None:
    assert workqueue.backoff_delay(failures, base_s=0.5, max_s=60.0) == expected


def test_retry_backs_off_and_forget_starts_afresh() -> None:
    async def go() -> None:
        queue: workqueue.WorkQueue[str] = workqueue.WorkQueue(base_delay_s=0.01, max_delay_s=0.04)
        queue.add("a")
        key = await queue.get()
        delays = []
        for _ in range(4):
            delays.append(queue.retry(key))
            queue.done(key)
            key = await asyncio.wait_for(queue.get(), 1)  # it does come back
        assert delays == [0.01, 0.02, 0.04, 0.04]
        assert queue.failures("a") == 4
        queue.forget("a")
        assert queue.retry("a") == 0.01
        queue.done("a")
        queue.shutdown()

    asyncio.run(go())


def test_cancel_drops_a_planned_wake_up() -> None:
    async def go() -> bool:
        queue: workqueue.WorkQueue[str] = workqueue.WorkQueue()
        queue.add_after("gone", 0.02)
        queue.cancel("gone")
        await asyncio.sleep(0.06)
        return queue.idle() and len(queue) == 0

    assert asyncio.run(go())


def test_a_high_priority_key_is_handed_out_before_every_low_one_and_a_waiting_key_moves_up() -> None:
    """A thousand pods turning Ready queue their graphs LOW; a `kubectl scale` of one of them (HIGH)
    and a user's new graph (HIGH) go first, in their order; the rest keep theirs."""
    async def go() -> list[str]:
        queue: workqueue.WorkQueue[str] = workqueue.WorkQueue()
        for key in ("a", "b", "c", "d"):
            queue.add(key, priority=workqueue.LOW)
        queue.add("c", priority=workqueue.HIGH)  # waiting at LOW: moves up
        queue.add("e", priority=workqueue.HIGH)
        queue.add("c", priority=workqueue.LOW)  # already waiting higher: stays where it is
        assert len(queue) == 5
        order = [await queue.get() for _ in range(5)]
        assert len(queue) == 0
        for key in order:
            queue.done(key)
        assert queue.idle()
        return order

    assert asyncio.run(go()) == ["c", "e", "a", "b", "d"]


def test_an_add_while_active_keeps_the_highest_priority_for_the_pass_after() -> None:
    async def go() -> list[str]:
        queue: workqueue.WorkQueue[str] = workqueue.WorkQueue()
        queue.add("a")
        assert await queue.get() == "a"
        queue.add("a", priority=workqueue.HIGH)
        queue.add("a", priority=workqueue.LOW)
        queue.add("b", priority=workqueue.LOW)
        queue.done("a")  # "a" comes back HIGH: ahead of "b", which came first
        return [await queue.get(), await queue.get()]

    assert asyncio.run(go()) == ["a", "b"]


def test_a_delayed_add_wakes_at_the_higher_of_the_priorities_asked() -> None:
    async def go() -> list[str]:
        queue: workqueue.WorkQueue[str] = workqueue.WorkQueue()
        queue.add_after("a", 0.05, priority=workqueue.LOW)
        queue.add_after("a", 0.2, priority=workqueue.HIGH)  # later: the earlier wake-up stays, now HIGH
        queue.add("b", priority=workqueue.LOW)
        await asyncio.sleep(0.1)
        return [await queue.get(), await queue.get()]

    assert asyncio.run(go()) == ["a", "b"]


def test_a_waiting_worker_wakes_for_a_key_added_later() -> None:
    async def go() -> str:
        queue: workqueue.WorkQueue[str] = workqueue.WorkQueue()
        waiting = asyncio.create_task(queue.get())
        await asyncio.sleep(0)
        assert not waiting.done()
        queue.add("a", priority=workqueue.HIGH)
        return await asyncio.wait_for(waiting, 1)

    assert asyncio.run(go()) == "a"
