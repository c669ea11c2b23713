"""Online calibration of forecast quantiles: adaptive conformal inference on normalised errors.

Why: a predictor's own interval is a model's opinion of its error (Gaussian, fitted on history that
may be calmer or wilder than now). Sizing for its q-quantile provisions for load that is exceeded one
interval in (1 − q)⁻¹ only if that opinion is right, and on a bursty trace it is not. This module
makes it right on whatever trace it meets, with nothing set per trace:

1. **Conformal scores.** Each realised value becomes a score, its error in units of the model's own
   spread: `(realised − mean) / spread`. The calibrated q-quantile of a new forecast is
   `mean + spread × (the q-th empirical quantile of the last scores)`: split conformal prediction on
   a rolling window, so a predictor whose spread is too narrow (or too wide) by any factor, or whose
   errors are skewed (bursts above, never below), is corrected. The window is SCORE_WINDOW scores,
   or as many as the level needs to be told apart from the largest score (`score_window`).
2. **Adaptive level** (Gibbs & Candès, "Adaptive Conformal Inference Under Distribution Shift",
   2021). The level read off the scores is not q itself but a level that moves after each outcome:
   up by STEP_SIZE × q after a miss, down by STEP_SIZE × (1 − q) after a hit. Its long-run miss rate
   is 1 − q whatever the scores do, and after a change of regime (noise doubling) it reacts within a
   few misses instead of waiting for the window to turn over.
3. **Rises, at rare levels** (`rise_quantile`). A level rarer than the day window resolves (above 0.993)
   is also bounded by the same conformal quantile of how far the series rose within the horizon, as a
   multiple of where it started: scores kept for a week mean one thing in spreads, many in ratios.

Until the window holds MIN_SCORES scores the quantile is the model's Gaussian one; after that, until it
holds enough to resolve a level (n ≥ q / (1 − q)), the larger of the model's and the largest score
seen: early intervals neither trust the model alone nor a handful of errors.

Everything is pure: a `Calibration` value goes in with one outcome and a new value comes out.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

import numpy as np

# Recent scores a level up to 0.993 reads: a day of 10-minute intervals, 2.4 hours of one-minute ones.
# Long enough to resolve a 0.99 quantile, short enough to forget a regime that ended.
SCORE_WINDOW: Final = 144
# A level q is resolved by q / (1 − q) scores (0.999: 999): a window of SCORE_WINDOW reads every level
# above 0.993 as its largest score, and the risks from there to the API's 0.999 all bought the same fleet
# (ADR 0017). A level that needs more scores reads that many, up to the last MAX_SCORE_WINDOW; the levels
# below keep the day-long window, which forgets a regime that ended.
MAX_SCORE_WINDOW: Final = 1000
# How far one outcome moves the adaptive level (Gibbs & Candès' γ). Chosen on synthetic streams (a
# change of noise level, tests/unit/test_conformal.py), not on any trace: 0.005, their choice for
# series of thousands of points, takes hundreds of intervals to follow a change.
STEP_SIZE: Final = 0.02
# Rises are read from starts within this factor of the latest value: a trough's rises are larger
# multiples than a busy hour's (traffic returns to its daily level), and the morning ramp's multiple
# applied at the peak sizes for a rise the peak does not make. A factor, not a share of any trace's range;
# its value is fitted, not derived: ADR 0028.
RISE_BAND: Final = 2.0
# Outcomes the coverage a dashboard shows is measured over.
COVERAGE_WINDOW: Final = 144
# A spread below this share of the series' level is taken as this: a model that claims to know the load
# to better than 5% (a constant forecast from two points, a flat history, a forecast of 0 between two
# bursts) would otherwise turn ordinary noise into scores of thousands, which then sit in the window and
# inflate every quantile for SCORE_WINDOW intervals. The caller says what the level is (`floor`).
SPREAD_FLOOR_SHARE: Final = 0.05
# Below this many scores the empirical quantiles are noise (with five, the median is the third score
# seen): the model's own Gaussian quantile is used until then.
MIN_SCORES: Final = 10
# Levels every calibration tracks and the planner exports, besides the graph's own risk.
REPORTED_LEVELS: Final = (0.5, 0.9, 0.99)


def _check_level(q: float) -> None:
    if not 0 < q < 1:
        raise ValueError(f"quantile level must lie in (0, 1), got {q}")


def scores_to_resolve(q: float) -> int:
    """How many scores split conformal needs for a finite q-quantile: with fewer, the bound it gives is
    no score at all, and reading the largest one instead claims a coverage nothing has shown."""
    _check_level(q)
    return math.ceil(q / (1.0 - q) - 1e-9)


def resolvable(q: float) -> bool:
    """Whether the scores a calibration ever keeps (MAX_SCORE_WINDOW) resolve the q-quantile."""
    return scores_to_resolve(q) <= MAX_SCORE_WINDOW


def score_window(q: float) -> int:
    """How many of the latest scores the q-quantile is read from: SCORE_WINDOW, or as many as resolve q."""
    return min(MAX_SCORE_WINDOW, max(SCORE_WINDOW, scores_to_resolve(q)))


def split_conformal(values: np.ndarray, level: float) -> float:
    """The value that covers `level` of the next exchangeable one: split conformal's finite-sample level,
    (n + 1) q / n, read with the "higher" rule; levels at or past 1 take the largest value."""
    n = len(values)
    return float(np.quantile(values, min(1.0, max(0.0, level) * (n + 1) / n), method="higher"))


def rare(q: float) -> bool:
    """Whether the q-quantile needs more scores than the day window (SCORE_WINDOW) holds: above 0.993."""
    return scores_to_resolve(q) > SCORE_WINDOW


def rise_quantile(rates: Sequence[float], steps: int, q: float, *, least: float = 0.0) -> float | None:
    """The q-quantile of how far the series rose within `steps` intervals of each recent interval, as a
    multiple of that interval's value; None before MIN_SCORES rises are known.

    Why: a rare level is read from up to MAX_SCORE_WINDOW scores, and over that many intervals an error
    counted in the model's spread loses its unit (a calm stretch shrinks the spread, and the next jump
    scores many of them, or a wild stretch widens it and a jump scores few). A rise counted as a
    multiple of where it started is the same quantity in a calm week and a busy one, which is how the
    traffic of a fleet jumps: in proportion to its level, not by a fixed amount (ADR 0028).
    Split conformal again, on these ratios: covers q of exchangeable rises, with nothing set per series.
    Only rises that started within RISE_BAND of the latest value count (Mondrian conformal, by level),
    and none from at or under `least` (a ratio to a near-silence measures nothing).
    """
    _check_level(q)
    series = np.asarray(rates, dtype=float)
    if steps < 1 or len(series) <= steps:
        return None
    starts = series[:-steps]
    ahead = np.lib.stride_tricks.sliding_window_view(series[1:], steps).max(axis=1)
    latest = series[-1]
    counted = (starts > max(least, 0.0)) & (starts >= latest / RISE_BAND) & (starts <= latest * RISE_BAND)
    rises = (ahead[counted] / starts[counted])[-score_window(q):]
    n = len(rises)
    if n < MIN_SCORES:
        return None
    return split_conformal(rises, q)


def _spread(mean: float, spread: float, floor: float) -> float:
    return max(spread, floor, SPREAD_FLOOR_SHARE * abs(mean), 1e-9)


@dataclasses.dataclass(frozen=True)
class Calibration:
    """One series' calibration state: its recent scores and, per tracked level, the adaptive level
    and the recent outcomes (True: the realised value fell at or under the calibrated quantile)."""

    scores: tuple[float, ...] = ()
    levels: Mapping[float, float] = dataclasses.field(default_factory=dict)
    hits: Mapping[float, tuple[bool, ...]] = dataclasses.field(default_factory=dict)

    def level(self, q: float) -> float:
        """The level the q-quantile is read at now: q itself until an outcome moved it, and never below a
        lower tracked level's (each level adapts on its own, and quantiles must not cross)."""
        own = self.levels.get(q, q)
        return max([own, *(level for tracked, level in self.levels.items() if tracked < q)])

    def coverage(self, q: float) -> float | None:
        """The share of the last COVERAGE_WINDOW outcomes at or under the calibrated q-quantile."""
        hits = self.hits.get(q, ())
        return sum(hits) / len(hits) if hits else None


def quantile(calibration: Calibration, mean: float, spread: float, q: float, *, floor: float = 0.0) -> float:
    """The calibrated q-quantile of a forecast with this `mean` and model `spread`, at least 0.

    `floor`: the least spread to normalise by (SPREAD_FLOOR_SHARE of the series' recent level); it
    must be the one `update` gets for the same forecast.
    """
    _check_level(q)
    scale = _spread(mean, spread, floor)
    scores = calibration.scores[-score_window(q):]
    level = calibration.level(q)
    gaussian = statistics.NormalDist().inv_cdf(q)
    n = len(scores)
    if n < MIN_SCORES:
        return max(0.0, mean + gaussian * max(spread, 0.0))
    if n < q / (1.0 - q):
        # Too few scores to resolve this level: the larger of the model's word and the worst error seen.
        return max(0.0, mean + scale * max(gaussian * max(spread, 0.0) / scale, max(scores)))
    score = split_conformal(np.asarray(scores), level) if level > 0 else -math.inf
    return max(0.0, mean + scale * score)


def update(calibration: Calibration, mean: float, spread: float, realised: float,
           levels: Iterable[float] = REPORTED_LEVELS, *, floor: float = 0.0,
           keep: int = MAX_SCORE_WINDOW) -> Calibration:
    """The calibration after one outcome: the forecast (`mean`, `spread`) met `realised`.

    Each tracked level (those given, and any tracked before) records whether the quantile it gave
    before this outcome covered it and moves its adaptive level; then the score joins the window,
    which keeps the latest `keep` scores (at least SCORE_WINDOW): the caller says how rare a level
    it reads (`score_window`), and a graph planned at the default risk keeps a day's scores, not 1,000.
    """
    if not (math.isfinite(mean) and math.isfinite(spread) and math.isfinite(realised)):
        return calibration
    tracked = sorted({*calibration.levels, *levels})
    new_levels: dict[float, float] = {}
    new_hits: dict[float, tuple[bool, ...]] = {}
    for q in tracked:
        _check_level(q)
        covered = realised <= quantile(calibration, mean, spread, q, floor=floor)
        miss = 0.0 if covered else 1.0
        # Gibbs & Candès: α ← α + γ (α_target − miss), written for the level 1 − α. Clipped to [0, 1]:
        # past 1 the quantile is already the largest score, and a level that winds up there would take
        # as many hits to come back down.
        own = calibration.levels.get(q, q)
        new_levels[q] = min(1.0, max(0.0, own + STEP_SIZE * (miss - (1.0 - q))))
        new_hits[q] = (*calibration.hits.get(q, ()), covered)[-COVERAGE_WINDOW:]
    score = (realised - mean) / _spread(mean, spread, floor)
    kept = min(MAX_SCORE_WINDOW, max(SCORE_WINDOW, keep))
    return Calibration(scores=(*calibration.scores, score)[-kept:], levels=new_levels, hits=new_hits)


def coverages(calibration: Calibration) -> Mapping[float, float]:
    """Every tracked level's recent coverage (levels with no outcome yet left out)."""
    out = {q: calibration.coverage(q) for q in sorted(calibration.hits)}
    return {q: c for q, c in out.items() if c is not None}
