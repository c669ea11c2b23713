"""The reconciler's work queue: which graph to look at next, with client-go's workqueue guarantees.

Watch events only say "look at this key again"; this queue turns a storm of them into orderly work:

- **dedup**: a key waits in the queue at most once, however often it is added;
- **per-key serialisation**: a key handed to a worker is not handed out again until that worker
  calls `done`; adds that arrive meanwhile fold into exactly one more pass afterwards;
- **delays**: `add_after` wakes a key later (resync), keeping the earliest wake-up when asked twice;
- **retry with backoff**: `retry` counts a key's consecutive failures and re-adds it after
  base × 2^(failures-1), capped; `forget` resets the count after a success.

No I/O: asyncio only, so it is unit-tested on its own (tests/unit/test_workqueue.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


def backoff_delay(failures: int, *, base_s: float, max_s: float) -> float:
    """base, 2×base, 4×base, ... up to max_s, for the 1st, 2nd, 3rd... consecutive failure."""
    return float(min(base_s * 2.0 ** max(failures - 1, 0), max_s))


class WorkQueue(Generic[K]):
    def __init__(self, *, base_delay_s: float = 0.5, max_delay_s: float = 60.0,
                 on_depth: Callable[[int], None] | None = None) -> None:
        self.base_delay_s = base_delay_s
        self.max_delay_s = max_delay_s
        self._on_depth = on_depth or (lambda depth: None)
        self._ready: asyncio.Queue[K] = asyncio.Queue()
        self._queued: set[K] = set()  # in _ready, not yet handed out
        self._active: set[K] = set()  # handed to a worker, not yet done
        self._dirty: set[K] = set()  # added while active: one more pass after done
        self._timers: dict[K, asyncio.TimerHandle] = {}
        self._failures: dict[K, int] = {}

    def __len__(self) -> int:
        return len(self._queued)

    def idle(self) -> bool:
        """Nothing queued, nothing being worked on, nothing to redo (timers for later do not count)."""
        return not self._queued and not self._active and not self._dirty

    def add(self, key: K) -> None:
        if key in self._active:
            self._dirty.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            self._ready.put_nowait(key)
            self._on_depth(len(self._queued))

    def add_after(self, key: K, delay_s: float) -> None:
        if delay_s <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        timer = self._timers.get(key)
        if timer is not None:
            if timer.when() <= loop.time() + delay_s:
                return  # an earlier wake-up is already planned
            timer.cancel()
        self._timers[key] = loop.call_later(delay_s, self._wake, key)

    def _wake(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key)

    async def get(self) -> K:
        """The next key to work on; the caller must call `done(key)` when it has finished."""
        key = await self._ready.get()
        self._queued.discard(key)
        self._active.add(key)
        self._on_depth(len(self._queued))
        return key

    def done(self, key: K) -> None:
        self._active.discard(key)
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)

    def retry(self, key: K) -> float:
        """Count one more failure of `key` and add it again after the backoff; returns that delay."""
        failures = self._failures.get(key, 0) + 1
        self._failures[key] = failures
        delay = backoff_delay(failures, base_s=self.base_delay_s, max_s=self.max_delay_s)
        self.add_after(key, delay)
        return delay

    def failures(self, key: K) -> int:
        return self._failures.get(key, 0)

    def forget(self, key: K) -> None:
        """A success: the next failure of `key` starts the backoff afresh."""
        self._failures.pop(key, None)

    def cancel(self, key: K) -> None:
        """Drop a planned wake-up (the object is gone)."""
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()

    def shutdown(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
