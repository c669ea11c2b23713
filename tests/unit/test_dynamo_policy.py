"""The `dynamo` backtest policy's two loops on synthetic load steps: the load loop steps one replica per
period on the engines' gauges, the throughput loop sets the floor every 180 s."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fleetpilot import perfmodel
from fleetpilot.api import profile as profiles
from fleetpilot.api import v1alpha1 as api
from fleetpilot.planner import capacity, predict
from fleetpilot.planner.backtest import driver, fleetsim, policies
from fleetpilot.traces import Request

TIMING = perfmodel.PerformanceModel(perfmodel.MODELS["llama-3.1-8b"], perfmodel.GPUS["h200-sxm"])
SLA = api.SlaTarget(ttft_ms=500, itl_ms=15, percentile=90)  # an ITL target decode batching can cross
ITL_S = SLA.itl_ms / 1e3
SETTING = policies.Setting(
    capacity=capacity.CapacityModel(profiles.from_performance_model(
        TIMING, isls=[128, 512, 1024, 2048, 4096, 8192], contexts=[512, 1024, 2048, 4096, 8192],
        concurrencies=[1, 2, 4, 8, 16, 32, 64, 128, 256], engine="simulator")),
    sla=SLA, interval_s=60.0, startup_s=120.0, bounds={"prefill": (1, 16), "decode": (1, 16)})
ISL, OSL = 2048, 128


def stats(start: float, end: float, *, rate: float = 2.0, ready: tuple[int, int] = (2, 2),
          starting: tuple[int, int] = (0, 0), queued_tokens: float = 0.0, sequences: float = 0.0,
          kv_usage: float = 0.1) -> fleetsim.WindowStats:
    pools: Sequence[fleetsim.FleetPool] = fleetsim.FLEET_POOLS
    return fleetsim.WindowStats(
        start=start, end=end, arrivals=round(rate * (end - start)), rate_rps=rate, isl_mean=ISL, osl_mean=OSL,
        ttft_p=0.2, itl_p=0.02, ttft_mean=0.2, itl_mean=0.02, prefill_busy=0.5, decode_kv_usage=kv_usage,
        ready=dict(zip(pools, ready, strict=True)),
        active={pool: n + s for pool, n, s in zip(pools, ready, starting, strict=True)},
        prefill_queued_tokens=queued_tokens, decode_waiting=0.0, decode_running=sequences)


def planner(factor: float = 1.0, initial: tuple[int, int] = (2, 2)) -> policies.Dynamo:
    return policies.Dynamo(SETTING, predict.make_predictor("constant"), factor=factor,
                           initial={"prefill": initial[0], "decode": initial[1]})


def test_a_prompt_backlog_adds_one_prefill_replica_at_the_next_load_tick() -> None:
    dynamo = planner()
    backlog = 2 * 20 * ISL  # 20 prompts queued per worker: far past a 500 ms TTFT
    reaction = dynamo.react(stats(0, 5, queued_tokens=backlog, sequences=0, starting=(0, 1)), 5.0)
    assert reaction == {"prefill": 3, "decode": 2}  # decode, scaling already, is left alone
    # While that replica starts, the pool is only observed, whatever the backlog.
    assert dynamo.react(stats(5, 10, ready=(2, 2), starting=(1, 1), queued_tokens=backlog * 2), 10.0) is None
    # Once it is ready and the backlog persists: one more, never a jump.
    assert dynamo.react(stats(10, 15, ready=(3, 2), starting=(0, 1), queued_tokens=backlog * 2), 15.0) == {
        "prefill": 4, "decode": 2}


def test_decode_scales_up_on_the_itl_of_its_sequences_and_down_only_when_survivors_stay_within_target() -> None:
    dynamo = planner()
    context = ISL + OSL / 2
    crowded = next(n for n in (8, 16, 32, 64, 128, 256) if SETTING.capacity.itl_s(n, context).value > ITL_S)
    assert dynamo.react(stats(0, 5, sequences=2 * crowded, starting=(1, 0)), 5.0) == {"prefill": 2, "decode": 3}
    # Idle: survivors of a scale-down would be far within target, so one replica goes (per pool).
    dynamo = planner(initial=(3, 3))
    assert dynamo.react(stats(0, 5, ready=(3, 3), sequences=3.0), 5.0) is None  # not below the fleet it took over
    dynamo.floor = {"prefill": 1, "decode": 1}  # as after a throughput tick at low load
    assert dynamo.react(stats(0, 5, ready=(3, 3), sequences=3.0), 5.0) == {"prefill": 2, "decode": 2}
    # Busy enough that 2 survivors would cross 80% of the ITL target: decode stays.
    busy = next(n for n in np.linspace(1, 256, 512) if SETTING.capacity.itl_s(n * 1.5, context).value > 0.8 * ITL_S
                and SETTING.capacity.itl_s(n, context).value < ITL_S)
    dynamo = planner(initial=(3, 3))
    dynamo.floor = {"prefill": 1, "decode": 1}
    decision = dynamo.react(stats(0, 5, ready=(3, 3), sequences=3 * busy), 5.0)
    assert decision is not None and decision["decode"] == 3


def test_the_throughput_loop_sets_a_floor_every_180_seconds_that_the_load_loop_cannot_cut() -> None:
    dynamo = planner(initial=(1, 1))
    heavy = 30.0  # req/s: far more than one prefill replica's prompt throughput at ISL 2048
    # Two 60 s intervals: no throughput tick yet, so an idle load loop keeps the minimum.
    for k in range(2):
        assert dynamo.decide(stats(60 * k, 60 * (k + 1), rate=heavy, ready=(1, 1)), 60 * (k + 1)) == {
            "prefill": 1, "decode": 1}
    decision = dynamo.decide(stats(120, 180, rate=heavy, ready=(1, 1)), 180)
    per_prefill = SETTING.capacity.prefill_tokens_per_s(ISL).value / ISL
    assert decision["prefill"] == int(np.ceil(heavy / per_prefill)) > 1
    assert decision["decode"] >= 1
    assert dynamo.forecast() == heavy  # factor 1: the forecast itself
    # An idle load tick right after (no queue, no sequences) cannot go below the floor.
    assert dynamo.react(stats(180, 185, ready=(1, 1)), 185) is None


def test_a_higher_load_factor_buys_a_higher_floor_for_the_same_load() -> None:
    def floor(factor: float) -> dict[fleetsim.FleetPool, int]:
        dynamo = planner(factor, initial=(1, 1))
        for k in range(3):
            decision = dynamo.decide(stats(60 * k, 60 * (k + 1), rate=40.0, ready=(1, 1)), 60 * (k + 1))
        return decision

    assert floor(2.0)["decode"] >= floor(1.0)["decode"]
    assert floor(2.0)["prefill"] > floor(1.0)["prefill"]


def test_in_the_loop_a_load_step_gets_a_replica_within_one_load_period() -> None:
    """Driven by the backtest's loop on the per-request simulator: traffic jumps at t=60 s; the first
    scale-up comes at the first 5 s load tick that sees the queue, long before the next 60 s decision."""
    rng = np.random.default_rng(3)
    times = np.concatenate([np.sort(rng.uniform(0, 60, 60)), np.sort(rng.uniform(60, 120, 3000))])
    requests = [Request(float(t), ISL, OSL) for t in times]
    setting = policies.Setting(capacity=SETTING.capacity, sla=SLA, interval_s=60.0, startup_s=30.0,
                               bounds={"prefill": (1, 16), "decode": (1, 16)})
    dynamo = policies.Dynamo(setting, predict.make_predictor("constant"), factor=1.0,
                             initial={"prefill": 1, "decode": 1})
    fleet = driver.RequestFleet(fleetsim.FleetConfig(timing=TIMING, startup_s=30.0), requests, dynamo.initial())
    seen: list[tuple[float, dict[fleetsim.FleetPool, int]]] = []
    react = dynamo.react

    def recording(window: fleetsim.WindowStats, now: float) -> dict[fleetsim.FleetPool, int] | None:
        decision = react(window, now)
        if decision is not None:
            seen.append((now, decision))
        return decision

    dynamo.react = recording  # type: ignore[method-assign]
    driver.run(fleet, dynamo, duration_s=120, interval_s=60, sla=SLA)
    first_up = next(now for now, decision in seen if decision["prefill"] > 1)
    assert 60 < first_up <= 70
