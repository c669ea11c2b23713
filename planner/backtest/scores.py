"""How a backtest run is scored: request-level SLA attainment, its worst stretch, and the cost to meet the SLA.

Where it sits: after a run, on what the fleet model reports per request (`fleetsim`) or per step of
a sampled request mix (`fluid`); `evaluate` reads these scores to rank policies. Pure.

The rules, as serving papers (DistServe, Splitwise) and llm-d score SLO attainment:

- a request **meets the SLA** when its TTFT and its mean inter-token latency are both within target;
- a request that could not meet it even alone on an idle replica (a prompt whose prefill alone takes
  longer than the TTFT target) is **excluded** from every policy alike, and counted;
- a run's **attainment** is the share of the remaining requests that met the SLA;
- a run **meets the SLA** when its attainment reaches the SLA percentile (p90 → 90%) *and* no sliding
  5-minute window falls more than 5 points below it, so a policy cannot buy the average by sacrificing
  one burst. Windows with fewer than `MIN_WINDOW_REQUESTS` eligible requests are too small to judge;
- requests that arrive before `scored_from_s` (a run's burn-in) are replayed but not scored: a planner in
  production has the history its warm start loads, and a replay that starts every policy with none would
  judge its first minutes on what no causal policy can know.

Across policies, the scoreboard reads each one's GPU-hours to meet the SLA against the **strongest
baseline** (the cheapest of the baselines, each at its own best setting) and the oracle: the share of
the possible saving a policy **captures**.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

WINDOW_S = 300.0  # the sliding window of the continuity rule
STRIDE_S = 60.0  # how far it slides
WINDOW_SLACK = 0.05  # how far below the SLA percentile one window may fall
MIN_WINDOW_REQUESTS = 20


@dataclasses.dataclass(frozen=True)
class RequestScores:
    """A run's request-level scores against one SLA."""

    target: float  # the SLA percentile as a share: p90 → 0.9
    requests: int  # every arrival
    excluded: int  # could not meet the SLA even alone on an idle replica
    good: float  # eligible requests that met both targets
    worst_window: float  # the lowest attainment of any judged sliding window (NaN: none judged)
    worst_window_start: float  # where it starts, seconds into the trace

    @property
    def eligible(self) -> float:
        return self.requests - self.excluded

    @property
    def attainment(self) -> float:
        return self.good / self.eligible if self.eligible > 0 else 1.0

    @property
    def effective(self) -> float:
        """One number for both rules: the SLA is met iff this reaches `target`."""
        if math.isnan(self.worst_window):
            return self.attainment
        return min(self.attainment, self.worst_window + WINDOW_SLACK)

    @property
    def meets(self) -> bool:
        return self.effective >= self.target - 1e-12


def binned(times: np.ndarray, eligible: np.ndarray, good: np.ndarray, *, stride_s: float = STRIDE_S,
           duration_s: float, scored_from_s: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Eligible and good request counts per `stride_s` bin of arrival time from `scored_from_s` on
    (weights may be fractional; earlier arrivals are left out)."""
    count = max(1, math.ceil((duration_s - scored_from_s) / stride_s))
    times = np.asarray(times)
    scored = times >= scored_from_s
    index = np.clip(((times[scored] - scored_from_s) // stride_s).astype(int), 0, count - 1)
    return (np.bincount(index, weights=np.asarray(eligible)[scored], minlength=count),
            np.bincount(index, weights=np.asarray(good)[scored], minlength=count))


def score_bins(eligible_bins: np.ndarray, good_bins: np.ndarray, *, requests: int, excluded: int, target: float,
               stride_s: float = STRIDE_S, window_s: float = WINDOW_S,
               min_requests: float = MIN_WINDOW_REQUESTS, scored_from_s: float = 0.0) -> RequestScores:
    """Scores from per-bin counts (the first bin starting at `scored_from_s`): the total, and the worst
    sliding window of `window_s`."""
    width = max(1, round(window_s / stride_s))
    kernel = np.ones(width)
    if len(eligible_bins) >= width:
        in_window = np.convolve(eligible_bins, kernel, mode="valid")
        good_in_window = np.convolve(good_bins, kernel, mode="valid")
    else:  # a run shorter than one window is one window
        in_window, good_in_window = eligible_bins.sum(keepdims=True), good_bins.sum(keepdims=True)
    judged = in_window >= min_requests
    worst, start = math.nan, math.nan
    if judged.any():
        shares = np.where(judged, good_in_window / np.maximum(in_window, 1e-12), np.inf)
        at = int(np.argmin(shares))
        worst, start = float(shares[at]), scored_from_s + at * stride_s
    return RequestScores(target=target, requests=requests, excluded=excluded, good=float(good_bins.sum()),
                         worst_window=worst, worst_window_start=start)


def score_requests(arrival: np.ndarray, ttft: np.ndarray, itl: np.ndarray, unservable: np.ndarray, *,
                   ttft_target_s: float, itl_target_s: float, percentile: float, duration_s: float,
                   scored_from_s: float = 0.0) -> RequestScores:
    """Scores of the individual requests that arrived from `scored_from_s` on (failed ones carry infinite
    latencies)."""
    scored = np.asarray(arrival) >= scored_from_s
    eligible = ~unservable
    good = eligible & (ttft <= ttft_target_s) & (itl <= itl_target_s)
    eligible_bins, good_bins = binned(arrival, eligible.astype(float), good.astype(float), duration_s=duration_s,
                                      scored_from_s=scored_from_s)
    return score_bins(eligible_bins, good_bins, requests=int(scored.sum()), excluded=int((unservable & scored).sum()),
                      target=percentile / 100.0, scored_from_s=scored_from_s)


# -- what a policy costs to meet the SLA ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CostToMeet:
    """The GPU-hours a sweep needs to meet the SLA, read off its curve, and whether the curve brackets it."""

    gpu_hours: float | None  # None: no setting met the SLA
    bracketed: bool  # the cheapest setting missed and the dearest met: the figure is interpolated, not an end
    note: str = ""


def cost_to_meet(points: Sequence[tuple[float, float]], target: float) -> CostToMeet:
    """`points` are (GPU-hours, effective score) of a sweep. The cost at which the best score reachable for
    at most that cost crosses `target`, linear from the dearest setting that missed it to the cheapest
    that met it.

    A dearer setting that scored no better still missed: spending its GPU-hours did not meet the SLA, so
    the line starts there, at the best score reached so far. Skipping it would draw the line across a
    plateau and read a cost the sweep showed to be too little.
    """
    ordered = sorted(points)
    if not ordered:
        return CostToMeet(None, False, "no runs")
    best = -math.inf
    previous: tuple[float, float] | None = None
    for cost, score in ordered:
        if score <= best:
            previous = (cost, best)  # spent more, reached no more: the plateau runs at least this far
            continue
        if score >= target:
            if previous is None:
                return CostToMeet(cost, False, "even the cheapest setting met the SLA: its cost is an upper bound")
            (c0, s0), (c1, s1) = previous, (cost, score)
            return CostToMeet(c0 + (target - s0) * (c1 - c0) / (s1 - s0), True)
        best = score
        previous = (cost, score)
    return CostToMeet(None, False, f"no setting met the SLA (best {best:.1%})")


def lone_latencies(isl: np.ndarray, osl: np.ndarray, *, ttft: Callable[[int, int], float],
                   itl: Callable[[int, int], float]) -> tuple[np.ndarray, np.ndarray]:
    """Each request's TTFT and mean ITL alone on an idle replica, from per-(isl, osl) functions.

    Lengths repeat a lot in real traces: each distinct pair is computed once.
    """
    pairs = np.stack([np.asarray(isl, dtype=np.int64), np.asarray(osl, dtype=np.int64)], axis=1)
    unique, inverse = np.unique(pairs, axis=0, return_inverse=True)
    ttfts = np.array([ttft(int(i), int(o)) for i, o in unique])
    itls = np.array([itl(int(i), int(o)) for i, o in unique])
    inverse = inverse.reshape(-1)
    return ttfts[inverse], itls[inverse]


# -- the scoreboard: fleetpilot against the strongest baseline --------------------------------------------


def strongest_baseline(costs: Mapping[str, float | None], baselines: Sequence[str]) -> tuple[str, float] | None:
    """The cheapest of `baselines` to meet the SLA, each at its own best setting: (name, GPU-hours), from
    each policy's cost to meet (None: it never met it). None when no baseline met it."""
    met = [(cost, name) for name in baselines if (cost := costs.get(name)) is not None]
    if not met:
        return None
    cost, name = min(met)
    return name, cost


def captured_share(*, baseline: float, ours: float, oracle: float) -> float | None:
    """The share of the saving possible over the strongest baseline that a policy captures:
    (baseline − ours) / (baseline − oracle), all GPU-hours to meet the SLA. 1: all of it (the oracle's
    cost), 0: none (the baseline's), below 0: dearer than the baseline. None when the baseline is no
    dearer than the oracle: there was no saving to capture."""
    possible = baseline - oracle
    if possible <= 1e-12 * max(abs(baseline), 1.0):
        return None
    return (baseline - ours) / possible
