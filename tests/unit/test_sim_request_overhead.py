"""The per-request overhead the performance model prices (`Calibration.ttft_overhead_s`), as the
simulator's scheduler spends it: before the queue, outside every step, once per request.

With the vLLM calibration a lone request's first token must come `PerformanceModel.ttft(isl)` after it
was sent, which is what `fleetpilot profile` measures against a simulator and compares with the model.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from sim_timing import DECODE_STEP_S, PREFILL_S_PER_TOKEN, FakeTiming

from fleetpilot import perfmodel
from fleetpilot.sim import engine
from fleetpilot.sim import scheduler as scheduler_mod

LLAMA_8B_H200 = perfmodel.PerformanceModel(perfmodel.MODELS["llama-3.1-8b"], perfmodel.GPUS["h200-sxm"])
OVERHEAD_S = 0.5  # the fake calibration's: far beyond a step, so misplacing it shows


@dataclasses.dataclass(frozen=True)
class _Calibration:
    ttft_overhead_s: float


class CalibratedFake(FakeTiming):
    """The shared fake timing plus a calibration carrying a request overhead, as PerformanceModel has."""

    calibration = _Calibration(OVERHEAD_S)


def drive(scheduler: scheduler_mod.Scheduler, now: float, until: float) -> tuple[
        float, list[scheduler_mod.TokenEvent], list[scheduler_mod.RequestRecord], list[float]]:
    """Step in simulated time (waiting out deadlines between steps) until `until` or nothing is left:
    the time reached, the tokens, the finished records and every step's duration."""
    events: list[scheduler_mod.TokenEvent] = []
    records: list[scheduler_mod.RequestRecord] = []
    durations: list[float] = []
    while now < until and scheduler.has_work():
        plan, result = scheduler.step(now)
        if plan.empty:
            deadline = scheduler.next_deadline()
            assert deadline is not None and deadline > now, "stuck: nothing to run or wait for"
            now = min(deadline, until)
            continue
        durations.append(scheduler.step_duration(plan))
        now += durations[-1]
        events += result.events
        records += result.finished
    return now, events, records, durations


@pytest.mark.parametrize("isl", [128, 1117, 4096])
def test_a_lone_requests_first_token_comes_when_the_model_says(isl: int) -> None:
    scheduler = scheduler_mod.Scheduler(LLAMA_8B_H200)
    assert scheduler.request_overhead_s == LLAMA_8B_H200.calibration.ttft_overhead_s > 0
    scheduler.add(scheduler_mod.RequestSpec(isl, 3), 0.0)
    _, events, (record,), _ = drive(scheduler, 0.0, 10.0)
    assert events[0].time == pytest.approx(LLAMA_8B_H200.ttft(isl))
    # The engine's own clock starts once the request is queued, as vLLM's does after tokenizing: its
    # TTFT histogram shows the prefill alone.
    assert record.arrival == pytest.approx(LLAMA_8B_H200.calibration.ttft_overhead_s)
    assert record.first_token is not None
    assert record.first_token - record.arrival == pytest.approx(LLAMA_8B_H200.prefill_time(isl))


def test_the_overhead_is_not_part_of_any_step_so_running_decodes_do_not_wait_for_it() -> None:
    scheduler = scheduler_mod.Scheduler(CalibratedFake())
    first = scheduler.add(scheduler_mod.RequestSpec(100, 200), 0.0)
    now, _, _, _ = drive(scheduler, 0.0, OVERHEAD_S + 0.05)
    assert scheduler.phase(first) is scheduler_mod.Phase.DECODE
    second = scheduler.add(scheduler_mod.RequestSpec(100, 2), now)
    assert scheduler.phase(second) is scheduler_mod.Phase.ARRIVING
    snap = scheduler.snapshot()
    assert (snap.arriving, snap.waiting, snap.running) == (1, 0, 1)
    _, events, _, durations = drive(scheduler, now, now + 2 * OVERHEAD_S)
    decode_only = [d for d in durations if d == pytest.approx(DECODE_STEP_S)]
    assert len(decode_only) >= len(durations) - 1  # at most the step that admits `second` carries its prefill
    assert max(durations) == pytest.approx(DECODE_STEP_S + 100 * PREFILL_S_PER_TOKEN)
    first_of_second = next(e.time for e in events if e.request_id == second)
    assert now + OVERHEAD_S <= first_of_second <= now + OVERHEAD_S + 2 * DECODE_STEP_S + 0.01


def test_a_decode_worker_does_not_pay_the_overhead_the_prefill_worker_paid() -> None:
    scheduler = scheduler_mod.Scheduler(CalibratedFake())
    remote = scheduler.add(scheduler_mod.RequestSpec(1000, 2, scheduler_mod.Mode.REMOTE_PREFILL), 0.0)
    assert scheduler.phase(remote) is scheduler_mod.Phase.WAITING
    prefill = scheduler.add(scheduler_mod.RequestSpec(1000, 1, scheduler_mod.Mode.PREFILL_ONLY), 0.0)
    assert scheduler.phase(prefill) is scheduler_mod.Phase.ARRIVING
    _, events, _, _ = drive(scheduler, 0.0, 10.0)
    times = {e.request_id: e.time for e in events if e.index == 0}
    assert times[remote] < OVERHEAD_S <= times[prefill]


def test_a_request_cancelled_while_arriving_leaves_nothing_behind() -> None:
    scheduler = scheduler_mod.Scheduler(CalibratedFake())
    rid = scheduler.add(scheduler_mod.RequestSpec(100, 5), 0.0)
    assert scheduler.next_deadline() == pytest.approx(OVERHEAD_S)
    record = scheduler.cancel(rid, 0.1)
    assert record is not None and record.finish_reason == scheduler_mod.FINISH_ABORT
    snap = scheduler.snapshot()
    assert (snap.arriving, snap.waiting, snap.kv_blocks_used) == (0, 0, 0)
    assert not scheduler.has_work() and scheduler.next_deadline() is None


def test_the_config_can_set_the_overhead_and_refuses_a_negative_one() -> None:
    assert scheduler_mod.Scheduler(LLAMA_8B_H200, scheduler_mod.SchedulerConfig(request_overhead_s=0.0)
                                   ).request_overhead_s == 0.0
    assert scheduler_mod.Scheduler(FakeTiming()).request_overhead_s == 0.0  # a model without a calibration
    with pytest.raises(ValueError, match="request_overhead_s"):
        scheduler_mod.SchedulerConfig(request_overhead_s=-1.0)


def test_the_engine_waits_out_the_overhead_on_its_clock() -> None:
    async def scenario() -> None:
        sim = engine.Engine(scheduler_mod.Scheduler(CalibratedFake()), speedup=100.0)
        await sim.start()
        try:
            sent = sim.now()
            async with sim.submit(scheduler_mod.RequestSpec(1000, 2)) as stream:
                assert sim.snapshot().arriving == 1
                first = await anext(stream)
            assert first.time - sent >= OVERHEAD_S + 1000 * PREFILL_S_PER_TOKEN
            assert sim.now() - sent >= OVERHEAD_S  # simulated seconds, so really waited (÷ speedup)
        finally:
            await sim.stop()

    asyncio.run(asyncio.wait_for(scenario(), timeout=30))
