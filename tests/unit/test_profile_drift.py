"""Profile drift: sustained disagreement between the fleet's latency and its profile's, and autoCorrect."""

from __future__ import annotations

import math
import re
import statistics

import pydantic
import pytest

from fleetpilot.api import v1alpha1 as api
from fleetpilot.planner import capacity, core, drift, live

ISL, OSL, RATE = 2000.0, 200.0, 4.0


@pytest.fixture(scope="module")
def model() -> capacity.CapacityModel:
    return capacity.CapacityModel(live.simulator_profile(1))


def config(**profile: object) -> core.GraphPlanConfig:
    bounds = {"scaling": {"min": 1, "max": 16}}
    planner: dict[str, object] = {"mode": "sla", "sla": {"ttftMs": 500, "itlMs": 20}, "predictor": "constant",
                                  "intervalSeconds": 60}
    if profile:
        planner["profile"] = profile
    spec = api.DynamoGraphSpec.model_validate({
        "model": {"name": "m"}, "engine": {"framework": "simulator"},
        "components": {"prefill": bounds, "decode": bounds}, "planner": planner})
    return core.config_from_spec(spec, startup_s=60, hold_s=300)


def slowed_itl(model: capacity.CapacityModel, slowdown: float, *, rate: float = RATE) -> float:
    """The mean ITL of one decode replica `slowdown` times slower than its profile at `rate` (Little's law's
    fixed point: the sequences held depend on the ITL itself)."""
    itl = 0.01
    for _ in range(50):
        itl = slowdown * model.itl_s(rate * OSL * itl, ISL + OSL / 2).value
    return itl


def observation(model: capacity.CapacityModel, *, slowdown: float, ttft_slowdown: float = 1.0,
                rate: float = RATE) -> core.Observation:
    """One interval of a one-replica-per-pool fleet whose decode runs `slowdown` and prefill `ttft_slowdown`
    times slower than the profile at `rate`."""
    itl = slowed_itl(model, slowdown, rate=rate)
    prefill = ttft_slowdown * model.expected_ttft_pool_s(rate, 1, isl=ISL, percentile=90)
    return core.Observation(time=0.0, rate_rps=rate, isl=ISL, osl=OSL, ttft_s=prefill + itl, itl_s=itl * 1.05,
                            prefill_s=prefill, itl_mean_s=itl)


def run(model: capacity.CapacityModel, cfg: core.GraphPlanConfig, observations: list[core.Observation],
        ) -> tuple[core.Plan, core.GraphMemory]:
    memory = core.GraphMemory()
    current = {"prefill": 1, "decode": 1}
    plan = None
    for index, seen in enumerate(observations):
        plan, memory = core.plan_interval(cfg, seen, memory, current=current, capacity=model, now=60.0 * index,
                                          ready=current)
    assert plan is not None
    return plan, memory


def test_a_fleet_slower_than_its_profile_is_reported_with_the_figures(model: capacity.CapacityModel) -> None:
    plan, _ = run(model, config(), [observation(model, slowdown=1.3) for _ in range(10)])
    verdict = plan.drift
    assert verdict is not None and verdict.drifted is True and verdict.reason == "Drifted"
    itl = verdict.figure("itl")
    assert itl is not None and itl.ratio == pytest.approx(1.3, rel=0.01)
    assert itl.observed_s == pytest.approx(slowed_itl(model, 1.3), rel=1e-6)
    assert itl.predicted_s == pytest.approx(itl.observed_s / 1.3, rel=0.01)
    assert "slower than its profile" in verdict.message and "ITL" in verdict.message and "×1.30" in verdict.message


def test_a_fleet_within_the_threshold_is_as_profiled(model: capacity.CapacityModel) -> None:
    plan, _ = run(model, config(), [observation(model, slowdown=1.1) for _ in range(10)])
    assert plan.drift is not None and plan.drift.drifted is False and plan.drift.reason == "AsProfiled"
    assert "within 20% of the profile" in plan.drift.message
    # The graph's own threshold decides: 5% calls the same fleet drifted.
    tight, _ = run(model, config(driftThreshold=0.05), [observation(model, slowdown=1.1) for _ in range(10)])
    assert tight.drift is not None and tight.drift.drifted is True


def test_drift_must_be_sustained_not_one_interval(model: capacity.CapacityModel) -> None:
    seen = [observation(model, slowdown=1.0) for _ in range(9)] + [observation(model, slowdown=2.0)]
    plan, _ = run(model, config(), seen)
    assert plan.drift is not None and plan.drift.drifted is False
    early, _ = run(model, config(), [observation(model, slowdown=2.0) for _ in range(drift.MIN_INTERVALS - 1)])
    assert early.drift is not None and early.drift.drifted is None and early.drift.reason == "NotMeasured"


def test_ttft_inside_the_profiles_queueing_band_is_as_profiled(model: capacity.CapacityModel) -> None:
    """Whether the prefill replicas share a queue or not is the traffic's business: only a TTFT outside what
    either end predicts says the profile is off."""
    busy = 30.0  # two replicas at ~70%: the two ends of queue sharing differ
    shared = model.expected_ttft_pool_s(busy, 2, isl=ISL, percentile=90, pooling=1.0)
    separate = model.expected_ttft_pool_s(busy, 2, isl=ISL, percentile=90, pooling=0.0)
    assert separate > 1.2 * shared

    def sample(observed: float | None) -> tuple[float, float]:
        return drift.ttft_sample(model, observed_s=observed, rate_rps=busy, replicas=2, isl=ISL, percentile=90,
                                 mix=None)

    observed, predicted = sample((shared + separate) / 2)
    assert observed == predicted
    assert sample(2 * separate) == (2 * separate, separate)
    assert sample(shared / 2) == (shared / 2, shared)
    assert all(math.isnan(v) for v in sample(None))


def test_a_faster_fleet_is_drift_too() -> None:
    samples = [drift.Sample(ttft_observed_s=0.1, ttft_predicted_s=0.2) for _ in range(6)]
    verdict = drift.judge(samples)
    assert verdict.drifted is True and "faster than its profile" in verdict.message
    figure = verdict.figure("ttft")
    assert figure is not None and figure.ratio == pytest.approx(0.5)
    mixed = drift.judge([drift.Sample(0.1, 0.2, 0.026, 0.02)] * 6)
    assert mixed.drifted is True and mixed.message.startswith("the fleet differs from its profile beyond 20%")


def test_the_message_ratio_is_the_quotient_of_the_figures_it_prints() -> None:
    """The median measured and the median predicted come from different intervals here (both 500 ms, a
    quotient of 1.00), while the median interval's ratio is 0.875: the message prints that interval's
    figures, whose quotient is the ratio beside them; with an even count, the two middle intervals'."""
    intervals = [(0.100, 0.200), (0.300, 0.400), (0.900, 1.000), (0.700, 0.800), (0.500, 0.500)]
    for extra in ([], [(0.600, 0.500)]):
        samples = [drift.Sample(ttft_observed_s=o, ttft_predicted_s=p) for o, p in intervals + extra]
        verdict = drift.judge(samples)
        found = re.search(r"TTFT ([\d.]+) ms measured vs ([\d.]+) ms predicted \(×([\d.]+)", verdict.message)
        assert found is not None, verdict.message
        measured, predicted, ratio = (float(g) for g in found.groups())
        assert ratio == pytest.approx(measured / predicted, abs=0.006), verdict.message
        figure = verdict.figure("ttft")
        assert figure is not None and figure.ratio == pytest.approx(figure.observed_s / figure.predicted_s)
        ratios = sorted(o / p for o, p in intervals + extra)
        middle = ratios[(len(ratios) - 1) // 2: len(ratios) // 2 + 1]
        assert figure.ratio == pytest.approx(statistics.geometric_mean(middle))
    assert (measured, predicted) == (pytest.approx(793.7, abs=0.05), pytest.approx(894.4, abs=0.05))


def test_auto_correct_off_sizes_from_the_profile_as_written(model: capacity.CapacityModel) -> None:
    """The learning goes on (and is reported), but sizing uses the profile's own figures."""
    slow = [observation(model, slowdown=1.6, rate=60.0) for _ in range(10)]
    corrected, memory_on = run(model, config(), slow)
    as_written, memory_off = run(model, config(autoCorrect=False), slow)
    assert corrected.corrections.decode == pytest.approx(1.6, rel=0.01)
    assert as_written.corrections.decode == 1.0 and as_written.corrections.decode_offset_s == 0.0
    assert core.learned(memory_off)["decodeSpeed"] == pytest.approx(1.6, rel=0.01)
    assert corrected.replicas["decode"] > as_written.replicas["decode"]
    assert "autoCorrect off" in as_written.reason
    assert as_written.drift is not None and as_written.drift.drifted is True
    assert core.learned(memory_on) == core.learned(memory_off)


def test_the_api_defaults_and_bounds_the_profile_settings() -> None:
    assert config().auto_correct is True and config().drift_threshold == drift.DEFAULT_THRESHOLD
    assert config(autoCorrect=False).auto_correct is False
    with pytest.raises(pydantic.ValidationError, match="driftThreshold must lie from 0.05 to 1.0"):
        config(driftThreshold=2)
    with pytest.raises(pydantic.ValidationError, match="autoCorrect|auto_correct|extra"):
        config(autocorrect=True)


def test_idle_intervals_leave_the_last_judgement_standing(model: capacity.CapacityModel) -> None:
    idle = core.Observation(time=0.0, rate_rps=0.0)
    plan, _ = run(model, config(), [observation(model, slowdown=1.3) for _ in range(6)] + [idle] * 12)
    assert plan.drift is not None and plan.drift.drifted is True
