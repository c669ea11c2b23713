"""Length mixes from the frontend's histograms: exact means, the histogram's spread, pooling intervals."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fleetpilot.api import contract
from fleetpilot.planner import lengths


def test_a_histogram_counts_each_length_in_the_bucket_prometheus_would() -> None:
    bounds = (16, 32, 64, math.inf)
    # 16 is "le 16"; 17..32 the next; past the last finite bound, +Inf.
    assert lengths.histogram([1, 16, 17, 32, 33, 64, 65, 10**6], bounds) == (2.0, 2.0, 2.0, 2.0)


def test_a_mix_keeps_the_exact_mean_and_the_histograms_spread() -> None:
    rng = np.random.default_rng(3)
    samples = rng.lognormal(math.log(2000), 1.0, 20_000)
    histogram = lengths.of_lengths(list(samples))
    assert histogram is not None
    mix = histogram.mix()
    assert mix is not None
    assert mix.mean == pytest.approx(samples.mean(), rel=1e-9)
    exact_cv2 = samples.var() / samples.mean() ** 2
    mix_cv2 = mix.second_moment / mix.mean**2 - 1.0
    # Buckets a factor of two wide lose the spread within each bucket (a few percent of it), not the shape.
    assert mix_cv2 == pytest.approx(exact_cv2, rel=0.25)
    assert mix_cv2 > 1.0  # a long tail stays a long tail


def test_one_length_is_a_point_whose_size_biased_mean_is_itself() -> None:
    histogram = lengths.of_lengths([300.0] * 10)
    assert histogram is not None
    mix = histogram.mix()
    assert mix is not None
    assert mix.lengths == pytest.approx((300.0,))
    assert mix.size_biased_mean == pytest.approx(300.0)


def test_long_outputs_are_over_represented_among_running_sequences() -> None:
    """Half the requests generate 10 tokens and half 990: at any moment 99% of the running sequences
    are the long ones, so the mean context they hold is far above isl + mean(osl) / 2."""
    mix = lengths.LengthMix((10.0, 990.0), (0.5, 0.5))
    assert mix.mean == pytest.approx(500.0)
    assert mix.size_biased_mean == pytest.approx((0.5 * 100 + 0.5 * 990**2) / 500)
    assert mix.size_biased_mean > 1.9 * mix.mean


def test_pooled_intervals_add_counts_and_weigh_means_by_them() -> None:
    buckets = len(contract.TOKEN_BUCKETS)
    busy = lengths.Histogram(tuple([0.0] * 6 + [30.0] + [0.0] * (buckets - 7)), 600.0)
    quiet = lengths.Histogram(tuple([0.0] * 9 + [10.0] + [0.0] * (buckets - 10)), 5000.0)
    pooled = lengths.pooled([busy, quiet])
    assert pooled is not None
    assert pooled.total == 40.0
    assert pooled.mean == pytest.approx((30 * 600 + 10 * 5000) / 40)
    mix = pooled.mix()
    assert mix is not None and mix.shares == pytest.approx((0.75, 0.25))
    assert lengths.pooled([]) is None
    assert lengths.pooled([lengths.Histogram(tuple([0.0] * buckets), 0.0)]) is None


def test_an_empty_or_malformed_histogram_says_so() -> None:
    assert lengths.of_lengths([]) is None
    assert lengths.from_histogram((16, 32), (0.0, 0.0)) is None
    with pytest.raises(ValueError, match="one count per bucket"):
        lengths.from_histogram((16, 32), (1.0,))
    with pytest.raises(ValueError, match="buckets"):
        lengths.Histogram((1.0, 2.0), 10.0)
    with pytest.raises(ValueError, match="sum to 1"):
        lengths.LengthMix((1.0, 2.0), (0.5, 0.6))


def test_prometheus_cumulative_buckets_become_a_histogram_and_foreign_bounds_are_ignored() -> None:
    bounds = [float(b) for b in contract.TOKEN_BUCKETS]
    per_bucket = [0.0] * len(bounds)
    per_bucket[6], per_bucket[8] = 3.0, 1.0  # 3 req/s at 513-1024 tokens, 1 req/s at 2049-4096
    cumulative = dict(zip(bounds, np.cumsum(per_bucket).tolist(), strict=True))
    histogram = lengths.from_cumulative(cumulative, 1200.0)
    assert histogram is not None and histogram.counts == tuple(per_bucket) and histogram.mean == 1200.0
    assert lengths.from_cumulative(cumulative, None) is None  # no mean: no traffic seen
    assert lengths.from_cumulative({16.0: 1.0, math.inf: 2.0}, 100.0) is None  # another frontend's buckets
    assert lengths.from_cumulative(dict.fromkeys(bounds, 0.0), 100.0) is None  # nothing arrived
    reset = dict(cumulative)
    reset[bounds[7]] = 2.0  # a counter reset made the cumulative count dip: never a negative bucket
    dipped = lengths.from_cumulative(reset, 1200.0)
    assert dipped is not None and min(dipped.counts) >= 0.0
