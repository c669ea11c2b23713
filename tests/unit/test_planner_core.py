"""The planner core: one interval of one graph, as a pure function (the live loop's and replay's heart)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from fleetpilot.api import contract
from fleetpilot.api import v1alpha1 as api
from fleetpilot.planner import capacity, core, lengths, live, predict, sizing


@pytest.fixture(scope="module")
def model() -> capacity.CapacityModel:
    return capacity.CapacityModel(live.simulator_profile(1))


def config(*, max_replicas: int = 16, **planner: object) -> core.GraphPlanConfig:
    bounds = {"scaling": {"min": 1, "max": max_replicas}}
    spec = api.DynamoGraphSpec.model_validate({
        "model": {"name": "m"}, "engine": {"framework": "simulator"},
        "components": {"prefill": bounds, "decode": bounds},
        "planner": {"mode": "sla", "sla": {"ttftMs": 500, "itlMs": 50}, "predictor": "constant",
                    "intervalSeconds": 60, **planner},
    })
    return core.config_from_spec(spec, startup_s=120, hold_s=300)


def seen(rate: float) -> core.Observation:
    return core.Observation(time=0.0, rate_rps=rate, isl=2000, osl=200, ttft_s=0.2, itl_s=0.02)


ONE_EACH = {"prefill": 1, "decode": 1}


def planned(model: capacity.CapacityModel, rates: list[float]) -> list[core.Plan]:
    """One plan per 60-s interval of `rates`, each applied before the next (up to 64 replicas a pool)."""
    memory, current, plans = core.GraphMemory(), dict(ONE_EACH), []
    for k, rate in enumerate(rates):
        plan, memory = core.plan_interval(config(max_replicas=64), seen(rate), memory, current=current,
                                          capacity=model, now=60.0 * k)
        plans.append(plan)
        current = dict(plan.replicas)
    return plans


def test_the_fast_path_runs_every_five_seconds_unless_the_graph_turns_it_off() -> None:
    assert config().reactive_period_s == 5.0
    assert config(fastPathSeconds=20).reactive_period_s == 20.0
    assert config(fastPathSeconds=0).reactive_period_s is None
    with pytest.raises(ValueError, match="fastPathSeconds|fast_path_seconds"):
        config(fastPathSeconds=-1)


def test_missing_data_holds_replicas_and_keeps_history(model: capacity.CapacityModel) -> None:
    memory = core.GraphMemory(rates=(5.0,), lengths=(core.IntervalLengths(0.0, 5.0, 2000.0, 200.0),))
    plan, after = core.plan_interval(config(), core.Observation(time=0.0, error="Prometheus down"), memory,
                                     current={"prefill": 3, "decode": 2}, capacity=model, now=100.0)
    assert not plan.data_ok and dict(plan.replicas) == {"prefill": 3, "decode": 2}
    assert "Prometheus down" in plan.reason
    assert after.rates == memory.rates


def test_more_load_means_more_replicas_of_both_pools(model: capacity.CapacityModel) -> None:
    light, _ = core.plan_interval(config(), seen(1.0), core.GraphMemory(), current=ONE_EACH, capacity=model, now=0.0)
    heavy, _ = core.plan_interval(config(), seen(100.0), core.GraphMemory(), current=ONE_EACH, capacity=model,
                                  now=0.0)
    assert dict(light.replicas) == ONE_EACH
    assert heavy.replicas["prefill"] > 1 and heavy.replicas["decode"] > 1
    assert heavy.predicted is not None and heavy.predicted.rate_rps == pytest.approx(100.0)


def test_the_horizon_sizes_for_the_peak_before_a_new_replica_is_ready(
    model: capacity.CapacityModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A predictor forecasting a rise within the start-up time gets the replicas for the rise now."""

    @dataclasses.dataclass(frozen=True)
    class Rising:
        name: str = "rising"

        def forecast(self, history: object, *, steps: int, step_seconds: float, start: object = ()) -> object:
            from fleetpilot.planner.predict import Forecast

            mean = tuple(10.0 * (i + 1) for i in range(steps))
            return Forecast(mean=mean, lower=mean, upper=mean, predictor="rising", fallback=None)

    monkeypatch.setattr(core.predict, "make_predictor", lambda name, **_: Rising())
    plan, _ = core.plan_interval(config(), seen(10.0), core.GraphMemory(), current=ONE_EACH, capacity=model, now=0.0)
    assert config().horizon_steps == 2
    assert plan.predicted is not None and plan.predicted.rate_rps == pytest.approx(20.0)


def test_a_budget_caps_the_decision_but_the_claim_says_what_was_wanted(model: capacity.CapacityModel) -> None:
    plan, _ = core.plan_interval(config(gpuBudget=4), seen(100.0), core.GraphMemory(), current=ONE_EACH,
                                 capacity=model, now=0.0)
    assert sum(plan.replicas.values()) <= 4
    assert plan.wanted_gpus is not None and plan.wanted_gpus > 4


def test_the_decode_running_cap_is_learned_from_requests_waiting_for_a_slot() -> None:
    """Waiting for a slot while each replica runs 256: the engines run no more. Without waiting, a
    replica seen running more raises the cap; an interval that says nothing keeps it."""
    def seen_decode(running: float, waiting: float) -> core.Observation:
        return core.Observation(time=0.0, decode_running=running, decode_waiting=waiting)

    assert core.learn_max_running(None, seen_decode(512, 300), decode_replicas=2) == 256
    assert core.learn_max_running(None, seen_decode(512, 3), decode_replicas=2) is None  # a few: not full
    assert core.learn_max_running(256, seen_decode(600, 0), decode_replicas=2) == 300
    assert core.learn_max_running(256, seen_decode(100, 0), decode_replicas=2) == 256
    assert core.learn_max_running(256, core.Observation(time=0.0), decode_replicas=2) == 256


def test_the_engine_flags_batch_cap_binds_from_the_first_interval(model: capacity.CapacityModel) -> None:
    """A graph whose decode engines run at most 64 sequences (--max-num-seqs 64) is sized for 64 per
    replica before any interval has shown it, as a fleet that showed it would be; a lower cap the
    fleet shows (a smaller KV cache) wins over the flag, and is what the planner remembers."""
    def with_cap(cap: int | None) -> core.GraphPlanConfig:
        return dataclasses.replace(config(), decode_batch_cap=cap)

    observation = core.Observation(time=0.0, rate_rps=30.0, isl=2000, osl=200, ttft_s=0.2, itl_s=0.02, prefill_s=0.2)
    unstated, _ = core.plan_interval(with_cap(None), observation, core.GraphMemory(), current=ONE_EACH,
                                     capacity=model, now=0.0)
    stated, memory = core.plan_interval(with_cap(64), observation, core.GraphMemory(), current=ONE_EACH,
                                        capacity=model, now=0.0)
    shown, _ = core.plan_interval(with_cap(None), observation, core.GraphMemory(decode_max_running=64.0),
                                  current=ONE_EACH, capacity=model, now=0.0)
    assert math.isnan(unstated.corrections.decode_max_running)
    assert stated.corrections.decode_max_running == 64.0 and memory.decode_max_running is None  # stated, not learned
    assert stated.replicas == shown.replicas and stated.replicas["decode"] > unstated.replicas["decode"]
    lower, _ = core.plan_interval(with_cap(64), observation, core.GraphMemory(decode_max_running=32.0),
                                  current=ONE_EACH, capacity=model, now=0.0)
    assert lower.corrections.decode_max_running == 32.0


def test_traffic_that_stops_dead_is_an_outage_held_through_and_a_quiet_graphs_empty_interval_is_not(
        model: capacity.CapacityModel) -> None:
    """600 req/s for an hour, then nothing for two: Poisson arrivals at the quietest level remembered are
    never silent for a minute, so each silent interval holds the fleet (as for missing metrics) and leaves
    the rate history alone; when the load returns, the plan is the one made before the silence. The
    interval in which it returns measures part outage, part load (100 req/s of the 600 that came back):
    it scales nothing down. A graph that has been this quiet before (3 requests a minute expected at its
    quietest), or whose silence outlasts OUTAGE_HOLD_S, is planned as ever."""
    busy = planned(model, [600.0] * 60 + [0.0] * 120 + [600.0])
    before, during, after = busy[59], busy[60:180], busy[180]
    assert all(not p.data_ok and p.replicas == before.replicas for p in during)
    assert "outage" in during[0].reason and "36,000" in during[0].reason
    assert after.data_ok and after.replicas == before.replicas and before.replicas["decode"] > 1
    partial = planned(model, [600.0] * 60 + [0.0] * 120 + [100.0, 100.0])
    assert partial[180].data_ok and partial[180].replicas == before.replicas and "resumed" in partial[180].reason
    assert "resumed" not in partial[181].reason  # measured whole: planned as such (the hold then applies)
    assert planned(model, [0.05] * 60 + [0.0])[60].data_ok
    # It has been near silent before (early on: after 30 busy intervals, 0.2 req/s would be a trickle, held).
    assert planned(model, [600.0] * 20 + [0.2] + [600.0] * 39 + [0.0])[60].data_ok
    assert planned(model, [600.0] * 29 + [0.0])[29].data_ok  # too little history to call it an outage
    held = int(core.OUTAGE_HOLD_S // 60)
    long = planned(model, [600.0] * 60 + [0.0] * (held + 2))
    assert not long[60 + held - 1].data_ok and long[60 + held].data_ok and long[60 + held + 1].data_ok


def test_a_trickle_after_traffic_is_an_outage_held_like_silence_and_a_decline_is_not(
        model: capacity.CapacityModel) -> None:
    """An outage upstream leaves a trickle (retries, a region that still gets through): 600 req/s for an
    hour, then 5 req/s for two hours, is held as silence is, and the fleet meets the returning load as
    it was. A fall to just over a tenth of the quietest interval is traffic; so is a decline that halves
    the load each interval: it passes through its quieter levels first."""
    trickle = planned(model, [600.0] * 60 + [5.0] * 120 + [600.0])
    before, during, after = trickle[59], trickle[60:180], trickle[180]
    assert all(p.outage and not p.data_ok and p.replicas == before.replicas for p in during)
    assert "5 req/s this interval, under 10% of the quietest" in during[0].reason and "36,000" in during[0].reason
    assert after.data_ok and after.replicas == before.replicas and before.replicas["prefill"] > 1
    assert not planned(model, [600.0] * 60 + [61.0])[60].outage  # over a tenth: traffic, planned as ever
    halving = planned(model, [600.0] * 60 + [600.0 / 2 ** k for k in range(1, 12)])
    assert not any(p.outage for p in halving) and halving[-1].replicas["prefill"] < before.replicas["prefill"]


def test_lengths_are_the_recent_requests_mean_and_outlive_a_pause_only_while_nothing_is_newer() -> None:
    """The mean of the requests of the last six intervals (each interval by its rate); an idle interval
    adds nothing (its lengths are unknown, not 0); with no request in the window, the last intervals
    that had traffic stand, however old."""
    def at(minute: float, rate: float, isl: float) -> core.IntervalLengths:
        return core.IntervalLengths(60.0 * minute, rate, isl, 100.0)

    seen = core.with_lengths(core.with_lengths((), at(0, 1.0, 2000.0)), at(1, 3.0, 1000.0))
    assert core.recent_length(seen, "isl") == 1250.0  # by requests, not by interval
    assert core.with_lengths(seen, at(2, 0.0, 0.0)) == seen
    assert core.recent_lengths(seen, now=60.0 * 50, interval_s=60.0) == seen  # nothing newer: they stand
    for minute in range(2, 9):
        seen = core.with_lengths(seen, at(minute, 2.0, 500.0))
    assert len(seen) == core.MIX_INTERVALS and core.recent_length(seen, "isl") == 500.0
    after_pause = core.with_lengths(seen, at(40, 1.0, 76.0))
    assert core.recent_lengths(after_pause, now=60.0 * 40, interval_s=60.0) == (at(40, 1.0, 76.0),)
    assert core.recent_length((), "osl") == 0.0


def test_after_a_pause_new_traffic_is_sized_at_its_own_lengths_within_one_interval(
        model: capacity.CapacityModel) -> None:
    """An hour of 1,683-token prompts, 25 idle minutes, then 76-token prompts: the first interval of the
    new traffic is sized at ISL 76 and its own mix, and asks for no more prefill than that traffic needs
    (before, the mean and mix of the traffic before the pause stood for six intervals of traffic)."""
    def histogram(counts: dict[int, float], mean: float) -> lengths.Histogram:
        """Requests per bucket of the contract's bounds, keyed by each bucket's upper bound."""
        return lengths.Histogram(tuple(counts.get(int(b) if b != math.inf else -1, 0.0)
                                       for b in contract.TOKEN_BUCKETS), mean)

    def long_isl() -> lengths.Histogram:
        return histogram({1024: 60.0, 2048: 60.0, 4096: 60.0}, 1683.0)

    def short_isl() -> lengths.Histogram:
        return histogram({64: 90.0, 128: 90.0}, 76.0)

    cfg = config(max_replicas=64)
    before = [core.Observation(time=0.0, rate_rps=3.0, isl=1683, osl=200, ttft_s=0.2, itl_s=0.02,
                               isl_histogram=long_isl())] * 60
    pause = [core.Observation(time=0.0, rate_rps=0.0)] * 25
    after = core.Observation(time=0.0, rate_rps=3.0, isl=76, osl=200, ttft_s=0.05, itl_s=0.02,
                             isl_histogram=short_isl())
    memory, current = core.GraphMemory(), dict(ONE_EACH)
    for k, observation in enumerate([*before, *pause, after]):
        plan, memory = core.plan_interval(cfg, observation, memory, current=current, capacity=model, now=60.0 * k)
        current = dict(plan.replicas)
    assert plan.predicted is not None and plan.predicted.isl == pytest.approx(76.0)
    assert plan.predicted.isl_mix is not None and max(plan.predicted.isl_mix.lengths) < 128.0
    fresh, _ = core.plan_interval(cfg, after, core.GraphMemory(), current=ONE_EACH, capacity=model, now=0.0)
    assert plan.replicas["prefill"] <= max(fresh.replicas["prefill"], 1)
    assert not plan.warnings


def test_a_few_requests_in_the_hand_off_are_not_an_engine_cap() -> None:
    """At 1.5 requests/s and a 90-ms step, two prefilled requests waiting for their first token are the
    hand-off's ordinary arrivals (the e2e drift run learned a false cap of 38 from such a reading and
    doubled decode); ten waiting are a backlog whatever the rate."""
    def seen(waiting: float) -> core.Observation:
        return core.Observation(time=0.0, rate_rps=1.5, itl_s=0.09, decode_running=38.0, decode_waiting=waiting)

    assert core.learn_max_running(None, seen(2), decode_replicas=1) is None
    assert core.learn_max_running(None, seen(3), decode_replicas=1) is None
    assert core.learn_max_running(None, seen(10), decode_replicas=1) == 38.0
    # The same two waiting at a rate whose hand-off holds none is a full pool.
    slow = dataclasses.replace(seen(2), rate_rps=0.05, decode_running=20.0)
    assert core.learn_max_running(None, slow, decode_replicas=1) == 20.0


def test_a_decode_backlog_the_profile_does_not_explain_adds_decode(model: capacity.CapacityModel) -> None:
    """The profile says one decode replica holds hundreds of sequences; the fleet's engines run 64 and
    the rest wait. Once seen, the plan sizes decode for 64 per replica."""
    observation = core.Observation(time=0.0, rate_rps=30.0, isl=2000, osl=200, ttft_s=20.0, itl_s=0.02,
                                   prefill_s=0.2, decode_running=64.0, decode_waiting=400.0)
    blind, _ = core.plan_interval(config(), dataclasses.replace(observation, decode_running=None),
                                  core.GraphMemory(), current=ONE_EACH, capacity=model, now=0.0)
    learned, memory = core.plan_interval(config(), observation, core.GraphMemory(), current=ONE_EACH,
                                         capacity=model, now=0.0)
    assert memory.decode_max_running == 64.0 and learned.corrections.decode_max_running == 64.0
    assert learned.replicas["decode"] > blind.replicas["decode"]
    assert learned.replicas["prefill"] == blind.replicas["prefill"]


def _histogram(lengths_: list[float]) -> lengths.Histogram:
    histogram = lengths.of_lengths(lengths_)
    assert histogram is not None
    return histogram


def test_the_planner_learns_how_far_its_prefill_replicas_share_one_queue(model: capacity.CapacityModel) -> None:
    """Two fleets of 4 prefill replicas at the same load: one shows the TTFT of a single shared queue,
    the other that of four separate ones. Each teaches the planner its own sharing, and the planner
    then sizes the first leaner than the second for the same forecast."""
    cfg = config()
    isl = 2000.0
    rate = 0.8 * 4 / model.prefill_service_s(isl).value  # the pool 80% busy: its percentile request queues

    def run(pooling: float) -> core.Plan:
        prefill_s = model.expected_ttft_pool_s(rate, 4, isl=isl, percentile=90, pooling=pooling)
        observation = core.Observation(time=0.0, rate_rps=rate, isl=isl, osl=200, ttft_s=prefill_s + 0.05,
                                       itl_s=0.02, prefill_s=prefill_s)
        memory, plan = core.GraphMemory(), None
        for k in range(3):
            plan, memory = core.plan_interval(cfg, dataclasses.replace(observation, time=60.0 * k), memory,
                                              current={"prefill": 4, "decode": 2}, capacity=model, now=60.0 * k)
        assert plan is not None
        return plan

    shared, separate = run(1.0), run(0.0)
    assert shared.corrections.pooling == pytest.approx(1.0, abs=1e-6)
    assert separate.corrections.pooling == pytest.approx(0.0, abs=1e-6)
    # What the queue explains is not counted again as latency the profile misses.
    assert abs(shared.corrections.prefill_offset_s) < 1e-3 and abs(separate.corrections.prefill_offset_s) < 1e-3
    assert shared.replicas["prefill"] < separate.replicas["prefill"]
    assert "queue sharing" in separate.reason


def test_the_length_histograms_reach_sizing_as_a_mix_with_the_loads_mean(model: capacity.CapacityModel) -> None:
    """Long-tailed prompts (most short, a few very long) at the same mean as uniform ones: the mix
    reaches the load with that mean, and the long tail buys prefill replicas the mean would not."""
    short, tail = [1000.0] * 90, [11000.0] * 10  # mean 2000, like the uniform case
    uniform = [2000.0] * 100
    cfg = config()

    def plan_with(isls: list[float]) -> core.Plan:
        observation = core.Observation(time=0.0, rate_rps=40.0, isl=2000, osl=200, ttft_s=0.3, itl_s=0.02,
                                       isl_histogram=_histogram(isls), osl_histogram=_histogram([200.0] * 100))
        plan, _ = core.plan_interval(cfg, observation, core.GraphMemory(), current=ONE_EACH, capacity=model, now=0.0)
        return plan

    long_tailed, even = plan_with(short + tail), plan_with(uniform)
    assert long_tailed.predicted is not None and long_tailed.predicted.isl_mix is not None
    assert long_tailed.predicted.isl_mix.mean == pytest.approx(long_tailed.predicted.isl)
    assert long_tailed.replicas["prefill"] > even.replicas["prefill"]
    mean_only, _ = core.plan_interval(dataclasses.replace(cfg, length_mix=False), dataclasses.replace(
        core.Observation(time=0.0, rate_rps=40.0, isl=2000, osl=200, ttft_s=0.3, itl_s=0.02),
        isl_histogram=_histogram(short + tail)), core.GraphMemory(), current=ONE_EACH, capacity=model, now=0.0)
    assert mean_only.predicted is not None and mean_only.predicted.isl_mix is None


def test_a_fleet_no_cautious_forecast_needs_goes_down_without_the_hold_once_the_forecast_is_scored(
    model: capacity.CapacityModel,
) -> None:
    """Sixteen replicas of each for a load that needs a few, under an hour-long hold: while the
    forecast has fewer than MIN_SCORES scored errors the hold keeps them (its cautious quantile means
    nothing yet); then the pools go at once to what the 0.99-quantile of the load needs, which is no
    less than what the forecast itself wants."""
    cfg = dataclasses.replace(config(max_replicas=32), hold_s=3600.0)
    memory = core.GraphMemory()
    current = {"prefill": 16, "decode": 16}
    plans, scored = [], []
    for k in range(16):
        observation = core.Observation(time=60.0 * k, rate_rps=10.0 + (k % 2), isl=2000, osl=200, ttft_s=0.2,
                                       itl_s=0.02)
        plan, memory = core.plan_interval(cfg, observation, memory, current=current, capacity=model, now=60.0 * k)
        plans.append(plan)
        scored.append(min(len(c.scores) for c in memory.forecast_calibration.values()) if memory.forecast_calibration
                      else 0)
        current = dict(plan.replicas)
    cut = next(k for k, p in enumerate(plans) if p.replicas["prefill"] < 16)
    assert any("at once" in r for r in plans[cut].reasons)
    # Never before the forecast's errors were scored MIN_SCORES times, and as soon as they were.
    assert scored[cut] >= core.conformal.MIN_SCORES > scored[cut - 1]
    assert all(dict(p.replicas) == {"prefill": 16, "decode": 16} for p in plans[:cut])
    after = [p.replicas["prefill"] for p in plans[cut:]]
    assert after == sorted(after, reverse=True) and after[-1] >= 1  # down once, never back up on a flat load


def test_planning_at_a_rare_risk_a_scale_down_skips_the_hold_only_as_far_as_a_rarer_quantile_allows(
    model: capacity.CapacityModel,
) -> None:
    """Risk 0.99 on a flat load whose errors, nine hundred intervals back, once ran twenty spreads over:
    the risk's own quantile (the last 144 scores) no longer sees that surge, a quantile ten times rarer
    (the last 999) does. Sixteen replicas of each go down at once only to what the rarer one needs, not
    to what the plan itself sizes for (which, as the cautious quantile, would skip every hold)."""
    memory = _surge_long_ago()
    cfg = dataclasses.replace(config(max_replicas=32, risk=0.99), hold_s=3600.0)
    plan, _ = core.plan_interval(cfg, seen(10.0), memory, current={"prefill": 16, "decode": 16}, capacity=model,
                                 now=0.0)
    assert plan.predicted is not None
    rarer = core.cautious_risk(0.99)
    assert rarer is not None and 0.99 < rarer < 1.0 and core.cautious_risk(0.9) == core.CAUTIOUS_RISK
    forecast = core.PendingForecast((10.0,), (0.0,), 2000.0, 200.0, level=10.0)
    cautious = core.load_at_risk(forecast, memory, risk=rarer, burst=1.0)
    assert cautious.rate_rps > 1.5 * plan.predicted.rate_rps  # the surge, seen by the rarer quantile alone
    needs = sizing.size(dataclasses.replace(cautious, isl_mix=None, osl_mix=None), model, cfg.sla,
                        core.sizing_corrections(cfg, memory)).replicas
    assert needs["prefill"] > sizing.size(dataclasses.replace(plan.predicted, isl_mix=None, osl_mix=None), model,
                                          cfg.sla, core.sizing_corrections(cfg, memory)).replicas["prefill"]
    assert plan.replicas["prefill"] >= needs["prefill"] and plan.replicas["prefill"] < 16


def test_planning_at_a_risk_whose_rarer_quantile_no_window_resolves_every_scale_down_waits_for_the_hold(
    model: capacity.CapacityModel,
) -> None:
    """At risk 0.995 the cautious level is 0.9995, which 1,999 scores resolve and a calibration keeps at
    most 1,000: read as the largest of them it would claim a safety nothing has shown. The same surplus
    that goes down at once at risk 0.99 waits for the hold."""
    assert core.cautious_risk(0.995) is None and core.cautious_risk(0.99) is not None
    cfg = dataclasses.replace(config(max_replicas=32, risk=0.995), hold_s=3600.0)
    memory = _surge_long_ago()
    plan, _ = core.plan_interval(cfg, seen(10.0), memory, current={"prefill": 16, "decode": 16},
                                 capacity=model, now=0.0)
    assert plan.predicted is not None
    assert sizing.size(dataclasses.replace(plan.predicted, isl_mix=None, osl_mix=None), model, cfg.sla,
                       core.sizing_corrections(cfg, memory)).replicas["prefill"] < 16
    assert dict(plan.replicas) == {"prefill": 16, "decode": 16}
    assert not any("at once" in r for r in plan.reasons)


def _surge_long_ago() -> core.GraphMemory:
    """A flat load whose forecast errors, scored a thousand times, once (900 intervals ago) ran twenty
    spreads over."""
    import numpy as np

    rng = np.random.default_rng(3)
    scores = [float(s) for s in 0.3 * rng.standard_normal(1000)]
    scores[100] = 20.0
    calibration = core.conformal.Calibration(scores=tuple(scores))
    return dataclasses.replace(core.warm_memory((10.0,) * 60, (2000.0,) * 60, (200.0,) * 60, now=0.0, interval_s=60.0),
                               forecast_calibration=dict.fromkeys(core.LOADS, calibration))


def test_a_surprise_in_the_first_intervals_does_not_size_the_fleet_for_many_times_the_peak(
    model: capacity.CapacityModel, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On/off traffic that starts with two quiet minutes and a burst: the burst is an error of a dozen
    spreads of a model fitted on three points. Scored, it would sit in the calibration window and, once
    the spread has grown to what the series does, size for many times the busiest minute; forecasts
    made from fewer than SCORED_FROM_INTERVALS intervals are not scored, so the planner's 0.9-quantile
    stays within three times the busiest minute it has seen (2.3 here)."""
    import numpy as np

    rng = np.random.default_rng(7)
    # (quiet, not silent: two minutes without a request after 4 req/s would be an outage, held)
    rates = [4.0, 0.05, 0.05, 36.0, *(float(rng.uniform(20, 40)) if rng.random() < 0.4 else float(rng.uniform(0, 4))
                                    for _ in range(36))]

    def worst_overshoot() -> float:
        memory, current, worst = core.GraphMemory(), dict(ONE_EACH), 0.0
        for k, rate in enumerate(rates):
            plan, memory = core.plan_interval(config(max_replicas=64), seen(rate), memory, current=current,
                                              capacity=model, now=60.0 * k)
            assert plan.predicted is not None
            worst = max(worst, plan.predicted.rate_rps / max(rates[:k + 1]))
            current = dict(plan.replicas)
        return worst

    assert worst_overshoot() < 3.0
    monkeypatch.setattr(core, "SCORED_FROM_INTERVALS", 0)
    assert worst_overshoot() > 6.0  # what scoring from the first interval did (13×)


def test_what_the_planner_learned_survives_a_restart_through_the_graphs_status(model: capacity.CapacityModel) -> None:
    """A planner that ran twelve intervals on a fleet slower than its profile, whose prompts queue as
    if each replica stood alone, and whose decode engines cap at 40 sequences; a new one starts from
    the load history (Prometheus) and `status.planner.learned`: its next decision is the one the old
    planner makes, and without the learned state it is not."""
    cfg = config(max_replicas=64)
    isl, rate = 2000.0, 40.0
    prefill_s = 1.6 * model.expected_ttft_pool_s(rate * 1.6, 6, isl=isl, percentile=90, pooling=0.0)

    def seen_at(k: int) -> core.Observation:
        return core.Observation(time=60.0 * k, rate_rps=rate, isl=isl, osl=200, ttft_s=prefill_s + 0.05,
                                itl_s=0.03, prefill_s=prefill_s, prefill_busy=min(0.85, rate * 1.6 * model.prefill_service_s(isl).value / 6),
                                decode_running=120.0, decode_waiting=30.0)
    memory, current = core.GraphMemory(), {"prefill": 6, "decode": 3}
    for k in range(12):
        _, memory = core.plan_interval(cfg, seen_at(k), memory, current=current, capacity=model, now=60.0 * k)
    status = core.learned(memory)
    assert status["prefillSpeed"] == pytest.approx(1.6, rel=0.05)
    assert status["prefillQueueSharing"] == pytest.approx(0.0, abs=0.05) and status["decodeMaxRunning"] == 40.0
    assert all(isinstance(v, float) for v in status.values())

    def next_plan(start: core.GraphMemory) -> core.Plan:
        """From one replica each, so that the decision is the sizing itself (no hold in the way)."""
        plan, _ = core.plan_interval(cfg, seen_at(12), start, current=ONE_EACH, capacity=model, now=720.0)
        return plan

    history = (memory.rates, (2000.0,) * len(memory.rates), (200.0,) * len(memory.rates))
    restarted = core.remember(core.warm_memory(*history, now=720.0, interval_s=60.0), status)
    cold = core.warm_memory(*history, now=720.0, interval_s=60.0)
    assert dict(next_plan(restarted).replicas) == dict(next_plan(memory).replicas)
    assert dict(next_plan(cold).replicas) != dict(next_plan(memory).replicas)
    # A hand-edited or foreign status is ignored field by field, never a crash.
    odd = core.remember(core.GraphMemory(), {"prefillSpeed": "fast", "burst": float("nan"), "decodeMaxRunning": -3})
    assert core.learned(odd) == {"prefillSpeed": 1.0, "decodeSpeed": 1.0, "prefillOffsetSeconds": 0.0,
                                 "decodeOffsetSeconds": 0.0}


def test_an_sla_below_the_profiles_floor_is_reported_and_sized_for_the_floor_plus_a_margin(
    model: capacity.CapacityModel,
) -> None:
    """ITL 1 ms is below what one sequence alone takes on the simulator's profile: the plan says so
    (SLAInfeasible, naming target and floor) and sizes decode as for the floor + 25%, not one sequence per
    replica up to scaling.max."""
    floor_ms = model.decode_capacity(2000, 200, 0.001).itl_s * 1e3
    quiet = core.Observation(time=0.0, rate_rps=5.0, isl=2000, osl=200)  # no latencies: nothing to correct
    impossible, _ = core.plan_interval(config(sla={"ttftMs": 500, "itlMs": 1}), quiet, core.GraphMemory(),
                                       current=ONE_EACH, capacity=model, now=0.0)
    relaxed, _ = core.plan_interval(config(sla={"ttftMs": 500, "itlMs": floor_ms * 1.25}), quiet,
                                    core.GraphMemory(), current=ONE_EACH, capacity=model, now=0.0)
    assert impossible.warnings is not None and [r for r, _ in impossible.warnings] == ["SLAInfeasible"]
    assert f"ITL target 1.0 ms is below the floor of {floor_ms:.1f} ms" in impossible.warnings[0][1]
    assert impossible.replicas["decode"] == relaxed.replicas["decode"] < 16
    assert relaxed.warnings == ()


def test_a_gpu_budget_below_the_minimums_is_a_warning_not_a_sentence(model: capacity.CapacityModel) -> None:
    bounds = {"scaling": {"min": 2, "max": 8}}
    spec = api.DynamoGraphSpec.model_validate({
        "model": {"name": "m"}, "engine": {"framework": "simulator"},
        "components": {"prefill": {"replicas": 2, **bounds}, "decode": {"replicas": 2, **bounds}},
        "planner": {"mode": "sla", "sla": {"ttftMs": 500, "itlMs": 50}, "predictor": "constant", "gpuBudget": 3}})
    plan, _ = core.plan_interval(core.config_from_spec(spec), seen(1.0), core.GraphMemory(),
                                 current={"prefill": 2, "decode": 2}, capacity=model, now=0.0)
    assert plan.warnings is not None and plan.warnings[0][0] == "BudgetBelowMinimum"
    assert "GPU budget 3 is below the 4 GPUs the pools' scaling.min need" in plan.warnings[0][1]
    assert dict(plan.replicas) == {"prefill": 2, "decode": 2}  # the minimums are kept
    holding, _ = core.plan_interval(core.config_from_spec(spec), core.Observation(time=0.0, error="down"),
                                    core.GraphMemory(), current={"prefill": 2, "decode": 2}, capacity=model, now=0.0)
    assert holding.warnings is None  # not sized: the last word stands


def test_a_multinode_group_counts_every_pods_gpus_against_the_budget(model: capacity.CapacityModel) -> None:
    """Decode replicas of two 8-GPU pods (TP16) cost 16 GPUs each: a 40-GPU budget holds one prefill
    replica (8) and two decode groups (32), never a third group."""
    spec = api.DynamoGraphSpec.model_validate({
        "model": {"name": "m"}, "engine": {"framework": "simulator"},
        "components": {"prefill": {"gpus": 8, "parallelism": {"tensor": 8}, "scaling": {"max": 8}},
                       "decode": {"nodes": 2, "gpus": 8, "parallelism": {"tensor": 16}, "scaling": {"max": 8}}},
        "planner": {"mode": "sla", "sla": {"ttftMs": 500, "itlMs": 50}, "predictor": "constant", "gpuBudget": 40},
    })
    plan_config = core.config_from_spec(spec, startup_s=120, hold_s=300)
    assert plan_config.gpus_per_replica == {"prefill": 8, "decode": 16}
    assert core.min_gpus(plan_config) == 24
    plan, _ = core.plan_interval(plan_config, seen(400.0), core.GraphMemory(), current=ONE_EACH, capacity=model,
                                 now=0.0)
    assert 8 * plan.replicas["prefill"] + 16 * plan.replicas["decode"] <= 40
    assert plan.wanted_gpus is not None and plan.wanted_gpus > 40 and plan.wanted_gpus % 8 == 0


def test_the_planner_hands_each_forecast_the_last_fit_as_its_start(model: capacity.CapacityModel) -> None:
    """The rate forecast's fitted parameters stay in the graph's memory and start the next interval's fit."""
    starts: list[tuple[float, ...]] = []

    @dataclasses.dataclass(frozen=True)
    class Remembering:
        name: str = "remembering"

        def forecast(self, history: tuple[float, ...], *, steps: int, step_seconds: float,
                     start: tuple[float, ...] = ()) -> predict.Forecast:
            starts.append(tuple(start))
            mean = (history[-1],) * steps
            return predict.Forecast(mean=mean, lower=mean, upper=mean, predictor=self.name,
                                    state=(float(len(history)),))

    memory = core.GraphMemory()
    for k in range(3):
        _, memory = core.plan_interval(config(), seen(10.0), memory, current=ONE_EACH, capacity=model,
                                       now=60.0 * k, predictor=Remembering())
    assert starts == [(), (1.0,), (2.0,)]
    assert memory.forecast_state == (3.0,)
