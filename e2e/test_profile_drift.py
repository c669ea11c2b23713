"""A fleet 30% slower than its profile: the planner says so (ProfileDrift), and autoCorrect keeps the SLA.

The simulator's workers run at `--speedup 0.1 / 1.3` while the planner is handed the profile of
`--speedup 0.1`: every step takes 1.3 times what the profile says. The same steady load runs twice in one
session, on two graphs that differ in one field: `spec.planner.profile.autoCorrect` false (size from the
profile as written) and true (the default: size with the speed factors and offsets learned from the
fleet). The fast path is off in both, so the interval's sizing alone is compared.

At 1.5 requests/s the profile sizes decode at one replica (it expects a mean ITL of ~70 ms at the ~19
sequences that replica holds); the slowed engine then runs ~96 ms, over the 90 ms target. Corrected by
the learned decode speed (~1.3), the planner runs two decode replicas and the ITL stays under it
(`scenario.needed` with and without the correction). What is measured at the client: p90 TTFT and
mean ITL over the requests sent after the planner has had time to act, and the share within both targets.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import harness as harness_mod
import scenario as scenario_mod
from conftest import Graph, run_load

SLOWDOWN = 1.3
DRIFT = dataclasses.replace(
    scenario_mod.ClosedLoop(), ttft_ms=1000, itl_ms=90, risk=0.5, fast_path_s=0, engine_slowdown=SLOWDOWN,
    # Prefill starts and stays at two or more: the live planner cannot measure prefill's speed (the engines
    # report no busy share) and this engine's prefill is faster than its profile says (the profile's 18.8 ms
    # per-request overhead, docs/adr/0037-sim-overhead.md), so with one replica TTFT depended on the
    # forecast's first intervals and the machine's load, not on what the scenario tests.
    bounds=(("prefill", 2, 4), ("decode", 1, 4)), shape=((0, 1.5), (140, 1.5)),
)
# The SLA is judged on requests sent from here on. The frontend reports a request's ITL when it ends, 256
# tokens (~22 s) after it began, so the planner learns the decode speed from about 30 s; its decision then
# takes an interval and a pod ~10 s: in the runs that set this, decode was scaled at 40-60 s.
JUDGED_FROM_S = 80.0


def drift_run(harness: harness_mod.Harness, results: Path, *, auto_correct: bool) -> dict[str, Any]:
    name = "drift-corrected" if auto_correct else "drift-as-profiled"
    s = dataclasses.replace(DRIFT, namespace=f"e2e-{name}", graph=name, auto_correct=auto_correct)
    graph = Graph(harness, s)
    graph.create()
    try:
        run = run_load(graph, scenario_mod.write_trace(s, results / f"{name}.trace.csv"), results / f"{name}.load.json")
        # The condition needs five intervals with traffic (the load gave fourteen); idle ones leave it standing.
        drifted = harness_mod.wait_for(
            lambda: next((c for c in graph.get().get("status", {}).get("conditions", [])
                          if c["type"] == "ProfileDrift" and c["status"] == "True"), None),
            timeout=60, what=lambda: f"ProfileDrift=True on {name}: {graph.get().get('status', {}).get('conditions')}")
        events = graph.kubectl.json("get", "events", "-n", s.namespace, "--field-selector", "reason=ProfileDrift")
        learned = graph.get().get("status", {}).get("planner", {}).get("learned", {})
    finally:
        graph.delete()
    samples, load = run["samples"], run["load"]
    judged = [r for r in load["requests"] if r["status"] == "ok" and r["start_ms"] is not None
              and r["start_ms"] / 1000 >= JUDGED_FROM_S and r["ttft_ms"] is not None and r["itl_ms"] is not None]
    itl_ratio = re.search(r"ITL [\d.]+ ms measured vs [\d.]+ ms predicted \(×([\d.]+)", drifted["message"])
    summary = {
        "auto_correct": auto_correct, "requests_judged": len(judged),
        "errors": sum(1 for r in load["requests"] if r["status"] == "error"),
        "ttft_p90_ms": scenario_mod.percentile([r["ttft_ms"] for r in judged], s.percentile),
        "itl_p90_ms": scenario_mod.percentile([r["itl_ms"] for r in judged], s.percentile),
        "sla_attainment": sum(1 for r in judged if r["ttft_ms"] <= s.ttft_ms and r["itl_ms"] <= s.itl_ms)
        / max(len(judged), 1),
        "decode_desired_max": max((x["decode_desired"] or 0) for x in samples),
        "prefill_desired_max": max((x["prefill_desired"] or 0) for x in samples),
        "profile_drift": drifted["message"], "itl_drift_ratio": float(itl_ratio.group(1)) if itl_ratio else None,
        "drift_events": [(e["type"], e["message"]) for e in events.get("items", [])],
        "learned": learned,
    }
    rows = scenario_mod.timeline(s, samples, load, t0_unix=run["t0"])
    scenario_mod.write_results(name, results, scenario=s, rows=rows, summary=summary, extra={"samples": samples},
                               marks={"judged": run["load_start"] + JUDGED_FROM_S})
    return summary


def test_a_slow_fleet_is_reported_and_autocorrect_meets_the_sla(harness: harness_mod.Harness, results: Path) -> None:
    as_profiled = drift_run(harness, results, auto_correct=False)
    corrected = drift_run(harness, results, auto_correct=True)
    both = {"autoCorrect false": as_profiled, "autoCorrect true": corrected}
    print(f"\n{both}")

    for run in (as_profiled, corrected):
        # The condition names ITL, measured about 1.3 times what the profile predicts.
        assert run["itl_drift_ratio"] is not None and 1.15 <= run["itl_drift_ratio"] <= 1.5, both
        assert run["drift_events"] and all(kind == "Warning" for kind, _ in run["drift_events"]), both
        assert 1.15 <= run["learned"]["decodeSpeed"] <= 1.5, both
    # The scenario tests something only if the profile as written broke the ITL target ...
    assert as_profiled["itl_p90_ms"] > DRIFT.itl_ms, both
    # ... and the learned correction met it again. (Before the planner told a hand-off's few waiting
    # requests from a backlog, `core.in_handoff`, one reading of 2 waiting taught the uncorrected planner a
    # false engine cap, so it added a decode replica late and its ITL came in under the target: the CI
    # run of 52a488f.) TTFT is reported, not asserted: the drift is decode's, prefill runs at
    # its floor of two, and on a shared 2-core machine (load average 10 while these runs were developed) the
    # same fleet's p90 TTFT swung from 0.8 to 5.9 s with the machine's load.
    assert corrected["itl_p90_ms"] <= DRIFT.itl_ms, both
    assert corrected["sla_attainment"] > as_profiled["sla_attainment"], both
