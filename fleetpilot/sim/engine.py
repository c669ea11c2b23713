"""The simulator's engine: the scheduler run in real time, one token stream per request.

Where it sits: `server` (HTTP, OpenAI shapes, vLLM's `kv_transfer_params`) → `Engine` (this module:
one asyncio loop, per-request token streams, real-time pacing) → `scheduler.Scheduler` (the pure
core: continuous batching over a paged KV cache, timed by the performance model, in simulated
seconds). The engine turns simulated time into wall-clock time: it sleeps each step's modelled
duration divided by `speedup`, and hands each step's tokens to the streams of their requests. Between
steps it waits, on the same clock, for the scheduler's next deadline: a request's per-request overhead
ending (it then joins the queue), a KV transfer arriving, held KV timing out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import Self

from fleetpilot.sim import scheduler as scheduler_mod

logger = logging.getLogger("fleetpilot.sim")


class EngineStopped(RuntimeError):
    """The engine shut down before the request finished."""


class RequestStream:
    """One request's tokens, as an async iterator; leaving `async with` early cancels the request."""

    def __init__(self, engine: Engine, request_id: str, prompt_tokens: int) -> None:
        self.request_id = request_id
        self.prompt_tokens = prompt_tokens
        self.done = False
        self._engine = engine
        self._queue: asyncio.Queue[scheduler_mod.TokenEvent | None] = asyncio.Queue()

    def _put(self, event: scheduler_mod.TokenEvent | None) -> None:
        self._queue.put_nowait(event)

    def __aiter__(self) -> AsyncIterator[scheduler_mod.TokenEvent]:
        return self

    async def __anext__(self) -> scheduler_mod.TokenEvent:
        if self.done:
            raise StopAsyncIteration
        event = await self._queue.get()
        if event is None:
            self.done = True
            raise EngineStopped("the simulator engine stopped")
        if event.finished:
            self.done = True
        return event

    def cancel(self) -> None:
        if not self.done:
            self.done = True
            self._engine.cancel(self.request_id)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.cancel()


class Engine:
    """Runs the scheduler in real time: each step sleeps its modelled duration divided by `speedup`.

    Simulated time runs `speedup` times faster than the wall clock and is what the metrics report.
    Steps are paced against absolute deadlines, so a late wake-up shortens the next sleep instead
    of slowing the simulation; a new arrival is never stamped after the step that serves it starts.
    """

    def __init__(
        self, scheduler: scheduler_mod.Scheduler, *, speedup: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if speedup <= 0:
            raise ValueError("speedup must be > 0")
        self.scheduler = scheduler
        self.speedup = speedup
        self._clock = clock
        self._origin = clock()
        self._streams: dict[str, RequestStream] = {}
        self._listeners: list[Callable[[scheduler_mod.RequestRecord], None]] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._last_arrival = 0.0
        self._step_end = 0.0

    def now(self) -> float:
        """Simulated seconds since the engine was made."""
        return (self._clock() - self._origin) * self.speedup

    def add_finish_listener(self, listener: Callable[[scheduler_mod.RequestRecord], None]) -> None:
        """Called with each request that finished normally (cancellations only count in the totals)."""
        self._listeners.append(listener)

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="fleetpilot-sim-engine")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for stream in self._streams.values():
            stream._put(None)
        self._streams.clear()

    def submit(self, spec: scheduler_mod.RequestSpec) -> RequestStream:
        """Queue a request and return its token stream; raises RequestRejected or EngineStopped."""
        if not self.running:
            raise EngineStopped("the simulator engine is not running")
        now = self.now()
        request_id = self.scheduler.add(spec, now)
        self._last_arrival = max(self._last_arrival, now)
        stream = RequestStream(self, request_id, spec.prompt_tokens)
        self._streams[request_id] = stream
        self._wake.set()
        return stream

    def cancel(self, request_id: str) -> None:
        self._streams.pop(request_id, None)
        if self.scheduler.cancel(request_id, self.now()) is not None:
            self._wake.set()  # freed KV may admit someone

    def release_after_transfer(self, request_id: str) -> bool:
        """A decode worker pulls a held request's KV: free it once the modelled transfer is over."""
        tokens = self.scheduler.held_tokens(request_id)
        if tokens is None:
            return False
        delay = self.scheduler.timing.kv_transfer_time(tokens, self.scheduler.config.kv_bandwidth_bytes_per_s)
        self.scheduler.release_after(request_id, delay, self.now())
        self._wake.set()
        return True

    def snapshot(self) -> scheduler_mod.Snapshot:
        return self.scheduler.snapshot()

    async def _sleep_until(self, sim_time: float) -> None:
        delay = self._origin + sim_time / self.speedup - self._clock()
        await asyncio.sleep(max(0.0, delay))  # sleep(0) still lets the server run when we are behind

    async def _loop(self) -> None:
        try:
            idle = True
            while True:
                # After idling, simulated time is the wall clock's; while busy, steps chain end to start.
                start = self.now() if idle else max(self._step_end, self._last_arrival)
                self.scheduler.advance(start)
                plan = self.scheduler.schedule(start)
                if plan.empty:
                    idle = True
                    deadline = self.scheduler.next_deadline()
                    self._wake.clear()
                    timeout = None if deadline is None else max(0.0, (deadline - self.now()) / self.speedup)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), timeout)
                    continue
                idle = False
                end = start + self.scheduler.step_duration(plan)
                await self._sleep_until(end)
                self._step_end = end
                self._dispatch(self.scheduler.complete(plan, end))
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("simulator engine loop failed")
            for stream in self._streams.values():
                stream._put(None)
            self._streams.clear()
            raise

    def _dispatch(self, result: scheduler_mod.StepResult) -> None:
        for event in result.events:
            stream = self._streams.get(event.request_id)
            if stream is None:
                continue
            stream._put(event)
            if event.finished:
                del self._streams[event.request_id]
        for record in result.finished:
            for listener in self._listeners:
                try:
                    listener(record)
                except Exception:
                    logger.exception("finish listener failed for %s", record.request_id)
