"""How the demo judges its replay (e2e/scenario.py): servable requests, attainment, the static comparison."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import source_files

from fleetpilot import traces

scenario_mod: Any = source_files.load("scenario", Path("e2e/scenario.py"))

DEMO = dataclasses.replace(scenario_mod.ClosedLoop(), risk=None)  # TTFT 1 s, ITL 65 ms, engine at 0.1×


def request(arrival_s: float, isl: int, osl: int = 32) -> traces.Request:
    return traces.Request(arrival_s=arrival_s, input_tokens=isl, output_tokens=osl)


def test_a_prompt_longer_than_the_ttft_target_allows_on_an_idle_replica_is_not_servable() -> None:
    # At a tenth of an H200's speed a few hundred tokens prefill well within a second, 8,000 do not.
    short, long = scenario_mod.servable([request(0, 300), request(0, 8000)], DEMO)
    assert short and not long
    # A slower engine, or a tighter target, makes the same short prompt unservable.
    assert scenario_mod.servable([request(0, 300)], dataclasses.replace(DEMO, ttft_ms=50)) == [False]


def test_attainment_counts_only_requests_within_both_targets() -> None:
    records = [
        {"status": "ok", "ttft_ms": 900.0, "itl_ms": 60.0},
        {"status": "ok", "ttft_ms": 1100.0, "itl_ms": 60.0},  # TTFT over
        {"status": "ok", "ttft_ms": 500.0, "itl_ms": 70.0},  # ITL over
        {"status": "error", "ttft_ms": None, "itl_ms": None},
    ]
    assert scenario_mod.attainment(records, DEMO) == 0.25
    assert scenario_mod.attainment([], DEMO) == 0.0


def test_the_static_fleet_is_sized_for_the_busiest_scored_interval_within_the_bounds() -> None:
    quiet = [request(t * 0.5, 1000) for t in range(20)]  # 2 req/s for 10 s
    # A burst of 6 req/s in the history is not the scored part's: only what follows `scored_from_s` counts.
    burst = [request(20 + t / 6, 1000) for t in range(60)]
    history_first = [*burst, *[dataclasses.replace(r, arrival_s=r.arrival_s + 40) for r in quiet]]
    sized_for_quiet = scenario_mod.static_fleet(history_first, DEMO, scored_from_s=40.0)
    sized_for_burst = scenario_mod.static_fleet(history_first, DEMO, scored_from_s=0.0)
    assert sized_for_quiet["prefill"] < sized_for_burst["prefill"]
    for fleet in (sized_for_quiet, sized_for_burst):
        for component, replicas in fleet.items():
            low, high = DEMO.bound(component)
            assert low <= replicas <= high
