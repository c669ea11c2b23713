"""Online calibration of forecast quantiles (planner/conformal.py) and how the core uses it.

The streams are synthetic and seeded: a forecaster whose opinion of its error is fixed (mean 10,
spread 1) meets outcomes whose real error differs from that opinion; the calibrated quantile must
cover what the level says anyway.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from test_planner_core import config

from fleetpilot.api import v1alpha1 as api
from fleetpilot.planner import capacity, conformal, core, live, predict


def _covered(outcomes: np.ndarray, q: float, *, mean: float = 10.0, spread: float = 1.0) -> np.ndarray:
    """For each outcome, whether the calibrated q-quantile given before it covered it."""
    calibration = conformal.Calibration()
    hits = []
    for value in outcomes:
        hits.append(value <= conformal.quantile(calibration, mean, spread, q))
        calibration = conformal.update(calibration, mean, spread, float(value), levels=(q,))
    return np.array(hits)


@pytest.mark.parametrize("q", [0.5, 0.9, 0.99])
def test_coverage_matches_the_level_when_the_model_is_wrong_by_a_factor(q: float) -> None:
    """The errors are three times wider than the model says: the model's own 0.9-quantile would cover
    about 66%; the calibrated one covers q within two points after the first window."""
    rng = np.random.default_rng(7)
    outcomes = 10.0 + 3.0 * rng.standard_normal(3000)
    hits = _covered(outcomes, q)
    assert abs(hits[conformal.SCORE_WINDOW:].mean() - q) <= 0.02
    if q == 0.9:
        naive = outcomes <= predict.Forecast((10.0,), (10.0,), (10.0,), "x", scale=(1.0,)).quantile(q)[0]
        assert naive.mean() < 0.7


def test_coverage_recovers_within_the_window_when_the_noise_doubles() -> None:
    """Halfway through, the noise doubles. Coverage of the 0.9-quantile dips right after the change,
    is back within three points of 0.9 over the rest of the window that follows, and stays there."""
    rng = np.random.default_rng(11)
    n = 2000
    sigma = np.where(np.arange(n) < n // 2, 1.0, 2.0)
    hits = _covered(10.0 + sigma * rng.standard_normal(n), 0.9)
    window = conformal.SCORE_WINDOW
    before = hits[window:n // 2].mean()
    right_after = hits[n // 2:n // 2 + 30].mean()
    recovered = hits[n // 2 + 30:n // 2 + window].mean()
    later = hits[n // 2 + window:].mean()
    assert abs(before - 0.9) <= 0.03
    assert right_after < 0.85  # the change is real: the old scores under-cover it
    assert abs(recovered - 0.9) <= 0.03
    assert abs(later - 0.9) <= 0.03


def test_skewed_errors_get_an_asymmetric_quantile() -> None:
    """Bursts: errors only ever above the mean (exponential). The 0.5-quantile sits above the mean and
    the 0.99 one far above the model's Gaussian, each covering its level."""
    rng = np.random.default_rng(3)
    outcomes = 10.0 + rng.exponential(2.0, 3000)
    for q in (0.5, 0.99):
        hits = _covered(outcomes, q)
        assert abs(hits[conformal.SCORE_WINDOW:].mean() - q) <= 0.02


def test_calibrated_quantiles_do_not_cross() -> None:
    """Each tracked level adapts on its own, yet a higher level never gives a lower quantile."""
    rng = np.random.default_rng(5)
    levels = [0.5, 0.6, 0.8, 0.9, 0.95, 0.99, 0.999]
    calibration = conformal.Calibration()
    for value in 10.0 + rng.standard_normal(200) * np.linspace(1, 3, 200):
        calibration = conformal.update(calibration, 10.0, 1.0, float(value), levels=levels)
    calibrated = [conformal.quantile(calibration, 10.0, 1.0, q) for q in levels]
    assert calibrated == sorted(calibrated)


@pytest.mark.parametrize("name", sorted(predict.PREDICTORS))
def test_each_predictors_quantiles_are_monotone_in_the_level(name: str) -> None:
    t = np.arange(96)
    history = 50 + 10 * np.sin(2 * np.pi * t / 24) + np.random.default_rng(1).normal(0, 2, len(t))
    forecast = predict.make_predictor(name).forecast(history.tolist(), steps=3, step_seconds=3600.0)
    assert forecast.predictor == name, forecast.fallback
    assert all(s > 0 for s in forecast.scale)
    levels = [0.5, 0.7, 0.9, 0.99, 0.999]
    per_level = [forecast.quantile(q) for q in levels]
    for step in range(3):
        values = [quantiles[step] for quantiles in per_level]
        assert values == sorted(values) and values[0] == pytest.approx(forecast.mean[step])


def test_too_few_scores_take_the_model_or_the_worst_error() -> None:
    """Below MIN_SCORES the model's Gaussian quantile stands; from there until the window resolves the
    level (99 scores for 0.99), the larger of the Gaussian and the largest score seen."""
    calibration = conformal.Calibration()
    for value in (10.5, 9.0, 14.0, 10.0, 11.0):  # scores 0.5, -1, 4, 0, 1
        calibration = conformal.update(calibration, 10.0, 1.0, value)
    assert conformal.quantile(calibration, 10.0, 1.0, 0.99) == pytest.approx(10.0 + 2.3263, abs=1e-3)
    for value in (10.0,) * (conformal.MIN_SCORES - 5):
        calibration = conformal.update(calibration, 10.0, 1.0, value)
    assert conformal.quantile(calibration, 10.0, 1.0, 0.99) == pytest.approx(14.0)
    quiet = conformal.Calibration(scores=(0.1, -0.1, 0.0, 0.2, -0.2) * 2)
    assert conformal.quantile(quiet, 10.0, 1.0, 0.99) == pytest.approx(10.0 + 2.3263, abs=1e-3)
    assert conformal.quantile(conformal.Calibration(), 10.0, 1.0, 0.9) == pytest.approx(11.2816, abs=1e-3)


def test_a_spread_floor_keeps_one_surprise_from_dominating_the_window() -> None:
    """A forecast of 0 with a spread of 0.001 meets a burst of 9: normalised by the spread the score
    would be 9,000; the floor (a share of the series' level, 1 here) makes it 9 / 0.05 = 180."""
    calibration = conformal.update(conformal.Calibration(), 0.0, 0.001, 9.0, floor=conformal.SPREAD_FLOOR_SHARE)
    assert calibration.scores == (pytest.approx(180.0),)


def test_outcomes_that_are_not_numbers_change_nothing() -> None:
    calibration = conformal.update(conformal.Calibration(), 10.0, 1.0, 12.0)
    assert conformal.update(calibration, 10.0, 1.0, math.nan) is calibration
    with pytest.raises(ValueError, match="level"):
        conformal.quantile(calibration, 10.0, 1.0, 1.0)


def test_coverage_is_reported_per_tracked_level() -> None:
    calibration = conformal.Calibration()
    for value in (9.0, 11.0, 30.0, 10.0):
        calibration = conformal.update(calibration, 10.0, 1.0, value, levels=(0.5, 0.95))
    assert set(conformal.coverages(calibration)) == {0.5, 0.95}
    assert conformal.coverages(calibration)[0.5] == pytest.approx(0.5)  # 9 and 10 under the median


# -- in the planner core --------------------------------------------------------------------------------


def test_a_forecast_is_scored_against_the_interval_it_was_for() -> None:
    """A forecast made now for the next two intervals meets its first step at the next interval and its
    second at the one after; each load (requests, input and output tokens) is scored."""
    pending = core.PendingForecast(rate_mean=(10.0, 20.0), rate_spread=(1.0, 2.0), isl=100.0, osl=10.0)
    silent = core.PendingForecast(rate_mean=(0.0, 0.0), rate_spread=(0.0, 0.0), isl=100.0, osl=10.0)
    memory = core.realise(core.GraphMemory(pending=(silent,)), rate=12.0, isl=100.0, osl=10.0, risk=0.9)
    assert memory.forecast_calibration == {}  # a forecast with no spread has no opinion of its error to score
    memory = core.GraphMemory(pending=(pending,))
    memory = core.realise(memory, rate=12.0, isl=100.0, osl=10.0, risk=0.9)
    assert memory.forecast_calibration["requests"].scores == (pytest.approx(2.0),)  # (12 − 10) / 1
    assert memory.forecast_calibration["input_tokens"].scores == (pytest.approx(2.0),)
    newer = core.PendingForecast(rate_mean=(30.0, 30.0), rate_spread=(3.0, 3.0), isl=100.0, osl=10.0)
    memory = core.realise(dataclasses.replace(memory, pending=(pending, newer)), rate=20.0, isl=120.0, osl=10.0,
                          risk=0.9)
    # Two outcomes this interval: step 1 of the older forecast (20 vs 20) and step 0 of the newer (20 vs 30).
    assert memory.forecast_calibration["requests"].scores[-2:] == (pytest.approx(0.0), pytest.approx(-10 / 3))
    assert len(memory.forecast_calibration["output_tokens"].scores) == 3
    # Input tokens: 20 × 120 = 2400 realised against 20 × 100 = 2000 forecast with spread 200: +2.
    assert memory.forecast_calibration["input_tokens"].scores[-2] == pytest.approx(2.0)


def test_a_higher_risk_asks_for_more_replicas_on_noisy_load() -> None:
    """The same noisy history planned at risk 0.5 and 0.99: the 0.99 plan sizes for a higher load and
    never asks for fewer replicas; the plan reports the coverage of every tracked level."""
    rng = np.random.default_rng(2)
    rates = np.clip(40 + 12 * rng.standard_normal(60), 1, None)
    chosen: dict[float, core.Plan] = {}
    model = capacity.CapacityModel(live.simulator_profile(1))
    for risk in (0.5, 0.99):
        graph = config(max_replicas=64, risk=risk)
        memory = core.GraphMemory()
        current = {"prefill": 1, "decode": 1}
        for k, rate in enumerate(rates):
            observation = core.Observation(time=60.0 * k, rate_rps=float(rate), isl=800, osl=400,
                                           ttft_s=0.2, itl_s=0.01)
            plan, memory = core.plan_interval(graph, observation, memory, current=current, capacity=model,
                                              now=60.0 * k)
            current = dict(plan.replicas)
        chosen[risk] = plan
    low, high = chosen[0.5], chosen[0.99]
    assert low.predicted is not None and high.predicted is not None
    assert high.predicted.rate_rps > 1.3 * low.predicted.rate_rps
    assert high.replicas["prefill"] >= low.replicas["prefill"] and high.replicas["decode"] >= low.replicas["decode"]
    assert set(high.coverage["requests"]) == {0.5, 0.9, 0.99}


def test_risk_outside_the_open_unit_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="risk"):
        dataclasses.replace(config(), risk=1.0)
    assert api.PlannerSpec().risk == config().risk == 0.9


def test_the_rarest_levels_the_api_accepts_are_resolved_not_read_as_the_largest_recent_score() -> None:
    """Heavy-tailed errors (Student's t, 3 degrees of freedom): the 0.999-quantile misses fewer than 0.4%
    of them (ACI's level, clipped at 1, keeps it from 0.1%), where a window of SCORE_WINDOW read it as
    the largest of 144 scores and missed 1/145 ≈ 0.7% (0.6% on this stream); and the levels from 0.99 to
    0.999, all the largest of the same 144 scores there, now rise with the level: each reads the largest
    of the q / (1 − q) latest scores, split conformal's smallest window that covers q."""
    rng = np.random.default_rng(13)
    outcomes = 10.0 + rng.standard_t(3, 20000)
    hits = _covered(outcomes, 0.999)
    assert hits[conformal.MAX_SCORE_WINDOW:].mean() >= 0.996
    calibration = conformal.Calibration()
    for value in outcomes[:3000]:
        calibration = conformal.update(calibration, 10.0, 1.0, float(value), levels=())
    rare = [conformal.quantile(calibration, 10.0, 1.0, q) for q in (0.99, 0.995, 0.9975, 0.999)]
    assert rare == sorted(rare) and rare[-1] > rare[0]
    assert conformal.score_window(0.9) == conformal.SCORE_WINDOW
    assert conformal.score_window(0.999) == 999 <= conformal.MAX_SCORE_WINDOW


def test_a_graph_keeps_only_the_scores_its_rarest_quantile_reads() -> None:
    """Three hundred intervals of noisy load: at the default risk a graph's calibration keeps the last
    SCORE_WINDOW scores per load (a day's, what its 0.99 cautious quantile reads), at risk 0.99 every
    one of them (its cautious quantile, ten times rarer, reads up to MAX_SCORE_WINDOW), at risk 0.995
    the 199 its own level reads (its cautious level no window resolves, `core.cautious_risk`); 1,000
    graphs at the default do not carry 1,000 scores each."""
    model = capacity.CapacityModel(live.simulator_profile(1))
    rng = np.random.default_rng(2)
    rates = [float(r) for r in 10.0 + rng.standard_normal(300)]
    kept = {}
    for risk in (0.9, 0.99, 0.995):
        memory, current = core.GraphMemory(), {"prefill": 2, "decode": 2}
        for k, rate in enumerate(rates):
            observation = core.Observation(time=60.0 * k, rate_rps=rate, isl=2000, osl=200, ttft_s=0.2, itl_s=0.02)
            plan, memory = core.plan_interval(config(max_replicas=32, risk=risk), observation, memory,
                                              current=current, capacity=model, now=60.0 * k)
            current = dict(plan.replicas)
        kept[risk] = {len(c.scores) for c in memory.forecast_calibration.values()}
    assert kept[0.9] == {conformal.SCORE_WINDOW}
    assert min(kept[0.99]) > 250
    assert kept[0.995] == {conformal.scores_to_resolve(0.995)}


def test_rises_are_read_as_multiples_of_where_they_started_and_cover_the_level() -> None:
    """A rate that wanders multiplicatively and jumps by half now and then: the 0.999-quantile of the
    rises over the next two intervals, times the latest rate, covers the peak of those intervals at
    least 99.5% of the time once enough rises are known; the same series a thousand times busier reads
    the same multiple (a ratio has no unit to lose over a week)."""
    rng = np.random.default_rng(21)
    steps, q = 2, 0.999
    log_rate = np.cumsum(0.05 * rng.standard_normal(6000)) + np.where(rng.random(6000) < 0.01, np.log(1.5), 0.0)
    rates = 100.0 * np.exp(log_rate - np.maximum.accumulate(log_rate) * 0.5)
    covered = []
    for t in range(conformal.MAX_SCORE_WINDOW, len(rates) - steps, 7):
        rise = conformal.rise_quantile(rates[:t + 1], steps, q)
        assert rise is not None
        covered.append(rates[t + 1:t + 1 + steps].max() <= rates[t] * rise)
    assert np.mean(covered) >= 0.995
    assert conformal.rise_quantile(1000.0 * rates[:2000], steps, q) == pytest.approx(
        conformal.rise_quantile(rates[:2000], steps, q))


def test_a_rise_needs_enough_starts_and_none_from_a_near_silence() -> None:
    """Fewer than MIN_SCORES rises give no bound; intervals at or under `least` start none (a dip to 6
    then 19 is a burst after a lull, not a multiple to size a busy fleet by), nor do those outside
    RISE_BAND of the latest (0.1 → 50 beside a latest 10); the rarest level read from a handful of
    rises is the largest of them."""
    assert conformal.rise_quantile([10.0] * conformal.MIN_SCORES, 1, 0.999) is None  # nine rises
    assert conformal.rise_quantile([10.0] * 30, 0, 0.999) is None
    rates = [10.0, 12.0, 11.0, 10.0, 13.0, 10.0, 11.0, 12.0, 10.0, 11.0, 10.0, 10.0, 6.0, 19.0, 10.0]
    assert conformal.rise_quantile(rates, 1, 0.999, least=7.0) == pytest.approx(1.3)  # 10 → 13
    assert conformal.rise_quantile(rates, 1, 0.999) == pytest.approx(19.0 / 6.0)  # 6 → 19, counted
    # Over two intervals the 10 before the dip reaches the 19 after it: a rise from a busy level counts.
    assert conformal.rise_quantile(rates, 2, 0.999, least=7.0) == pytest.approx(1.9)
    outside = [*rates[:12], 0.1, 50.0, 10.0]
    assert conformal.rise_quantile(outside, 1, 0.999) == pytest.approx(1.3)


def test_rises_are_read_from_starts_near_the_latest_level() -> None:
    """A daily trough at 10 that doubles into the day's 100, and near 100 rises of at most 25%: at the
    peak the bound is the peak's own rises, not the morning's doubling; at the trough it is the
    doubling. Rises from levels RISE_BAND away are another regime (Mondrian conformal, by level)."""
    day = [10.0, 20.0, 40.0, 80.0, 100.0, 110.0, 100.0, 120.0, 100.0, 90.0, 60.0, 30.0]
    rates = day * 20
    at_peak = conformal.rise_quantile([*rates, 100.0], 1, 0.999)
    at_trough = conformal.rise_quantile([*rates, 10.0], 1, 0.999)
    assert at_peak == pytest.approx(1.25)  # 80 → 100, the largest rise from within a factor of two of 100
    assert at_trough == pytest.approx(2.0)


def test_only_levels_the_day_window_cannot_resolve_are_rare() -> None:
    assert not conformal.rare(0.9) and not conformal.rare(0.99) and not conformal.rare(0.993)
    assert conformal.rare(0.995) and conformal.rare(0.999)


def test_a_plan_at_a_rare_risk_sizes_for_the_rises_it_has_seen() -> None:
    """A calm stretch in which the rate twice jumped by half within an interval: at risk 0.995 the load
    sized for is at least the latest rate times 1.5, whatever the forecast's scores say; at 0.99, a
    level the day's scores resolve, the rises add nothing; and jumps older than the rises the level
    reads (199 at 0.995) are forgotten."""
    rates = tuple([1000.0] * 300 + [1500.0] + [1000.0] * 100 + [1500.0] + [1000.0] * 60)
    pending = core.PendingForecast(rate_mean=(1000.0,), rate_spread=(10.0,), isl=1000.0, osl=100.0,
                                   level=1000.0)
    memory = core.GraphMemory(rates=rates)
    assert core.rise_floor(pending, rates, 0.995) == pytest.approx(1500.0)
    assert core.rise_floor(pending, rates, 0.99) == 0.0
    assert core.rise_floor(pending, rates[:301] + (1000.0,) * 300, 0.995) == pytest.approx(1000.0)
    rare = core.load_at_risk(pending, memory, risk=0.995, burst=1.0)
    usual = core.load_at_risk(pending, memory, risk=0.99, burst=1.0)
    assert rare.rate_rps == pytest.approx(1500.0) and rare.decode_rate_rps == pytest.approx(1500.0)
    assert usual.rate_rps < 1100.0
