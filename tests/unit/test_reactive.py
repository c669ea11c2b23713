"""The planner's fast path: it blames the pool that is short, adds within its bounds, and never goes below
the predictive floor; in the backtest a decode backlog makes the planner add decode, not prefill."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from fleetpilot import perfmodel
from fleetpilot.api import profile as profiles
from fleetpilot.api import v1alpha1 as api
from fleetpilot.planner import capacity, core, predict, reactive, sizing
from fleetpilot.planner.backtest import driver, fleetsim, policies
from fleetpilot.traces import Request

TIMING = perfmodel.PerformanceModel(perfmodel.MODELS["llama-3.1-8b"], perfmodel.GPUS["h200-sxm"])
MODEL = capacity.CapacityModel(profiles.from_performance_model(
    TIMING, isls=[128, 512, 1024, 2048, 4096, 8192], contexts=[512, 1024, 2048, 4096, 8192],
    concurrencies=[1, 2, 4, 8, 16, 32, 64, 128, 256], engine="simulator"))
TTFT_S, ITL_S = 0.5, 0.05
ISL, OSL = 2048, 128
BOUNDS: dict[sizing.Pool, tuple[int, int]] = {"prefill": (1, 16), "decode": (1, 16)}
STARTUP_S = 120.0


def gauges(*, queued: float = 0.0, running: float = 0.0, waiting: float = 0.0, ready: tuple[int, int] = (2, 2),
           starting: tuple[int, int] = (0, 0)) -> reactive.Gauges:
    return reactive.Gauges(
        prefill_queued_tokens=queued, decode_running=running, decode_waiting=waiting,
        ready={"prefill": ready[0], "decode": ready[1]},
        active={"prefill": ready[0] + starting[0], "decode": ready[1] + starting[1]})


def react(g: reactive.Gauges, floor: tuple[int, int] = (2, 2),
          bounds: dict[sizing.Pool, tuple[int, int]] | None = None, itl_target_s: float = ITL_S) -> reactive.Reaction:
    return reactive.react(g, MODEL, isl=ISL, osl=OSL, ttft_target_s=TTFT_S, itl_target_s=itl_target_s,
                          floor={"prefill": floor[0], "decode": floor[1]},
                          bounds=bounds or BOUNDS, startup_s=STARTUP_S)


def test_a_pool_asleep_at_zero_asks_for_nothing_until_something_waits_for_it() -> None:
    """Pools scaled to zero (scaling.min 0) with nothing queued: tick after tick the fast path adds no
    replica (it used to read the next prompt's wait as infinite and add one every tick, undoing each
    scale to zero). Queued prompt tokens, or prefilled requests waiting for decode, are demand: a
    replica for the pool they wait on, and none for the other."""
    zero: dict[sizing.Pool, tuple[int, int]] = {"prefill": (0, 4), "decode": (0, 4)}
    asleep = gauges(ready=(0, 0))
    for _ in range(20):
        reaction = react(asleep, floor=(0, 0), bounds=zero)
        assert not reaction.changed and dict(reaction.replicas) == {"prefill": 0, "decode": 0}
    woken = react(gauges(queued=ISL, ready=(0, 0)), floor=(0, 0), bounds=zero)
    assert woken.changed and dict(woken.replicas) == {"prefill": 1, "decode": 0}
    handed_off = react(gauges(waiting=3, ready=(1, 0)), floor=(1, 0), bounds=zero)
    assert handed_off.changed and dict(handed_off.replicas) == {"prefill": 1, "decode": 1}


def test_a_quiet_fleet_keeps_its_replicas() -> None:
    reaction = react(gauges(running=8))
    assert not reaction.changed and dict(reaction.replicas) == {"prefill": 2, "decode": 2}


def test_a_prompt_backlog_adds_the_prefill_it_projects_bounded_by_half_the_pool() -> None:
    """Arrivals unread (the pool taken to drain as fast as prompts arrive): a backlog a prompt would
    still wait behind a startup from now adds the replicas that drain it within one more startup."""
    per_s = MODEL.prefill_tokens_per_s(ISL).value
    slack = TTFT_S - MODEL.lone_ttft_s(ISL).value
    assert not react(gauges(queued=1.9 * slack * per_s, running=8)).changed  # 2 replicas: under the slack
    reaction = react(gauges(queued=2.2 * slack * per_s, running=8))
    assert reaction.changed and dict(reaction.replicas) == {"prefill": 3, "decode": 2}
    assert "prefill" in reaction.reasons[0]
    # A backlog worth 6 replica-startups of work on 8 replicas: the need is 8 + 6 = 14, one step is
    # bounded by half the pool (8 → 12); on 16 replicas the same backlog asks for 16 + 6, capped at the max.
    backlog = 6 * STARTUP_S * per_s
    assert react(gauges(queued=backlog, running=8, ready=(8, 2)), floor=(8, 2)).replicas["prefill"] == 12
    big: dict[sizing.Pool, tuple[int, int]] = {"prefill": (1, 64), "decode": (1, 16)}
    assert react(gauges(queued=backlog, running=8, ready=(16, 2)), floor=(16, 2), bounds=big).replicas["prefill"] == 22


def test_the_backlog_is_projected_a_startup_ahead_at_the_rate_arrivals_bring() -> None:
    """A replica added now serves a startup from now: a spike's backlog that the pool drains by
    itself before then asks for nothing; the same backlog with arrivals at the pool's rate, or above
    it, adds what the arrivals and the backlog then need, not what would empty today's queue within
    the TTFT slack (a long backlog used to ask for the pool's bound)."""
    per_s = MODEL.prefill_tokens_per_s(ISL).value
    slack = TTFT_S - MODEL.lone_ttft_s(ISL).value
    queued = 20 * slack * per_s  # a prompt now waits ten times the slack on 2 replicas
    drains = 2 * per_s / ISL * 0.8  # prompts/s at 80% of what 2 replicas prefill: 0.4 replica-rates spare
    def with_arrivals(rate: float, ready: int = 2) -> reactive.Reaction:
        return reactive.react(gauges(queued=queued, running=8, ready=(ready, 2)), MODEL, isl=ISL, osl=OSL,
                              ttft_target_s=TTFT_S, itl_target_s=ITL_S, floor={"prefill": ready, "decode": 2},
                              bounds={"prefill": (1, 64), "decode": (1, 16)}, arriving_rps=rate, startup_s=STARTUP_S)
    assert 0.4 * per_s * STARTUP_S > queued  # the spare rate drains the queue within a startup
    assert not with_arrivals(drains).changed
    at_capacity = with_arrivals(2 * per_s / ISL)
    assert at_capacity.replicas["prefill"] == 3  # 2 for the arrivals, and the backlog over a startup needs a third
    overloaded = with_arrivals(4 * per_s / ISL, ready=8)  # twice what 2 serve, on 8: no shortage
    assert not overloaded.changed
    assert with_arrivals(12 * per_s / ISL, ready=8).replicas["prefill"] == 12  # 12 needed, and more: +50% at most


def test_the_risk_reads_the_arrivals_spread_over_a_startup() -> None:
    """`arrival_quantile` is the readings' mean at risk 0.5 and rises with the risk; bursty readings
    widen it beyond Poisson's, so a backlog the pool drains at the mean rate adds replicas only at a
    risk that reads the bursts."""
    steady = tuple(reactive.Reading(5.0 * i, 5.0 * (i + 1), 50.0) for i in range(60))  # 10 req/s
    bursty = tuple(reactive.Reading(5.0 * i, 5.0 * (i + 1), 200.0 if i % 12 == 0 else 50.0) for i in range(60))
    mean = reactive.arrival_quantile(steady, horizon_s=120.0, risk=0.5)
    assert mean == pytest.approx(10.0)
    poisson = reactive.arrival_quantile(steady, horizon_s=120.0, risk=0.99)
    assert poisson == pytest.approx(10.0 + 2.326 * math.sqrt(10.0 / 120.0), rel=1e-3)
    spread = reactive.arrival_quantile(bursty, horizon_s=120.0, risk=0.99)
    assert spread is not None and spread > poisson + 1.0
    assert reactive.arrival_quantile(steady[:3], horizon_s=120.0, risk=0.9) is None
    # A backlog that 2 replicas drain within a startup at the mean rate, not at its 0.99 quantile.
    per_s = MODEL.prefill_tokens_per_s(ISL).value
    capacity_rps = 2 * per_s / ISL
    scale = 0.9 * capacity_rps / float(np.mean([r.requests / 5.0 for r in bursty]))
    readings = tuple(dataclasses.replace(r, requests=r.requests * scale) for r in bursty)
    low = reactive.arrival_quantile(readings, horizon_s=120.0, risk=0.5)
    high = reactive.arrival_quantile(readings, horizon_s=120.0, risk=0.99)
    assert low is not None and high is not None and low < capacity_rps < high
    queued = 0.5 * (capacity_rps - low) * ISL * 120.0
    assert queued > 2 * per_s * (TTFT_S - MODEL.lone_ttft_s(ISL).value)  # a prompt waits past the target now
    def at(rate: float) -> reactive.Reaction:
        return reactive.react(gauges(queued=queued, running=8), MODEL, isl=ISL, osl=OSL, ttft_target_s=TTFT_S,
                              itl_target_s=ITL_S, floor={"prefill": 2, "decode": 2}, bounds=BOUNDS,
                              arriving_rps=rate, startup_s=STARTUP_S)
    assert not at(low).changed
    assert at(high).changed


def test_replicas_still_starting_count_as_the_answer_to_a_shortage() -> None:
    per_s = MODEL.prefill_tokens_per_s(ISL).value
    slack = TTFT_S - MODEL.lone_ttft_s(ISL).value
    backlog = 2.5 * slack * per_s  # short for 2 replicas, enough for 3
    assert react(gauges(queued=backlog)).replicas["prefill"] == 3
    # The third is starting: the same backlog asks for nothing more.
    assert not react(gauges(queued=backlog, starting=(1, 0))).changed


def test_a_decode_backlog_adds_decode_and_never_prefill() -> None:
    # 60 sequences decode on 2 replicas and 90 prefilled requests wait for a slot: nothing is queued
    # for prefill, so TTFT's growth is decode's fault.
    reaction = react(gauges(running=60, waiting=90))
    assert reaction.changed
    assert reaction.replicas["prefill"] == 2
    assert reaction.replicas["decode"] == 3  # wants 5 (150 / 60 × 2), one step adds at most half of 2
    assert "decode slot" in " ".join(reaction.reasons)
    assert reactive.decode_wait_s(gauges(running=60, waiting=90), MODEL, isl=ISL, osl=OSL, replicas=2) > TTFT_S


def test_decode_adds_when_the_itl_of_its_sequences_exceeds_the_target() -> None:
    context, tight = ISL + OSL / 2, 0.015  # an ITL target decode batching can cross
    crowded = next(n for n in range(1, 257) if MODEL.itl_s(n, context).value > tight)
    assert not react(gauges(running=2 * (crowded - 1)), itl_target_s=tight).changed
    reaction = react(gauges(running=2 * crowded), itl_target_s=tight)
    assert reaction.replicas == {"prefill": 2, "decode": 3}


def test_never_below_the_floor_nor_above_the_max() -> None:
    # The predictive loop asked for more than is active yet: the fast path keeps its floor.
    assert dict(react(gauges(running=8), floor=(5, 4)).replicas) == {"prefill": 5, "decode": 4}
    # At the max, a shortage changes nothing.
    per_s = MODEL.prefill_tokens_per_s(ISL).value
    capped = react(gauges(queued=100 * per_s, ready=(4, 2)), floor=(4, 2),
                   bounds={"prefill": (1, 4), "decode": (1, 16)})
    assert not capped.changed and capped.replicas["prefill"] == 4


def test_no_lengths_no_reaction() -> None:
    reaction = reactive.react(gauges(queued=1e9), MODEL, isl=0.0, osl=0.0, ttft_target_s=TTFT_S,
                              itl_target_s=ITL_S, floor={"prefill": 2, "decode": 2}, bounds=BOUNDS,
                              startup_s=STARTUP_S)
    assert not reaction.changed


# -- in the backtest -------------------------------------------------------------------------------------

SLA = api.SlaTarget(ttft_ms=500, itl_ms=50, percentile=90)
SETTING = policies.Setting(capacity=MODEL, sla=SLA, interval_s=60.0, startup_s=30.0,
                           bounds={"prefill": (1, 16), "decode": (1, 16)})


def _decode_bound_trace() -> list[Request]:
    """Short prompts, long outputs: two minutes at a rate one prefill replica handles easily but whose
    sequences fill one decode replica's KV cache many times over."""
    rate, seconds = 4.0, 240
    return [Request(arrival_s=i / rate, input_tokens=4000, output_tokens=4000) for i in range(int(rate * seconds))]


def _fleet(initial: dict[fleetsim.FleetPool, int]) -> driver.RequestFleet:
    return driver.RequestFleet(fleetsim.FleetConfig(timing=TIMING, startup_s=SETTING.startup_s),
                               _decode_bound_trace(), initial)


@pytest.mark.parametrize("fast_path", [True, False])
def test_a_decode_backlog_makes_the_planner_add_decode_not_prefill(fast_path: bool) -> None:
    planner = policies.Fleetpilot(SETTING, predict.make_predictor("constant"), predictor_name="constant",
                                  risk=0.5, initial={"prefill": 1, "decode": 1}, reactive=fast_path)
    result = driver.run(_fleet({"prefill": 1, "decode": 1}), planner, duration_s=240.0, interval_s=60.0, sla=SLA)
    peak = {pool: int(result.timeline.active[pool].max()) for pool in ("prefill", "decode")}
    # One prefill replica serves the prompts; the decode pool is what is short.
    assert peak["prefill"] == 1, peak
    assert peak["decode"] >= 3, peak
    if fast_path:
        assert planner.reactions >= 1


def test_the_prefill_correction_blames_only_the_prefill_part_of_ttft() -> None:
    spec = api.DynamoGraphSpec.model_validate({
        "model": {"name": "m"}, "engine": {"framework": "simulator"},
        "components": {"prefill": {"scaling": {"min": 1, "max": 16}}, "decode": {"scaling": {"min": 1, "max": 16}}},
        "planner": {"mode": "sla", "sla": {"ttftMs": 500, "itlMs": 50}, "predictor": "constant"},
    })
    config = core.config_from_spec(spec)
    # TTFT 8 s at the 90th percentile, of which the prompts' own part is 0.1 s: a decode backlog.
    seen = core.Observation(time=0.0, rate_rps=12.0, isl=ISL, osl=OSL, ttft_s=8.0, itl_s=0.02, prefill_s=0.1)
    serving = {"prefill": 1, "decode": 1}
    plan, _ = core.plan_interval(config, seen, core.GraphMemory(), current=serving, capacity=MODEL, now=0.0)
    blind, _ = core.plan_interval(config, dataclasses.replace(seen, prefill_s=None), core.GraphMemory(),
                                  current=serving, capacity=MODEL, now=0.0)
    # Blamed whole, 8 s of TTFT the profile does not explain; blamed right, less than the 0.1 s prefill part.
    assert blind.corrections.prefill_offset_s > 7.0
    assert plan.corrections.prefill_offset_s < 0.1
    assert plan.replicas["prefill"] < blind.replicas["prefill"]


def test_a_pool_whose_replicas_are_all_still_starting_is_left_to_them() -> None:
    """Nothing serves yet and the queues grow: the starting replicas are the answer, not more of them."""
    per_s = MODEL.prefill_tokens_per_s(ISL).value
    cold = gauges(queued=50 * per_s, running=0, waiting=400, ready=(0, 0), starting=(2, 2))
    assert not react(cold).changed


def test_an_itl_target_below_the_floor_adds_no_decode_every_tick() -> None:
    """ITL 1 ms where one sequence alone takes more: every tick would see the target missed and add a decode
    replica, up to scaling.max, for nothing. Through `core.react` the target is the floor + 25% (as sizing
    has it): a decode pool running 8 sequences per replica is not short; one running far more still is."""
    spec = api.DynamoGraphSpec.model_validate({
        "model": {"name": "m"}, "engine": {"framework": "simulator"},
        "components": {"prefill": {"replicas": 2, "scaling": {"max": 16}}, "decode": {"replicas": 2, "scaling": {"max": 16}}},
        "planner": {"mode": "sla", "sla": {"ttftMs": 500, "itlMs": 1}}})
    config = core.config_from_spec(spec)
    memory = core.GraphMemory(lengths=(core.IntervalLengths(0.0, 1.0, float(ISL), float(OSL)),))
    floor = {"prefill": 2, "decode": 2}
    assert react(gauges(running=16), itl_target_s=0.001).changed  # the raw target: more decode, every tick
    assert not core.react(config, gauges(running=16), memory, floor=floor, capacity=MODEL, now=0.0).changed
    crowded = core.react(config, gauges(running=400), memory, floor=floor, capacity=MODEL, now=0.0)
    assert crowded.changed and crowded.replicas["decode"] == 3


# -- the arrivals' trend -------------------------------------------------------------------------------


def readings(rates: list[float], *, period_s: float = 5.0, seed: int | None = None) -> tuple[reactive.Reading, ...]:
    """One reading per period at each rate: Poisson counts with a seed, the expected counts without."""
    rng = np.random.default_rng(seed)
    counts = [float(rng.poisson(r * period_s)) if seed is not None else r * period_s for r in rates]
    return tuple(reactive.Reading(i * period_s, (i + 1) * period_s, n) for i, n in enumerate(counts))


def test_steady_poisson_arrivals_are_rarely_a_trend() -> None:
    """Five minutes of 5-s readings at a steady 20 req/s: the slope clears two standard errors in about
    2.3% of windows (one-sided), and where it does, the projection's lower bound stays near the rate."""
    trends = [reactive.rate_ahead(readings([20.0] * 60, seed=seed), lead_s=125.0) for seed in range(1000)]
    fired = [t for t in trends if t is not None]
    assert 5 <= len(fired) <= 40  # 2.3% of 1,000 is 23 (a standard deviation ~5): a test that can fail both ways
    assert all(t.rate_ahead_rps < 24.0 for t in fired)


def test_a_rising_load_is_projected_a_startup_ahead_below_where_it_goes() -> None:
    """Arrivals rising 5 → 15 req/s over five minutes: the trend is seen, its slope recovered, and the
    rate sized for lies between now's and the true one 125 s ahead (the projection's lower bound)."""
    rates = [5.0 + 10.0 * (i + 0.5) / 60 for i in range(60)]
    trend = reactive.rate_ahead(readings(rates, seed=7), lead_s=125.0)
    assert trend is not None
    assert trend.rise_rps_per_s == pytest.approx(10.0 / 300.0, rel=0.35)
    assert 15.0 < trend.rate_ahead_rps < 15.0 + 125.0 * 10.0 / 300.0


def test_traffic_returning_after_a_silence_is_a_trend() -> None:
    """0.5 → 40 req/s over the window (a hockey stick): a trend whose lower bound a startup ahead is
    above the rate the window began with many times over."""
    rates = list(np.geomspace(0.5, 40.0, 60))
    trend = reactive.rate_ahead(readings(rates, seed=3), lead_s=125.0)
    assert trend is not None and trend.rate_ahead_rps > 20.0


def test_a_falling_or_short_series_is_no_trend() -> None:
    assert reactive.rate_ahead(readings(list(np.linspace(40.0, 10.0, 60)), seed=1), lead_s=125.0) is None
    assert reactive.rate_ahead(readings([5.0, 10.0, 20.0]), lead_s=125.0) is None


def test_readings_are_kept_for_the_window_and_restart_when_they_go_back() -> None:
    kept: tuple[reactive.Reading, ...] = ()
    for reading in readings([1.0] * 100):
        kept = reactive.remember_arrivals(kept, reading, keep_s=300.0)
    assert len(kept) == 60 and kept[0].start == pytest.approx(200.0)
    assert reactive.remember_arrivals(kept, reactive.Reading(10.0, 15.0, 3.0), keep_s=300.0) == (
        reactive.Reading(10.0, 15.0, 3.0),)
    assert reactive.trend_window_s(startup_s=120.0, period_s=5.0) == reactive.TREND_WINDOW_S
    assert reactive.trend_window_s(startup_s=600.0, period_s=5.0) == 605.0


def test_a_trend_adds_what_it_needs_ahead_in_bounded_steps_and_only_up() -> None:
    trend = reactive.Trend(rate_now_rps=10.0, rate_ahead_rps=20.0, lead_s=125.0, rise_rps_per_s=0.08)
    reaction = reactive.react(gauges(running=8), MODEL, isl=ISL, osl=OSL, ttft_target_s=TTFT_S, itl_target_s=ITL_S,
                              floor={"prefill": 2, "decode": 2}, bounds=BOUNDS,
                              ahead={"prefill": 6, "decode": 3}, trend=trend, startup_s=STARTUP_S)
    assert reaction.changed and dict(reaction.replicas) == {"prefill": 3, "decode": 3}
    assert any("arrivals rising" in why for why in reaction.reasons)
    # Fewer than the fleet runs: nothing to take away (scale-down stays with the plan).
    calm = reactive.react(gauges(running=8, ready=(4, 4)), MODEL, isl=ISL, osl=OSL, ttft_target_s=TTFT_S,
                          itl_target_s=ITL_S, floor={"prefill": 4, "decode": 4}, bounds=BOUNDS,
                          ahead={"prefill": 2, "decode": 2}, trend=trend, startup_s=STARTUP_S)
    assert not calm.changed and dict(calm.replicas) == {"prefill": 4, "decode": 4}
    # Never past the max.
    capped = reactive.react(gauges(running=8, ready=(8, 2)), MODEL, isl=ISL, osl=OSL, ttft_target_s=TTFT_S,
                            itl_target_s=ITL_S, floor={"prefill": 8, "decode": 2}, bounds={"prefill": (1, 9), "decode": (1, 16)},
                            ahead={"prefill": 30, "decode": 2}, trend=trend, startup_s=STARTUP_S)
    assert capped.replicas["prefill"] == 9
