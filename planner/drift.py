"""Profile drift: whether the running fleet has left its capacity profile behind, and by how much.

Where it sits: the planner's pure layer, beside `sizing`. Each interval `core.plan_interval` reads one
`Sample` — what the fleet's TTFT and ITL were against what the profile predicts at that interval's
load and length mix — and keeps the last few in the graph's memory; `judge` turns them into a
`Verdict`, which the live planner reports as the graph's `ProfileDrift` condition, a Warning Event and
`fleetpilot_planner_profile_drift*` metrics.

It is not a second estimator. ITL's prediction is the one the planner's decode speed factor already
compares with (the profile's ITL at the sequences each replica held, by Little's law), so the ITL ratio
is that factor. TTFT's is the profile's percentile TTFT of the serving prefill pool at the interval's
rate, bursts and prompt mix (`capacity.expected_ttft_pool_s`, which the offsets are measured against),
taken as a band: from one shared queue to separate queues, the two ends the planner's learned queue
sharing lies between. TTFT inside the band is as profiled whatever the sharing; outside, the ratio to
the nearer end is how far the fleet is off.

Sustained: the median of the per-interval ratios over the intervals kept (the last ones that measured
anything, as many as the planner's calibration window: an idle graph keeps its last judgement), once at
least `MIN_INTERVALS` of them measured it, beyond 1 ± threshold (slower: above 1 + threshold; faster:
below 1 / (1 + threshold)).

The figures reported with it are the median interval's own, so that measured ÷ predicted is the ratio
printed beside them. Medians of the measured and of the predicted figures taken apart would come from
different intervals (a busy interval's measured TTFT beside a quiet one's prediction), and their
quotient from neither. With an even count the median is the geometric mean of the two middle intervals
— of their ratios, and alike of their measured and of their predicted figures — which keeps the three
consistent and treats ×2 and ×0.5 as equally far off.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from typing import Literal

from fleetpilot.planner import capacity as capacities
from fleetpilot.planner import lengths

Metric = Literal["ttft", "itl"]
METRICS: tuple[Metric, ...] = ("ttft", "itl")
DEFAULT_THRESHOLD = 0.2
MIN_INTERVALS = 5
_NAMES: dict[Metric, str] = {"ttft": "TTFT", "itl": "ITL"}


@dataclasses.dataclass(frozen=True)
class Sample:
    """One interval: each metric as measured and as the profile predicts it (NaN: not measured)."""

    ttft_observed_s: float = math.nan
    ttft_predicted_s: float = math.nan
    itl_observed_s: float = math.nan
    itl_predicted_s: float = math.nan

    def observed(self, metric: Metric) -> float:
        return self.ttft_observed_s if metric == "ttft" else self.itl_observed_s

    def predicted(self, metric: Metric) -> float:
        return self.ttft_predicted_s if metric == "ttft" else self.itl_predicted_s

    @property
    def measured(self) -> bool:
        """Whether the interval measured either metric against the profile."""
        return any(math.isfinite(self.ratio(metric)) for metric in METRICS)

    def ratio(self, metric: Metric) -> float:
        """Measured over predicted; NaN where either is missing."""
        observed, predicted = self.observed(metric), self.predicted(metric)
        if observed > 0 and predicted > 0 and math.isfinite(observed) and math.isfinite(predicted):
            return observed / predicted
        return math.nan


def ttft_sample(capacity: capacities.CapacityModel, *, observed_s: float | None, rate_rps: float, replicas: int,
                isl: float, percentile: float, mix: lengths.LengthMix | None) -> tuple[float, float]:
    """(observed, predicted) TTFT at the percentile: the prediction is the end of the profile's band
    (one shared queue .. separate queues, `rate_rps` offered to `replicas`) nearer the observation, or the
    observation itself inside the band. NaN where the profile's pool is saturated or nothing was seen."""
    if observed_s is None or not (observed_s > 0 and math.isfinite(observed_s)) or rate_rps <= 0 or replicas < 1:
        return math.nan, math.nan
    shared = capacity.expected_ttft_pool_s(rate_rps, replicas, isl=isl, percentile=percentile, mix=mix, pooling=1.0)
    separate = capacity.expected_ttft_pool_s(rate_rps, replicas, isl=isl, percentile=percentile, mix=mix,
                                             pooling=0.0)
    if not (math.isfinite(shared) and math.isfinite(separate)):
        return observed_s, math.nan
    low, high = min(shared, separate), max(shared, separate)
    return observed_s, min(max(observed_s, low), high)


@dataclasses.dataclass(frozen=True)
class Figure:
    """One metric over the intervals kept: the median interval by ratio (see the module docstring), its
    measured and predicted figures and their ratio, and how many intervals measured the metric."""

    metric: Metric
    observed_s: float
    predicted_s: float
    ratio: float
    intervals: int

    def words(self) -> str:
        name = _NAMES[self.metric]
        unit, scale = ("ms", 1e3)
        return (f"{name} {self.observed_s * scale:.1f} {unit} measured vs {self.predicted_s * scale:.1f} {unit} "
                f"predicted (×{self.ratio:.2f}, the median of {self.intervals} intervals by ratio)")


Reason = Literal["Drifted", "AsProfiled", "NotMeasured"]


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Whether the fleet has drifted from its profile; `drifted` None until enough intervals measured it."""

    drifted: bool | None
    reason: Reason
    message: str
    figures: tuple[Figure, ...] = ()
    threshold: float = DEFAULT_THRESHOLD

    def figure(self, metric: Metric) -> Figure | None:
        return next((f for f in self.figures if f.metric == metric), None)

    def off(self, figure: Figure) -> bool:
        """Whether this metric is beyond the threshold, either way."""
        return figure.ratio > 1.0 + self.threshold or figure.ratio < 1.0 / (1.0 + self.threshold)


def median_interval(samples: Sequence[Sample], metric: Metric) -> tuple[float, float]:
    """(measured, predicted) of the interval whose ratio is the median of `samples` (all measured `metric`);
    with an even count, the geometric means of the two middle intervals' figures."""
    ranked = sorted(samples, key=lambda s: s.ratio(metric))
    middle = ranked[(len(ranked) - 1) // 2: len(ranked) // 2 + 1]  # one interval, or the two middle ones
    return (statistics.geometric_mean([s.observed(metric) for s in middle]),
            statistics.geometric_mean([s.predicted(metric) for s in middle]))


def judge(samples: Sequence[Sample], *, threshold: float = DEFAULT_THRESHOLD,
          min_intervals: int = MIN_INTERVALS) -> Verdict:
    """The verdict over the samples kept (see the module docstring)."""
    figures = []
    for metric in METRICS:
        measured = [s for s in samples if math.isfinite(s.ratio(metric))]
        if len(measured) < min_intervals:
            continue
        observed, predicted = median_interval(measured, metric)
        figures.append(Figure(metric, observed, predicted, observed / predicted, len(measured)))
    if not figures:
        return Verdict(None, "NotMeasured", f"fewer than {min_intervals} intervals with traffic measured TTFT or "
                       "ITL against the profile yet", threshold=threshold)
    verdict = Verdict(False, "AsProfiled", "", tuple(figures), threshold)
    off = [f for f in figures if verdict.off(f)]
    within = [f for f in figures if not verdict.off(f)]
    if not off:
        return dataclasses.replace(verdict, message=f"within {threshold:.0%} of the profile: "
                                   + "; ".join(f.words() for f in figures))
    slower = [f for f in off if f.ratio > 1.0]
    how = "runs slower than" if len(slower) == len(off) else ("runs faster than" if not slower else "differs from")
    message = (f"the fleet {how} its profile beyond {threshold:.0%}: " + "; ".join(f.words() for f in off)
               + ("; within it: " + "; ".join(f.words() for f in within) if within else ""))
    return dataclasses.replace(verdict, drifted=True, reason="Drifted", message=message)
