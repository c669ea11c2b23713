"""The planner backtest benchmark: every scaling policy on three real traces, against the oracle.

Writes benchmarks/results/backtest.md (tables) and one timeline and one cost–attainment PNG per trace
(with the `plots` extra; without matplotlib the tables only, and a line saying so):
- Azure LLM inference 2023, code (1 h), rate ×4 so that the fleet needs several prefill replicas;
- Mooncake conversation (1 h) as recorded, with a 2 s TTFT target (its p90 prompt alone takes 0.9 s);
- ServeGen m-large (14 days of 10-minute rates), rate ×0.1, Poisson arrivals, fluid fleet model.
All on the calibrated vLLM H200 Llama-3.1-8B performance model (the fleet's truth), with the measured
Dynamo H200 profile as what the planners believe. The fluid model is checked against the per-request
simulator on the two 1-hour traces in the same run.

Run: `~/.cache/fleetpilot/venv/bin/python benchmarks/backtest.py [--workers 2] [--quick]`
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as the planner runs; before numpy

from fleetpilot import plots
from fleetpilot.api import v1alpha1 as api
from fleetpilot.planner.backtest import evaluate

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO.parent / "shared" / "traces"
RESULTS = REPO / "benchmarks" / "results"
PROFILE = TRACES / "calibration" / "h200_llama31_8b_fp8_vllm"
TARGET = 0.99


def scenarios(quick: bool) -> list[evaluate.Scenario]:
    profile = evaluate.load_profile(str(PROFILE))
    sla = api.SlaTarget(ttft_ms=500, itl_ms=50, percentile=90)
    out = [
        evaluate.scenario_from_trace("Azure code 2023 (1 h, rate ×4)", TRACES / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv",
                                     profile=profile, sla=sla, rate_factor=4.0),
        evaluate.scenario_from_trace("Mooncake conversation (1 h)", TRACES / "mooncake_fast25" / "conversation_trace.jsonl",
                                     profile=profile, sla=api.SlaTarget(ttft_ms=2000, itl_ms=50, percentile=90)),
    ]
    if not quick:
        out.append(evaluate.scenario_from_servegen(
            "ServeGen m-large (14 days, rate ×0.1)", TRACES / "servegen_alibaba" / "aggregate_rate_10min.csv",
            profile=profile, sla=sla, rate_factor=0.1))
    return out


def slug(name: str) -> str:
    return name.split("(")[0].strip().lower().replace(" ", "_")


def validation(scenario: evaluate.Scenario) -> list[str]:
    """The fluid model against the per-request simulator, same trace, same policies and knobs."""
    fluid = evaluate.Scenario(**{**scenario.__dict__, "fidelity": "fluid"})
    rows = []
    for group in ("static-peak", "fleetpilot-constant"):
        exact = evaluate.run_group(scenario, group)
        approx = evaluate.run_group(fluid, group)
        for a, b in zip(exact.results, approx.results, strict=True):
            rows.append(f"| {scenario.name} | {group} | {a.knob:g} | {a.gpu_hours:.2f} / {b.gpu_hours:.2f} "
                        f"| {a.attainment:.1%} / {b.attainment:.1%} | {a.good / max(a.requests, 1):.1%} / "
                        f"{b.good / max(b.requests, 1):.1%} |")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2, help="processes (one policy group each)")
    parser.add_argument("--quick", action="store_true", help="the two 1-hour traces only")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    sections = []
    skipped = False
    began = time.perf_counter()
    for scenario in scenarios(args.quick):
        print(f"== {scenario.name}: {scenario.description}", flush=True)
        started = time.perf_counter()
        done = evaluate.run_all(scenario, workers=args.workers, progress=lambda g: print(
            f"   {g.name:22} {len(g.results)} runs, {g.seconds_per_run:6.2f} s/run, best attainment "
            f"{max(r.attainment for r in g.results):.1%}", flush=True))
        elapsed = time.perf_counter() - started
        summary = evaluate.summarise(done, TARGET)
        best = evaluate.best_fleetpilot(summary) or "fleetpilot-constant"
        chosen = summary[best].cheapest_at_target or max(done[best].results, key=lambda r: r.attainment)
        name = slug(scenario.name)
        drawn = evaluate.draw(scenario, done, args.out, target=TARGET, chosen=chosen,
                              title=f"{scenario.name}: {best}, headroom {chosen.knob:g}",
                              timeline=(f"{best} timeline", f"backtest_{name}_timeline.png"),
                              curves=("cost vs attainment", f"backtest_{name}_curves.png"))
        skipped = skipped or not drawn
        section = evaluate.markdown_section(scenario, done, target=TARGET, png=drawn)
        sections.append(section + f"\nWhole sweep for this trace: {elapsed:.0f} s with {args.workers} worker(s).\n")
        print(f"   done in {elapsed:.0f} s", flush=True)

    print("== fluid model vs per-request simulator", flush=True)
    rows = []
    for scenario in scenarios(quick=True):
        rows += validation(scenario)
    header = [
        "# Planner backtest", "",
        ("Generated by `~/.cache/fleetpilot/venv/bin/python benchmarks/backtest.py` "
         f"({'quick' if args.quick else 'full'} run, {args.workers} workers, {time.perf_counter() - began:.0f} s "
         "on the 2-core development machine). Policies, knobs and scores are defined in planner/backtest/policies.py and "
         "planner/backtest/driver.py; every fleetpilot row is the real planner core (`core.plan_interval`)."), "",
        ("SLA attainment is the share of intervals whose p-th percentile TTFT and ITL both met target; "
         "GPU-hours count replicas from the moment they are asked for; GPU-hours at 99% are interpolated along "
         "each policy's knob sweep. The oracle knows the trace: per interval, the fewest replicas that meet the "
         "SLA on that interval's requests, asked for one startup time ahead; its knob gives up the dearest "
         "intervals (positive values) or tightens the targets it sizes for (negative). Every dynamic policy "
         "starts from the oracle's first fleet, so no one loses the first minutes to a cold start."), "",
    ]
    footer = [
        "## Fluid model against the per-request simulator", "",
        "Same trace, same policy and knob; each cell is per-request / fluid.", "",
        "| trace | policy | knob | GPU-hours | attainment | requests within SLA |", "|---|---|---:|---:|---:|---:|",
        *rows, "",
    ]
    if skipped:
        note = plots.skipped_note("timelines and cost curves")
        header += [note, ""]
        print(note)
    (args.out / "backtest.md").write_text("\n".join(header + sections + footer))
    print(f"wrote {args.out / 'backtest.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
