"""Scale to zero and back (planner/zero.py and the frontends' reading in planner/frontends.py)."""

from __future__ import annotations

from fleetpilot.api import contract
from fleetpilot.planner import frontends, zero

MINS = {"prefill": 0, "decode": 0}


def test_a_held_request_wakes_every_pool_at_zero() -> None:
    demand = zero.Demand(held=1, inflight=1, idle_s=0)
    assert zero.decide(min_replicas=MINS, current={"prefill": 0, "decode": 0}, demand=demand,
                       idle_window_s=300) == {"prefill": 1, "decode": 1}
    # Already awake (or waking): nothing to do; the interval's plan sizes from here.
    assert zero.decide(min_replicas=MINS, current={"prefill": 1, "decode": 1}, demand=demand,
                       idle_window_s=300) == {}


def test_only_pools_that_may_be_at_zero_sleep() -> None:
    demand = zero.Demand(held=0, inflight=0, idle_s=301)
    assert zero.decide(min_replicas={"prefill": 1, "decode": 0}, current={"prefill": 2, "decode": 3},
                       demand=demand, idle_window_s=300) == {"decode": 0}


def test_no_sleep_before_the_idle_window_or_with_work_in_flight() -> None:
    current = {"prefill": 1, "decode": 1}
    for demand in (zero.Demand(held=0, inflight=0, idle_s=299), zero.Demand(held=0, inflight=2, idle_s=900)):
        assert zero.decide(min_replicas=MINS, current=current, demand=demand, idle_window_s=300) == {}
        assert not zero.asleep(demand, 300)
    assert zero.asleep(zero.Demand(held=0, inflight=0, idle_s=300), 300)


def exposition(*, held: float, idle: float, inflight: float) -> str:
    return (f'# TYPE {contract.HELD_METRIC} gauge\n{contract.HELD_METRIC}{{model="m"}} {held}\n'
            f'# TYPE {contract.IDLE_METRIC} gauge\n{contract.IDLE_METRIC}{{model="m"}} {idle}\n'
            f'# TYPE {contract.INFLIGHT_METRIC} gauge\n{contract.INFLIGHT_METRIC}{{model="m"}} {inflight}\n')


def test_the_frontends_demand_is_summed_and_the_idle_clock_is_the_least() -> None:
    demand = frontends.demand_from_expositions([exposition(held=2, idle=500, inflight=2),
                                                exposition(held=1, idle=40, inflight=3)])
    assert demand == zero.Demand(held=3, inflight=5, idle_s=40)


def test_a_frontend_without_the_metrics_makes_the_reading_unknown() -> None:
    assert frontends.demand_from_expositions([exposition(held=0, idle=500, inflight=0), "up 1\n"]) is None
    assert frontends.demand_from_expositions([]) is None
