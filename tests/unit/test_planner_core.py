"""The planner core: one interval of one graph, as a pure function (the live loop's and replay's heart)."""

from __future__ import annotations

import dataclasses

import pytest

from fleetpilot.api import v1alpha1 as api
from fleetpilot.planner import capacity, core, live


@pytest.fixture(scope="module")
def model() -> capacity.CapacityModel:
    return capacity.CapacityModel(live.simulator_profile(1))


def config(*, max_replicas: int = 16, **planner: object) -> core.GraphPlanConfig:
    bounds = {"scaling": {"min": 1, "max": max_replicas}}
    spec = api.DynamoGraphSpec.model_validate({
        "model": {"name": "m"}, "engine": {"framework": "simulator"},
        "components": {"prefill": bounds, "decode": bounds},
        "planner": {"mode": "sla", "sla": {"ttftMs": 500, "itlMs": 50}, "predictor": "constant",
                    "intervalSeconds": 60, **planner},
    })
    return core.config_from_spec(spec, startup_s=120, hold_s=300)


def seen(rate: float) -> core.Observation:
    return core.Observation(time=0.0, rate_rps=rate, isl=2000, osl=200, ttft_s=0.2, itl_s=0.02)


ONE_EACH = {"prefill": 1, "decode": 1}


def test_the_fast_path_runs_every_five_seconds_unless_the_graph_turns_it_off() -> None:
    assert config().reactive_period_s == 5.0
    assert config(fastPathSeconds=20).reactive_period_s == 20.0
    assert config(fastPathSeconds=0).reactive_period_s is None
    with pytest.raises(ValueError, match="fastPathSeconds|fast_path_seconds"):
        config(fastPathSeconds=-1)


def test_missing_data_holds_replicas_and_keeps_history(model: capacity.CapacityModel) -> None:
    memory = core.GraphMemory(rates=(5.0,), isls=(2000.0,), osls=(200.0,))
    plan, after = core.plan_interval(config(), core.Observation(time=0.0, error="Prometheus down"), memory,
                                     current={"prefill": 3, "decode": 2}, capacity=model, now=100.0)
    assert not plan.data_ok and dict(plan.replicas) == {"prefill": 3, "decode": 2}
    assert "Prometheus down" in plan.reason
    assert after.rates == memory.rates


def test_more_load_means_more_replicas_of_both_pools(model: capacity.CapacityModel) -> None:
    light, _ = core.plan_interval(config(), seen(1.0), core.GraphMemory(), current=ONE_EACH, capacity=model, now=0.0)
    heavy, _ = core.plan_interval(config(), seen(100.0), core.GraphMemory(), current=ONE_EACH, capacity=model,
                                  now=0.0)
    assert dict(light.replicas) == ONE_EACH
    assert heavy.replicas["prefill"] > 1 and heavy.replicas["decode"] > 1
    assert heavy.predicted is not None and heavy.predicted.rate_rps == pytest.approx(100.0)


def test_the_horizon_sizes_for_the_peak_before_a_new_replica_is_ready(
    model: capacity.CapacityModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A predictor forecasting a rise within the start-up time gets the replicas for the rise now."""

    @dataclasses.dataclass(frozen=True)
    class Rising:
        name: str = "rising"

        def forecast(self, history: object, *, steps: int, step_seconds: float) -> object:
            from fleetpilot.planner.predict import Forecast

            mean = tuple(10.0 * (i + 1) for i in range(steps))
            return Forecast(mean=mean, lower=mean, upper=mean, predictor="rising", fallback=None)

    monkeypatch.setattr(core.predict, "make_predictor", lambda name, **_: Rising())
    plan, _ = core.plan_interval(config(), seen(10.0), core.GraphMemory(), current=ONE_EACH, capacity=model, now=0.0)
    assert config().horizon_steps == 2
    assert plan.predicted is not None and plan.predicted.rate_rps == pytest.approx(20.0)


def test_a_budget_caps_the_decision_but_the_claim_says_what_was_wanted(model: capacity.CapacityModel) -> None:
    plan, _ = core.plan_interval(config(gpuBudget=4), seen(100.0), core.GraphMemory(), current=ONE_EACH,
                                 capacity=model, now=0.0)
    assert sum(plan.replicas.values()) <= 4
    assert plan.wanted_gpus is not None and plan.wanted_gpus > 4


def test_the_decode_running_cap_is_learned_from_requests_waiting_for_a_slot() -> None:
    """Waiting for a slot while each replica runs 256: the engines run no more. Without waiting, a
    replica seen running more raises the cap; an interval that says nothing keeps it."""
    def seen_decode(running: float, waiting: float) -> core.Observation:
        return core.Observation(time=0.0, decode_running=running, decode_waiting=waiting)

    assert core.learn_max_running(None, seen_decode(512, 300), decode_replicas=2) == 256
    assert core.learn_max_running(None, seen_decode(512, 3), decode_replicas=2) is None  # a few: not full
    assert core.learn_max_running(256, seen_decode(600, 0), decode_replicas=2) == 300
    assert core.learn_max_running(256, seen_decode(100, 0), decode_replicas=2) == 256
    assert core.learn_max_running(256, core.Observation(time=0.0), decode_replicas=2) == 256


def test_a_decode_backlog_the_profile_does_not_explain_adds_decode(model: capacity.CapacityModel) -> None:
    """The profile says one decode replica holds hundreds of sequences; the fleet's engines run 64 and
    the rest wait. Once seen, the plan sizes decode for 64 per replica."""
    observation = core.Observation(time=0.0, rate_rps=30.0, isl=2000, osl=200, ttft_s=20.0, itl_s=0.02,
                                   prefill_s=0.2, decode_running=64.0, decode_waiting=400.0)
    blind, _ = core.plan_interval(config(), dataclasses.replace(observation, decode_running=None),
                                  core.GraphMemory(), current=ONE_EACH, capacity=model, now=0.0)
    learned, memory = core.plan_interval(config(), observation, core.GraphMemory(), current=ONE_EACH,
                                         capacity=model, now=0.0)
    assert memory.decode_max_running == 64.0 and learned.corrections.decode_max_running == 64.0
    assert learned.replicas["decode"] > blind.replicas["decode"]
    assert learned.replicas["prefill"] == blind.replicas["prefill"]
