"""Sizing and constraining: replica counts by hand, the corrections, hysteresis, bounds and budgets,
and the properties the planner must keep over any sequence of inputs."""

from __future__ import annotations

import math
from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetpilot.api import profile as profiles
from fleetpilot.api import v1alpha1
from fleetpilot.planner import capacity as capacities
from fleetpilot.planner import sizing

PROPERTY = settings(deadline=None, max_examples=150)


def tiny_profile(*, kv_capacity_tokens: int = 100_000) -> profiles.Profile:
    """Prefill: 0.1 s per prompt up to ISL 1000 (10,000 tokens/s), the lone TTFT as well.
    Decode at context 1000: ITL 10 ms at 1 sequence, 20 ms at 50, 30 ms at 100, every sequence
    running (tokens/s = concurrency / ITL); a second row at context 3000 makes it a grid."""
    rows = [(1000, 1, 10.0), (1000, 50, 20.0), (1000, 100, 30.0), (3000, 1, 14.0), (3000, 100, 50.0)]
    return profiles.Profile(
        model="tiny",
        engine="simulator",
        gpu="none",
        kv_capacity_tokens=kv_capacity_tokens,
        prefill=(
            profiles.PrefillPoint(isl=1000, ttft_ms=100.0, tokens_per_s_per_gpu=10_000.0),
            profiles.PrefillPoint(isl=2000, ttft_ms=200.0, tokens_per_s_per_gpu=10_000.0),
        ),
        decode=tuple(
            profiles.DecodePoint(context_length=k, concurrency=c, itl_ms=itl, tokens_per_s_per_gpu=c / (itl / 1e3))
            for k, c, itl in rows
        ),
    )


TINY = capacities.CapacityModel(tiny_profile())
# ISL 1000 prefills in S = 0.1 s alone. At p90 the wait quantile at utilisation 0.5 is
# S / (1 − 0.5) · ln(0.5 / 0.1) = 0.2 · ln 5 s, so this TTFT target allows ρ = 0.5: 5 requests/s.
TTFT_MS = (0.1 + 0.2 * math.log(5.0)) * 1e3
# ISL 1000 + OSL 400 would be context 1200; the decode cases use ISL 800, OSL 400: context 1000, a row,
# where ITL reaches 20 ms at concurrency 50: 50 / (400 × 0.020) = 6.25 requests/s per replica. Prefill at
# ISL 800 is below the grid and clamped to the ISL 1000 time (0.1 s), so still 5 requests/s.
SLA = v1alpha1.SlaTarget(ttft_ms=TTFT_MS, itl_ms=20.0, percentile=90)
LOAD = sizing.Load(rate_rps=20.0, isl=800, osl=400)
# The hand-computed cases size prefill as separate queues, one M/M/1 per replica (queue sharing 0):
# replicas = rate / the per-replica rate. A shared queue is tested on its own below.
SEPARATE = sizing.Corrections(prefill_pooling=0.0)


def bounds(low: int = 1, high: int = 8) -> v1alpha1.ScalingBounds:
    return v1alpha1.ScalingBounds(min=low, max=high)


def test_hand_computed_rates_behind_the_sizing_cases() -> None:
    assert TINY.prefill_rate_per_replica(800, TTFT_MS / 1e3) == pytest.approx(5.0)
    assert TINY.decode_rate_per_replica(800, 400, 0.020) == pytest.approx(6.25)


# -- size ------------------------------------------------------------------------------------------


def test_size_for_the_load() -> None:
    """Prefill: 20 / 5 = 4 replicas. Decode: 20 / 6.25 = 3.2 → 4 replicas."""
    desired = sizing.size(LOAD, TINY, SLA, SEPARATE)
    assert (desired.prefill, desired.decode) == (4, 4)
    assert dict(desired.replicas) == {"prefill": 4, "decode": 4}
    assert "prefill 4" in desired.reason and "decode 4" in desired.reason


def test_size_rounds_exact_quotients_down() -> None:
    """Prefill 25 / 5 = 5 exactly, decode 25 / 6.25 = 4 exactly (floating point says 4.000000000000001;
    the planner must not buy a fifth replica for it)."""
    desired = sizing.size(sizing.Load(25.0 * 1.0000000000000002, 800, 400), TINY, SLA, SEPARATE)
    assert (desired.prefill, desired.decode) == (5, 4)


def test_prefill_and_decode_are_sized_for_their_own_rates() -> None:
    """The input-token and output-token loads have their own quantiles: 20 prompts/s for prefill
    (4 replicas), 30 outputs/s for decode (30 / 6.25 = 4.8 → 5); the reason names both rates."""
    desired = sizing.size(sizing.Load(20.0, 800, 400, decode_rate_rps=30.0), TINY, SLA, SEPARATE)
    assert (desired.prefill, desired.decode) == (4, 5)
    assert "20 req/s of prompts, 30 of outputs" in desired.reason
    decode_only = sizing.size(sizing.Load(0.0, 800, 400, decode_rate_rps=1.0), TINY, SLA)
    assert (decode_only.prefill, decode_only.decode) == (0, 1)


def test_corrections_raise_and_lower_replicas() -> None:
    """A prefill replica 1.5× slower than its profile takes 0.15 s per prompt alone and 1.5× as long in
    queue: the profile is asked for the target ÷ 1.5 and the rate it gives divided by 1.5, which buys
    more than 1.5× the replicas (the lone TTFT eats into the queueing slack too). Decode 0.5× faster:
    the profile at twice the ITL target (its grid's last row), then twice that rate."""
    ttft_s, itl_s = SLA.ttft_ms / 1e3, SLA.itl_ms / 1e3
    desired = sizing.size(LOAD, TINY, SLA, sizing.Corrections(prefill=1.5, decode=0.5, prefill_pooling=0.0))
    slower = TINY.prefill_rate_per_replica(800, ttft_s / 1.5) / 1.5
    faster = TINY.decode_rate_per_replica(800, 400, itl_s / 0.5) / 0.5
    assert (desired.prefill, desired.decode) == (math.ceil(20 / slower), math.ceil(20 / faster))
    assert desired.prefill > 6 and desired.decode == 2  # 20 / (100 / (400 × 0.030) × 2) = 1.2 → 2
    assert "prefill correction 1.50" in desired.reason
    # Below 1 is honoured for prefill too (fleetpilot's difference from a prefill correction capped at 1).
    lower = sizing.size(LOAD, TINY, SLA, sizing.Corrections(prefill=0.6, prefill_pooling=0.0))
    assert lower.prefill < 4  # 4 without the correction


def test_corrections_are_clamped() -> None:
    """10× is used as 3×, 0.1× as 0.5×."""
    clamped = sizing.size(LOAD, TINY, SLA, sizing.Corrections(prefill=10.0, decode=0.1))
    at_bounds = sizing.size(LOAD, TINY, SLA, sizing.Corrections(prefill=3.0, decode=0.5))
    assert dict(clamped.replicas) == dict(at_bounds.replicas)
    assert "clamped from 10.00" in clamped.reason
    assert sizing.clamp_correction(float("nan")) == 1.0
    assert (sizing.CORRECTION_MIN, sizing.CORRECTION_MAX) == (0.5, 3.0)


def test_a_latency_offset_comes_off_the_target_up_to_half_of_it() -> None:
    """Latency the profile does not model (HTTP, the KV transfer, the long prompts of the mix) leaves
    less of the target for queueing; it is credited up to half the target, and never below zero."""
    ttft_s = SLA.ttft_ms / 1e3
    offset = 0.1 * ttft_s
    desired = sizing.size(LOAD, TINY, SLA, sizing.Corrections(prefill_offset_s=offset, prefill_pooling=0.0))
    assert desired.prefill == math.ceil(20 / TINY.prefill_rate_per_replica(800, ttft_s - offset)) > 4
    assert "ms of TTFT latency the profile does not model" in desired.reason
    huge = sizing.size(LOAD, TINY, SLA, sizing.Corrections(prefill_offset_s=10.0, prefill_pooling=0.0))
    half = sizing.size(LOAD, TINY, SLA, sizing.Corrections(prefill_offset_s=0.5 * ttft_s, prefill_pooling=0.0))
    assert huge.prefill == half.prefill
    negative = sizing.size(LOAD, TINY, SLA, sizing.Corrections(prefill_offset_s=-1.0, prefill_pooling=0.0))
    assert negative.prefill == sizing.size(LOAD, TINY, SLA, SEPARATE).prefill == 4


def test_correction_from_latencies() -> None:
    assert sizing.correction(0.6, 0.4) == pytest.approx(1.5)
    assert sizing.correction(None, 0.4) == 1.0
    assert sizing.correction(0.6, 0.0) == 1.0
    assert sizing.correction(0.6, math.inf) == 1.0


def test_no_load_needs_no_replicas_and_any_load_needs_one() -> None:
    idle = sizing.size(sizing.Load(0.0, 0.0, 0.0), TINY, SLA)
    assert (idle.prefill, idle.decode) == (0, 0)
    trickle = sizing.size(sizing.Load(0.001, 800, 400), TINY, SLA)
    assert (trickle.prefill, trickle.decode) == (1, 1)


def test_unreachable_ttft_sizes_for_the_floor_plus_a_margin_and_says_so() -> None:
    """A 50 ms TTFT target at ISL 800 (0.1 s alone) cannot be met by any pool. Sizing for the floor itself
    would keep the p90 request from waiting at all (ρ = 0.1: 20 separate replicas for 20 requests/s); the
    planner sizes for the floor + 25% (125 ms) instead and names target and floor."""
    sla = v1alpha1.SlaTarget(ttft_ms=50.0, itl_ms=20.0)
    desired = sizing.size(LOAD, TINY, sla, SEPARATE)
    relaxed = sizing.size(LOAD, TINY, v1alpha1.SlaTarget(ttft_ms=125.0, itl_ms=20.0), SEPARATE)
    assert desired.prefill == relaxed.prefill < 20
    assert set(desired.infeasible) == {"prefill"} and not relaxed.infeasible
    assert "TTFT target 50 ms at p90 is below the floor of 100 ms" in desired.infeasible["prefill"]
    assert "sized for 125 ms (the floor + 25%)" in desired.infeasible["prefill"]


def test_unreachable_itl_does_not_send_decode_to_its_maximum() -> None:
    """ITL 5 ms where one sequence alone takes 10 ms: one sequence per replica would need 20 / 0.25 = 80
    replicas (0.25 requests/s each at OSL 400), every one of them missing the target anyway. Sized for the
    floor + 25% (12.5 ms: 13.25 sequences, 2.65 requests/s per replica): 8 replicas."""
    sla = v1alpha1.SlaTarget(ttft_ms=TTFT_MS, itl_ms=5.0)
    desired = sizing.size(LOAD, TINY, sla, SEPARATE)
    assert desired.decode == 8 == math.ceil(20 / TINY.decode_rate_per_replica(800, 400, 0.0125))
    assert set(desired.infeasible) == {"decode"}
    assert "ITL target 5.0 ms is below the floor of 10.0 ms" in desired.infeasible["decode"]
    # A correction and an offset move the floor the fleet sees: 10 ms × 1.5 + 2 ms.
    slower = sizing.size(LOAD, TINY, sla, sizing.Corrections(decode=1.5, decode_offset_s=0.002, prefill_pooling=0.0))
    assert "below the floor of 17.0 ms" in slower.infeasible["decode"]
    aggregated = sizing.size_aggregated(LOAD, TINY, sla, SEPARATE)
    assert "ITL target 5.0 ms" in aggregated.infeasible["aggregated"]


def test_a_context_no_kv_cache_holds_is_infeasible_with_one_replica() -> None:
    small = capacities.CapacityModel(tiny_profile(kv_capacity_tokens=500))
    desired = sizing.size(LOAD, small, SLA, SEPARATE)
    assert desired.decode == 1
    assert "exceeds the KV cache" in desired.infeasible["decode"]


def test_reachable_targets_are_feasible() -> None:
    assert sizing.size(LOAD, TINY, SLA, SEPARATE).infeasible == {}


def test_decode_pool_may_have_its_own_capacity_model() -> None:
    """A decode pool whose KV cache holds only 20,000 tokens is full at 20 sequences of context 1000
    (a wall), where a replica serves 20 / (400 × (0.010 + 0.010 × 19 / 49)) = 3.603 requests/s; it is
    planned at 0.9 of that rate, 3.243 → 20 / 3.243 → 7 replicas (the shared model's 6.25 → 4)."""
    small = capacities.CapacityModel(tiny_profile(kv_capacity_tokens=20_000))
    desired = sizing.size(LOAD, TINY, SLA, decode_capacity=small)
    wall_rate = 20 / (400 * (0.010 + 0.010 * 19 / 49))
    assert small.decode_rate_per_replica(800, 400, 0.020) == pytest.approx(0.9 * wall_rate)
    assert (desired.prefill, desired.decode) == (4, math.ceil(20 / (0.9 * wall_rate)))
    assert desired.decode == 7


def test_size_aggregated_adds_the_phase_shares() -> None:
    """A replica's time goes to both phases: 20 / 5 + 20 / 6.25 = 4 + 3.2 = 7.2 → 8 replicas."""
    desired = sizing.size_aggregated(LOAD, TINY, SLA, SEPARATE)
    assert dict(desired.replicas) == {"aggregated": 8}
    assert desired.aggregated == 8
    assert "4.00" in desired.reason and "3.20" in desired.reason
    corrected = sizing.size_aggregated(LOAD, TINY, SLA, sizing.Corrections(prefill=2.0, prefill_pooling=0.0))
    slower = TINY.prefill_rate_per_replica(800, SLA.ttft_ms / 1e3 / 2.0) / 2.0
    assert corrected.aggregated == math.ceil(20 / slower) + math.ceil(3.2)  # the prefill pool is whole replicas


def test_invalid_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="rate_rps"):
        sizing.Load(-1.0, 100, 100)
    with pytest.raises(ValueError, match="decode_rps"):
        sizing.Load(1.0, 100, 100, decode_rate_rps=math.nan)


# -- constrain, by hand ----------------------------------------------------------------------------------

DISAGG_BOUNDS: dict[sizing.Pool, v1alpha1.ScalingBounds] = {"prefill": bounds(), "decode": bounds()}
GPUS: dict[sizing.Pool, int] = {"prefill": 1, "decode": 2}
NO_WAIT = sizing.ScaleDownState()


def desire(prefill: int, decode: int) -> sizing.Desired:
    return sizing.Desired({"prefill": prefill, "decode": decode}, "test")


def decide(
    want: sizing.Desired,
    current: Mapping[sizing.Pool, int],
    *,
    state: sizing.ScaleDownState = NO_WAIT,
    now: float = 0.0,
    budget: int | None = None,
    bounds_: Mapping[sizing.Pool, v1alpha1.ScalingBounds] = DISAGG_BOUNDS,
    max_step_up: int | None = None,
    data_ok: bool = True,
    safe: Mapping[sizing.Pool, int] | None = None,
    max_step_down: int | None = 1,
) -> sizing.Decision:
    return sizing.constrain(
        want,
        current=current,
        bounds=bounds_,
        gpus_per_replica=GPUS,
        gpu_budget=budget,
        state=state,
        now=now,
        hold_seconds=300.0,
        max_step_down=max_step_down,
        max_step_up=max_step_up,
        data_ok=data_ok,
        data_note="Prometheus unreachable",
        safe=safe,
    )


def test_scale_up_is_immediate_and_may_be_step_limited() -> None:
    decision = decide(desire(6, 3), {"prefill": 2, "decode": 2})
    assert (decision.prefill, decision.decode) == (6, 3)
    assert any("prefill: scale up 2 → 6" in r for r in decision.reasons)
    limited = decide(desire(6, 3), {"prefill": 2, "decode": 2}, max_step_up=2)
    assert (limited.prefill, limited.decode) == (4, 3)


def test_scale_down_waits_for_the_hold_period_then_steps() -> None:
    """Desired 2 against current 4 from t = 0, hold 300 s, one replica per step: kept at t = 0 and
    200, 3 at t = 300, kept at 500, 2 at 600, and nothing left waiting."""
    current: dict[sizing.Pool, int] = {"prefill": 4, "decode": 1}
    state = NO_WAIT
    seen = []
    for now in (0.0, 200.0, 300.0, 500.0, 600.0, 700.0):
        decision = decide(desire(2, 1), current, state=state, now=now)
        current, state = dict(decision.replicas), decision.state
        seen.append(decision.prefill)
    assert seen == [4, 4, 3, 3, 2, 2]
    assert state.waiting_since == {}


def test_a_pool_above_what_a_cautious_forecast_needs_goes_down_to_it_at_once() -> None:
    """Prefill 10 wanting 3, and even the cautious forecast wanting only 5: down to 5 now, the last two
    after the hold, as any scale-down. Decode 4 wanting 2 with a cautious 4: the hold as usual. Never
    below the target, never more than max_step_down in a step."""
    current: dict[sizing.Pool, int] = {"prefill": 10, "decode": 4}
    now_ = decide(desire(3, 2), current, safe={"prefill": 5, "decode": 4}, max_step_down=None)
    assert (now_.prefill, now_.decode) == (5, 4)
    assert any("prefill: scale down 10 → 5 at once" in r for r in now_.reasons)
    assert now_.state.waiting_since == {"prefill": 0.0, "decode": 0.0} and now_.binding["prefill"] == "hold"
    later = decide(desire(3, 2), dict(now_.replicas), state=now_.state, now=300.0, safe={"prefill": 5, "decode": 4},
                   max_step_down=None)
    assert (later.prefill, later.decode) == (3, 2)
    below_target = decide(desire(6, 2), current, safe={"prefill": 2, "decode": 4}, max_step_down=None)
    assert below_target.prefill == 6
    stepped = decide(desire(3, 2), current, safe={"prefill": 5, "decode": 4}, max_step_down=2)
    assert stepped.prefill == 8


def test_a_rising_desire_restarts_the_wait() -> None:
    first = decide(desire(2, 1), {"prefill": 4, "decode": 1}, now=0.0)
    assert first.state.waiting_since == {"prefill": 0.0}
    back = decide(desire(4, 1), {"prefill": 4, "decode": 1}, state=first.state, now=200.0)
    assert back.state.waiting_since == {}
    again = decide(desire(2, 1), {"prefill": 4, "decode": 1}, state=back.state, now=400.0)
    assert again.prefill == 4  # only 0 s below since the restart, not 400
    assert any("for 0 s of the 300 s hold" in r for r in again.reasons)


def test_bounds_clamp_desire_and_skip_hysteresis() -> None:
    clamped = decide(desire(20, 0), {"prefill": 2, "decode": 2})
    assert (clamped.prefill, clamped.decode) == (8, 2)  # decode 0 → min 1 waits below current 2
    assert any("clamped to max 8" in r for r in clamped.reasons)
    shrunk = decide(desire(3, 3), {"prefill": 12, "decode": 3})  # the bounds were lowered under it
    assert shrunk.prefill == 8
    assert any("outside [1, 8]" in r for r in shrunk.reasons)


def test_budget_cuts_the_pool_with_most_slack_relative_to_need() -> None:
    """Prefill held at 6 by hysteresis needs 3 (slack 2×), decode 4 needs 4 (1×): 6 + 4 × 2 = 14 GPUs
    over a budget of 12, so prefill gives two replicas back."""
    decision = decide(desire(3, 4), {"prefill": 6, "decode": 4}, budget=12)
    assert (decision.prefill, decision.decode) == (4, 4)
    assert any("GPU budget 12" in r and "prefill 6 → 4" in r for r in decision.reasons)


def test_budget_cut_on_equal_slack_frees_the_most_gpus_first() -> None:
    """Both want 4 (4 + 8 = 12 GPUs, budget 10): equal slack, so the cut that frees more GPUs goes first
    (decode, 2 GPUs): 4 + 3 × 2 = 10."""
    decision = decide(desire(4, 4), {"prefill": 1, "decode": 1}, budget=10)
    assert (decision.prefill, decision.decode) == (4, 3)


def test_budget_below_the_minimums_keeps_the_minimums_and_says_so() -> None:
    mins: dict[sizing.Pool, v1alpha1.ScalingBounds] = {"prefill": bounds(2, 8), "decode": bounds(2, 8)}
    decision = decide(desire(5, 5), {"prefill": 2, "decode": 2}, budget=4, bounds_=mins)
    assert (decision.prefill, decision.decode) == (2, 2)
    assert any("minimums alone need 6 GPUs" in r for r in decision.reasons)


def test_missing_data_holds_everything_and_says_why() -> None:
    waiting = sizing.ScaleDownState({"prefill": 0.0})
    decision = decide(desire(1, 8), {"prefill": 4, "decode": 2}, state=waiting, now=1000.0, data_ok=False)
    assert (decision.prefill, decision.decode) == (4, 2)
    assert "Prometheus unreachable" in decision.reasons[0]
    assert decision.state.waiting_since == {}


def test_aggregated_graphs_constrain_their_one_pool() -> None:
    decision = sizing.constrain(
        sizing.Desired({"aggregated": 5}, "test"),
        current={"aggregated": 2},
        bounds={"aggregated": bounds()},
        gpus_per_replica={"aggregated": 4},
        gpu_budget=16,
        state=NO_WAIT,
        now=0.0,
        hold_seconds=60.0,
    )
    assert decision.aggregated == 4  # 5 × 4 GPUs = 20 > 16
    assert dict(decision.replicas) == {"aggregated": 4}


def test_constrain_refuses_missing_pools() -> None:
    with pytest.raises(ValueError, match="bounds"):
        sizing.constrain(
            desire(1, 1),
            current={"prefill": 1, "decode": 1},
            bounds={"prefill": bounds()},
            gpus_per_replica=GPUS,
            gpu_budget=None,
            state=NO_WAIT,
            now=0.0,
            hold_seconds=0.0,
        )


# -- constrain, properties ----------------------------------------------------------------------------------

POOL_PAIR: tuple[sizing.Pool, ...] = ("prefill", "decode")


@st.composite
def bounds_pairs(draw: st.DrawFn) -> dict[sizing.Pool, v1alpha1.ScalingBounds]:
    result = {}
    for pool in POOL_PAIR:
        low = draw(st.integers(0, 6))
        result[pool] = bounds(low, draw(st.integers(max(low, 1), 12)))
    return result


replica_counts = st.integers(0, 20)
pairs = st.fixed_dictionaries({"prefill": replica_counts, "decode": replica_counts})
gpu_pairs = st.fixed_dictionaries({"prefill": st.integers(1, 4), "decode": st.integers(1, 8)})
states = st.dictionaries(st.sampled_from(POOL_PAIR), st.floats(-1000, 1000)).map(sizing.ScaleDownState)


def min_gpus(limits: Mapping[sizing.Pool, v1alpha1.ScalingBounds], gpus: Mapping[sizing.Pool, int]) -> int:
    return sum(limits[pool].min_replicas * gpus[pool] for pool in POOL_PAIR)


@PROPERTY
@given(
    want=pairs,
    current=pairs,
    limits=bounds_pairs(),
    gpus=gpu_pairs,
    budget=st.none() | st.integers(0, 120),
    state=states,
    now=st.floats(0, 5000),
    hold=st.floats(0, 1000),
    step_down=st.integers(1, 5),
    step_up=st.none() | st.integers(1, 5),
)
def test_replicas_stay_within_bounds_and_budget(
    want: dict[sizing.Pool, int],
    current: dict[sizing.Pool, int],
    limits: dict[sizing.Pool, v1alpha1.ScalingBounds],
    gpus: dict[sizing.Pool, int],
    budget: int | None,
    state: sizing.ScaleDownState,
    now: float,
    hold: float,
    step_down: int,
    step_up: int | None,
) -> None:
    decision = sizing.constrain(
        sizing.Desired(want, "test"),
        current=current,
        bounds=limits,
        gpus_per_replica=gpus,
        gpu_budget=budget,
        state=state,
        now=now,
        hold_seconds=hold,
        max_step_down=step_down,
        max_step_up=step_up,
    )
    for pool in POOL_PAIR:
        assert limits[pool].min_replicas <= decision.replicas[pool] <= limits[pool].max_replicas
    used = sum(decision.replicas[pool] * gpus[pool] for pool in POOL_PAIR)
    if budget is not None and min_gpus(limits, gpus) <= budget:
        assert used <= budget
    assert decision.reasons


@PROPERTY
@given(want=pairs, current=pairs, limits=bounds_pairs(), budget=st.none() | st.integers(0, 40), state=states)
def test_missing_data_never_changes_replicas(
    want: dict[sizing.Pool, int],
    current: dict[sizing.Pool, int],
    limits: dict[sizing.Pool, v1alpha1.ScalingBounds],
    budget: int | None,
    state: sizing.ScaleDownState,
) -> None:
    decision = sizing.constrain(
        sizing.Desired(want, "test"),
        current=current,
        bounds=limits,
        gpus_per_replica=GPUS,
        gpu_budget=budget,
        state=state,
        now=100.0,
        hold_seconds=0.0,
        max_step_down=5,
        data_ok=False,
    )
    assert dict(decision.replicas) == current


@PROPERTY
@given(
    steps=st.lists(
        st.tuples(st.floats(0, 400), st.integers(0, 15), st.integers(0, 15), st.booleans() | st.just(True)),
        min_size=1,
        max_size=40,
    ),
    limits=bounds_pairs(),
    start=pairs,
    hold=st.floats(0, 600),
    step_down=st.integers(1, 3),
    step_up=st.none() | st.integers(1, 4),
)
def test_hysteresis_over_a_sequence_of_intervals(
    steps: list[tuple[float, int, int, bool]],
    limits: dict[sizing.Pool, v1alpha1.ScalingBounds],
    start: dict[sizing.Pool, int],
    hold: float,
    step_down: int,
    step_up: int | None,
) -> None:
    """Over any sequence of desired values, times and data gaps (no budget, replicas within bounds):
    a pool scales down only after its target has stayed below its replicas for the hold period, by
    at most max_step_down, at most once per hold period; it scales up at once (by max_step_up)."""
    current: dict[sizing.Pool, int] = {
        pool: min(max(start[pool], limits[pool].min_replicas), limits[pool].max_replicas) for pool in POOL_PAIR
    }
    state = sizing.ScaleDownState()
    now = 0.0
    below_since: dict[sizing.Pool, float | None] = {pool: None for pool in POOL_PAIR}
    last_down: dict[sizing.Pool, float | None] = {pool: None for pool in POOL_PAIR}
    for dt, want_prefill, want_decode, data_ok in steps:
        now += dt
        want: dict[sizing.Pool, int] = {"prefill": want_prefill, "decode": want_decode}
        decision = sizing.constrain(
            sizing.Desired(want, "test"),
            current=current,
            bounds=limits,
            gpus_per_replica=GPUS,
            gpu_budget=None,
            state=state,
            now=now,
            hold_seconds=hold,
            max_step_down=step_down,
            max_step_up=step_up,
            data_ok=data_ok,
        )
        for pool in POOL_PAIR:
            before, after = current[pool], decision.replicas[pool]
            target = min(max(want[pool], limits[pool].min_replicas), limits[pool].max_replicas)
            if not data_ok:
                assert after == before
                continue
            # The streak of "target below replicas" as an outside observer sees it (data gaps included).
            if target < before:
                if below_since[pool] is None:
                    below_since[pool] = now
            else:
                below_since[pool] = None
            streak_start = below_since[pool]
            if after < before:
                assert streak_start is not None and now - streak_start >= hold
                assert before - after <= step_down
                assert after >= target
                previous = last_down[pool]
                assert previous is None or now - previous >= hold
                last_down[pool] = now
            if target > before:
                assert after == (target if step_up is None else min(target, before + step_up))
            if target == before:
                assert after == before
        current, state = dict(decision.replicas), decision.state


def test_scale_down_lands_on_the_highest_target_of_the_hold_as_the_hpa_does() -> None:
    """Without a step limit, a pool held at 8 whose targets were 5, 3 and 4 during the 300 s hold goes
    to 5 (the highest of them) when the hold ends, in one step; then waits a full hold again."""
    current: dict[sizing.Pool, int] = {"prefill": 8, "decode": 1}
    state = NO_WAIT
    seen = []
    for now, want in ((0.0, 5), (100.0, 3), (200.0, 4), (300.0, 2), (400.0, 2), (600.0, 2)):
        decision = sizing.constrain(
            desire(want, 1), current=current, bounds=DISAGG_BOUNDS, gpus_per_replica=GPUS, gpu_budget=None,
            state=state, now=now, hold_seconds=300.0)
        current, state = dict(decision.replicas), decision.state
        seen.append(decision.prefill)
    assert seen == [8, 8, 8, 5, 5, 2]
    assert state.waiting_since == {}


def test_each_pool_says_what_set_its_replicas() -> None:
    """The forecast, the bounds, the hold, the budget or missing data: one word per pool, for status and metrics."""
    assert dict(decide(desire(6, 3), {"prefill": 2, "decode": 3}).binding) == {"prefill": "forecast", "decode": "forecast"}
    assert decide(desire(20, 3), {"prefill": 2, "decode": 3}).binding["prefill"] == "bounds"
    assert decide(desire(2, 3), {"prefill": 4, "decode": 3}).binding["prefill"] == "hold"
    assert decide(desire(6, 3), {"prefill": 2, "decode": 2}, max_step_up=2).binding["prefill"] == "step-limit"
    assert decide(desire(3, 4), {"prefill": 6, "decode": 4}, budget=12).binding["prefill"] == "budget"
    assert set(decide(desire(1, 1), {"prefill": 4, "decode": 2}, data_ok=False).binding.values()) == {"no-data"}


def test_a_learned_running_cap_limits_what_a_decode_replica_is_sized_for() -> None:
    """The profile lets a decode replica run up to its ITL ceiling (50); a fleet whose engines run at most 20
    sequences each serves fewer requests per replica, and sizing uses the smaller ceiling: a wall, planned
    where a replica serves 0.9 of its rate there (20 / (400 × 0.01388) = 3.603 requests/s): 3.243, at
    c = 12.97 + 0.2647 × (c − 1), c = 17.28 sequences."""
    free = TINY.decode_capacity(800, 400, 0.020)
    capped = TINY.decode_capacity(800, 400, 0.020, max_running=20.0)
    assert free.max_concurrency > 20 and capped.limited_by == "engine"
    assert capped.max_concurrency == pytest.approx(17.28, abs=0.01)
    assert capped.rate_rps == pytest.approx(0.9 * 20 / (400 * (0.010 + 0.010 * 19 / 49)))
    assert capped.rate_rps < free.rate_rps
    plain = sizing.size(LOAD, TINY, SLA)
    learned = sizing.size(LOAD, TINY, SLA, sizing.Corrections(decode_max_running=20.0))
    assert learned.decode > plain.decode and learned.prefill == plain.prefill
    assert "the fleet runs at most 20 sequences per replica" in learned.reason
