"""Load predictors (fleetpilot.planner.predict): accuracy on a real trace, and the defined behaviour.

Accuracy is a rolling-origin backtest on the ServeGen m-large request rate (read from
../shared/traces, never copied): at each origin a predictor sees the 7 days before it and forecasts
the next 3 ten-minute windows. The table of MAPE per predictor and horizon prints with `-s`. The
behaviour tests use small synthetic series, so they pin what happens on bad input without relying
on a trace. No test measures wall-clock time: the fit-time bound is checked through the history
window it implies.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from statsmodels.tsa.statespace import sarimax, structural

from fleetpilot.planner import predict

SERVEGEN = (Path(__file__).resolve().parents[2].parent / "shared" / "traces" / "servegen_alibaba"
            / "aggregate_rate_10min.csv")
needs_trace = pytest.mark.skipif(not SERVEGEN.is_file(), reason=f"no ServeGen trace at {SERVEGEN}")

STEP_S = 600.0
DAY = 144  # 10-minute windows per day
SEASONAL = ("arima", "kalman", "prophet")
ALL = ("constant", *SEASONAL)

# Backtest design: 24 origins, 11 windows apart, the last one leaving exactly 3 windows to score;
# they span the last 42 hours. 11 is coprime with the 6 windows of an hour, so the origins sample
# every minute-of-the-hour phase of the trace's hourly bursts instead of one phase only.
ORIGINS = 24
SPACING = 11
HISTORY = 7 * DAY
HORIZONS = (1, 3)


def servegen(model: str) -> list[float]:
    with SERVEGEN.open(newline="") as handle:
        rows = [row for row in csv.DictReader(handle) if row["model"] == model]
    rows.sort(key=lambda row: float(row["t_start_s"]))
    return [float(row["total_rate_rps"]) for row in rows]


def daily_wave(days: float, *, level: float = 100.0, amplitude: float = 30.0, noise: float = 3.0,
               seed: int = 7) -> list[float]:
    """A 10-minute-step series with a daily sine and a little noise: what the seasonal models expect."""
    t = np.arange(int(days * DAY))
    rng = np.random.default_rng(seed)
    values = level + amplitude * np.sin(2 * np.pi * t / DAY) + rng.normal(0.0, noise, len(t))
    return [float(v) for v in values]


def assert_well_formed(forecast: predict.Forecast, steps: int) -> None:
    assert len(forecast.mean) == len(forecast.lower) == len(forecast.upper) == steps
    for low, mid, high in zip(forecast.lower, forecast.mean, forecast.upper, strict=True):
        assert all(math.isfinite(v) for v in (low, mid, high))
        assert 0.0 <= low <= mid <= high


# -- accuracy on the ServeGen trace ------------------------------------------------------------------


@pytest.fixture(scope="module")
def mape() -> dict[tuple[str, int], float]:
    """MAPE (%) per (predictor, horizon in steps) over the rolling origins; prints the table."""
    series = servegen("m-large")
    last = len(series) - max(HORIZONS)
    origins = [last - SPACING * k for k in reversed(range(ORIGINS))]
    errors: dict[tuple[str, int], list[float]] = {(name, h): [] for name in ALL for h in HORIZONS}
    fallbacks = dict.fromkeys(ALL, 0)
    for name in ALL:
        predictor = predict.make_predictor(name)
        for origin in origins:
            forecast = predictor.forecast(series[origin - HISTORY:origin], steps=max(HORIZONS), step_seconds=STEP_S)
            fallbacks[name] += forecast.fallback is not None
            for h in HORIZONS:
                actual = series[origin + h - 1]
                errors[name, h].append(abs(forecast.mean[h - 1] - actual) / actual)
    table = {key: 100 * float(np.mean(values)) for key, values in errors.items()}
    print(f"\nServeGen m-large, {ORIGINS} origins every {SPACING} windows over the last 2 days, "
          f"{HISTORY} windows (7 days) of history")
    print(f"{'predictor':<10}" + "".join(f"{f'MAPE {h} step' + 's' * (h > 1):>15}" for h in HORIZONS)
          + f"{'fallbacks':>11}")
    for name in ALL:
        print(f"{name:<10}" + "".join(f"{table[name, h]:>14.1f}%" for h in HORIZONS) + f"{fallbacks[name]:>11}")
    return table


@needs_trace
@pytest.mark.parametrize("name", SEASONAL)
def test_seasonal_predictors_beat_constant_half_an_hour_ahead(mape: dict[tuple[str, int], float],
                                                              name: str) -> None:
    # Single origins scatter widely (the per-origin difference to `constant` has a spread of ~16
    # points), so 24 origins show the ranking, not its size. Over every origin of the two days (283,
    # too slow for a unit test) the 3-step MAPE was: constant 26.8%, kalman 21.9%, prophet 23.8%,
    # arima 23.9%.
    assert mape[name, 3] < mape["constant", 3]


@needs_trace
def test_mape_is_finite_and_sane(mape: dict[tuple[str, int], float]) -> None:
    # The trace is bursty: on these two days single 10-minute windows jump by 50-100% at the hour,
    # so even the best forecast misses by 15-25% on average (printed table: 15-18% one step ahead,
    # 18-23% three steps ahead). 30% leaves room for library updates but not for a real breakage
    # (a phase error in the Fourier terms, a unit error, a level lagging by hours).
    for value in mape.values():
        assert math.isfinite(value)
        assert value < 30.0


@needs_trace
def test_no_fallbacks_on_the_trace() -> None:
    series = servegen("m-large")
    for name in SEASONAL:
        forecast = predict.make_predictor(name).forecast(series[-HISTORY:], steps=6, step_seconds=STEP_S)
        assert forecast.fallback is None, forecast.fallback
        assert forecast.predictor == name
        assert_well_formed(forecast, 6)


# -- history cleaning ----------------------------------------------------------------------------------


def test_clean_history_drops_leading_interpolates_interior_holds_trailing() -> None:
    nan = math.nan
    assert predict.clean_history([nan, nan, 1.0, nan, 3.0, nan, nan, 6.0, nan, nan]) == (
        1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 6.0, 6.0)
    assert predict.clean_history([math.inf, 2.0, -math.inf, 4.0]) == (2.0, 3.0, 4.0)
    assert predict.clean_history([nan, nan]) == ()
    assert predict.clean_history([]) == ()
    assert predict.clean_history([5.0, -1.0]) == (5.0, 0.0)  # a negative rate is a glitch: 0
    assert predict.clean_history([1.0, None, 3.0]) == (1.0, 2.0, 3.0)  # type: ignore[list-item]


def test_constant_uses_last_finite_value() -> None:
    forecast = predict.Constant().forecast([1.0, 2.0, math.nan], steps=2, step_seconds=STEP_S)
    assert forecast.mean == (2.0, 2.0)
    assert forecast.fallback is None


@pytest.mark.parametrize("name", ALL)
def test_gaps_give_the_same_forecast_as_the_history_cleaned_by_hand(name: str) -> None:
    clean = daily_wave(3)
    gappy: list[float] = [math.nan, math.nan, *clean]
    gappy[2 + 200] = math.nan  # interior: interpolated from its neighbours
    gappy.append(math.nan)  # trailing: the last finite value holds
    by_hand = list(clean)
    by_hand[200] = (clean[199] + clean[201]) / 2
    by_hand.append(clean[-1])
    predictor = predict.make_predictor(name)
    got = predictor.forecast(gappy, steps=4, step_seconds=STEP_S)
    assert got == predictor.forecast(by_hand, steps=4, step_seconds=STEP_S)
    assert got.fallback is None
    assert_well_formed(got, 4)


# -- defined behaviour of every predictor ----------------------------------------------------------------


@pytest.mark.parametrize("name", SEASONAL)
def test_short_history_falls_back_to_constant(name: str) -> None:
    predictor = predict.make_predictor(name)
    history = [10.0, 12.0, 11.0, 13.0, 12.0]
    forecast = predictor.forecast(history, steps=3, step_seconds=STEP_S)
    assert forecast.predictor == "constant"
    assert forecast.fallback is not None
    assert forecast.fallback.startswith(f"{name}: 5 usable points")
    assert forecast.mean == (12.0, 12.0, 12.0)
    assert_well_formed(forecast, 3)


@pytest.mark.parametrize("name", SEASONAL)
def test_minimum_history_is_enough(name: str) -> None:
    predictor = {"arima": predict.Arima, "kalman": predict.Kalman, "prophet": predict.ProphetPredictor}[name]()
    minimum = predictor.min_points
    forecast = predictor.forecast(daily_wave(1)[:minimum], steps=3, step_seconds=STEP_S)
    assert forecast.fallback is None, forecast.fallback
    assert forecast.predictor == name


@pytest.mark.parametrize("name", ALL)
def test_no_finite_history_forecasts_zero(name: str) -> None:
    forecast = predict.make_predictor(name).forecast([math.nan] * 30, steps=3, step_seconds=STEP_S)
    assert forecast.mean == forecast.lower == forecast.upper == (0.0, 0.0, 0.0)
    assert forecast.fallback is not None and "no finite observations" in forecast.fallback


@pytest.mark.parametrize("name", ALL)
def test_all_zero_history_forecasts_zeros(name: str) -> None:
    forecast = predict.make_predictor(name).forecast([0.0] * (3 * DAY), steps=6, step_seconds=STEP_S)
    assert forecast.mean == forecast.lower == forecast.upper == (0.0,) * 6
    if name != "constant":
        assert forecast.fallback == f"{name}: flat history, nothing to fit"


@pytest.mark.parametrize("name", ALL)
def test_falling_history_is_clipped_at_zero(name: str) -> None:
    falling = [max(0.5, 100.0 - 0.5 * i) + (1.0 if i % 2 else -1.0) * 0.3 for i in range(200)]
    forecast = predict.make_predictor(name).forecast(falling, steps=24, step_seconds=STEP_S)
    assert_well_formed(forecast, 24)


def test_clipping_acts_where_a_trend_runs_below_zero() -> None:
    # A local linear trend extrapolates the slope: without the clip this forecast goes negative.
    falling = [100.0 - 0.8 * i + (0.2 if i % 2 else -0.2) for i in range(120)]
    forecast = predict.Kalman(trend="local linear trend").forecast(falling, steps=30, step_seconds=STEP_S)
    assert forecast.fallback is None, forecast.fallback
    assert forecast.mean[-1] == 0.0
    assert_well_formed(forecast, 30)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("steps", [1, 6, 37])
def test_length_and_interval_order(name: str, steps: int) -> None:
    forecast = predict.make_predictor(name).forecast(daily_wave(2.5), steps=steps, step_seconds=STEP_S)
    assert forecast.fallback is None, forecast.fallback
    assert_well_formed(forecast, steps)
    assert any(low < high for low, high in zip(forecast.lower, forecast.upper, strict=True))


@pytest.mark.parametrize("name", ALL)
def test_deterministic(name: str) -> None:
    history = daily_wave(2.5, seed=3)
    first = predict.make_predictor(name).forecast(history, steps=6, step_seconds=STEP_S)
    again = predict.make_predictor(name)
    assert again.forecast(history, steps=6, step_seconds=STEP_S) == first
    assert again.forecast(history, steps=6, step_seconds=STEP_S) == first


def test_seasonal_predictors_follow_a_clean_daily_wave() -> None:
    """Two and a half days of a noisy sine: the next hours follow the wave, not the last value."""
    history = daily_wave(2.5, noise=1.0)
    t = np.arange(len(history), len(history) + 36)
    truth = 100.0 + 30.0 * np.sin(2 * np.pi * t / DAY)
    for name in SEASONAL:
        forecast = predict.make_predictor(name).forecast(history, steps=36, step_seconds=STEP_S)
        error = float(np.max(np.abs(np.array(forecast.mean) - truth)))
        assert error < 6.0, (name, error)
    flat = predict.Constant().forecast(history, steps=36, step_seconds=STEP_S)
    assert float(np.max(np.abs(np.array(flat.mean) - truth))) > 20.0


# -- failures inside a fit ---------------------------------------------------------------------------------


def boom(*args: object, **kwargs: object) -> None:
    raise np.linalg.LinAlgError("synthetic failure")


@pytest.mark.parametrize(("name", "target", "attribute"), [
    ("arima", sarimax, "SARIMAX"),
    ("kalman", structural, "UnobservedComponents"),
])
def test_a_fit_that_raises_falls_back(monkeypatch: pytest.MonkeyPatch, name: str, target: object,
                                      attribute: str) -> None:
    monkeypatch.setattr(target, attribute, boom)
    forecast = predict.make_predictor(name).forecast(daily_wave(3), steps=3, step_seconds=STEP_S)
    assert forecast.predictor == "constant"
    assert forecast.fallback == f"{name}: fit failed: LinAlgError: synthetic failure"
    assert_well_formed(forecast, 3)


def test_a_prophet_fit_that_raises_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    import prophet

    monkeypatch.setattr(prophet.Prophet, "fit", boom)
    forecast = predict.ProphetPredictor().forecast(daily_wave(3), steps=3, step_seconds=STEP_S)
    assert forecast.predictor == "constant"
    assert forecast.fallback == "prophet: fit failed: LinAlgError: synthetic failure"


@pytest.mark.parametrize("name", SEASONAL)
def test_a_fit_that_does_not_converge_falls_back(name: str) -> None:
    forecast = predict.make_predictor(name, maxiter=1).forecast(daily_wave(3), steps=3, step_seconds=STEP_S)
    assert forecast.predictor == "constant"
    assert forecast.fallback is not None and forecast.fallback.startswith(f"{name}: did not converge")


# -- the fit-time bound, through the history it allows ----------------------------------------------------


def test_fit_window() -> None:
    def window(n_points: int, *, max_history_s: float = 14 * 86400, max_fit_seconds: float = 10.0) -> int:
        return predict.fit_window(n_points=n_points, step_seconds=STEP_S, max_history_s=max_history_s,
                                  max_fit_seconds=max_fit_seconds, seconds_per_point=1e-3, min_points=20)

    assert window(2000, max_fit_seconds=0.5) == 500  # time bound: 0.5 s at 1 ms a point
    assert window(2000, max_history_s=86400) == 144  # age bound: one day of 10-minute windows
    assert window(100) == 100  # never more than there is
    assert window(2000, max_fit_seconds=1e-6) == 20  # never fewer than the minimum


@pytest.mark.parametrize("name", SEASONAL)
def test_max_fit_seconds_caps_the_history_used(name: str) -> None:
    history = daily_wave(3)
    seconds_per_point = {"arima": predict.ARIMA_SECONDS_PER_POINT, "kalman": predict.KALMAN_SECONDS_PER_POINT,
                         "prophet": predict.PROPHET_SECONDS_PER_POINT}[name]
    budget = 100.5 * seconds_per_point  # room for 100 points (the half: no float rounding down to 99)
    capped = predict.make_predictor(name, max_fit_seconds=budget).forecast(history, steps=3, step_seconds=STEP_S)
    assert capped.fallback is None, capped.fallback
    assert capped == predict.make_predictor(name).forecast(history[-100:], steps=3, step_seconds=STEP_S)
    assert capped != predict.make_predictor(name).forecast(history, steps=3, step_seconds=STEP_S)


def test_seasonal_terms_follow_the_history_and_the_step() -> None:
    week = 7 * 86400
    periods = [(86400.0, 3), (3600.0, 2)]
    assert predict.seasonal_terms(n_points=week // 600, step_seconds=600, periods=periods) == [(144.0, 3), (6.0, 2)]
    # One day of history: the daily period is seen once only, indistinguishable from a trend.
    assert predict.seasonal_terms(n_points=144, step_seconds=600, periods=periods) == [(6.0, 2)]
    # Hourly steps cannot resolve an hourly period; the daily one keeps its harmonics.
    assert predict.seasonal_terms(n_points=168, step_seconds=3600, periods=periods) == [(24.0, 3)]
    # Harmonics stay below Nyquist: a 4-step period has one usable harmonic.
    assert predict.seasonal_terms(n_points=100, step_seconds=900, periods=[(3600.0, 5)]) == [(4.0, 1)]


# -- API edges -------------------------------------------------------------------------------------------


def test_make_predictor_refuses_unknown_names_and_options() -> None:
    with pytest.raises(ValueError, match="constant, arima, prophet, kalman"):
        predict.make_predictor("lstm")
    with pytest.raises(ValueError, match="unknown option.*horizon"):
        predict.make_predictor("arima", horizon=3)
    assert predict.make_predictor("constant", window=3).name == "constant"


@pytest.mark.parametrize("bad", [{"steps": 0}, {"steps": 2.0}, {"step_seconds": 0.0}, {"step_seconds": math.nan}])
def test_caller_errors_raise(bad: dict[str, float]) -> None:
    call: dict[str, float] = {"steps": 3, "step_seconds": STEP_S, **bad}
    with pytest.raises(ValueError):
        predict.Constant().forecast([1.0, 2.0], **call)  # type: ignore[arg-type]


def test_misconfigured_predictors_refuse_at_construction() -> None:
    with pytest.raises(ValueError, match="unknown Kalman trend"):
        predict.Kalman(trend="local levle")
    with pytest.raises(ValueError, match="coverage"):
        predict.Arima(coverage=1.5)
    with pytest.raises(ValueError, match="maxiter"):
        predict.ProphetPredictor(maxiter=0)


def test_fallback_keeps_the_requested_coverage() -> None:
    history = [10.0, 14.0, 9.0, 13.0, 11.0]
    wide = predict.Arima(coverage=0.99).forecast(history, steps=1, step_seconds=STEP_S)
    narrow = predict.Arima(coverage=0.5).forecast(history, steps=1, step_seconds=STEP_S)
    assert wide.fallback is not None and narrow.fallback is not None
    assert wide.upper[0] - wide.lower[0] > narrow.upper[0] - narrow.lower[0]


def test_forecast_refuses_mismatched_lengths() -> None:
    with pytest.raises(ValueError, match="lengths differ"):
        predict.Forecast(mean=(1.0,), lower=(), upper=(1.0,), predictor="constant")


def test_constant_window_and_interval() -> None:
    forecast = predict.Constant(window=3).forecast([1.0, 2.0, 3.0, 4.0], steps=4, step_seconds=STEP_S)
    assert forecast.mean == (3.0,) * 4
    widths = [high - low for low, high in zip(forecast.lower, forecast.upper, strict=True)]
    assert widths == sorted(widths)  # uncertainty grows with the horizon
    one_point = predict.Constant().forecast([7.0], steps=2, step_seconds=STEP_S)
    assert one_point.mean == one_point.lower == one_point.upper == (7.0, 7.0)


# -- properties ---------------------------------------------------------------------------------------------

histories = st.lists(st.floats(min_value=0.0, max_value=1e4, allow_nan=False, allow_infinity=False), max_size=60)


def check_any_history(make: Callable[[], predict.Predictor], history: list[float], steps: int) -> None:
    forecast = make().forecast(history, steps=steps, step_seconds=STEP_S)
    assert_well_formed(forecast, steps)


@settings(max_examples=60, deadline=None)
@given(history=histories, steps=st.integers(min_value=1, max_value=8))
def test_constant_any_history(history: list[float], steps: int) -> None:
    check_any_history(predict.Constant, history, steps)


@settings(max_examples=25, deadline=None)
@given(history=histories, steps=st.integers(min_value=1, max_value=8))
def test_kalman_any_history(history: list[float], steps: int) -> None:
    check_any_history(predict.Kalman, history, steps)


# -- warm start: the last fit's parameters as the next fit's start --------------------------------------


@pytest.mark.parametrize("name", ("arima", "kalman"))
def test_a_warm_start_reaches_the_cold_fit_in_fewer_iterations(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """One interval later, started from the last fit's parameters, the fit lands on the same forecast
    (to the optimiser's tolerance) after fewer L-BFGS iterations than from the model's own start."""
    series = servegen("m-large")[:3 * DAY + 1]
    predictor = predict.make_predictor(name)
    before = predictor.forecast(series[:-1], steps=3, step_seconds=STEP_S)
    assert before.predictor == name and before.state and all(math.isfinite(v) for v in before.state)

    iterations: list[int] = []
    converged = predict._converged

    def counting(results: object) -> bool:
        iterations.append(int(getattr(results, "mle_retvals", {}).get("iterations", 0)))
        return converged(results)

    monkeypatch.setattr(predict, "_converged", counting)
    cold = predictor.forecast(series, steps=3, step_seconds=STEP_S)
    cold_iterations, iterations[:] = sum(iterations), []
    warm = predictor.forecast(series, steps=3, step_seconds=STEP_S, start=before.state)
    warm_iterations = sum(iterations)
    assert warm.predictor == cold.predictor == name
    assert warm.mean == pytest.approx(cold.mean, rel=1e-3)
    assert warm.scale == pytest.approx(cold.scale, rel=1e-2)
    assert len(warm.state) == len(cold.state) == len(before.state)
    assert warm_iterations < cold_iterations


@pytest.mark.parametrize("name", ("arima", "kalman"))
@pytest.mark.parametrize("start", [(0.5,), (math.nan, 0.1, 0.1), ()])
def test_a_start_that_does_not_fit_the_model_is_ignored(name: str, start: tuple[float, ...]) -> None:
    """Another model's parameters (wrong length) or a broken state: the fit starts cold, the same answer."""
    series = daily_wave(3)
    cold = predict.make_predictor(name).forecast(series, steps=3, step_seconds=STEP_S)
    assert predict.make_predictor(name).forecast(series, steps=3, step_seconds=STEP_S, start=start) == cold


def test_predictors_without_a_fitted_model_carry_no_state() -> None:
    series = daily_wave(3)
    assert predict.Constant().forecast(series, steps=2, step_seconds=STEP_S, start=(1.0, 2.0)).state == ()
    fallback = predict.Arima().forecast(series[:5], steps=2, step_seconds=STEP_S)
    assert fallback.predictor == "constant" and fallback.state == ()
