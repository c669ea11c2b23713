"""The planner learns how its fleet differs from the profile: a speed factor from the prefill busy share and
the mean ITL, a latency offset from what the SLA percentile still exceeds, the median over recent intervals,
and how much burstier than Poisson the arrivals are."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from fleetpilot.api import contract
from fleetpilot.api import v1alpha1 as api
from fleetpilot.planner import capacity, core, live, sizing

MODEL = capacity.CapacityModel(live.simulator_profile(1))
SPEC = api.DynamoGraphSpec.model_validate({
    "model": {"name": "m"}, "engine": {"framework": "simulator"},
    "components": {"prefill": {"scaling": {"min": 1, "max": 32}}, "decode": {"scaling": {"min": 1, "max": 32}}},
    "planner": {"mode": "sla", "sla": {"ttftMs": 500, "itlMs": 50}, "predictor": "constant"},
})
CONFIG = core.config_from_spec(SPEC)
ISL, OSL = 2000.0, 200.0
SERVING: dict[sizing.Pool, int] = {"prefill": 2, "decode": 2}


def observed(*, busy_factor: float = 1.0, offset_s: float = 0.0, itl_factor: float = 1.0, rate: float = 8.0,
             itl_offset_s: float = 0.0) -> core.Observation:
    """What a fleet `busy_factor`× slower than the profile at prefill (and `itl_factor`× at decode) would
    report, with `offset_s` of TTFT (and `itl_offset_s` of ITL) the profile does not model."""
    per_replica = rate / SERVING["prefill"]
    busy = busy_factor * per_replica * MODEL.prefill_service_s(ISL).value
    ttft = busy_factor * MODEL.expected_ttft_s(ISL, per_replica * busy_factor, percentile=90) + offset_s
    # Decode: solve Little's law on the slowed fleet for its mean ITL.
    per_decode = rate / SERVING["decode"]
    itl = itl_factor * MODEL.itl_s(1.0, ISL + OSL / 2).value
    for _ in range(50):
        itl = itl_factor * MODEL.itl_s(max(per_decode * OSL * itl, 1.0), ISL + OSL / 2).value
    return core.Observation(time=0.0, rate_rps=rate, isl=ISL, osl=OSL, ttft_s=ttft, prefill_s=ttft,
                            itl_s=itl + itl_offset_s, itl_mean_s=itl, prefill_busy=busy)


def test_a_fleet_that_matches_its_profile_needs_no_correction() -> None:
    estimate = core.interval_corrections(CONFIG, MODEL, observed(), SERVING)
    assert estimate.prefill == pytest.approx(1.0)
    assert estimate.decode == pytest.approx(1.0, rel=1e-3)
    # The pool's TTFT quantile is searched to a tenth of a microsecond (capacity._TTFT_RESOLUTION_S): no
    # offset means none beyond that.
    assert estimate.prefill_offset_s == pytest.approx(0.0, abs=1e-6)
    assert estimate.decode_offset_s == pytest.approx(0.0, abs=1e-4)


def test_a_slower_fleet_and_latency_the_profile_does_not_model_are_told_apart() -> None:
    estimate = core.interval_corrections(
        CONFIG, MODEL, observed(busy_factor=1.6, offset_s=0.12, itl_factor=1.3, itl_offset_s=0.004),
        SERVING)
    assert estimate.prefill == pytest.approx(1.6)
    assert estimate.prefill_offset_s == pytest.approx(0.12)
    assert estimate.decode == pytest.approx(1.3, rel=1e-3)
    assert estimate.decode_offset_s == pytest.approx(0.004, abs=1e-4)


def test_an_idle_or_saturated_prefill_pool_says_nothing_about_its_speed() -> None:
    idle = core.interval_corrections(CONFIG, MODEL, observed(rate=0.05), SERVING)
    assert math.isnan(idle.prefill)
    saturated = core.Observation(time=0.0, rate_rps=8.0, isl=ISL, osl=OSL, ttft_s=5.0, prefill_busy=0.99)
    assert math.isnan(core.interval_corrections(CONFIG, MODEL, saturated, SERVING).prefill)
    nothing = core.interval_corrections(CONFIG, MODEL, core.Observation(time=0.0, rate_rps=0.0), SERVING)
    assert all(math.isnan(v) for v in (nothing.prefill, nothing.decode, nothing.prefill_offset_s))


def test_the_planner_sizes_with_the_median_of_recent_estimates() -> None:
    """One interval of a backlog (offset 5 s) among steady ones moves nothing; the estimates of the last
    CALIBRATION_INTERVALS intervals decide."""
    steady = sizing.Corrections(0.7, 1.2, 0.1, 0.001)
    spike = sizing.Corrections(3.0, 3.0, 5.0, 0.05)
    unknown = sizing.Corrections(math.nan, math.nan, math.nan, math.nan)
    assert core.calibrated((steady, spike, steady, unknown)) == steady
    assert core.calibrated(()) == sizing.Corrections()
    memory = core.GraphMemory()
    for _ in range(core.CALIBRATION_INTERVALS + 3):
        plan, memory = core.plan_interval(CONFIG, observed(busy_factor=0.7), memory, current=SERVING,
                                          capacity=MODEL, now=0.0)
    assert len(memory.calibration) == core.CALIBRATION_INTERVALS
    assert plan.corrections.prefill == pytest.approx(0.7)


def test_burstiness_is_the_excess_over_poisson() -> None:
    window = contract.BURST_WINDOW_S
    poisson_p90 = stats.poisson.ppf(0.9, 10.0 * window) / window
    assert core.burstiness(poisson_p90, 10.0, percentile=90) == pytest.approx(1.0)
    assert core.burstiness(5.0, 10.0, percentile=90) == 1.0  # never below 1
    # A minute whose 600 requests all come within 5 s: the p90 request saw 120 req/s, not 10.
    assert core.burstiness(120.0, 10.0, percentile=90) == pytest.approx(120.0 / poisson_p90)


def test_bursts_raise_prefill_but_not_decode() -> None:
    calm = core.Observation(time=0.0, rate_rps=8.0, isl=ISL, osl=OSL, ttft_s=0.2, itl_s=0.02, burst_rate_rps=8.0)
    bursty = core.Observation(time=0.0, rate_rps=8.0, isl=ISL, osl=OSL, ttft_s=0.2, itl_s=0.02, burst_rate_rps=64.0)
    smooth, _ = core.plan_interval(CONFIG, calm, core.GraphMemory(), current=SERVING, capacity=MODEL, now=0.0)
    spiky, memory = core.plan_interval(CONFIG, bursty, core.GraphMemory(), current=SERVING, capacity=MODEL, now=0.0)
    assert memory.bursts and memory.bursts[-1] > 4
    assert spiky.predicted is not None and spiky.predicted.burst == pytest.approx(memory.bursts[-1])
    assert spiky.replicas["prefill"] > smooth.replicas["prefill"]
    assert spiky.replicas["decode"] == smooth.replicas["decode"]
