"""Load predictors: step 2 of the planner (observe → **predict** → size → constrain → actuate).

Each interval the planner hands a predictor the recent history of one observed series (request
rate, mean ISL or OSL, one value per planner interval) and asks for the next `steps` values, enough
to cover the time a new replica needs to become ready. Sizing then provisions for a quantile of the
forecast distribution (`Forecast.scale`, corrected online by `conformal`), so a forecast that lags a
daily ramp costs SLA misses and one that overshoots costs GPUs. The same functions run live (history from Prometheus) and in replay (history from a
trace, thousands of times per backtest), so they are pure: plain numbers in, a `Forecast` out, no
I/O, no clock, no state the caller can observe. (Prophet runs its Stan optimiser as a subprocess
with temporary files, and its first use turns Prophet's and cmdstanpy's loggers down to WARNING;
nothing else of it is visible to the caller.)

The predictors, from cheapest to richest:

- `Constant` — the last value (or the mean of the last few). Never wrong by much for long; the
  baseline every other predictor must beat, and the fallback of all of them. At a horizon of
  exactly one hour it is also the hourly seasonal-naive forecast, and on ServeGen nothing beat it
  there.
- `Arima` — a regression on Fourier terms (daily, and hourly where the step resolves it) followed by
  a small fixed-order ARIMA on what the regression leaves. Reacts within a step or two to level
  shifts and still knows the time-of-day shape; a few tens of milliseconds per fit.
- `Kalman` — a structural state-space model (local level, stochastic daily and hourly Fourier
  seasonals). Its seasonal shape adapts day by day instead of being one average over the history,
  which made it the most accurate at 10–30 minutes ahead on the ServeGen traces; the slowest of the
  statsmodels fits (a few hundred milliseconds).
- `ProphetPredictor` — Prophet (trend with changepoints, daily/weekly/hourly seasonality), then a
  small ARIMA on Prophet's own residuals: Prophet alone does not look at the last observations, so
  at short horizons it lost to `Constant` on the ServeGen traces. The one to try where weekly
  patterns or trend changes matter: it turns weekly seasonality on from two weeks of history.

The accuracy comparisons here and in the predictors' docstrings are `benchmarks/predictor_bench.py`'s:
rolling-origin forecasts of the ServeGen request rates, each predictor beside `Constant`.

Defined behaviour shared by all of them:

- History cleaning (`clean_history`): non-finite values are gaps; leading gaps are dropped, interior
  gaps interpolated linearly, trailing gaps held at the last finite value; negative values (a
  metrics glitch, rates cannot be negative) count as 0.
- Too little history (fewer points than the predictor's `min_points`), a flat history (nothing to
  fit), a fit that raises, does not converge or forecasts non-finite numbers: the answer comes from
  `Constant`, `Forecast.predictor` says "constant" and `Forecast.fallback` says which predictor was
  asked for and why it was not used. The planner never gets an exception for bad data.
- Every value of a forecast and its interval is clipped at 0; `lower <= mean <= upper`.
- Fit time is bounded without a clock, so replays stay deterministic: `max_fit_seconds` caps the
  number of history points used (from a measured worst-case cost per point, the constants
  `*_SECONDS_PER_POINT` below) and `maxiter` caps the optimiser's iterations.

Warm start: a fitted forecast carries the model's estimated parameters (`Forecast.state`), and the
caller may hand them back as `start` for the next fit, one interval later, where the optimiser then
begins. The answer is the same optimum to the optimiser's tolerance for less CPU (fewer L-BFGS
iterations; measured on ServeGen m-large by `benchmarks/predictor_bench.py --warm`: ADR 0020). Nothing is
cached inside a predictor: the start is an argument, so a call is still a function of its inputs, and
the planner keeps the state in its per-graph memory. A start that does not fit the model (a seasonal
term came in with more history, another predictor's parameters) is ignored, and a warm fit that does
not converge is retried cold before the predictor falls back.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import pathlib
import statistics
import warnings
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Final, Protocol

import numpy as np
import numpy.typing as npt
from statsmodels.tsa.statespace import sarimax, structural

FloatArray = npt.NDArray[np.float64]

DAY_S: Final = 86_400.0
HOUR_S: Final = 3_600.0
WEEK_S: Final = 7 * DAY_S

# Worst-case fit cost per history point at the default `maxiter`, measured on the ServeGen series
# (7 and 14 days of 10-minute windows, both models) on a 2-core machine with single-threaded BLAS,
# rounded up: `max_fit_seconds / cost` is the number of points a fit may use (see `fit_window`). With
# the default 0.5 s, Arima and Prophet use 14 days of 10-minute windows and Kalman about 7.7.
# Multi-threaded OpenBLAS on a busy 2-core machine made the same fits 2-30x slower (threads spinning
# for a core they do not get): run the planner with OPENBLAS_NUM_THREADS=1.
ARIMA_SECONDS_PER_POINT: Final = 2.0e-4
KALMAN_SECONDS_PER_POINT: Final = 4.5e-4
PROPHET_SECONDS_PER_POINT: Final = 2.0e-4


@dataclasses.dataclass(frozen=True)
class Forecast:
    """The next `len(mean)` values of a series, one per step, as a distribution: mean and spread.

    `scale` is the model's own standard deviation of each step's error (ARIMA's and the Kalman
    filter's forecast variance, the residual model's for Prophet, the spread of recent changes for
    `Constant`); `quantile` reads the model's Gaussian quantiles off it. The model's word on its own
    uncertainty is only a starting point: `conformal` corrects it online to what the realised load
    says. `lower`/`upper` bound the central interval at the predictor's `coverage` (80% by default).
    `predictor` names what produced the numbers; `fallback` is set when that is not the predictor
    that was asked for, with the reason.
    """

    mean: tuple[float, ...]
    lower: tuple[float, ...]
    upper: tuple[float, ...]
    predictor: str
    fallback: str | None = None
    scale: tuple[float, ...] = ()  # empty: no spread known (every quantile is the mean)
    # The fitted model's parameters, for the next call's `start` (empty: nothing was fitted).
    state: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not len(self.mean) == len(self.lower) == len(self.upper):
            raise ValueError(
                f"forecast lengths differ: mean {len(self.mean)}, lower {len(self.lower)}, upper {len(self.upper)}"
            )
        if self.scale and len(self.scale) != len(self.mean):
            raise ValueError(f"forecast lengths differ: mean {len(self.mean)}, scale {len(self.scale)}")

    def spread(self, step: int) -> float:
        """The standard deviation of step `step`'s error (0-based), 0 when the model gave none."""
        return self.scale[step] if self.scale else 0.0

    def quantile(self, q: float) -> tuple[float, ...]:
        """The model's (uncalibrated) q-quantile of each step, Gaussian, clipped at 0; monotone in q."""
        if not 0 < q < 1:
            raise ValueError(f"quantile level must lie in (0, 1), got {q}")
        z = statistics.NormalDist().inv_cdf(q)
        return tuple(max(0.0, m + z * self.spread(i)) for i, m in enumerate(self.mean))


class Predictor(Protocol):
    """What the planner calls. Stateless: each call fits on `history` alone, from `start` if given."""

    @property
    def name(self) -> str: ...

    def forecast(self, history: Sequence[float], *, steps: int, step_seconds: float,
                 start: Sequence[float] = ()) -> Forecast:
        """Forecast the `steps` values after `history`, whose points are `step_seconds` apart; `start`:
        the `state` of this predictor's last forecast, where the fit begins (see the module docstring)."""
        ...


# -- plain helpers -----------------------------------------------------------------------------------


def clean_history(history: Sequence[float]) -> tuple[float, ...]:
    """The history a model can fit: see the module docstring for the rules.

    Returns an empty tuple when there is no finite value at all. None counts as a gap too, so a
    caller can pass Prometheus's missing samples through unchanged.
    """
    return tuple(_clean(history).tolist())


def fit_window(*, n_points: int, step_seconds: float, max_history_s: float, max_fit_seconds: float,
               seconds_per_point: float, min_points: int) -> int:
    """How many of the most recent `n_points` a fit uses.

    The smaller of the history cap (`max_history_s`, older data describes a different regime) and
    the time cap (`max_fit_seconds` at `seconds_per_point`), but never fewer than `min_points`: a
    model starved below its minimum is worse than one that is a little slow.
    """
    by_age = math.floor(max_history_s / step_seconds)
    by_time = math.floor(max_fit_seconds / seconds_per_point)
    return min(n_points, max(min_points, min(by_age, by_time)))


def seasonal_terms(*, n_points: int, step_seconds: float,
                   periods: Sequence[tuple[float, int]]) -> list[tuple[float, int]]:
    """The (period in steps, harmonics) pairs a fit can use, from (period in seconds, harmonics).

    A period is used only when the history covers it at least twice (once is indistinguishable
    from a trend) and a step resolves it (at least 3 steps per period). Harmonics stay below the
    Nyquist limit of `period / 2` steps, where a sine term is identically zero.
    """
    usable = []
    for period_s, harmonics in periods:
        period = period_s / step_seconds
        if period < 3 or n_points < 2 * period or harmonics < 1:
            continue
        usable.append((period, min(harmonics, math.ceil(period / 2) - 1)))
    return usable


def fourier(t: FloatArray, terms: Sequence[tuple[float, int]]) -> FloatArray:
    """Columns cos(2πjt/P), sin(2πjt/P) for each (P, harmonics) pair; shape (len(t), 2·Σharmonics)."""
    columns = [np.empty((len(t), 0))]
    for period, harmonics in terms:
        angle = 2 * np.pi * np.outer(t, np.arange(1, harmonics + 1)) / period
        columns += [np.cos(angle), np.sin(angle)]
    return np.hstack(columns)


def _clean(history: Sequence[float]) -> FloatArray:
    values = np.asarray(history, dtype=np.float64).reshape(-1)
    finite = np.isfinite(values)
    if not finite.any():
        return np.empty(0)
    index = np.flatnonzero(finite)
    values = values[index[0]:]  # leading gaps: nothing to interpolate from
    index = index - index[0]
    # Interior gaps interpolate; trailing ones take the last finite value (np.interp holds the ends).
    filled: FloatArray = np.interp(np.arange(len(values)), index, values[index])
    return np.maximum(filled, 0.0)


def _z(coverage: float) -> float:
    return statistics.NormalDist().inv_cdf(0.5 + coverage / 2)


def _check_call(steps: int, step_seconds: float) -> None:
    # Caller bugs, not data problems: these raise instead of falling back.
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    if not (math.isfinite(step_seconds) and step_seconds > 0):
        raise ValueError(f"step_seconds must be a positive number, got {step_seconds!r}")


def _check_options(*, coverage: float, min_points: int, max_fit_seconds: float, max_history_s: float,
                   maxiter: int) -> None:
    if not 0 < coverage < 1:
        raise ValueError(f"coverage must be in (0, 1), got {coverage}")
    if min_points < 2:
        raise ValueError(f"min_points must be at least 2, got {min_points}")
    if not max_fit_seconds > 0 or not max_history_s > 0:
        raise ValueError("max_fit_seconds and max_history_s must be positive")
    if maxiter < 1:
        raise ValueError(f"maxiter must be at least 1, got {maxiter}")


def _finish(mean: FloatArray, se: FloatArray, *, coverage: float, predictor: str,
            fallback: str | None = None, state: tuple[float, ...] = ()) -> Forecast:
    """The central interval at `coverage` from the standard error, everything clipped at 0 (rates
    and token counts cannot be negative) and ordered around the mean."""
    se = np.maximum(se, 0.0)
    half_width = _z(coverage) * se
    lower = np.clip(mean - half_width, 0.0, np.maximum(mean, 0.0))
    upper = np.maximum(mean + half_width, 0.0)
    mean = np.maximum(mean, 0.0)
    return Forecast(mean=tuple(mean.tolist()), lower=tuple(lower.tolist()), upper=tuple(upper.tolist()),
                    predictor=predictor, fallback=fallback, scale=tuple(se.tolist()), state=state)


class _FitFailed(Exception):
    """A fit finished but its answer must not be used: the optimiser did not converge."""


# (mean, standard error) per step in the units of the history, before clipping, and the fitted
# parameters (the next fit's start).
_Fitted = tuple[FloatArray, FloatArray, tuple[float, ...]]


def _guarded(name: str, history: Sequence[float], *, steps: int, step_seconds: float, min_points: int,
             window: int, coverage: float, fit: Callable[[FloatArray], _Fitted]) -> Forecast:
    """Run `fit` on the cleaned, windowed history; anything that goes wrong answers with `Constant`."""
    _check_call(steps, step_seconds)
    values = _clean(history)

    def fall_back(reason: str) -> Forecast:
        settings = Constant(coverage=coverage)
        return _constant(values, steps=steps, settings=settings, fallback=f"{name}: {reason}")

    if len(values) < min_points:
        return fall_back(f"{len(values)} usable points of history, needs at least {min_points}")
    values = values[-window:]
    if np.ptp(values) == 0:
        return fall_back("flat history, nothing to fit")
    # Scale to order 1 (the mean is positive: values are >= 0 and not all equal): the optimisers'
    # tolerances and starting points assume it, and the same code sees request rates in the
    # thousands and mean OSLs in the hundreds.
    scale = float(np.mean(values))
    try:
        # Convergence is judged from the results (`_fit_converged`), not from the warnings statsmodels
        # prints for every first attempt that stops short; silence them. (catch_warnings swaps a
        # process-wide filter list: fine for the planner, which forecasts one series at a time.)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mean, se, state = fit(values / scale)
            mean, se = mean * scale, se * scale
    except _FitFailed as error:
        return fall_back(str(error))
    # Deliberately broad: numerical libraries raise a zoo (LinAlgError, ValueError, RuntimeError from
    # the Stan subprocess, ...), and any of them must cost one interval's accuracy, not the planner.
    except Exception as error:  # noqa: BLE001
        return fall_back(f"fit failed: {type(error).__name__}: {error}")
    if not (np.isfinite(mean).all() and np.isfinite(se).all()):
        return fall_back("fit produced non-finite values")
    if len(mean) != steps or len(se) != steps:
        return fall_back(f"fit produced {len(mean)} values for {steps} steps")
    return _finish(mean, se, coverage=coverage, predictor=name, state=state)


def _fit_converged(model: Any, *, maxiter: int, start: Sequence[float] = ()) -> Any:
    """Fit a statsmodels state-space model by maximum likelihood; raise `_FitFailed` if it never converges.

    L-BFGS stops with a failed line search when a variance sits at its bound of 0 (a seasonal that
    does not drift, common here): the gradient there is flat, the point usually the optimum. A
    Nelder-Mead restart from where it stopped needs no gradient and confirms or improves that point
    in a few dozen cheap iterations (deterministic, unlike a random restart); only its failure counts.
    `start`: where L-BFGS begins (the last fit's parameters), used only when it has the model's shape
    and is finite; a warm fit that does not converge is run again from the model's own start.
    """
    usable = len(start) == model.k_params and all(math.isfinite(value) for value in start)
    results = model.fit(disp=False, maxiter=maxiter, start_params=np.asarray(start) if usable else None)
    if usable and not _converged(results):
        results = model.fit(disp=False, maxiter=maxiter)
    if not _converged(results):
        results = model.fit(disp=False, maxiter=4 * maxiter, method="nm", start_params=results.params)
        if not _converged(results):
            raise _FitFailed(f"did not converge (L-BFGS with maxiter={maxiter}, then Nelder-Mead)")
    return results


def _converged(results: Any) -> bool:
    return bool((getattr(results, "mle_retvals", None) or {}).get("converged", True))


# -- predictors ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class Constant:
    """Tomorrow looks like now: the mean of the last `window` points (1: the last value).

    The interval assumes a random walk: the spread of one-step changes over the last
    `spread_window` points, widening with the square root of the horizon.
    """

    name: ClassVar[str] = "constant"
    window: int = 1
    spread_window: int = 24
    coverage: float = 0.8

    def __post_init__(self) -> None:
        if self.window < 1 or self.spread_window < 2:
            raise ValueError("window must be at least 1 and spread_window at least 2")
        if not 0 < self.coverage < 1:
            raise ValueError(f"coverage must be in (0, 1), got {self.coverage}")

    def forecast(self, history: Sequence[float], *, steps: int, step_seconds: float,
                 start: Sequence[float] = ()) -> Forecast:
        _check_call(steps, step_seconds)
        return _constant(_clean(history), steps=steps, settings=self)


def _constant(values: FloatArray, *, steps: int, settings: Constant, fallback: str | None = None) -> Forecast:
    if len(values) == 0:
        zeros = np.zeros(steps)
        reason = "no finite observations, forecasting 0"
        return _finish(zeros, zeros, coverage=settings.coverage, predictor=Constant.name,
                       fallback=f"{fallback}; {reason}" if fallback else f"constant: {reason}")
    level = float(np.mean(values[-settings.window:]))
    changes = np.diff(values[-settings.spread_window:])
    spread = float(np.std(changes, ddof=1)) if len(changes) >= 2 else 0.0
    se = spread * np.sqrt(np.arange(1, steps + 1))
    return _finish(np.full(steps, level), se, coverage=settings.coverage, predictor=Constant.name, fallback=fallback)


class _FittedPredictor:
    """What the model-based predictors share: a history window bounded by the fit-time budget, the
    fallback to `Constant` on short, flat or failing fits, and clipping (all in `_guarded`)."""

    name: ClassVar[str]
    seconds_per_point: ClassVar[float]  # measured worst-case fit cost per history point
    min_points: int
    max_history_s: float
    max_fit_seconds: float
    maxiter: int
    coverage: float

    def __post_init__(self) -> None:
        self._check_options()

    def _check_options(self) -> None:
        _check_options(coverage=self.coverage, min_points=self.min_points, maxiter=self.maxiter,
                       max_fit_seconds=self.max_fit_seconds, max_history_s=self.max_history_s)

    def forecast(self, history: Sequence[float], *, steps: int, step_seconds: float,
                 start: Sequence[float] = ()) -> Forecast:
        window = fit_window(n_points=len(history), step_seconds=step_seconds, min_points=self.min_points,
                            max_history_s=self.max_history_s, max_fit_seconds=self.max_fit_seconds,
                            seconds_per_point=self.seconds_per_point)
        return _guarded(self.name, history, steps=steps, step_seconds=step_seconds,
                        min_points=self.min_points, window=window, coverage=self.coverage,
                        fit=lambda y: self._fit(y, steps=steps, step_seconds=step_seconds, start=start))

    def _fit(self, y: FloatArray, *, steps: int, step_seconds: float, start: Sequence[float]) -> _Fitted:
        raise NotImplementedError


@dataclasses.dataclass(frozen=True, kw_only=True)
class Arima(_FittedPredictor):
    """Fourier regression for the daily (and hourly) shape, then ARIMA`order` on the remainder.

    Two stages instead of SARIMAX with the Fourier terms as exogenous regressors: the same
    accuracy on the ServeGen traces at a fifth of the fit time, because the optimiser then searches
    only the ARMA coefficients. A seasonal ARIMA with a daily period (144 steps) is out of the
    question (minutes per fit). The order is fixed, not searched by AIC: a search multiplies the
    fit time and its choice flips between neighbouring origins, which makes replays jumpy.
    """

    name: ClassVar[str] = "arima"
    seconds_per_point: ClassVar[float] = ARIMA_SECONDS_PER_POINT
    order: tuple[int, int, int] = (2, 1, 1)
    seasonal_periods: tuple[tuple[float, int], ...] = ((DAY_S, 3), (HOUR_S, 2))
    min_points: int = 20  # ARMA(2,1) + variance after one difference: ~4 points per parameter
    max_history_s: float = 14 * DAY_S
    max_fit_seconds: float = 0.5
    maxiter: int = 50
    coverage: float = 0.8

    def _fit(self, y: FloatArray, *, steps: int, step_seconds: float, start: Sequence[float]) -> _Fitted:
        n = len(y)
        terms = seasonal_terms(n_points=n, step_seconds=step_seconds, periods=self.seasonal_periods)
        design = np.hstack([np.ones((n + steps, 1)), fourier(np.arange(n + steps, dtype=np.float64), terms)])
        coefficients = np.linalg.lstsq(design[:n], y, rcond=None)[0]
        seasonal = design @ coefficients
        model = sarimax.SARIMAX(y - seasonal[:n], order=self.order, trend="n", concentrate_scale=True)
        results = _fit_converged(model, maxiter=self.maxiter, start=start)
        ahead = results.get_forecast(steps)
        return (np.asarray(ahead.predicted_mean) + seasonal[n:], np.asarray(ahead.se_mean, dtype=np.float64),
                _parameters(results))


# The trends of statsmodels' UnobservedComponents that have a level that can move.
KALMAN_TRENDS: Final = ("local level", "random walk", "local linear trend", "local linear deterministic trend",
                        "random walk with drift", "smooth trend", "random trend")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Kalman(_FittedPredictor):
    """Structural model: a `trend` plus stochastic Fourier seasonals, estimated by the Kalman filter.

    The default trend is a local level, not a local linear trend: a slope estimated from noisy
    10-minute windows extrapolates the noise, and on the ServeGen traces the local linear trend lost
    to `Constant` at 30 minutes ahead while the local level beat it. Because the seasonals are
    stochastic, the day's shape (and the hourly bursts of scheduled clients) follows recent days
    rather than the average of the whole history.
    """

    name: ClassVar[str] = "kalman"
    seconds_per_point: ClassVar[float] = KALMAN_SECONDS_PER_POINT
    trend: str = "local level"  # one of KALMAN_TRENDS
    seasonal_periods: tuple[tuple[float, int], ...] = ((DAY_S, 3), (HOUR_S, 2))
    min_points: int = 16  # three or four variances to estimate
    max_history_s: float = 14 * DAY_S
    max_fit_seconds: float = 0.5
    maxiter: int = 50
    coverage: float = 0.8

    def __post_init__(self) -> None:
        super().__post_init__()
        # A misspelt trend would otherwise fail inside every fit and fall back silently, forever.
        if self.trend not in KALMAN_TRENDS:
            raise ValueError(f"unknown Kalman trend {self.trend!r}; choose one of: {', '.join(KALMAN_TRENDS)}")

    def _fit(self, y: FloatArray, *, steps: int, step_seconds: float, start: Sequence[float]) -> _Fitted:
        terms = seasonal_terms(n_points=len(y), step_seconds=step_seconds, periods=self.seasonal_periods)
        seasonals = [{"period": period, "harmonics": harmonics} for period, harmonics in terms]
        model = structural.UnobservedComponents(y, level=self.trend, freq_seasonal=seasonals or None)
        results = _fit_converged(model, maxiter=self.maxiter, start=start)
        ahead = results.get_forecast(steps)
        return np.asarray(ahead.predicted_mean), np.asarray(ahead.se_mean, dtype=np.float64), _parameters(results)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProphetPredictor(_FittedPredictor):
    """Prophet's trend and seasonalities, then ARIMA`residual_order` on Prophet's residuals.

    Prophet models the series as a function of time only, so alone it ignores where the last
    observations sit; on the ServeGen traces that made it lose to `Constant` at every horizon up to
    an hour. The residual ARIMA (None turns it off) brings the recent level back. Seasonalities
    turn on as the history allows: hourly and daily from two periods of history, weekly from two
    weeks. Timestamps are synthesised from `step_seconds`, so only the shapes matter, not the
    calendar. Prophet's own intervals need Monte Carlo samples (slow, and random); the interval
    here is the residual model's.
    """

    name: ClassVar[str] = "prophet"
    seconds_per_point: ClassVar[float] = PROPHET_SECONDS_PER_POINT
    residual_order: tuple[int, int, int] | None = (1, 1, 1)
    daily_order: int = 4  # Prophet's own default; 10 fitted the ServeGen days no better
    weekly_order: int = 3
    hourly_order: int = 2
    changepoint_range: float = 1.0  # Prophet's default 0.8 freezes the trend over the last fifth
    min_points: int = 24
    max_history_s: float = 28 * DAY_S
    max_fit_seconds: float = 0.5
    maxiter: int = 2000
    coverage: float = 0.8

    def _fit(self, y: FloatArray, *, steps: int, step_seconds: float, start: Sequence[float]) -> _Fitted:
        # Prophet's Stan fit, not the residual ARIMA, is its cost: it is not warm-started.
        import pandas as pd

        prophet = _quiet_prophet()
        n = len(y)
        model = prophet.Prophet(
            yearly_seasonality=False, weekly_seasonality=False, daily_seasonality=False,
            changepoint_range=self.changepoint_range, uncertainty_samples=0,
        )
        wanted = {"daily": (DAY_S, self.daily_order), "weekly": (WEEK_S, self.weekly_order),
                  "hourly": (HOUR_S, self.hourly_order)}
        for name, (period_s, order) in wanted.items():
            for _, harmonics in seasonal_terms(n_points=n, step_seconds=step_seconds, periods=[(period_s, order)]):
                model.add_seasonality(name=name, period=period_s / DAY_S, fourier_order=harmonics)
        stamps = pd.Timestamp("2000-01-03") + pd.to_timedelta(np.arange(n + steps) * step_seconds, unit="s")
        # seed: cmdstan's optimiser is deterministic from Prophet's initial values, pinned anyway.
        model.fit(pd.DataFrame({"ds": stamps[:n], "y": y}), iter=self.maxiter, seed=0)
        if _stan_hit_iteration_cap(model):
            raise _FitFailed(f"did not converge (Stan L-BFGS hit maxiter={self.maxiter})")
        fitted = model.predict(pd.DataFrame({"ds": stamps}))["yhat"].to_numpy(dtype=np.float64)
        future = fitted[n:]
        if self.residual_order is None:
            residuals = y - fitted[:n]
            return future, float(np.std(residuals, ddof=1)) * np.ones(steps), ()
        residual_model = sarimax.SARIMAX(y - fitted[:n], order=self.residual_order, trend="n",
                                         concentrate_scale=True)
        results = _fit_converged(residual_model, maxiter=50)
        ahead = results.get_forecast(steps)
        return np.asarray(ahead.predicted_mean) + future, np.asarray(ahead.se_mean, dtype=np.float64), ()


def _parameters(results: Any) -> tuple[float, ...]:
    """A statsmodels fit's estimated parameters, as plain floats (a forecast's `state`)."""
    return tuple(float(value) for value in np.asarray(results.params, dtype=np.float64))


def _stan_hit_iteration_cap(model: Any) -> bool:
    """Whether Stan's optimiser stopped at its iteration cap rather than at an optimum.

    Stan reports that as a normal termination and cmdstanpy passes it on silently; only Stan's
    console output (a file cmdstanpy keeps for the fit) says so. Anything missing along the way
    counts as converged: this check can only add a fallback, never break a fit.
    """
    try:
        console = pathlib.Path(model.stan_fit.runset.stdout_files[0]).read_text(errors="replace")
    except (AttributeError, IndexError, TypeError, OSError):
        return False
    return "Maximum number of iterations hit" in console


def _quiet_prophet() -> Any:
    """Import Prophet (slow, so only when used) with its INFO-per-fit logging turned down."""
    # prophet.plot logs an ERROR at import when plotly is missing; plots are not used here.
    logging.getLogger("prophet.plot").setLevel(logging.CRITICAL)
    import prophet
    from cmdstanpy import utils as cmdstanpy_utils

    # cmdstanpy configures its logger on first use (level DEBUG, INFO handler); configure it first so
    # that our level is the one that stays.
    cmdstanpy_utils.get_logger()
    logging.getLogger("cmdstanpy").setLevel(logging.WARNING)
    logging.getLogger("prophet").setLevel(logging.WARNING)
    return prophet


# -- selection ----------------------------------------------------------------------------------------

PREDICTORS: Final[dict[str, type[Constant | Arima | ProphetPredictor | Kalman]]] = {
    "constant": Constant,
    "arima": Arima,
    "prophet": ProphetPredictor,
    "kalman": Kalman,
}


def make_predictor(name: str, **options: Any) -> Predictor:
    """The predictor called `name` (as in a graph's planner spec), with its dataclass fields as options."""
    factory = PREDICTORS.get(name)
    if factory is None:
        raise ValueError(f"unknown predictor {name!r}; choose one of: {', '.join(PREDICTORS)}")
    fields = {field.name for field in dataclasses.fields(factory)}
    unknown = sorted(set(options) - fields)
    if unknown:
        raise ValueError(f"unknown option(s) for predictor {name!r}: {', '.join(unknown)}; "
                         f"valid: {', '.join(sorted(fields))}")
    return factory(**options)
