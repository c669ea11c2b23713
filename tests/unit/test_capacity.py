"""The capacity model: requests/s per replica at latency targets, computed by hand on a tiny profile,
and the monotonicity the planner relies on, on the measured and the modelled profiles."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from fleetpilot import perfmodel
from fleetpilot.api import profile as profiles
from fleetpilot.planner import capacity as capacities
from fleetpilot.planner import lengths

CALIBRATION = Path(__file__).resolve().parents[2].parent / "shared" / "traces" / "calibration"
needs_data = pytest.mark.skipif(not CALIBRATION.is_dir(), reason=f"no calibration data at {CALIBRATION}")


def tiny_profile(*, gpus: int = 1, saturated_share: float = 1.0) -> profiles.Profile:
    """A profile whose rates are easy to compute by hand.

    Prefill (per replica, `gpus` GPUs): ISL 1000 takes 100 ms alone, ISL 2000 takes 200 ms, so the
    throughput is 10,000 tokens/s per replica at both and the service time is isl / 10,000 s.

    Decode, KV capacity 100,000 tokens:

        context 1000: concurrency 1 → ITL 10 ms, 50 → 20 ms, 100 → 30 ms
        context 3000: concurrency 1 → ITL 14 ms, 50 → 30 ms, 100 → 50 ms

    with tokens/s = concurrency / ITL (every sequence runs: share 1), except the last point of the
    first row, whose throughput is `saturated_share` of that.
    """

    def decode(context: int, concurrency: int, itl_ms: float, share: float = 1.0) -> profiles.DecodePoint:
        tokens = share * concurrency / (itl_ms / 1e3) / gpus
        return profiles.DecodePoint(
            context_length=context, concurrency=concurrency, itl_ms=itl_ms, tokens_per_s_per_gpu=tokens
        )

    return profiles.Profile(
        model="tiny",
        engine="simulator",
        gpu="none",
        tensor_parallel=gpus,
        gpus_per_replica=gpus,
        kv_capacity_tokens=100_000,
        prefill=(
            profiles.PrefillPoint(isl=1000, ttft_ms=100.0, tokens_per_s_per_gpu=10_000.0 / gpus),
            profiles.PrefillPoint(isl=2000, ttft_ms=200.0, tokens_per_s_per_gpu=10_000.0 / gpus),
        ),
        decode=(
            decode(1000, 1, 10.0),
            decode(1000, 50, 20.0),
            decode(1000, 100, 30.0, saturated_share),
            decode(3000, 1, 14.0),
            decode(3000, 50, 30.0),
            decode(3000, 100, 50.0),
        ),
    )


TINY = capacities.CapacityModel(tiny_profile())


# -- prefill, by hand --------------------------------------------------------------------------------


def test_prefill_rate_at_a_target_that_allows_half_utilisation() -> None:
    """ISL 1000: S = 0.1 s, lone TTFT 0.1 s. At p90 (tail 0.1) and ρ = 0.5 the wait quantile is
    S / (1 − ρ) · ln(ρ / 0.1) = 0.2 · ln 5 = 0.32189 s, so a target of 0.1 + 0.32189 s allows
    exactly ρ = 0.5: 0.5 / 0.1 s = 5 requests/s."""
    target = 0.1 + 0.2 * math.log(5.0)
    capacity = TINY.prefill_capacity(1000, target, percentile=90)
    assert capacity.target_met
    assert capacity.utilization == pytest.approx(0.5, rel=1e-9)
    assert capacity.rate_rps == pytest.approx(5.0, rel=1e-9)
    assert TINY.prefill_rate_per_replica(1000, target) == pytest.approx(5.0, rel=1e-9)
    # and the model expects that TTFT back at that load (what corrections are measured against)
    assert TINY.expected_ttft_s(1000, 5.0, percentile=90) == pytest.approx(target)


def test_prefill_rate_when_the_target_equals_the_lone_ttft() -> None:
    """No slack for waiting: only ρ ≤ 1 − p keeps p90 of the requests from waiting at all.
    ρ = 0.1 at S = 0.1 s: 1 request/s. At p50 the same target allows ρ = 0.5: 5 requests/s."""
    assert TINY.prefill_rate_per_replica(1000, 0.1, percentile=90) == pytest.approx(1.0)
    assert TINY.prefill_rate_per_replica(1000, 0.1, percentile=50) == pytest.approx(5.0)


def test_prefill_rate_is_capped_at_max_utilisation() -> None:
    """A 10 s target would allow ρ ≈ 0.97 by the queue model; the cap is 0.9: 9 requests/s at S = 0.1 s,
    and 0.6 with max_utilization 0.6: 6 requests/s."""
    assert TINY.prefill_rate_per_replica(1000, 10.0) == pytest.approx(9.0)
    relaxed = capacities.CapacityModel(tiny_profile(), max_utilization=0.6)
    assert relaxed.prefill_rate_per_replica(1000, 10.0) == pytest.approx(6.0)
    assert "utilisation cap" in TINY.prefill_capacity(1000, 10.0).reason


def test_unreachable_ttft_gives_zero_and_the_check_says_why() -> None:
    """ISL 1500: lone TTFT 150 ms (halfway between 100 and 200). A 120 ms target cannot be met by any
    number of replicas; the best effort keeps the percentile from waiting: ρ = 0.1 at S = 0.15 s."""
    check = TINY.check_ttft_target(1500, 0.12)
    assert not check.met
    assert "unreachable" in check.reason and "150 ms" in check.reason
    capacity = TINY.prefill_capacity(1500, 0.12)
    assert capacity.rate_rps == 0.0
    assert not capacity.target_met
    assert capacity.best_effort_rps == pytest.approx(0.1 / 0.15)
    assert TINY.check_ttft_target(1500, 0.2).met


def test_prefill_service_time_interpolates_time_not_throughput() -> None:
    """Times interpolate linearly in ISL; past the longest ISL the edge throughput (10,000 tokens/s) is
    kept: ISL 4000 takes 0.4 s, extrapolated. Two GPUs at the same per-GPU rate halve the time."""
    assert TINY.prefill_service_s(1500) == capacities.Interpolated(pytest.approx(0.15), False)  # type: ignore[arg-type]
    beyond = TINY.prefill_service_s(4000)
    assert beyond.extrapolated and beyond.value == pytest.approx(0.4)
    assert TINY.lone_ttft_s(4000).value == pytest.approx(0.4)
    assert TINY.prefill_capacity(4000, 1.0).extrapolated
    below = TINY.lone_ttft_s(500)
    assert below.extrapolated and below.value == pytest.approx(0.1)
    double = capacities.CapacityModel(tiny_profile(gpus=2))
    assert double.prefill_service_s(1000).value == pytest.approx(0.1)  # 5,000 per GPU × 2 = 10,000
    wide = tiny_profile()
    two_gpus = wide.model_copy(update={"gpus_per_replica": 2, "tensor_parallel": 2})
    assert capacities.CapacityModel(two_gpus).prefill_service_s(1000).value == pytest.approx(0.05)


# -- decode, by hand ---------------------------------------------------------------------------------


def test_decode_rate_where_the_itl_target_crosses_a_grid_point() -> None:
    """ISL 800 + OSL 400 / 2 = context 1000, a measured row. ITL reaches 20 ms at concurrency 50:
    50 / (400 tokens × 0.020 s) = 6.25 requests/s."""
    capacity = TINY.decode_capacity(800, 400, 0.020)
    assert capacity.context_length == 1000
    assert capacity.concurrency == pytest.approx(50)
    assert capacity.limited_by == "itl"
    assert capacity.rate_rps == pytest.approx(6.25)
    assert not capacity.extrapolated


def test_decode_rate_between_grid_points() -> None:
    """Target 25 ms at context 1000: ITL goes 20 → 30 ms from 50 to 100, so 25 ms at 75:
    75 / (400 × 0.025) = 7.5 requests/s."""
    assert TINY.decode_rate_per_replica(800, 400, 0.025) == pytest.approx(7.5)
    assert TINY.expected_itl_s(800, 400, 7.5) == pytest.approx(0.025)


def test_decode_rate_limited_by_the_kv_cache() -> None:
    """ISL 1800, OSL 400: context 2000, halfway between the rows, so ITL(c) is the rows' mean:
    12 ms at 1, 25 ms at 50, 40 ms at 100. The KV cache holds 100,000 / 2000 = 50 such sequences,
    a wall past which requests queue for a slot: at it a replica serves 50 / (400 × 0.025) = 5
    requests/s, so a 40 ms target stops where it serves max_utilization (0.9) of that, 4.5 requests/s:
    c = 4.5 × 400 × (0.012 + (c − 1) × 0.013 / 49), c = 21.122 / 0.52245 = 40.43 sequences (not the 45
    that 0.9 of the wall's sequences would be: at 45 it serves 4.75, 95% of the wall's rate). At
    max_utilization 0.6: 3 requests/s, c = 14.082 / 0.68163 = 20.66."""
    assert TINY.itl_s(50, 2000).value == pytest.approx(0.025)
    capacity = TINY.decode_capacity(1800, 400, 0.040)
    assert capacity.limited_by == "kv"
    assert capacity.max_concurrency == capacity.concurrency == pytest.approx(40.43, abs=0.01)
    assert capacity.rate_rps == pytest.approx(4.5)
    assert capacity.itl_s == pytest.approx(0.012 + (capacity.concurrency - 1) * 0.013 / 49)
    relaxed = capacities.CapacityModel(tiny_profile(), max_utilization=0.6).decode_capacity(1800, 400, 0.040)
    assert relaxed.concurrency == pytest.approx(20.66, abs=0.01)
    assert relaxed.rate_rps == pytest.approx(3.0)


def test_an_engine_batch_cap_is_a_wall_planned_below() -> None:
    """The engine runs at most 40 sequences (max_num_seqs): below the KV cache's 50, so it binds. At 40 a
    replica serves 40 / (400 × (0.012 + 39 × 0.013 / 49)) = 4.475 requests/s; the ceiling is where it
    serves 0.9 of that, 4.027: c = 1611 × (0.012 + (c − 1) × 0.013 / 49), c = 33.0, where the 40 ms
    target alone would allow 50."""
    capacity = TINY.decode_capacity(1800, 400, 0.040, max_running=40)
    wall_rate = 40 / (400 * (0.012 + 39 * 0.013 / 49))
    assert capacity.limited_by == "engine"
    assert capacity.max_concurrency == pytest.approx(33.0, abs=0.02)
    assert capacity.rate_rps == pytest.approx(0.9 * wall_rate)


def test_decode_rate_limited_by_the_measured_grid() -> None:
    """A 100 ms target at context 1000 is met at every measured concurrency; the model does not go past
    the highest one measured (100): 100 / (400 × 0.030) = 8.33 requests/s."""
    capacity = TINY.decode_capacity(800, 400, 0.100)
    assert capacity.limited_by == "grid"
    assert capacity.rate_rps == pytest.approx(100 / 12)


def test_decode_rate_counts_only_the_sequences_the_engine_runs() -> None:
    """If the engine ran only 60 % of the 100 offered sequences (measured tokens/s = 0.6 × 100 / 30 ms),
    the rate at 100 is 0.6 × 100 / (400 × 0.030) = 5 requests/s, below the 6.25 at 50. The best rate
    up to the ceiling lies inside the segment [50, 100], where ITL = a + b·c (a = 0.010, b = 0.0002)
    and share = p + q·c (p = 1.4, q = −0.008): the rate ∝ (p·c + q·c²) / (a + b·c) peaks where
    q·b·c² + 2·q·a·c + p·a = 0, i.e. c² + 100·c − 8750 = 0, c = (−100 + √45000) / 2 = 56.07, giving
    (1.4 − 0.008 · 56.07) · 56.07 / (0.010 + 0.0002 · 56.07) / 400 = 6.29 requests/s."""
    saturated = capacities.CapacityModel(tiny_profile(saturated_share=0.6))
    assert saturated.running_share(100, 1000).value == pytest.approx(0.6)
    assert saturated.decode_tokens_per_s(100, 1000).value == pytest.approx(0.6 * 100 / 0.030)
    capacity = saturated.decode_capacity(800, 400, 0.100)
    assert capacity.max_concurrency == pytest.approx(100)
    assert capacity.limited_by == "grid"
    peak = (-100 + math.sqrt(45_000)) / 2
    assert capacity.concurrency == pytest.approx(peak)
    assert capacity.rate_rps == pytest.approx((1.4 - 0.008 * peak) * peak / (0.010 + 0.0002 * peak) / 400)
    assert capacity.rate_rps == pytest.approx(6.29, abs=0.005)


def test_unreachable_itl_gives_zero_and_the_check_says_why() -> None:
    """Even one sequence at context 1000 takes 10 ms a token: a 5 ms target is out of reach. The
    best effort is one sequence at a time: 1 / (400 × 0.010) = 0.25 requests/s."""
    check = TINY.check_itl_target(800, 400, 0.005)
    assert not check.met and "unreachable" in check.reason
    capacity = TINY.decode_capacity(800, 400, 0.005)
    assert capacity.rate_rps == 0.0 and capacity.limited_by == "unreachable"
    assert capacity.best_effort_rps == pytest.approx(0.25)


def test_a_context_larger_than_the_kv_cache_is_unreachable() -> None:
    check = TINY.check_itl_target(150_000, 100, 1.0)
    assert not check.met and "KV cache" in check.reason
    assert TINY.decode_rate_per_replica(150_000, 100, 1.0) == 0.0


def test_decode_outside_the_grid_is_clamped_and_reported() -> None:
    """Context 5000 lies past the last row (3000): ITL is read off that row, flagged extrapolated."""
    read = TINY.itl_s(50, 5000)
    assert read.extrapolated and read.value == pytest.approx(0.030)
    assert TINY.itl_s(200, 1000) == capacities.Interpolated(pytest.approx(0.030), True)  # type: ignore[arg-type]
    assert TINY.itl_s(75, 2000) == capacities.Interpolated(pytest.approx((0.025 + 0.040) / 2), False)  # type: ignore[arg-type]
    capacity = TINY.decode_capacity(4900, 200, 0.025)  # context 5000
    assert capacity.extrapolated and "extrapolated" in capacity.reason


def test_invalid_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="isl"):
        TINY.prefill_rate_per_replica(0, 0.5)
    with pytest.raises(ValueError, match="itl_target_s"):
        TINY.decode_rate_per_replica(100, 100, -1.0)
    with pytest.raises(ValueError, match="percentile"):
        TINY.prefill_rate_per_replica(100, 0.5, percentile=100)
    with pytest.raises(ValueError, match="max_utilization"):
        capacities.CapacityModel(tiny_profile(), max_utilization=1.0)


# -- monotonicity on real profiles ---------------------------------------------------------------------


def measured() -> capacities.CapacityModel:
    profile = profiles.from_dynamo_csv(
        CALIBRATION / "h200_llama31_8b_fp8_vllm_prefill.csv",
        CALIBRATION / "h200_llama31_8b_fp8_vllm_decode.csv",
        model="llama-3.1-8b",
        engine="vllm",
        gpu="h200-sxm",
    )
    return capacities.CapacityModel(profile)


def modelled() -> capacities.CapacityModel:
    model = perfmodel.PerformanceModel(perfmodel.MODELS["llama-3.1-70b"], perfmodel.GPUS["h100-sxm"], tensor_parallel=4)
    profile = profiles.from_performance_model(
        model,
        isls=[128, 512, 1024, 2048, 4096, 8192, 16384, 32768],
        contexts=[256, 1024, 4096, 16384, 65536],
        concurrencies=[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024],
    )
    return capacities.CapacityModel(profile)


def models() -> list[capacities.CapacityModel]:
    return [modelled(), *([measured()] if CALIBRATION.is_dir() else [])]


TTFT_TARGETS_S = [0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.8, 1.2, 2.0, 5.0]
ITL_TARGETS_S = [x / 1000 for x in (3, 5, 8, 10, 12, 15, 20, 25, 30, 35, 40, 45, 50, 60, 80, 120)]
ISLS = [50, 100, 300, 1000, 2500, 5000, 9000, 14000, 20000, 40000]


@pytest.mark.parametrize("capacity", models(), ids=lambda c: c.profile.source.split(":")[0])
def test_tighter_ttft_targets_give_fewer_prefill_requests_per_replica(capacity: capacities.CapacityModel) -> None:
    for isl in ISLS:
        for percentile in (50, 90, 99):
            rates = [capacity.prefill_rate_per_replica(isl, t, percentile=percentile) for t in TTFT_TARGETS_S]
            assert rates == sorted(rates), (isl, percentile, rates)
    assert any(capacity.prefill_rate_per_replica(1000, t) > 0 for t in TTFT_TARGETS_S)


@pytest.mark.parametrize("capacity", models(), ids=lambda c: c.profile.source.split(":")[0])
def test_longer_prompts_give_fewer_prefill_requests_per_replica(capacity: capacities.CapacityModel) -> None:
    for target in TTFT_TARGETS_S:
        rates = [capacity.prefill_rate_per_replica(isl, target) for isl in ISLS]
        assert rates == sorted(rates, reverse=True), (target, rates)


@pytest.mark.parametrize("capacity", models(), ids=lambda c: c.profile.source.split(":")[0])
def test_tighter_itl_targets_give_fewer_decode_requests_per_replica(capacity: capacities.CapacityModel) -> None:
    for isl, osl in [(100, 50), (200, 300), (1000, 200), (3000, 500), (8000, 1000), (12000, 3000), (60000, 500)]:
        rates = [capacity.decode_rate_per_replica(isl, osl, t) for t in ITL_TARGETS_S]
        assert rates == sorted(rates), (isl, osl, rates)
        assert rates[-1] > 0


@needs_data
def test_measured_profile_rates_are_plausible() -> None:
    """Spot checks on the Dynamo H200 profile (Llama-3.1-8B-FP8, one GPU), against its own rows.

    Prefill at ISL 3151 (a row: 63.2 ms alone) within 500 ms at p90 runs the replica about 72 % busy:
    ≈ 0.72 / 0.0632 s ≈ 11 requests/s. Decode at context 2997 (ISL 2897 + OSL 200 / 2, a row) with a
    31.8 ms target stops at the row's point (241, 31.8 ms), which measured 7,390 tokens/s:
    7,390 / 200 ≈ 37 requests/s."""
    capacity = measured()
    prefill = capacity.prefill_capacity(3151, 0.5)
    assert prefill.service_time_s == pytest.approx(0.063215, rel=1e-5)  # 3151 / 49,845.958
    assert 0.70 < prefill.utilization < 0.74
    decode = capacity.decode_capacity(2897, 200, 0.0317967)
    assert decode.concurrency == pytest.approx(241)
    assert decode.rate_rps == pytest.approx(7390.4536 / 200)


# -- the prefill pool: one shared queue, separate queues, and the length mix ---------------------------------


def test_a_shared_queue_needs_fewer_replicas_than_separate_ones_computed_by_hand() -> None:
    """20 prompts/s of 0.1 s each (2 Erlangs) at a 200 ms p90 TTFT. One shared queue (M/M/c): with 3
    replicas Erlang C is 0.444 and the wait's tail decays at c − a = 1 per 0.1 s, so p90 TTFT is
    0.1 + 0.1·ln(4.44) = 0.249 s (too slow); with 4, C = 0.174 and p90 TTFT 0.1 + 0.05·ln(1.74) = 0.128 s.
    Separate queues: each replica an M/M/1 at its share, as many as the per-replica rate allows."""
    assert float(capacities.erlang_c(3, 2.0)) == pytest.approx(4 / 9, rel=1e-9)
    assert float(capacities.erlang_c(4, 2.0)) == pytest.approx(4 / 23, rel=1e-9)
    assert TINY.expected_ttft_pool_s(20.0, 3, isl=1000) == pytest.approx(0.1 + 0.1 * math.log(40 / 9), rel=1e-6)
    assert TINY.expected_ttft_pool_s(20.0, 4, isl=1000) == pytest.approx(0.1 + 0.05 * math.log(40 / 23), rel=1e-6)
    shared = TINY.prefill_pool(20.0, 0.2, isl=1000, pooling=1.0)
    assert shared.replicas == 4 and shared.target_met
    separate = TINY.prefill_pool(20.0, 0.2, isl=1000, pooling=0.0)
    assert separate.replicas == math.ceil(20.0 / TINY.prefill_rate_per_replica(1000, 0.2)) == 10
    halfway = TINY.prefill_pool(20.0, 0.2, isl=1000, pooling=0.5)
    assert shared.replicas <= halfway.replicas <= separate.replicas
    assert "queue sharing 0.50" in halfway.reason


def test_the_queue_sharing_a_fleet_shows_is_read_back_from_its_ttft() -> None:
    """Whatever sharing the fleet has, the TTFT it shows gives that sharing back; a TTFT that neither
    end explains says so (clamped), and one where nobody waited says nothing (NaN)."""
    for pooling in (0.0, 0.3, 0.7, 1.0):
        observed = TINY.expected_ttft_pool_s(20.0, 4, isl=1000, pooling=pooling)
        assert observed > 0.1  # above the lone floor, where the queue shows
        assert TINY.pooling_observed(observed, 20.0, 4, isl=1000) == pytest.approx(pooling, abs=1e-6)
    slower_than_separate = 1.05 * TINY.expected_ttft_pool_s(20.0, 4, isl=1000, pooling=0.0)
    assert TINY.pooling_observed(slower_than_separate, 20.0, 4, isl=1000) == 0.0
    # Far slower than either end, where neither has anyone late: latency no queue explains (the offset's).
    assert math.isnan(TINY.pooling_observed(3 * slower_than_separate, 20.0, 4, isl=1000))
    # At the lone floor the percentile did not wait: at least as shared as the value that explains it.
    floor = TINY.pooling_observed(0.1, 20.0, 5, isl=1000)
    assert floor > 0.8 and TINY.expected_ttft_pool_s(20.0, 5, isl=1000, pooling=floor) == pytest.approx(0.1)
    assert math.isnan(TINY.pooling_observed(0.5, 0.01, 5, isl=1000))  # idle: nobody waits in either model
    assert math.isnan(TINY.pooling_observed(0.5, 60.0, 5, isl=1000))  # saturated


def test_the_length_mix_prices_the_long_prompts_and_the_variance_of_their_service() -> None:
    """Half the prompts at ISL 1000 (0.1 s alone and in service), half at 2000 (0.2 s): on one replica
    E[S] = 0.15 s, R = E[S²] / 2E[S] = 0.025 / 0.3 s, the wait's tail ρ·exp(−(1 − ρ)·u / R), and the late
    share at t ≥ 0.2 s is ½·ρ·e^(−θ(t − 0.1)) + ½·ρ·e^(−θ(t − 0.2)). The p90 TTFT solves it = 0.1."""
    mix = lengths.LengthMix((1000.0, 2000.0), (0.5, 0.5))
    rate = 4.0  # ρ = 0.6
    rho, residual = 0.6, 0.025 / 0.3
    theta = (1 - rho) / residual
    ttft = TINY.expected_ttft_pool_s(rate, 1, isl=1500, percentile=90, mix=mix)  # a pool of one replica
    late = 0.5 * rho * math.exp(-theta * (ttft - 0.1)) + 0.5 * rho * math.exp(-theta * (ttft - 0.2))
    assert late == pytest.approx(0.1, rel=1e-6)
    # Every prompt at the mean (1,500 tokens, no spread) misses the long half: it expects a shorter TTFT.
    assert TINY.expected_ttft_pool_s(rate, 1, isl=1500, percentile=90, mix=lengths.point(1500)) < ttft
    # A target the long prompts miss even alone, for more than 10% of requests, is out of reach.
    out_of_reach = TINY.prefill_pool(4.0, 0.15, isl=1500, mix=mix)
    assert not out_of_reach.target_met and "out of reach for 50%" in out_of_reach.reason


def test_decode_holds_the_size_biased_context_of_the_output_mix() -> None:
    """Outputs of 10 and 990 tokens, half each: the running sequences are nearly all long ones, so the
    mean context is E[isl] + E[osl²] / 2E[osl], above E[isl] + E[osl] / 2, and a replica sustains less."""
    outputs = lengths.LengthMix((10.0, 990.0), (0.5, 0.5))
    context = capacities.decode_context(1000.0, outputs, 500.0)
    assert context == pytest.approx(1000 + (0.5 * 10**2 + 0.5 * 990**2) / 500 / 2)
    assert context > capacities.decode_context(1000.0, None, 500.0) == 1250.0
    mean_based = TINY.decode_capacity(1000, 500, 0.025)
    mix_based = TINY.decode_capacity(1000, 500, 0.025, context_length=context)
    assert mix_based.context_length == pytest.approx(context)
    assert mix_based.rate_rps < mean_based.rate_rps


def test_the_search_from_a_guess_finds_what_bisection_finds_in_few_evaluations() -> None:
    """`fewest_near` answers as `fewest` does for a monotone test, whatever the guess, the bounds and
    where the answer lies (none meeting: `hi`); from a guess next to the answer it needs a handful of
    evaluations where bisection over hundreds needs about log2 of them."""
    for lo, hi in ((1, 1), (1, 2), (1, 9), (3, 40), (1, 300)):
        for answer in range(lo, hi + 2):  # hi + 1: no count in range is enough
            for guess in range(lo - 1, hi + 2):
                def enough(n: int, answer: int = answer) -> bool:
                    return n >= answer
                assert capacities.fewest_near(lo, hi, guess, enough) == capacities.fewest(lo, hi, enough) \
                    == min(answer, hi), (lo, hi, answer, guess)
    asked: list[int] = []

    def counted(n: int) -> bool:
        asked.append(n)
        return n >= 150
    assert capacities.fewest_near(1, 300, 149, counted) == 150
    assert len(asked) <= 3


def test_decode_capacity_answers_are_kept_per_argument_and_equal_a_fresh_models() -> None:
    """The fast path asks for the same lengths every tick: the model answers from what it computed,
    the same as a model that never answered before, and a changed argument is a new question."""
    model = capacities.CapacityModel(tiny_profile())
    asked = [(1000.0, 200.0, 0.02, None, None), (1000.0, 200.0, 0.025, None, None), (1000.0, 200.0, 0.02, 10.0, None),
             (1000.0, 200.0, 0.02, None, 1500.0), (2000.0, 100.0, 0.03, None, None)]
    first = [model.decode_capacity(i, o, t, max_running=r, context_length=c) for i, o, t, r, c in asked]
    again = [model.decode_capacity(i, o, t, max_running=r, context_length=c) for i, o, t, r, c in asked]
    fresh = [capacities.CapacityModel(tiny_profile()).decode_capacity(i, o, t, max_running=r, context_length=c)
             for i, o, t, r, c in asked]
    assert all(a is b for a, b in zip(first, again, strict=True))
    assert first == fresh
    assert len({(d.rate_rps, d.concurrency) for d in first}) > 1  # the arguments do change the answer
