"""Length mixes: the distribution of prompt or output lengths a pool serves, as the planner sizes for it.

Why not the mean: a prompt's cost and its TTFT grow with its length, so the requests that break a TTFT
percentile are the long ones, and a prefill replica's queue waits on the variance of its prompts as much
as on their mean (Pollaczek–Khinchine: the mean wait is λ·E[S²] / 2(1 − ρ)). A decode replica holds a
sequence for as long as it generates, so the sequences it runs at any moment are the long outputs more
often than their share of requests says (size-biased): the context they hold is E[isl] + E[osl²] / 2E[osl],
not E[isl] + E[osl] / 2. Dynamo's planner sizes at the mean and says so; on long-tailed traces that
is where the percentile is lost.

Where the mixes come from: the frontend's length histograms (`contract.TOKEN_BUCKETS`), live through
Prometheus and in the backtest from the trace's requests histogrammed the same way, so one planner core
sees one kind of data in both. A bucket is a coarse thing (its bounds are a factor of two apart), so a
mix places each bucket's requests at the bucket's geometric middle and then rescales every point so
that the mix has the exact mean the histogram's sum and count give: the mean is exact, the spread is
the histogram's. Pure: plain numbers in and out.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence

from fleetpilot.api import contract


@dataclasses.dataclass(frozen=True)
class LengthMix:
    """Lengths (tokens) and the share of requests at each; shares sum to 1."""

    lengths: tuple[float, ...]
    shares: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.lengths or len(self.lengths) != len(self.shares):
            raise ValueError("a LengthMix needs as many shares as lengths, and at least one")
        if any(not (x > 0 and math.isfinite(x)) for x in self.lengths):
            raise ValueError(f"lengths must be positive and finite, got {self.lengths}")
        if any(not (w >= 0 and math.isfinite(w)) for w in self.shares) or abs(sum(self.shares) - 1.0) > 1e-6:
            raise ValueError(f"shares must be ≥ 0 and sum to 1, got {self.shares}")

    @property
    def mean(self) -> float:
        return sum(x * w for x, w in zip(self.lengths, self.shares, strict=True))

    @property
    def second_moment(self) -> float:
        return sum(x * x * w for x, w in zip(self.lengths, self.shares, strict=True))

    @property
    def size_biased_mean(self) -> float:
        """E[X²] / E[X]: the mean length of what is in flight when each item stays in proportion to its length."""
        return self.second_moment / self.mean


def point(length: float) -> LengthMix:
    """Every request at one length: what sizing at the mean assumes."""
    return LengthMix((float(length),), (1.0,))


def from_histogram(upper_bounds: Sequence[float], counts: Sequence[float], *, mean: float | None = None,
                   ) -> LengthMix | None:
    """A mix from a histogram's per-bucket counts (not cumulative), `upper_bounds` ascending; the last
    bucket may be unbounded (inf). None when it holds no request.

    Each bucket's requests sit at the geometric middle of its bounds (the first bucket's lower bound is
    half its upper one; an unbounded last bucket sits at twice its lower bound); then, when `mean` is
    given (sum ÷ count of the histogram), every length is scaled so that the mix's mean is exactly it.
    """
    if len(upper_bounds) != len(counts):
        raise ValueError("a histogram needs one count per bucket")
    lengths: list[float] = []
    weights: list[float] = []
    lower = 0.0
    for upper, count in zip(upper_bounds, counts, strict=True):
        if count > 0 and math.isfinite(count):
            if math.isinf(upper):
                middle = 2.0 * lower if lower > 0 else 1.0
            else:
                low = lower if lower > 0 else upper / 2.0
                middle = math.sqrt(low * upper)
            lengths.append(middle)
            weights.append(float(count))
        lower = upper if math.isfinite(upper) else lower
    total = sum(weights)
    if total <= 0:
        return None
    mix = LengthMix(tuple(lengths), tuple(w / total for w in weights))
    if mean is not None and mean > 0 and math.isfinite(mean):
        mix = scaled_to_mean(mix, mean)
    return mix


def histogram(lengths: Iterable[float], upper_bounds: Sequence[float]) -> tuple[float, ...]:
    """Per-bucket counts of `lengths` (a length equal to a bound falls in that bound's bucket, as
    Prometheus' `le` says); lengths past the last bound are counted in the last bucket."""
    counts = [0.0] * len(upper_bounds)
    last = len(upper_bounds) - 1
    for x in lengths:
        counts[min(bisect.bisect_left(upper_bounds, x), last)] += 1.0
    return tuple(counts)


def scaled_to_mean(mix: LengthMix, mean: float) -> LengthMix:
    """The same shape, every length scaled so that the mean is `mean`."""
    factor = mean / mix.mean
    return LengthMix(tuple(x * factor for x in mix.lengths), mix.shares)


@dataclasses.dataclass(frozen=True)
class Histogram:
    """One interval's lengths as the frontend's histogram reports them: requests (or requests/s) per
    bucket of `contract.TOKEN_BUCKETS` (per bucket, not cumulative), and the exact mean length."""

    counts: tuple[float, ...]
    mean: float

    def __post_init__(self) -> None:
        if len(self.counts) != len(contract.TOKEN_BUCKETS):
            raise ValueError(f"a length histogram has {len(contract.TOKEN_BUCKETS)} buckets, got {len(self.counts)}")

    @property
    def total(self) -> float:
        return sum(self.counts)

    def mix(self) -> LengthMix | None:
        return from_histogram(contract.TOKEN_BUCKETS, self.counts, mean=self.mean)


def from_cumulative(by_bound: Mapping[float, float], mean: float | None) -> Histogram | None:
    """A histogram from Prometheus' cumulative buckets (`le` bound → requests or requests/s at or
    under it), as `sum by (le) (rate(..._bucket[w]))` gives them. None when the bounds are not the
    contract's (a frontend of another version), when there was no traffic, or without a mean."""
    if mean is None or not (mean > 0 and math.isfinite(mean)):
        return None
    if sorted(by_bound) != sorted(float(b) for b in contract.TOKEN_BUCKETS):
        return None
    cumulative = [max(0.0, by_bound[float(b)]) for b in contract.TOKEN_BUCKETS]
    # Per bucket; a counter reset between samples can make a cumulative count dip: never below zero.
    counts = tuple(max(0.0, high - low) for low, high in zip([0.0, *cumulative[:-1]], cumulative, strict=True))
    histogram = Histogram(counts, mean)
    return histogram if histogram.total > 0 else None


def of_lengths(lengths: Sequence[float]) -> Histogram | None:
    """The frontend's histogram of these lengths (what the backtest hands the planner); None when empty."""
    if not lengths:
        return None
    return Histogram(histogram(lengths, contract.TOKEN_BUCKETS), sum(lengths) / len(lengths))


def pooled(histograms: Iterable[Histogram]) -> Histogram | None:
    """Several intervals' histograms as one: counts added, means weighted by their counts."""
    kept = [h for h in histograms if h.total > 0]
    if not kept:
        return None
    total = sum(h.total for h in kept)
    counts = tuple(sum(column) for column in zip(*(h.counts for h in kept), strict=True))
    return Histogram(counts, sum(h.mean * h.total for h in kept) / total)
