"""The reconciler's work queue: which graph to look at next, with client-go's workqueue guarantees.

Watch events only say "look at this key again"; this queue turns a storm of them into orderly work:

- **dedup**: a key waits in the queue at most once, however often it is added;
- **per-key serialisation**: a key handed to a worker is not handed out again until that worker
  calls `done`; adds that arrive meanwhile fold into exactly one more pass afterwards;
- **delays**: `add_after` wakes a key later (resync), keeping the earliest wake-up when asked twice;
- **retry with backoff**: `retry` counts a key's consecutive failures and re-adds it after
  base × 2^(failures-1), capped; `forget` resets the count after a success;
- **priority**: a key added at `HIGH` is handed out before every key waiting at `LOW`, first come
  first served within a priority, and a waiting key added again at a higher priority moves up. The
  caller says which is which: what a user asked for (a spec change, a `kubectl scale`) is `HIGH`;
  what only reports (a pod turning Ready, our own status write, a resync) is `LOW`, so a thousand
  graphs' pods starting cannot hold a scale back (controller-runtime's priority queue does the same
  for its initial list and unchanged-generation updates).

No I/O: asyncio only, so it is unit-tested on its own (tests/unit/test_workqueue.py).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

LOW = 0  # a resync, a child's status, our own writes coming back
HIGH = 1  # what a user asked for: a new or changed spec


def backoff_delay(failures: int, *, base_s: float, max_s: float) -> float:
    """base, 2×base, 4×base, ... up to max_s, for the 1st, 2nd, 3rd... consecutive failure."""
    return float(min(base_s * 2.0 ** max(failures - 1, 0), max_s))


class WorkQueue(Generic[K]):
    def __init__(self, *, base_delay_s: float = 0.5, max_delay_s: float = 60.0,
                 on_depth: Callable[[int], None] | None = None) -> None:
        self.base_delay_s = base_delay_s
        self.max_delay_s = max_delay_s
        self._on_depth = on_depth or (lambda depth: None)
        # (−priority, arrival, key): the highest priority first, then first come. A key moved up leaves its
        # old entry behind, skipped when popped (it no longer matches `_queued`).
        self._heap: list[tuple[int, int, K]] = []
        self._arrivals = itertools.count()
        self._nonempty = asyncio.Event()
        self._queued: dict[K, int] = {}  # waiting to be handed out, at this priority
        self._active: set[K] = set()  # handed to a worker, not yet done
        self._dirty: dict[K, int] = {}  # added while active: one more pass after done, at this priority
        self._timers: dict[K, tuple[asyncio.TimerHandle, int]] = {}
        self._failures: dict[K, int] = {}

    def __len__(self) -> int:
        return len(self._queued)

    def idle(self) -> bool:
        """Nothing queued, nothing being worked on, nothing to redo (timers for later do not count)."""
        return not self._queued and not self._active and not self._dirty

    def add(self, key: K, *, priority: int = LOW) -> None:
        if key in self._active:
            self._dirty[key] = max(priority, self._dirty.get(key, priority))
            return
        waiting = self._queued.get(key)
        if waiting is not None and waiting >= priority:
            return
        self._queued[key] = priority
        heapq.heappush(self._heap, (-priority, next(self._arrivals), key))
        self._nonempty.set()
        if waiting is None:
            self._on_depth(len(self._queued))

    def add_after(self, key: K, delay_s: float, *, priority: int = LOW) -> None:
        if delay_s <= 0:
            self.add(key, priority=priority)
            return
        loop = asyncio.get_running_loop()
        planned = self._timers.get(key)
        if planned is not None:
            timer, planned_priority = planned
            if timer.when() <= loop.time() + delay_s:
                # An earlier wake-up is already planned: it wakes the key at the higher of the two priorities.
                self._timers[key] = (timer, max(planned_priority, priority))
                return
            timer.cancel()
            priority = max(priority, planned_priority)
        self._timers[key] = (loop.call_later(delay_s, self._wake, key), priority)

    def _wake(self, key: K) -> None:
        _, priority = self._timers.pop(key)
        self.add(key, priority=priority)

    async def get(self) -> K:
        """The next key to work on; the caller must call `done(key)` when it has finished."""
        while True:
            while self._heap:
                negative, _, key = heapq.heappop(self._heap)
                if self._queued.get(key) != -negative:
                    continue  # moved up since (a newer entry stands for it), or already handed out
                del self._queued[key]
                self._active.add(key)
                self._on_depth(len(self._queued))
                return key
            self._nonempty.clear()
            await self._nonempty.wait()

    def done(self, key: K) -> None:
        self._active.discard(key)
        priority = self._dirty.pop(key, None)
        if priority is not None:
            self.add(key, priority=priority)

    def retry(self, key: K) -> float:
        """Count one more failure of `key` and add it again after the backoff; returns that delay."""
        failures = self._failures.get(key, 0) + 1
        self._failures[key] = failures
        delay = backoff_delay(failures, base_s=self.base_delay_s, max_s=self.max_delay_s)
        self.add_after(key, delay)  # LOW: a failing key must not starve the others
        return delay

    def failures(self, key: K) -> int:
        return self._failures.get(key, 0)

    def forget(self, key: K) -> None:
        """A success: the next failure of `key` starts the backoff afresh."""
        self._failures.pop(key, None)

    def cancel(self, key: K) -> None:
        """Drop a planned wake-up (the object is gone)."""
        planned = self._timers.pop(key, None)
        if planned is not None:
            planned[0].cancel()

    def shutdown(self) -> None:
        for timer, _ in self._timers.values():
            timer.cancel()
        self._timers.clear()
