"""The simulator's real-time loop (fleetpilot/sim/engine.py): token streams over the scheduler, paced
1,000 times faster than real time. The scheduler's own decisions are test_sim_scheduler.py's.
"""

from __future__ import annotations

import asyncio

import pytest
from sim_timing import PREFILL_S_PER_TOKEN, FakeTiming

from fleetpilot.sim import engine
from fleetpilot.sim import scheduler as scheduler_mod


def make() -> scheduler_mod.Scheduler:
    return scheduler_mod.Scheduler(FakeTiming(1_000_000), scheduler_mod.SchedulerConfig())


def spec(prompt: int, max_tokens: int) -> scheduler_mod.RequestSpec:
    return scheduler_mod.RequestSpec(prompt_tokens=prompt, max_tokens=max_tokens)


# -- the real-time loop ------------------------------------------------------------------------------


def test_engine_streams_tokens_and_frees_kv_when_the_consumer_leaves() -> None:
    async def scenario() -> None:
        sim = engine.Engine(make(), speedup=1000.0)
        finished: list[scheduler_mod.RequestRecord] = []
        sim.add_finish_listener(finished.append)
        await sim.start()
        try:
            async with sim.submit(spec(200, 5)) as stream:
                tokens = [event async for event in stream]
            assert [t.index for t in tokens] == list(range(5))
            assert finished and finished[0].first_token is not None
            assert finished[0].first_token - finished[0].arrival >= 200 * PREFILL_S_PER_TOKEN

            async with sim.submit(spec(200, 100_000)) as stream:
                async for event in stream:
                    if event.index == 2:
                        break
            snap = sim.snapshot()
            assert (snap.running, snap.kv_blocks_used, snap.finished[scheduler_mod.FINISH_ABORT]) == (0, 0, 1)
            assert sim.running
        finally:
            await sim.stop()
        assert not sim.running

    asyncio.run(asyncio.wait_for(scenario(), timeout=30))


def test_stopping_the_engine_ends_open_streams_with_an_error() -> None:
    async def scenario() -> None:
        sim = engine.Engine(make(), speedup=1.0)
        await sim.start()
        stream = sim.submit(spec(200, 1000))
        await sim.stop()
        with pytest.raises(engine.EngineStopped):
            async for _ in stream:
                pass
        with pytest.raises(engine.EngineStopped):
            sim.submit(spec(200, 1))

    asyncio.run(asyncio.wait_for(scenario(), timeout=30))
