"""The backtest: the fleet simulator's bookkeeping and timing, the fluid model, scores, the oracle, shared
GPU budgets, and the command with and without matplotlib."""

from __future__ import annotations

import argparse
import collections
import dataclasses
import math
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from fleetpilot import perfmodel, traces
from fleetpilot.api import profile as profiles
from fleetpilot.api import v1alpha1 as api
from fleetpilot.planner import capacity, predict
from fleetpilot.planner.backtest import cli as backtest_cli
from fleetpilot.planner.backtest import driver, evaluate, fleetsim, fluid, policies
from fleetpilot.traces import Request

TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"
TIMING = perfmodel.PerformanceModel(perfmodel.MODELS["llama-3.1-8b"], perfmodel.GPUS["h200-sxm"])
CONFIG = fleetsim.FleetConfig(timing=TIMING, startup_s=30.0)
SLA = api.SlaTarget(ttft_ms=500, itl_ms=50, percentile=90)


def poisson_trace(rate: float, seconds: float, *, seed: int = 1, isl: float = 2048, osl: float = 128) -> list[Request]:
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(1 / rate, int(rate * seconds * 1.2)))
    times = times[times < seconds]
    inputs = rng.integers(int(isl / 2), int(isl * 1.5), len(times))
    outputs = rng.integers(max(2, int(osl / 2)), int(osl * 1.5), len(times))
    return [Request(float(t), int(i), int(o)) for t, i, o in zip(times, inputs, outputs, strict=True)]


class Seesaw(policies.Base):
    """A policy that scales both pools up and down every interval: drains galore."""

    name, knob = "seesaw", 0.0

    def __init__(self) -> None:
        self.k = 0

    def initial(self) -> dict[fleetsim.FleetPool, int]:
        return {"prefill": 3, "decode": 3}

    def decide(self, stats: fleetsim.WindowStats, now: float) -> dict[fleetsim.FleetPool, int]:
        self.k += 1
        n = 1 if self.k % 2 else 3
        return {"prefill": n, "decode": n}


def test_every_arrival_finishes_or_is_counted_failed_through_scale_downs() -> None:
    requests = poisson_trace(8.0, 300)
    # One request that no decode replica's KV cache can ever hold.
    too_big = Request(150.0, TIMING.kv_capacity_tokens(), 10)
    requests = sorted([*requests, too_big], key=lambda r: r.arrival_s)
    fleet = driver.RequestFleet(CONFIG, requests, Seesaw().initial())
    result = driver.run(fleet, Seesaw(), duration_s=300, interval_s=20, sla=SLA)

    outcomes = fleet.outcomes()
    finished = np.isfinite(outcomes.itl) & np.isfinite(outcomes.ttft)
    assert int(finished.sum()) + int(outcomes.failed.sum()) == len(requests)
    assert int(outcomes.failed.sum()) == 1 == result.failed
    assert outcomes.failed[[r is too_big for r in requests].index(True)]
    assert result.actions > 10  # it really did scale back and forth
    # Drained replicas stopped, and no replica is left holding work.
    stopped = [r for pool in fleetsim.FLEET_POOLS for r in fleet.replicas[pool] if r.stopped is not None]
    assert stopped
    assert all(r.idle() for pool in fleetsim.FLEET_POOLS for r in fleet.replicas[pool])


def test_a_lone_request_sees_the_performance_model_latencies() -> None:
    # One request every 2 s on plenty of replicas: nothing ever queues or batches.
    isl, osl = 1024, 64
    requests = [Request(2.0 * k, isl, osl) for k in range(30)]
    fleet = fleetsim.FleetSimulator(CONFIG, requests, {"prefill": 2, "decode": 2})
    fleet.finish()
    o = fleet.outcomes()
    expected_ttft = (TIMING.ttft(isl) + TIMING.kv_transfer_time(isl, CONFIG.kv_bandwidth_bytes_per_s)
                     + TIMING.decode_step_time(1, isl))
    expected_itl = TIMING.itl(1, isl + osl // 2)
    assert np.allclose(o.ttft, expected_ttft, rtol=0.01)
    assert np.allclose(o.itl, expected_itl, rtol=0.02)


def test_a_constant_rate_on_enough_replicas_meets_the_model_at_its_batch() -> None:
    # Steady Poisson load on one decode replica: Little's law sets the batch, the model sets the ITL.
    requests = poisson_trace(20.0, 200, osl=200, isl=1000)
    fleet = fleetsim.FleetSimulator(CONFIG, requests, {"prefill": 4, "decode": 1})
    fleet.finish()
    o = fleet.outcomes()
    steady = o.arrival > 50
    itl = float(np.mean(o.itl[steady]))
    concurrency = 20.0 * 200 * itl  # Little: rate × OSL × ITL
    context = 1000 + 100
    model_itl = TIMING.decode_step_time(round(concurrency), round(concurrency) * context)
    assert itl == pytest.approx(model_itl, rel=0.1)
    assert float(np.median(o.ttft[steady])) < 2 * (TIMING.ttft(1000) + TIMING.decode_step_time(round(concurrency), 0))


def test_replicas_take_their_startup_time_and_cost_gpus_from_the_start() -> None:
    fleet = fleetsim.FleetSimulator(CONFIG, poisson_trace(2.0, 100), {"prefill": 1, "decode": 1})
    fleet.run_until(10.0)
    fleet.set_target("prefill", 3)
    assert (fleet.ready("prefill"), fleet.active("prefill")) == (1, 3)
    fleet.run_until(10.0 + CONFIG.startup_s - 1)
    assert fleet.ready("prefill") == 1
    fleet.run_until(10.0 + CONFIG.startup_s)
    assert fleet.ready("prefill") == 3
    # GPU-seconds: 2 replicas for 100 s, 2 more from t=10.
    assert fleet.gpu_seconds(100.0) == pytest.approx(2 * 100 + 2 * 90)
    fleet.set_target("prefill", 0)
    fleet.finish()
    assert fleet.active("prefill") == 0


class Fixed(policies.Base):
    """The same fleet throughout."""

    name, knob = "fixed", 0.0

    def initial(self) -> dict[fleetsim.FleetPool, int]:
        return {"prefill": 2, "decode": 1}

    def decide(self, stats: fleetsim.WindowStats, now: float) -> dict[fleetsim.FleetPool, int]:
        return self.initial()


def test_a_run_is_scored_and_costed_only_after_its_burn_in() -> None:
    requests = poisson_trace(2.0, 1200, seed=3)
    whole = driver.run(driver.RequestFleet(CONFIG, requests, Fixed().initial()), Fixed(), duration_s=1200.0,
                       interval_s=60.0, sla=SLA)
    later = driver.run(driver.RequestFleet(CONFIG, requests, Fixed().initial()), Fixed(), duration_s=1200.0,
                       interval_s=60.0, sla=SLA, scored_from_s=600.0)
    gpus = CONFIG.gpus["prefill"] * 2 + CONFIG.gpus["decode"]
    assert whole.gpu_hours == pytest.approx(gpus * 1200 / 3600)
    assert later.gpu_hours == pytest.approx(gpus * 600 / 3600)
    assert whole.scores is not None and later.scores is not None
    assert whole.scores.requests == len(requests)
    assert later.scores.requests == sum(1 for r in requests if r.arrival_s >= 600.0)
    assert len(later.timeline.time) == len(whole.timeline.time)  # the burn-in is replayed all the same
    with pytest.raises(ValueError, match="scored_from_s"):
        driver.run(driver.RequestFleet(CONFIG, requests, Fixed().initial()), Fixed(), duration_s=1200.0,
                   interval_s=60.0, sla=SLA, scored_from_s=1200.0)


def test_a_short_replay_gets_no_burn_in_and_a_long_one_the_default(tmp_path: Path) -> None:
    assert evaluate.default_burn_in(1200.0, interval_s=60.0) == 0.0
    assert evaluate.default_burn_in(3600.0, interval_s=60.0) == evaluate.BURN_IN_S
    # Ten-minute intervals: ten of them, not one (a planner that has seen one interval plans blind).
    assert evaluate.default_burn_in(86400.0, interval_s=600.0) == evaluate.BURN_IN_INTERVALS * 600.0
    assert evaluate.default_burn_in(3 * 6000.0 - 1.0, interval_s=600.0) == 0.0
    trace = azure_csv(tmp_path / "tiny.csv", poisson_trace(1.0, 300, seed=5))
    profile = evaluate.model_profile(TIMING)
    scenario = evaluate.scenario_from_trace("tiny", trace, profile=profile, sla=SLA, burn_in_s=None,
                                            bounds={"prefill": (1, 4), "decode": (1, 4)})
    assert scenario.burn_in_s == 0.0
    with pytest.raises(ValueError, match="burn-in 600 s .* shorter than the replay"):
        evaluate.scenario_from_trace("tiny", trace, profile=profile, sla=SLA, burn_in_s=600.0,
                                     bounds={"prefill": (1, 4), "decode": (1, 4)})


def test_a_scenario_scales_its_rate_as_tenants_when_asked(tmp_path: Path) -> None:
    """The same requests and rate either way; as tenants the copies' arrivals are the trace's own,
    shifted as a whole, where the default puts each request's copies within one mean gap of it."""
    trace = azure_csv(tmp_path / "tiny.csv", poisson_trace(0.5, 600, seed=5))
    profile = evaluate.model_profile(TIMING)
    bounds: dict[fleetsim.FleetPool, tuple[int, int]] = {"prefill": (1, 4), "decode": (1, 4)}
    together = evaluate.scenario_from_trace("tiny", trace, profile=profile, sla=SLA, burn_in_s=None,
                                            rate_factor=3.0, bounds=bounds)
    tenants = evaluate.scenario_from_trace("tiny", trace, profile=profile, sla=SLA, burn_in_s=None,
                                           rate_factor=3.0, bounds=bounds, tenant_shift_s=60.0)
    assert len(tenants.requests) == len(together.requests)
    assert "as tenants (each copy shifted up to 60 s)" in tenants.description
    assert "tenants" not in together.description

    originals = [r.arrival_s for r in traces.load(trace)]
    span = originals[-1] - originals[0]

    def shifts(scenario: evaluate.Scenario) -> list[int]:
        """How often each offset (mod the span) of a copy from an original occurs, commonest first."""
        copies = collections.Counter(r.arrival_s for r in scenario.requests) - collections.Counter(originals)
        offsets = collections.Counter(round((c - o) % span, 6) for c in copies.elements() for o in originals)
        return [n for _, n in offsets.most_common(2)]

    assert max(shifts(together)) <= 3  # each copy its own jitter, within a mean gap of its original
    assert min(shifts(tenants)) >= 0.9 * len(originals)  # two copies of the trace, each shifted whole
    assert max(r.arrival_s for r in tenants.requests) <= originals[-1]  # wrapped round, not run over


def test_scaling_down_cancels_starting_replicas_before_draining_ready_ones() -> None:
    fleet = fleetsim.FleetSimulator(CONFIG, [], {"prefill": 2, "decode": 1})
    fleet.set_target("prefill", 4)
    fleet.set_target("prefill", 2)
    stopped = [r for r in fleet.replicas["prefill"] if r.stopped is not None]
    assert len(stopped) == 2
    assert all(r.ready_at == CONFIG.startup_s for r in stopped)


def test_the_fluid_scales_down_as_the_simulator_does_and_counts_ready_replicas_by_time() -> None:
    """Cancel the replicas still starting (the latest first), then drain the oldest ready ones; a
    replica counts as ready from its ready time, and a stopped or draining one never again."""
    fleet = fluid.FluidFleet(CONFIG, np.zeros(60), step_s=10, isl_sample=[1024], osl_sample=[64],
                             initial={"prefill": 2, "decode": 1})
    first, second = fleet.replicas["prefill"]
    fleet.run_until(10)
    fleet.set_target("prefill", 3)  # ready at 40
    fleet.run_until(20)
    fleet.set_target("prefill", 5)  # two more, ready at 50
    third, fourth, fifth = fleet.replicas["prefill"][2:]
    assert (fleet.ready("prefill"), fleet.active("prefill")) == (2, 5)
    assert [fleet.ready("prefill", at) for at in (39, 40, 49, 50)] == [2, 3, 3, 5]
    fleet.set_target("prefill", 3)  # two of the three starting go: the latest
    assert fifth.stopped == fourth.stopped == 20 and not fifth.draining and third.stopped is None
    assert (fleet.ready("prefill", 50), fleet.active("prefill")) == (3, 3)
    fleet.set_target("prefill", 1)  # the one still starting goes, then the oldest ready one drains
    assert third.stopped == 20 and first.draining and first.stopped is not None and first.stopped > 20
    assert second.stopped is None and not second.draining
    assert (fleet.ready("prefill", 50), fleet.active("prefill")) == (1, 1)
    fleet.set_target("prefill", 2)  # a new one after all that: ready one startup later
    assert [fleet.ready("prefill", at) for at in (49, 50)] == [1, 2]


def test_requests_go_to_the_least_loaded_ready_replica_the_oldest_of_equals() -> None:
    """The frontend's least-loaded routing as the simulator picks (`FleetSimulator._pick`): the fewest
    queued prompt tokens, the oldest replica among equals, a replica from the moment it is ready (before
    its ready event has run), never one draining or cancelled."""
    fleet = fleetsim.FleetSimulator(CONFIG, [], {"prefill": 3, "decode": 1})
    first, second, third = fleet.replicas["prefill"]
    assert isinstance(first, fleetsim._Prefill) and isinstance(second, fleetsim._Prefill)
    assert isinstance(third, fleetsim._Prefill)
    assert fleet._pick("prefill") is first
    first.queued_tokens = 100
    assert fleet._pick("prefill") is second
    second.queued_tokens, third.queued_tokens = 50, 50
    assert fleet._pick("prefill") is second
    fleet.set_target("prefill", 5)  # two more, ready after the startup
    fleet.set_target("prefill", 4)  # one of them cancelled before it ever serves
    fleet.now = CONFIG.startup_s  # the clock at their ready time, their ready event not yet handled
    cancelled, fourth = sorted(fleet.replicas["prefill"][3:], key=lambda r: r.stopped is None)
    assert cancelled.stopped is not None and fleet._pick("prefill") is fourth
    fleet.set_target("prefill", 3)  # drains the emptiest ready one: the newcomer
    assert fourth.draining and fleet._pick("prefill") is second
    assert all(not r.draining for r in (first, second, third))


def test_window_attainment_counts_only_windows_with_requests() -> None:
    outcomes = fleetsim.RequestOutcomes(
        arrival=np.array([1.0, 2.0, 130.0]), ttft=np.array([0.1, 0.2, 0.9]), itl=np.array([0.01, 0.01, 0.01]),
        failed=np.array([False, False, False]), isl=np.ones(3), osl=np.full(3, 10.0))
    scores = driver.score_requests(outcomes, 60.0, SLA, duration_s=180.0)
    assert list(scores.requests) == [2, 0, 1]
    assert list(scores.met) == [True, False, False]
    assert scores.attainment == 0.5
    assert scores.good.sum() == 2


def test_a_sweep_is_extended_past_its_ends_until_it_brackets_the_target() -> None:
    """A made-up policy whose score is its knob: a sweep of settings that all meet 90% goes leaner until
    one misses; one whose settings all miss goes dearer until one meets."""
    def run(knob: float) -> driver.RunResult:
        empty = np.zeros(0)
        timeline = driver.Timeline(empty, empty, empty, {}, {}, empty, empty)
        return driver.RunResult("p", knob, 10 * knob, knob, 1, 1, 0, 0, timeline)

    lean = evaluate._bracket([run(0.95), run(0.99)], run, target=0.9, leaner=lambda k: k - 0.04,
                             dearer=lambda k: k + 0.04)
    assert [round(r.knob, 2) for r in lean] == [0.91, 0.87]
    dear = evaluate._bracket([run(0.5), run(0.6)], run, target=0.9, leaner=lambda k: k - 0.1,
                             dearer=lambda k: k + 0.15)
    assert [round(r.knob, 2) for r in dear] == [0.75, 0.9]
    stuck = evaluate._bracket([run(0.5)], run, target=0.9, leaner=lambda k: None, dearer=lambda k: k + 0.01)
    assert len(stuck) == evaluate.MAX_EXTENSIONS  # gives up: the report then says it was not bracketed
    assert driver.cost_to_meet([run(0.87), run(0.91)], 0.9).bracketed


def test_lookahead_asks_for_the_highest_need_until_new_replicas_can_be_ready() -> None:
    needs = [{"prefill": n, "decode": 1} for n in (1, 1, 4, 1, 1, 2)]
    targets = policies.lookahead_targets(needs, interval_s=60, startup_s=120)
    # Window 5 needs 2: asked for at window 3, two intervals (one startup) ahead.
    assert [t["prefill"] for t in targets] == [4, 4, 4, 2, 2, 2]


def test_erlang_c_matches_known_values() -> None:
    assert fluid.erlang_c(1, 0.5) == pytest.approx(0.5)
    assert fluid.erlang_c(2, 1.0) == pytest.approx(1 / 3)
    assert fluid.erlang_c(3, 3.5) == 1.0
    assert fluid.erlang_c(2, np.array([0.0, 1.0, 2.5])) == pytest.approx([0.0, 1 / 3, 1.0])


def test_fluid_and_per_request_agree_on_a_poisson_load() -> None:
    # Poisson arrivals (what the fluid model assumes): the two fleet models should tell the same story.
    requests = poisson_trace(10.0, 600, seed=3)
    counts = np.bincount((np.array([r.arrival_s for r in requests]) // 10).astype(int), minlength=60)[:60]
    for prefill in (1, 2):
        exact = fleetsim.FleetSimulator(CONFIG, requests, {"prefill": prefill, "decode": 1})
        exact.finish()
        ttft_exact = float(np.percentile(exact.outcomes().ttft, 90))
        model = fluid.FluidFleet(CONFIG, counts, step_s=10, isl_sample=[r.input_tokens for r in requests],
                                 osl_sample=[r.output_tokens for r in requests], initial={"prefill": prefill, "decode": 1})
        model.finish()
        stats = model.window(0, 600, percentile=90)
        assert stats.ttft_p is not None
        assert stats.ttft_p == pytest.approx(ttft_exact, rel=0.35), prefill


def test_the_fluid_prices_each_step_s_prompts_as_they_come_on_a_request_trace() -> None:
    # Long prompts for five minutes, then short ones, at one rate on one prefill replica: the first
    # half overloads it (utilisation ~1.3), the second does not (~0.3); priced at the trace's mean
    # prompt (~0.8) the fluid sees no queue in either. Told each step's mix, it sees the first
    # half's queue as the per-request simulator does.
    first = poisson_trace(8.8, 300, seed=11, isl=8192, osl=16)
    second = [dataclasses.replace(r, arrival_s=r.arrival_s + 300) for r in poisson_trace(8.8, 300, seed=12, osl=16)]
    requests = first + second
    arrivals = np.array([r.arrival_s for r in requests])
    isl = np.array([r.input_tokens for r in requests], dtype=float)
    exact = fleetsim.FleetSimulator(CONFIG, requests, {"prefill": 1, "decode": 2})
    exact.finish()
    outcomes = exact.outcomes()
    exact_p90 = float(np.percentile(outcomes.ttft[arrivals < 300], 90))
    counts = np.bincount((arrivals // 10).astype(int), minlength=60)[:60].astype(float)
    mix = fluid.step_prompt_mix(CONFIG.timing, CONFIG.max_batched_tokens, arrivals, isl, step_s=10, steps=60)
    assert mix[:30].min() > 1.2 and mix[30:].max() < 0.8  # dearer, then cheaper, than the trace's mean

    def first_half_p90(prompt_mix: np.ndarray | None) -> float:
        model = fluid.FluidFleet(CONFIG, counts, step_s=10, isl_sample=[int(v) for v in isl],
                                 osl_sample=[r.output_tokens for r in requests],
                                 initial={"prefill": 1, "decode": 2}, prompt_mix=prompt_mix)
        model.finish()
        stats = model.window(0, 300, percentile=90)
        assert stats.ttft_p is not None
        return stats.ttft_p

    assert exact_p90 > 10.0  # the first half's queue: tens of seconds
    assert first_half_p90(mix) == pytest.approx(exact_p90, rel=0.35)
    assert first_half_p90(None) < exact_p90 / 3  # at the mean price the queue is not there
    with pytest.raises(ValueError, match="one positive factor per step"):
        fluid.FluidFleet(CONFIG, counts, step_s=10, isl_sample=[1024], osl_sample=[16],
                         initial={"prefill": 1, "decode": 1}, prompt_mix=mix[:10])


def test_the_fluid_queues_prompts_on_bursts_a_step_rate_hides() -> None:
    # A burst of 60 prompts within 0.3 s every 10 s: 6 req/s on average, a light load for two prefill
    # replicas, but each burst queues. Told the arrivals per half-second, the fluid sees the queue the
    # per-request simulator sees; told only the count per step, it sees none.
    rng = np.random.default_rng(5)
    requests = [Request(float(burst * 10 + t), int(i), 16) for burst in range(60)
                for t, i in zip(np.sort(rng.uniform(0, 0.3, 60)), rng.integers(1024, 3072, 60), strict=True)]
    arrivals = np.array([r.arrival_s for r in requests])
    exact = fleetsim.FleetSimulator(CONFIG, requests, {"prefill": 2, "decode": 2})
    exact.finish()
    ttft_exact = float(np.percentile(exact.outcomes().ttft, 90))
    lengths = {"isl_sample": [r.input_tokens for r in requests], "osl_sample": [r.output_tokens for r in requests]}

    def fluid_p90(counts: np.ndarray) -> float:
        model = fluid.FluidFleet(CONFIG, counts, step_s=10, initial={"prefill": 2, "decode": 2}, **lengths)
        model.finish()
        stats = model.window(0, 600, percentile=90)
        assert stats.ttft_p is not None
        return stats.ttft_p

    per_step = np.bincount((arrivals // 10).astype(int), minlength=60)[:60].astype(float)
    per_half_second = np.bincount((arrivals // 0.5).astype(int), minlength=1200)[:1200].astype(float)
    assert ttft_exact > SLA.ttft_ms / 1e3  # the bursts do queue
    assert fluid_p90(per_half_second.reshape(60, 20)) == pytest.approx(ttft_exact, rel=0.35)
    assert fluid_p90(per_step) < ttft_exact / 2


@pytest.fixture(scope="module")
def azure_scenario() -> evaluate.Scenario:
    profile = evaluate.load_profile(str(TRACES / "calibration" / "h200_llama31_8b_fp8_vllm"))
    return evaluate.scenario_from_trace(
        "azure", TRACES / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv", profile=profile, sla=SLA,
        rate_factor=4.0, duration_s=900.0)


def test_no_policy_beats_the_oracle_on_gpu_hours_at_equal_score(azure_scenario: evaluate.Scenario) -> None:
    knobs = {**evaluate.KNOBS, "static-peak": (1.0, 1.5, 2.0, 3.0), "fleetpilot": (0.5, 0.8, 0.95),
             "oracle": (0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 1.0), "hpa": (0.7, 0.4, 0.2), "dynamo": (1.0, 0.7, 0.4)}
    oracle = evaluate.run_group(azure_scenario, "oracle", knobs=knobs, bracket=False).results
    floor = min(r.effective for r in oracle)
    for group in ("static-peak", "hpa", "dynamo", "fleetpilot-constant"):
        for run in evaluate.run_group(azure_scenario, group, knobs=knobs, bracket=False).results:
            if run.effective < floor:
                continue
            at = driver.cost_to_meet(oracle, run.effective).gpu_hours
            assert at is not None and at <= run.gpu_hours + 1e-9, (group, run.knob, run.effective, run.gpu_hours, at)


def test_the_planner_in_the_loop_scales_with_the_load(azure_scenario: evaluate.Scenario) -> None:
    run = evaluate.run_group(azure_scenario, "fleetpilot-constant", knobs={"fleetpilot": (0.8,)},
                             bracket=False).results[0]
    prefill = run.timeline.active["prefill"]
    assert prefill.max() > prefill.min()  # it scaled
    assert run.actions > 0
    assert math.isfinite(run.gpu_hours) and run.gpu_hours > 0
    assert 0 < run.attainment <= 1


# -- without matplotlib ------------------------------------------------------------------------------------


def azure_csv(path: Path, requests: list[Request]) -> Path:
    """`requests` (within an hour) as an Azure LLM trace file (7-digit fractions of a second)."""
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for r in requests:
        whole, fraction = divmod(round(r.arrival_s * 10**7), 10**7)
        stamp = f"2023-11-16 18:{whole // 60:02d}:{whole % 60:02d}.{fraction:07d}"
        rows.append(f"{stamp},{r.input_tokens},{r.output_tokens}")
    path.write_text("\n".join(rows) + "\n")
    return path


def test_without_matplotlib_the_backtest_writes_its_tables_and_says_plots_were_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from fleetpilot import cli, plots

    # None in sys.modules makes `import matplotlib` (and any submodule) raise ImportError.
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")] + ["matplotlib"]:
        monkeypatch.setitem(sys.modules, name, None)
    assert plots.pyplot() is None
    trace = azure_csv(tmp_path / "tiny.csv", poisson_trace(2.0, 300, seed=5))
    out = tmp_path / "out"
    code = cli.main(["planner", "backtest", "--trace", str(trace), "--sla", "ttft=500ms,itl=50ms,p=90",
                     "--profile", str(TRACES / "calibration" / "h200_llama31_8b_fp8_vllm"),
                     "--predictors", "constant", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "GPU-hours to meet the SLA" in printed  # the table
    assert printed.count("plots skipped") == 1 and "pip install 'fleetpilot[plots]'" in printed
    report = (out / "backtest.md").read_text()
    assert "| fleetpilot-constant |" in report and "| oracle |" in report
    assert "every request scored from the first second" in report  # 5 minutes: too short for a burn-in
    assert "plots skipped" in report and "![" not in report  # no image links to files never drawn
    assert not list(out.glob("*.png"))


def test_a_servegen_model_the_file_lacks_is_a_one_line_error_naming_those_it_has(tmp_path: Path) -> None:
    from fleetpilot import cli

    series = tmp_path / "rates.csv"
    series.write_text("model,t_start_s,total_rate_rps,active_clients\nm-mid,0,1.5,3\nm-small,0,0.5,1\n"
                      "m-mid,600,2.0,3\nm-small,600,0.7,1\n")
    with pytest.raises(SystemExit) as raised:
        cli.main(["planner", "backtest", "--trace", str(series), "--sla", "ttft=500ms,itl=50ms,p=90",
                  "--profile", str(TRACES / "calibration" / "h200_llama31_8b_fp8_vllm"), "--out", str(tmp_path)])
    message = str(raised.value)
    assert "\n" not in message and "no model 'm-large'" in message and "m-mid, m-small" in message


def test_a_tenant_shift_on_a_rate_series_is_a_one_line_error_naming_the_flag(tmp_path: Path) -> None:
    """A ServeGen series has no copies to shift: `--tenant-shift` is refused, alone or with `--graph`."""
    from fleetpilot import cli

    series = tmp_path / "rates.csv"
    series.write_text("model,t_start_s,total_rate_rps,active_clients\nm-large,0,1.5,3\nm-large,600,2.0,3\n")
    common = ["--sla", "ttft=500ms,itl=50ms,p=90", "--tenant-shift", "60", "--out", str(tmp_path),
              "--profile", str(TRACES / "calibration" / "h200_llama31_8b_fp8_vllm")]
    for where in (["--trace", str(series)], ["--graph", f"bulk={series}", "--gpu-budget", "b=4"]):
        with pytest.raises(SystemExit) as raised:
            cli.main(["planner", "backtest", *where, *common])
        message = str(raised.value)
        assert "\n" not in message and "--tenant-shift" in message and "drop --tenant-shift" in message
    assert not (tmp_path / "backtest.md").exists()


def test_a_rate_series_read_smooth_keeps_every_window_s_mean_and_has_no_jumps() -> None:
    """Windows of 10, 40, 40, 5 req/s, ten steps each: read as steps the rate jumps 10 → 40 between two
    steps; read smooth, each window's steps still average its mean, no step is negative, and the
    largest change between neighbouring steps is a fraction of the jump."""
    means = [10.0, 40.0, 40.0, 5.0]
    step = evaluate.read_rates(means, per=10, reading="step")
    smooth = evaluate.read_rates(means, per=10, reading="smooth")
    assert list(step[:11]) == [10.0] * 10 + [40.0]
    assert smooth.shape == (40,) and (smooth >= 0).all()
    assert smooth.reshape(4, 10).mean(axis=1) == pytest.approx(means)
    assert np.abs(np.diff(smooth)).max() < 0.5 * 30.0
    assert smooth[9] > 10.0 and smooth[10] < 40.0  # the rise starts before the boundary and ends after it
    with pytest.raises(ValueError, match="reading must be one of step, smooth"):
        evaluate.read_rates(means, per=10, reading="linear")  # type: ignore[arg-type]


def test_a_rate_reading_on_a_request_trace_is_a_one_line_error(tmp_path: Path) -> None:
    from fleetpilot import cli

    with pytest.raises(SystemExit) as raised:
        cli.main(["planner", "backtest", "--trace", str(TRACES / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv"),
                  "--sla", "ttft=500ms,itl=50ms,p=90", "--rate-reading", "smooth", "--out", str(tmp_path),
                  "--profile", str(TRACES / "calibration" / "h200_llama31_8b_fp8_vllm")])
    message = str(raised.value)
    assert "\n" not in message and "--rate-reading" in message and "drop --rate-reading" in message


def test_graphs_under_a_budget_take_the_tenant_shift(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fleetpilot import cli

    trace = azure_csv(tmp_path / "tiny.csv", poisson_trace(2.0, 300, seed=5))
    code = cli.main(["planner", "backtest", "--graph", f"gold={trace},rate=4", "--gpu-budget", "shared=5",
                     "--tenant-shift", "30", "--sla", "ttft=500ms,itl=50ms,p=90", "--interval", "30",
                     "--profile", str(TRACES / "calibration" / "h200_llama31_8b_fp8_vllm"),
                     "--predictors", "constant", "--out", str(tmp_path / "out")])
    assert code == 0
    assert "as tenants (each copy shifted up to 30 s)" in capsys.readouterr().out


def test_replica_bounds_scale_with_the_traffic() -> None:
    loads = [policies.IntervalLoad(rate, 2048, 128) for rate in (5.0, 20.0, 10.0)]
    small = evaluate.scaled_bounds(PLANNER_SETTING.capacity, SLA, loads)
    large = evaluate.scaled_bounds(PLANNER_SETTING.capacity, SLA, [dataclasses.replace(load, rate_rps=load.rate_rps * 16)
                                                                   for load in loads])
    assert small["prefill"][0] == 1 and small["prefill"][1] >= 8
    assert large["prefill"][1] > 4 * small["prefill"][1] / 2  # grows with the rate
    assert large["decode"][1] >= small["decode"][1]
    # Traffic that needs hundreds of replicas (ServeGen m-mid) gets bounds four times its peak, however
    # many that is: a fixed ceiling capped every policy there, the oracle too.
    huge = [dataclasses.replace(load, rate_rps=load.rate_rps * 160) for load in loads]
    believed = policies.static_replicas(dataclasses.replace(PLANNER_SETTING, bounds={
        "prefill": (1, 10**6), "decode": (1, 10**6)}), huge, level="peak", factor=1.0)
    assert believed["prefill"] > 128
    assert evaluate.scaled_bounds(PLANNER_SETTING.capacity, SLA, huge)["prefill"] == (1, 4 * believed["prefill"])


# -- several graphs under one shared GPU budget --------------------------------------------------------------


PLANNER_SETTING = policies.Setting(
    capacity=capacity.CapacityModel(profiles.from_performance_model(
        TIMING, isls=[128, 512, 1024, 2048, 4096, 8192], contexts=[512, 1024, 2048, 4096, 8192],
        concurrencies=[1, 2, 4, 8, 16, 32, 64, 128, 256], engine="simulator")),
    sla=SLA, interval_s=30.0, startup_s=30.0, bounds={"prefill": (1, 16), "decode": (1, 8)})


def planned_graph(name: str, priority: int, *, rate: float, seed: int,
                  initial: dict[fleetsim.FleetPool, int]) -> driver.SharedGraph:
    policy = policies.Fleetpilot(PLANNER_SETTING, predict.make_predictor("constant"), predictor_name="constant",
                                 risk=0.9, initial=initial)
    fleet = driver.RequestFleet(CONFIG, poisson_trace(rate, 600, seed=seed), policy.initial())
    return driver.SharedGraph(name, priority, fleet, policy)


def test_under_a_binding_shared_budget_the_higher_priority_graph_keeps_its_sla() -> None:
    """Gold (priority 10, 15 req/s) wants 2-3 GPUs, bronze (priority 0, 60 req/s) about 5; the budget of 5
    holds gold's wants and bronze's minimum. Gold runs as it would alone; bronze is capped and misses."""
    def graphs() -> list[driver.SharedGraph]:
        return [planned_graph("bronze", 0, rate=60.0, seed=2, initial={"prefill": 3, "decode": 1}),
                planned_graph("gold", 10, rate=15.0, seed=1, initial={"prefill": 2, "decode": 1})]

    alone = {g.name: driver.run(g.fleet, g.policy, duration_s=600, interval_s=30, sla=SLA) for g in graphs()}
    shared = driver.run_shared(graphs(), budget=5, duration_s=600, interval_s=30)

    gold, bronze = shared.runs["gold"], shared.runs["bronze"]
    assert alone["gold"].attainment == alone["bronze"].attainment == 1.0  # each alone meets its SLA
    assert shared.capped_share("gold") == 0.0
    assert gold.attainment == alone["gold"].attainment
    assert gold.gpu_hours == pytest.approx(alone["gold"].gpu_hours)
    assert shared.capped_share("bronze") > 0.25
    assert bronze.attainment < 0.8 and bronze.gpu_hours < alone["bronze"].gpu_hours
    # Every interval's grants fit the budget, and each graph asks for no more than it is granted.
    granted = shared.granted["gold"] + shared.granted["bronze"]
    assert granted.max() <= 5
    for name, run in shared.runs.items():
        asked = run.timeline.active["prefill"] + run.timeline.active["decode"]
        assert (asked[1:] <= shared.granted[name][:-1]).all(), name

    # Deterministic, whatever order the graphs come in.
    again = driver.run_shared(graphs()[::-1], budget=5, duration_s=600, interval_s=30)
    assert {n: r.gpu_hours for n, r in again.runs.items()} == {n: r.gpu_hours for n, r in shared.runs.items()}
    assert all((again.granted[n] == shared.granted[n]).all() for n in shared.granted)


def test_the_backtest_command_runs_graphs_under_one_budget(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--graph` twice (one trace at two rates) and `--gpu-budget`: a table per graph, shared and alone."""
    from fleetpilot import cli

    trace = azure_csv(tmp_path / "tiny.csv", poisson_trace(2.0, 300, seed=5))
    out = tmp_path / "out"
    code = cli.main(["planner", "backtest", "--graph", f"gold={trace},priority=10,rate=4",
                     "--graph", f"bronze={trace},rate=12", "--gpu-budget", "shared=5",
                     "--sla", "ttft=500ms,itl=50ms,p=90", "--interval", "30", "--startup-seconds", "30",
                     "--profile", str(TRACES / "calibration" / "h200_llama31_8b_fp8_vllm"),
                     "--predictors", "constant", "--out", str(out)])
    assert code == 0
    assert "GPU budget shared = 5" in capsys.readouterr().out
    report = (out / "backtest.md").read_text()
    assert "## Shared GPU budget: 5 GPUs" in report
    assert "| gold | 10 |" in report and "| bronze | 0 |" in report


def test_a_graph_argument_reads_name_trace_priority_and_rate() -> None:
    graph = backtest_cli.parse_graph("gold=traces/a.csv,priority=10,rate=2.5")
    assert graph == backtest_cli.GraphArg("gold", Path("traces/a.csv"), priority=10, rate_scale=2.5)
    assert backtest_cli.parse_graph("b=x.jsonl") == backtest_cli.GraphArg("b", Path("x.jsonl"))
    with pytest.raises(argparse.ArgumentTypeError, match="unknown option"):
        backtest_cli.parse_graph("b=x.csv,weight=3")
    with pytest.raises(argparse.ArgumentTypeError, match="NAME=TRACE"):
        backtest_cli.parse_graph("x.csv")


class Reactive(policies.Base):
    """Decides nothing per interval; between decisions adds a prefill replica whenever prompts queue."""

    name, knob = "reactive", 0.0
    reactive_period_s = 5.0

    def __init__(self) -> None:
        self.calls: list[float] = []
        self.queued: list[float] = []
        self.current: dict[fleetsim.FleetPool, int] = {"prefill": 1, "decode": 4}

    def initial(self) -> dict[fleetsim.FleetPool, int]:
        return dict(self.current)

    def decide(self, stats: fleetsim.WindowStats, now: float) -> dict[fleetsim.FleetPool, int]:
        return dict(self.current)

    def react(self, stats: fleetsim.WindowStats, now: float) -> dict[fleetsim.FleetPool, int] | None:
        self.calls.append(now)
        self.queued.append(stats.prefill_queued_tokens)
        if stats.prefill_queued_tokens > 0 and self.current["prefill"] < 8:
            self.current = {**self.current, "prefill": self.current["prefill"] + 1}
            return dict(self.current)
        return None


def test_a_fast_loop_runs_between_decisions_and_sees_the_prompt_queue() -> None:
    requests = poisson_trace(12.0, 120.0, isl=4096, osl=16)  # more prompt work than one prefill replica does
    policy = Reactive()
    fleet = driver.RequestFleet(CONFIG, requests, policy.initial())
    result = driver.run(fleet, policy, duration_s=120.0, interval_s=30.0, sla=SLA)
    assert policy.calls == [t + k * 5.0 for t in (0.0, 30.0, 60.0, 90.0) for k in range(1, 6)]
    assert max(policy.queued) > 0
    assert result.actions == policy.current["prefill"] - 1 > 0
    assert fleet.active("prefill") == policy.current["prefill"]


def test_a_fast_loop_on_a_coarse_fluid_runs_as_many_ticks_as_its_step_spans() -> None:
    """A 30-s fluid step spans six 5-s periods of the loop: at each step it runs up to six times on the
    step's gauges, each seeing the replica the last one started (as six live ticks would, the queue
    aside), and stops at the first that changes nothing: +1 per tick takes prefill from 1 to 7 at the
    first step, where one call per step would have added one replica."""
    policy = Reactive()
    counts = np.full(4, 60.0 * 30.0)  # 60 req/s of 4,096-token prompts: more than eight prefill replicas do
    fleet = fluid.FluidFleet(CONFIG, counts, step_s=30.0, isl_sample=[4096], osl_sample=[16],
                             initial=policy.initial())
    result = driver.run(fleet, policy, duration_s=120.0, interval_s=60.0, sla=SLA)
    assert policy.calls == [30.0] * 6 + [90.0] * 2  # at 90: one more, then at its limit, no change
    assert [(t, c["prefill"]) for t, c in result.timeline.changes[1:]] == [(30.0, n) for n in range(2, 8)] + [(90.0, 8)]
    assert fleet.active("prefill") == 8


def test_a_replayed_fleet_scores_what_the_run_it_replays_scored(azure_scenario: evaluate.Scenario) -> None:
    # The fluid check compares the two fleet models on one fleet: replaying a run's fleet on the same
    # model must give back the same GPU-hours and the same requests met.
    run = evaluate.run_group(azure_scenario, "fleetpilot-constant", knobs={"fleetpilot": (0.9,)},
                             bracket=False).results[0]
    again = evaluate.replay(azure_scenario, run)
    assert run.actions > 0
    assert again.gpu_hours == pytest.approx(run.gpu_hours)
    assert again.request_attainment == pytest.approx(run.request_attainment)
    assert list(again.timeline.active["prefill"]) == list(run.timeline.active["prefill"])


def test_a_lone_request_meets_exactly_its_lone_ttft() -> None:
    # Requests whose lone TTFT misses the target are excluded from every score; one that the estimate
    # calls servable must be servable (a chunked 60k-token prompt pays a step's fixed cost per chunk).
    for isl in (100, 8192, 8193, 60_000):
        sim = fleetsim.FleetSimulator(CONFIG, [Request(0.0, isl, 64)], {"prefill": 1, "decode": 1})
        sim.finish()
        assert sim.outcomes().ttft[0] == pytest.approx(sim.lone_ttft(isl), rel=1e-9), isl


def test_the_fluid_length_sample_keeps_a_long_tail_s_quantiles() -> None:
    """Prompt cost is convex in length: the fluid's 2,000 requests are taken at evenly spaced quantiles
    of prompt length, so a long tail's quantiles (what prefill's load and its Allen–Cunneen residual
    rest on) are the trace's to 1%, where a random draw's p90 was 4% off."""
    rng = np.random.default_rng(3)
    prompts = np.maximum(1, rng.lognormal(8.5, 1.2, 48_000)).astype(int)
    fleet = fluid.FluidFleet(CONFIG, np.zeros(2), step_s=10.0, isl_sample=list(prompts),
                             osl_sample=[64] * len(prompts), initial={"prefill": 1, "decode": 1})
    assert len(fleet.isl) == 2000
    for q in (0.5, 0.9, 0.99):
        assert np.quantile(fleet.isl, q) == pytest.approx(np.quantile(prompts, q), rel=0.01)
    # The top few requests of 48,000 hold much of the mean square; a stratum keeps its middle one.
    assert np.mean(fleet.isl.astype(float) ** 2) == pytest.approx(np.mean(prompts.astype(float) ** 2), rel=0.1)


def test_the_fluid_follows_a_decode_batch_through_a_burst_of_a_second() -> None:
    """One decode replica: 300 requests within half a second fill its 256 slots (the
    rest wait for a slot, into TTFT), where the same 300 spread over the 10-s step never wait; and a
    burst the slots hold is admitted at once, however fast it came."""
    config = dataclasses.replace(CONFIG, max_num_seqs=256)
    lengths = {"isl_sample": [512] * 200, "osl_sample": [64, 128, 256, 512] * 50}

    def first_tokens(shape: list[float]) -> np.ndarray:
        fleet = fluid.FluidFleet(config, np.asarray([shape]), step_s=10.0, initial={"prefill": 8, "decode": 1},
                                 **lengths)
        fleet.run_until(10.0)
        return fleet.steps[0].ttft

    burst = first_tokens([300.0] + [0.0] * 19)
    spread = first_tokens([15.0] * 20)
    held = first_tokens([200.0] + [0.0] * 19)
    assert np.percentile(burst, 90) > 0.5 > np.percentile(spread, 90)
    assert np.percentile(held, 90) == pytest.approx(np.percentile(spread, 90), abs=0.2)


def test_the_fluid_queue_gauge_shows_the_queue_a_live_reading_finds_below_utilisation_one() -> None:
    """Below utilisation 1 no backlog piles up, yet prompts queue (Erlang C) and a fast loop reading the
    queue every few seconds finds them: the gauge is the step's 90th-percentile wait, as queued tokens,
    and it grows towards saturation."""
    def gauges(rate: float) -> tuple[float, float, float]:
        fleet = fluid.FluidFleet(CONFIG, np.full(2, rate * 60.0), step_s=60.0, isl_sample=[2048] * 50,
                                 osl_sample=[64] * 50, initial={"prefill": 2, "decode": 4})
        fleet.run_until(60.0)
        stats = fleet.window(0.0, 60.0, percentile=90, gauges_only=True)
        step = fleet.steps[0]
        return stats.prefill_queued_tokens, step.prefill_backlog_s, step.busy

    light = gauges(10.0)
    heavy = gauges(10.0 * 0.95 / light[2])  # utilisation is linear in the rate
    assert heavy[1] == 0.0 and 0.9 < heavy[2] < 1.0  # no fluid backlog...
    assert heavy[0] > 2048  # ...but more than a prompt's worth of tokens queued
    assert heavy[0] > 10 * light[0]


def test_the_fluid_oracle_sizes_for_every_step_of_an_interval_with_its_backlog_carried() -> None:
    """At 921 req/s one step alone is met by 34 prefill replicas at utilisation 1, but the backlog that
    step leaves grows over the interval's next steps: the oracle's need is what holds in every step
    of the run (35), so the oracle never plans a fleet that fails its own share."""
    rng = np.random.default_rng(0)
    lengths = {"isl_sample": list(rng.integers(1000, 3000, 200)), "osl_sample": list(rng.integers(50, 200, 200))}
    counts = np.full(10, 921.0 * 60)
    bounds: dict[fleetsim.FleetPool, tuple[int, int]] = {"prefill": (1, 200), "decode": (1, 200)}
    sizing = fluid.FluidFleet(CONFIG, counts, step_s=60.0, initial={"prefill": 0, "decode": 0}, **lengths)
    need = fluid.fluid_needs(sizing, interval_s=600.0, sla=SLA, attainment=0.9, bounds=bounds)[0]

    def shares(prefill: int) -> list[float]:
        fleet = fluid.FluidFleet(CONFIG, counts, step_s=60.0, initial={"prefill": prefill, "decode": need["decode"]},
                                 **lengths)
        fleet.run_until(600.0)
        servable = fleet.servable(SLA)
        return [float((servable & (step.ttft <= 0.5) & (step.itl <= 0.05)).mean() / servable.mean())
                for step in fleet.steps]

    assert min(shares(need["prefill"])) >= 0.9
    one_fewer = shares(need["prefill"] - 1)
    assert one_fewer[0] >= 0.9 > one_fewer[-1]  # the first step alone would have called it enough


def test_the_oracle_does_not_buy_the_bound_for_a_request_no_fleet_can_serve() -> None:
    # One request fits no decode replica's KV cache: no fleet serves every request of its interval,
    # so sizing that interval for all of them must settle for what any fleet serves, not the bound.
    requests = poisson_trace(2.0, 180, seed=4)
    requests.append(Request(90.0, 512, CONFIG.kv_capacity_tokens))
    requests.sort(key=lambda r: r.arrival_s)
    setting = dataclasses.replace(PLANNER_SETTING, startup_s=30.0, bounds={"prefill": (1, 16), "decode": (1, 16)})
    needs = driver.request_needs(requests, CONFIG, setting, attainment=1.0)
    assert max(max(need.values()) for need in needs) < 16, needs


def test_the_oracles_needs_at_several_shares_in_one_pass_are_those_of_each_share_alone() -> None:
    # A steady load and one burst of prompts that queue: how many replicas it takes depends on how many
    # of the burst's requests must meet the SLA.
    burst = [Request(100.0 + i * 0.005, 2048, 64) for i in range(150)]
    requests = sorted(poisson_trace(4.0, 240, seed=8) + burst, key=lambda r: r.arrival_s)
    setting = dataclasses.replace(PLANNER_SETTING, startup_s=30.0, bounds={"prefill": (1, 12), "decode": (1, 12)})
    shares = (0.6, 0.9, 1.0)
    together = driver.request_needs_at(requests, CONFIG, setting, attainments=shares)
    alone = {k: driver.request_needs(requests, CONFIG, setting, attainment=k) for k in shares}
    assert together == alone
    prefill = {k: sum(need["prefill"] for need in alone[k]) for k in shares}
    assert prefill[0.6] < prefill[1.0]  # the shares do differ: the test compares distinct sizings


def test_the_oracles_needs_do_not_depend_on_how_many_processes_search_them() -> None:
    # Intervals of 10 s over 300 s: two segments and a part (`driver.NEEDS_SEGMENT`), searched side
    # by side by two processes or one after another by one, with a burst in the second segment.
    burst = [Request(170.0 + i * 0.005, 2048, 64) for i in range(100)]
    requests = sorted(poisson_trace(4.0, 300, seed=9) + burst, key=lambda r: r.arrival_s)
    setting = dataclasses.replace(PLANNER_SETTING, interval_s=10.0, startup_s=10.0,
                                  bounds={"prefill": (1, 12), "decode": (1, 12)})
    shares = (0.75, 1.0)
    alone = driver.request_needs_at(requests, CONFIG, setting, attainments=shares)
    side_by_side = driver.request_needs_at(requests, CONFIG, setting, attainments=shares, workers=2)
    assert side_by_side == alone
    assert len(alone[1.0]) == 31 > 2 * driver.NEEDS_SEGMENT  # every interval, the one the last arrival opens too
    assert max(need["prefill"] for need in alone[1.0][17:19]) > max(need["prefill"] for need in alone[1.0][:10])


def test_the_oracle_sized_for_every_request_serves_them_beside_requests_nobody_can_serve() -> None:
    # Prompts of 100k tokens miss a 500 ms TTFT even alone, so no score counts them, but a fleet still
    # serves them: each holds a prefill replica for seconds and a share of a decode replica's KV cache.
    # Sized without them, the oracle left the servable requests waiting behind them.
    requests = poisson_trace(4.0, 300, seed=7)
    requests += [Request(float(t), 100_000, 400) for t in np.arange(2.0, 300.0, 4.0)]
    requests.sort(key=lambda r: r.arrival_s)
    setting = dataclasses.replace(PLANNER_SETTING, bounds={"prefill": (1, 32), "decode": (1, 32)})
    needs = driver.request_needs(requests, CONFIG, setting, attainment=1.0)
    oracle = policies.Oracle(setting, needs, knob=1.0)
    run = driver.run(driver.RequestFleet(CONFIG, requests, oracle.initial()), oracle, duration_s=300.0,
                     interval_s=setting.interval_s, sla=SLA)
    assert run.scores is not None and run.scores.excluded > 0
    assert run.request_attainment >= 0.99, run.request_attainment


def test_each_policy_is_also_read_at_its_default_setting() -> None:
    """The untuned table: a policy's run at the knob it ships with, its cost over the oracle's cost to meet
    the SLA, and whether it met the SLA there; a policy without that run gets no figure."""
    def run(policy: str, knob: float, gpu_hours: float, score: float) -> driver.RunResult:
        empty = np.zeros(0)
        timeline = driver.Timeline(empty, empty, empty, {}, {}, empty, empty)
        return driver.RunResult(policy, knob, gpu_hours, score, 1, 1, 0, 0, timeline)

    done = {
        "oracle": evaluate.GroupResult("oracle", [run("oracle", 0.8, 2.0, 0.85), run("oracle", 1.0, 3.0, 0.95)], 0.0),
        "hpa": evaluate.GroupResult("hpa", [run("hpa", 0.5, 2.5, 0.7), run("hpa", 0.25, 5.0, 0.97)], 0.0),
        "fleetpilot-constant": evaluate.GroupResult(
            "fleetpilot-constant", [run("fleetpilot-constant", 0.9, 3.75, 0.93)], 0.0),
        "dynamo": evaluate.GroupResult("dynamo", [run("dynamo", 2.0, 4.0, 0.99)], 0.0),
    }
    scenario = types.SimpleNamespace(sla=api.SlaTarget(ttft_ms=500, itl_ms=50, percentile=90),
                                     setting=types.SimpleNamespace(bounds={}))
    summary = evaluate.summarise(done, scenario)  # type: ignore[arg-type]
    assert summary["oracle"].gpu_hours_at_target == pytest.approx(2.5)  # halfway between 0.85 and 0.95
    assert evaluate.default_cell(summary, "fleetpilot-constant") == "1.50 met"
    assert evaluate.default_cell(summary, "hpa") == "1.00 missed (70.0%)"
    assert evaluate.default_cell(summary, "dynamo") == "—"  # its default (1.0) was not among the runs
    assert evaluate.default_cell(summary, "oracle") == "—"


# -- multinode group replicas -----------------------------------------------------------------------------


def test_a_group_replica_runs_its_parallelism_and_costs_every_gpu_of_its_nodes(tmp_path: Path) -> None:
    """A 70B TP16 replica on two 8-GPU nodes: the fleet times it with the model of that group
    (all-reduces over the network), a replica costs 16 GPUs, and the planner sizes in such groups."""
    timing = evaluate.replica_timing("llama-3.1-70b,tp=16,nodes=2")
    assert (timing.model.name, timing.tensor_parallel, timing.nodes) == ("llama-3.1-70b", 16, 2)
    trace = azure_csv(tmp_path / "tiny.csv", poisson_trace(1.0, 300, seed=5))
    scenario = evaluate.scenario_from_trace("group", trace, profile=evaluate.model_profile(timing), sla=SLA,
                                            timing=timing, bounds={"prefill": (1, 4), "decode": (1, 4)})
    assert scenario.fleet_config.gpus == {"prefill": 16, "decode": 16}
    assert scenario.setting.capacity.profile.gpus_per_replica == 16
    fleet = fleetsim.FleetSimulator(scenario.fleet_config, list(scenario.requests), {"prefill": 1, "decode": 2})
    fleet.finish()
    assert fleet.gpu_seconds(300.0) == pytest.approx(3 * 16 * 300)
    lone = fleetsim.FleetSimulator(scenario.fleet_config, [Request(0.0, 1024, 32)], {"prefill": 1, "decode": 1})
    lone.finish()
    assert lone.outcomes().itl[0] == pytest.approx(timing.itl(1, 1024 + 16), rel=0.02)
    run = evaluate.run_group(scenario, "fleetpilot-constant", knobs={"fleetpilot": (0.9,)}, bracket=False).results[0]
    # Every replica-hour the planner's fleet ran costs 16 GPU-hours (replicas sampled per interval).
    active = sum(run.timeline.active[pool] for pool in fleetsim.FLEET_POOLS)
    hours = scenario.duration_s / 3600
    assert 16 * active.min() * hours <= run.gpu_hours <= 16 * active.max() * hours * 1.01


def test_a_replica_argument_names_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="unknown option 'ranks'"):
        evaluate.replica_timing("llama-3.1-70b,ranks=2")
    with pytest.raises(ValueError, match="unknown 'llama-9b'"):
        evaluate.replica_timing("llama-9b,tp=2")
    with pytest.raises(ValueError, match="does not fit 1 GPUs' memory"):
        evaluate.replica_timing("llama-3.1-70b-bf16")
    with pytest.raises(ValueError, match="nodes must divide"):
        evaluate.replica_timing("llama-3.1-70b,tp=8,nodes=3")
