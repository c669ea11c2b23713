"""The synthetic traffic family: deterministic per seed, each component where its parameters put it,
every parameter within its documented range, and a seed that runs through the backtest into a row."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import source_files

from fleetpilot.api import v1alpha1 as api
from fleetpilot.planner import capacity, sizing
from fleetpilot.planner.backtest import evaluate, family

REPO = Path(__file__).resolve().parents[2]
PROFILE = REPO.parent / "shared" / "traces" / "calibration" / "h200_llama31_8b_fp8_vllm"
SLA = api.SlaTarget(ttft_ms=2000, itl_ms=50, percentile=90)


@pytest.fixture(scope="module")
def profile() -> Any:
    return evaluate.load_profile(str(PROFILE))


def _quiet(params: family.Params, **changes: Any) -> family.Params:
    """`params` with nothing happening but what `changes` put back: flat day, no events, no silence,
    little noise."""
    calm = dataclasses.replace(params, peak_to_trough=1.0, weekend_depth=0.0, ramps=(), flash_crowds=(), outages=(),
                               silent_share=0.0, noise_cv=0.02)
    return dataclasses.replace(calm, **changes)


def _seed_with(condition: Any) -> int:
    return next(seed for seed in range(500) if condition(family.draw(seed)))


def test_the_same_seed_is_the_same_scenario_and_another_seed_another(profile: Any) -> None:
    one = family.family_scenario(7, profile=profile, sla=SLA, duration_s=3600)
    again = family.family_scenario(7, profile=profile, sla=SLA, duration_s=3600)
    other = family.family_scenario(8, profile=profile, sla=SLA, duration_s=3600)
    assert one.counts is not None and again.counts is not None and other.counts is not None
    assert family.draw(7) == family.draw(7)
    np.testing.assert_array_equal(one.counts, again.counts)
    assert one.loads == again.loads and one.isl_sample == again.isl_sample and one.description == again.description
    np.testing.assert_array_equal(np.asarray(one.prompt_mix), np.asarray(again.prompt_mix))
    assert family.draw(7) != family.draw(8)
    assert not np.array_equal(one.counts, other.counts)
    assert one.isl_sample != other.isl_sample


def test_every_parameter_stays_in_its_documented_range_over_fifty_seeds() -> None:
    def within(name: str, value: float) -> bool:
        lo, hi = family.RANGES[name]
        return lo - 1e-9 <= value <= hi + 1e-9

    seen_on, seen_off = False, False
    for seed in range(50):
        p = family.draw(seed)
        assert within("duration_h", p.duration_s / 3600) and p.duration_s % 3600 == 0
        assert within("clock_start_h", p.clock_start_s / 3600)
        for name in ("fleet_replicas", "peak_to_trough", "peak_hour", "weekend_depth", "silent_run_min", "noise_cv"):
            assert within(name, getattr(p, name)), (seed, name)
        if p.silent_share == 0:
            seen_on = True
        else:
            seen_off = True
            assert within("silent_share", p.silent_share)
        for count, events, minutes, size in (("ramps", p.ramps, "ramp_min", "ramp_factor"),
                                             ("flash_crowds", p.flash_crowds, "flash_min", "flash_height"),
                                             ("outages", p.outages, "outage_min", "outage_residual")):
            assert within(count, len(events))
            for event in events:
                assert within(minutes, event.duration_s / 60) and within(size, event.size), (seed, count)
                assert 0 <= event.start_s and event.start_s + event.duration_s <= p.duration_s + 1e-6
        for outage in p.outages:
            assert within("recovery_min", outage.recovery_s / 60)
        assert within("long_isl", p.long.isl_mean) and within("short_isl", p.short.isl_mean)
        for cls in (p.long, p.short):
            assert within("isl_sigma", cls.isl_sigma) and within("osl", cls.osl_mean)
            assert within("osl_sigma", cls.osl_sigma)
        assert within("long_share", p.shift.before) and within("long_share", p.shift.after)
        assert within("shift_at", p.shift.at_s / p.duration_s) and within("shift_min", p.shift.over_s / 60)
    assert seen_on and seen_off  # both kinds of service occur


def test_the_diurnal_and_weekly_cycles_peak_and_dip_where_their_parameters_say() -> None:
    p = dataclasses.replace(family.draw(0), clock_start_s=0.0, peak_to_trough=4.0, peak_hour=15.0, weekend_depth=0.4)
    day = np.arange(0, family.DAY_S, 600.0)
    diurnal = family.factors(p, day)["diurnal"]
    assert diurnal.max() / diurnal.min() == pytest.approx(4.0, rel=1e-3)
    assert day[int(np.argmax(diurnal))] / 3600 == pytest.approx(15.0)
    week = np.array([2.5, 5.5, 6.5]) * family.DAY_S  # Wednesday, Saturday and Sunday noon
    assert family.factors(p, week)["weekly"] == pytest.approx([1.0, 0.6, 0.6])


def test_a_ramp_moves_the_level_by_its_factor_and_keeps_it() -> None:
    ramp = family.Window(start_s=3600.0, duration_s=1800.0, size=2.5)
    p = _quiet(family.draw(1), ramps=(ramp,))
    level = family.factors(p, np.array([3000.0, 4500.0, 6000.0, 9000.0]))["ramps"]
    assert level == pytest.approx([1.0, math.sqrt(2.5), 2.5, 2.5])


def test_a_flash_crowd_raises_the_rate_in_its_window_by_about_its_height() -> None:
    crowd = family.Window(start_s=3600.0, duration_s=600.0, size=3.0)
    p = _quiet(family.draw(2), flash_crowds=(crowd,), duration_s=7200.0)
    traffic = family.realise(p, base_rps=50.0)
    minute = np.arange(len(traffic.counts)) * traffic.step_s
    before = traffic.counts[(minute >= 3000) & (minute < 3600)].mean()
    plateau = traffic.counts[(minute >= 3660) & (minute < 4140)].mean()  # inside its rise and fall
    after = traffic.counts[(minute >= 4260) & (minute < 4800)].mean()
    assert plateau / before == pytest.approx(4.0, rel=0.05)
    assert after / before == pytest.approx(1.0, rel=0.05)


def test_an_outage_is_near_silent_and_the_traffic_comes_back_over_its_recovery() -> None:
    outage = family.Window(start_s=1800.0, duration_s=1200.0, size=0.02, recovery_s=600.0)
    p = _quiet(family.draw(3), outages=(outage,), duration_s=7200.0)
    traffic = family.realise(p, base_rps=40.0)
    minute = np.arange(len(traffic.counts)) * traffic.step_s
    normal = traffic.counts[minute < 1800].mean()
    inside = traffic.counts[(minute >= 1800) & (minute < 3000)].mean()
    halfway = traffic.counts[(minute >= 3240) & (minute < 3360)].mean()  # the middle of the recovery
    assert inside / normal < 0.04
    assert halfway / normal == pytest.approx(0.5, abs=0.1)
    assert traffic.counts[minute >= 3600].mean() / normal == pytest.approx(1.0, rel=0.05)


def test_silent_minutes_come_in_their_share_and_the_minute_noise_at_its_spread() -> None:
    silent = _quiet(family.draw(4), silent_share=0.25, silent_run_min=2.0)
    on = family.on_minutes(silent, 20_000, np.random.default_rng(0))
    assert 1 - on.mean() == pytest.approx(0.25, abs=0.02)
    runs = np.diff(np.flatnonzero(np.diff(np.concatenate(([1], on.astype(int), [1])))))[::2]  # off-run lengths
    assert runs.mean() == pytest.approx(2.0, rel=0.1)
    noisy = _quiet(family.draw(4), noise_cv=0.4)
    noise = family.minute_noise(noisy, 20_000, np.random.default_rng(0))
    assert noise.mean() == pytest.approx(1.0, abs=0.02) and noise.std() == pytest.approx(0.4, rel=0.05)


def test_the_mix_shift_changes_the_mean_prompt_length_after_its_time(profile: Any) -> None:
    seed = _seed_with(lambda p: p.shift.after - p.shift.before > 0.5)  # towards the long prompts
    scenario = family.family_scenario(seed, profile=profile, sla=SLA, duration_s=3 * 3600)
    p = family.draw(seed, duration_s=3 * 3600)
    minutes = np.arange(len(scenario.loads)) * 60.0
    isl = np.array([load.isl for load in scenario.loads])
    before, after = isl[minutes < p.shift.at_s - 60], isl[minutes > p.shift.at_s + p.shift.over_s + 60]
    expected = [w * p.long.isl_mean + (1 - w) * p.short.isl_mean for w in (p.shift.before, p.shift.after)]
    assert before.mean() == pytest.approx(expected[0], rel=0.15)
    assert after.mean() == pytest.approx(expected[1], rel=0.15)
    # The fluid prices the later prompts dearer, as their mix says.
    mix = np.asarray(scenario.prompt_mix)
    assert mix[minutes > p.shift.at_s + p.shift.over_s].mean() > 1.2 * mix[minutes < p.shift.at_s].mean()


def test_the_planners_readings_follow_the_mix_shift_as_the_frontends_histograms_would(profile: Any) -> None:
    seed = _seed_with(lambda p: p.shift.after - p.shift.before > 0.5)
    scenario = family.family_scenario(seed, profile=profile, sla=SLA, duration_s=3 * 3600)
    p = family.draw(seed, duration_s=3 * 3600)
    fleet = scenario.make_fleet({"prefill": 1, "decode": 1})
    minutes = [m for m in range(10, len(scenario.loads)) if scenario.rates[m] > 0]
    before = [m for m in minutes if (m + 1) * 60 < p.shift.at_s]
    after = [m for m in minutes if m * 60 > p.shift.at_s + p.shift.over_s]
    windows = {m: fleet.window(m * 60.0, (m + 1) * 60.0, percentile=90) for m in before[-5:] + after[:5]}
    for m, window in windows.items():
        # What the planner reads of a minute is that minute's mix: the static sizings' lengths (from the
        # classes' whole draws; the fluid's sample is picked at prompt-length quantiles, which keeps the
        # prompts' means closer than the outputs'), and a histogram of that minute's arrivals, same mean.
        assert window.isl_mean == pytest.approx(scenario.loads[m].isl, rel=0.1), m
        assert window.osl_mean == pytest.approx(scenario.loads[m].osl, rel=0.2), m
        assert window.isl_histogram is not None and window.isl_histogram.total == pytest.approx(window.arrivals)
        assert window.isl_histogram.mean == pytest.approx(window.isl_mean)
    assert min(windows[m].isl_mean or 0 for m in after[:5]) > 1.5 * max(windows[m].isl_mean or 0 for m in before[-5:])
    # Without its classes the same fleet reads the sample's mix in every window, as a rate series does.
    plain = dataclasses.replace(scenario, length_classes=None).make_fleet({"prefill": 1, "decode": 1})
    assert {plain.window(m * 60.0, (m + 1) * 60.0, percentile=90).isl_mean for m in windows} == {plain.isl_mean}


def test_the_fleet_scale_is_the_replicas_the_planners_sizing_wants_at_the_base_rate(profile: Any) -> None:
    beliefs = capacity.CapacityModel(profile)
    for seed in (0, 5, 9):
        p = family.draw(seed)
        w = family.mean_long_share(p)
        rate = family.base_rate(p, beliefs, SLA)
        load = sizing.Load(rate_rps=rate * 10, isl=w * p.long.isl_mean + (1 - w) * p.short.isl_mean,
                           osl=w * p.long.osl_mean + (1 - w) * p.short.osl_mean)
        total = sum(sizing.size(load, beliefs, SLA).replicas.values())  # ×10: rounding up stays small
        assert total / 10 == pytest.approx(p.fleet_replicas, rel=0.15, abs=0.3)


def test_a_short_seed_runs_through_the_backtest_into_a_family_row(profile: Any) -> None:
    scenario = family.family_scenario(11, profile=profile, sla=SLA, duration_s=1800)
    assert scenario.fidelity == "fluid" and scenario.duration_s == 1800
    assert scenario.burn_in_s == evaluate.default_burn_in(1800, interval_s=60)  # the harness's default
    knobs = {**evaluate.KNOBS, "static-peak": (1.0, 2.0), "oracle": (0.9, 1.0)}
    done = {group: evaluate.run_group(scenario, group, knobs=knobs, bracket=False) for group in ("static-peak", "oracle")}
    summary = evaluate.summarise(done, scenario)
    assert summary["oracle"].gpu_hours_at_target is not None
    benchmark: Any = source_files.load("backtest_benchmark", Path("benchmarks/backtest.py"))
    row = benchmark.Row("family", 1.0, 120.0, seed=11)
    assert row.label == "family seed 11, startup 120 s"
    board = "\n".join(benchmark.family_board([(row, summary)]))
    assert "| static-peak | " in board and "| family seed 11, startup 120 s | " in board
    assert [r.label for r in benchmark.rows(False, seeds=range(3, 5))] == [
        "family seed 3, startup 120 s", "family seed 4, startup 120 s"]
