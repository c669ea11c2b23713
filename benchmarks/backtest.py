"""The planner backtest benchmark: every scaling policy on real traces at several fleet sizes and
replica startup times, scored per request, against the oracle.

Writes benchmarks/results/backtest.md (after every scenario, so a stopped run keeps its rows): one
headline table (rows: trace × rate × startup; columns: each policy's GPU-hours to meet the SLA as a
ratio to the oracle's), then per-scenario detail, the fluid model checked against the per-request
simulator, and PNGs (with the `plots` extra):
- Azure LLM inference 2023, code (1 h) and Mooncake conversation (1 h, 2 s TTFT target: its p90
  prompt alone takes 0.9 s), per request, at rate ×1, ×4 and ×16, replica startup 120 s; at ×4 also
  30 s and 600 s (a large model pulled from object storage); every ×4 and ×16 run (startup 120 s)
  of static-peak, fleetpilot-constant and the oracle is replayed on the fluid model to check it;
- ServeGen m-large (×0.1) and m-mid (×1: hundreds of replicas), 14 days of 10-minute rates, Poisson
  arrivals, fluid fleet model, fleetpilot with the constant and ARIMA predictors (Kalman and Prophet
  refits cost 80–170 s per run on 14 days). A series of 10-minute means says nothing of the rate within
  a window: each is read as steps (a jump within a second at every boundary) and, m-large here and
  m-mid in `--large`, smooth (`evaluate.read_rates`: every window's mean kept, no jumps).
All on the calibrated vLLM H200 Llama-3.1-8B performance model (the fleet's truth), with the measured
Dynamo H200 profile as what every planner believes. Nothing here is tuned to a trace.

Run: `~/.cache/fleetpilot/venv/bin/python benchmarks/backtest.py [--workers 2] [--quick | --large]`
(`--quick`: Azure and Mooncake at ×1, startup 120 s, fleetpilot with the constant predictor, no fluid
check; for CI. `--large`: only the large fleets, Azure and Mooncake at startup 120 s, into
backtest_large.md: ×16 and ×64 with the copies read as other tenants (`TENANT_SHIFT_S`), and ×64 as the
full run reads rate ×K; hundreds of replicas, each Azure ×64 run 11–14 s on the per-request simulator
but the row 24 min, and Mooncake ×64 unfinished after 70 (its oracle's sweep of shares over 770k
requests): past the full run's hour, so they run on their own).
`--row "Azure code 2023, ×4"` (repeatable) runs only the rows whose label contains it, every policy
as in the full run (with `--large`, one of the large fleets); give it an `--out` so the full report is
not overwritten.
`--family N [--family-seed-base B]`: instead of the traces, seeds B..B+N−1 of the synthetic traffic
family (`planner/backtest/family.py`: diurnal and weekly cycles, ramps, flash crowds, outages, on/off
minutes, minute noise, a shift of the length mix; every parameter drawn per seed), 3–5 h each on the
fluid model, every policy swept as on the real fluid rows (fleetpilot with the constant and ARIMA
predictors), into backtest_family.md: a row per seed, and over the seeds each policy's median and worst
ratio to the oracle, how many seeds it met (at any setting, and at its default), and each fleetpilot
variant's captured share of the saving over the strongest baseline. About 3 minutes per seed on one
core; with 2 workers, 20 seeds in about half an hour. The traces show that a planner works; the family
shows whether it generalises.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as the planner runs; before numpy

from fleetpilot import plots
from fleetpilot.api import profile as profiles
from fleetpilot.api import v1alpha1 as api
from fleetpilot.planner.backtest import driver, evaluate, family, scores

REPO = Path(__file__).resolve().parents[1]
# The shared traces beside the checkout; FLEETPILOT_TRACES names another copy (a machine without ../shared).
TRACES = Path(os.environ.get("FLEETPILOT_TRACES", REPO.parent / "shared" / "traces"))
RESULTS = REPO / "benchmarks" / "results"
PROFILE = TRACES / "calibration" / "h200_llama31_8b_fp8_vllm"
SLA = api.SlaTarget(ttft_ms=500, itl_ms=50, percentile=90)
MOONCAKE_SLA = api.SlaTarget(ttft_ms=2000, itl_ms=50, percentile=90)
REQUEST_TRACES = {  # name: (file, SLA)
    "Azure code 2023": (TRACES / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv", SLA),
    "Mooncake conversation": (TRACES / "mooncake_fast25" / "conversation_trace.jsonl", MOONCAKE_SLA),
}
SERVEGEN = TRACES / "servegen_alibaba" / "aggregate_rate_10min.csv"
# The family's SLA: Mooncake's, since the family's long-prompt class reaches Mooncake's prompts (at 500 ms
# most of them could not meet it even alone on an idle replica, and would be excluded).
FAMILY_SLA = MOONCAKE_SLA
# The policies fleetpilot is held against: the cheapest of them to meet the SLA, each at its own best
# setting, is the strongest baseline of a row (`scores.strongest_baseline`).
BASELINES = ("static-peak", "static-mean", "hpa", "dynamo", "dynamo-v1")


@dataclasses.dataclass(frozen=True)
class Row:
    """One row of the headline table: which trace, how scaled, how fast replicas start."""

    trace: str
    rate: float
    startup_s: float
    model: str = ""  # ServeGen only
    tenant_shift_s: float | None = None  # the rate's copies as other tenants (`traces.rate_scale`)
    reading: evaluate.RateReading = "step"  # ServeGen only: the rate within a window (`evaluate.read_rates`)
    seed: int = 0  # the family only: which of its seeds

    @property
    def label(self) -> str:
        if self.trace == "family":
            return f"family seed {self.seed}, startup {self.startup_s:g} s"
        tenants = " tenants" if self.tenant_shift_s is not None else ""
        smooth = " smooth" if self.reading == "smooth" else ""
        return (f"{self.trace}{' ' + self.model if self.model else ''}{smooth}, ×{self.rate:g}{tenants}, "
                f"startup {self.startup_s:g} s")


# The other reading of rate ×K: each copy of the trace another tenant, shifted whole by up to one planning
# interval, so the minute-to-minute time line stays the trace's and only its sub-minute bursts stop landing
# on each other. A choice of the scoreboard's, not of any policy: every policy sees the same requests.
TENANT_SHIFT_S = 60.0


def rows(quick: bool, large: bool = False, seeds: Sequence[int] = ()) -> Iterator[Row]:
    if seeds:  # the synthetic family instead of the traces
        for seed in seeds:
            yield Row("family", 1.0, 120.0, seed=seed)
        return
    if large:  # cheapest first, as below; Mooncake ×64's oracle search is hours (its 770k long prompts)
        for trace in REQUEST_TRACES:
            yield Row(trace, 16.0, 120.0, tenant_shift_s=TENANT_SHIFT_S)
        yield Row("ServeGen", 1.0, 120.0, "m-mid", reading="smooth")  # ~18 min: past the full run's hour
        yield Row("Azure code 2023", 64.0, 120.0, tenant_shift_s=TENANT_SHIFT_S)
        yield Row("Azure code 2023", 64.0, 120.0)
        yield Row("Mooncake conversation", 64.0, 120.0, tenant_shift_s=TENANT_SHIFT_S)
        yield Row("Mooncake conversation", 64.0, 120.0)
        return
    if quick:
        yield Row("Azure code 2023", 1.0, 120.0)
        yield Row("Mooncake conversation", 1.0, 120.0)
        return
    # The cheapest rows first: the report is written after each, so a stopped run keeps the most rows.
    for rate in (1.0, 4.0):
        for trace in REQUEST_TRACES:
            yield Row(trace, rate, 120.0)
    for startup in (30.0, 600.0):
        for trace in REQUEST_TRACES:
            yield Row(trace, 4.0, startup)
    yield Row("ServeGen", 0.1, 120.0, "m-large")
    yield Row("ServeGen", 0.1, 120.0, "m-large", reading="smooth")
    for trace in REQUEST_TRACES:
        yield Row(trace, 16.0, 120.0)
    yield Row("ServeGen", 1.0, 120.0, "m-mid")


def scenario(row: Row, profile: profiles.Profile, *, workers: int = 1) -> evaluate.Scenario:
    if row.trace == "family":
        return family.family_scenario(row.seed, profile=profile, sla=FAMILY_SLA, startup_s=row.startup_s,
                                      burn_in_s=None)
    if row.trace == "ServeGen":
        return evaluate.scenario_from_servegen(row.label, SERVEGEN, profile=profile, sla=SLA, burn_in_s=None,
                                               rate_factor=row.rate, model=row.model, startup_s=row.startup_s,
                                               reading=row.reading)
    path, sla = REQUEST_TRACES[row.trace]
    return evaluate.scenario_from_trace(row.label, path, profile=profile, sla=sla, burn_in_s=None,
                                        rate_factor=row.rate, startup_s=row.startup_s, workers=workers,
                                        tenant_shift_s=row.tenant_shift_s)


def slug(label: str) -> str:
    keep = "".join(c if c.isalnum() else "_" for c in label.lower())
    return "_".join(part for part in keep.split("_") if part)


def fidelity_rows(scenario_: evaluate.Scenario, done: Mapping[str, evaluate.GroupResult],
                  ) -> list[tuple[str, float, float, float, float]]:
    """(policy, knob, GPU-hours, per-request score, fluid score) at every sweep point of a static,
    a fleetpilot and the oracle sweep: each run's fleet, interval by interval, replayed on the fluid."""
    fluid = dataclasses.replace(scenario_, fidelity="fluid")
    out = []
    for group in ("static-peak", "fleetpilot-constant", "oracle"):
        for exact in done[group].results:
            approx = evaluate.replay(fluid, exact)
            out.append((group, exact.knob, exact.gpu_hours, exact.request_attainment, approx.request_attainment))
    return out


def coverage_section() -> list[str]:
    """The forecast coverage table (benchmarks/forecast_coverage.py writes it; it runs on its own, being
    a property of the predictors and their calibration, not of any fleet)."""
    path = RESULTS / "forecast_coverage.md"
    if not path.exists():
        return ["## Forecast coverage", "", "Not measured: run benchmarks/forecast_coverage.py.", ""]
    body = path.read_text().splitlines()[1:]  # its own title goes: this is a section here
    return ["## Forecast coverage: does the calibrated q-quantile cover q of the load?", *body, ""]


def _met(run: driver.RunResult | None) -> bool:
    return run is not None and run.effective >= (run.scores.target if run.scores is not None else 0.9) - 1e-12


def _median_worst(values: Sequence[float], *, worst: str, spec: str = ".2f") -> tuple[str, str]:
    if not values:
        return "—", "—"
    pick = max if worst == "max" else min
    return format(statistics.median(values), spec), format(pick(values), spec)


def family_board(headline: Sequence[tuple[Row, Mapping[str, evaluate.Summary]]]) -> list[str]:
    """Over the seeds run: each policy's median and worst ratio to the oracle on the seeds where it met
    the SLA, on how many it met it (at some setting of its sweep, and at its default), and for each
    fleetpilot variant the captured share of the saving over the strongest baseline, per seed and over
    the seeds (`scores.strongest_baseline`, `scores.captured_share`)."""
    summaries = [summary for _, summary in headline]
    n = len(summaries)
    groups = list(dict.fromkeys(g for summary in summaries for g in summary))
    oracle_met = sum(summary["oracle"].gpu_hours_at_target is not None for summary in summaries)
    lines = [
        "## The family over its seeds", "",
        (f"{n} seed(s); the oracle met the SLA on {oracle_met}. Per policy: on how many seeds it met the SLA at some "
         "setting of its sweep; over those where the oracle met it too, the median and the worst of its GPU-hours "
         "to meet it over the oracle's (the per-seed table below); and on how many seeds its default setting met "
         "it."), "",
        "| policy | seeds met | median ÷ oracle | worst ÷ oracle | met at default |", "|---|---:|---:|---:|---:|",
    ]
    for g in groups:
        if g == "oracle":
            continue
        met = sum(summary[g].gpu_hours_at_target is not None for summary in summaries if g in summary)
        ratios = [r for summary in summaries if g in summary and (r := evaluate.ratio_to_oracle(summary, g)) is not None]
        median, worst = _median_worst(ratios, worst="max")
        default = (f"{sum(_met(summary[g].at_default) for summary in summaries if g in summary)}/{n}"
                   if evaluate.knob_kind(g) in evaluate.DEFAULT_KNOBS else "—")
        lines.append(f"| {g} | {met}/{n} | {median} | {worst} | {default} |")
    fleetpilots = [g for g in groups if g.startswith("fleetpilot-")]
    shares: dict[str, list[float]] = {g: [] for g in fleetpilots}
    alone: dict[str, int] = dict.fromkeys(fleetpilots, 0)  # met where no baseline did
    per_seed = []
    for row, summary in headline:
        costs = {g: s.gpu_hours_at_target for g, s in summary.items()}
        strongest = scores.strongest_baseline(costs, BASELINES)
        oracle = costs.get("oracle")
        cells = []
        for g in fleetpilots:
            ours = costs.get(g)
            share = (scores.captured_share(baseline=strongest[1], ours=ours, oracle=oracle)
                     if strongest is not None and ours is not None and oracle else None)
            if share is not None:
                shares[g].append(share)
            if strongest is None and ours is not None:
                alone[g] += 1
            cells.append("not met" if ours is None else "no baseline met" if strongest is None
                         else "oracle not met" if not oracle else "—" if share is None else f"{share:.0%}")
        base = "none met" if strongest is None else (
            f"{strongest[0]} ({strongest[1] / oracle:.2f})" if oracle else strongest[0])
        per_seed.append(f"| {row.label} | {base} | " + " | ".join(cells) + " |")
    lines += [
        "", "### Captured share of the possible saving", "",
        ("Per seed, the strongest baseline is the cheapest of " + ", ".join(BASELINES) + " to meet the SLA, each at "
         "its own best setting (in brackets: its ratio to the oracle); a fleetpilot variant's captured share is "
         "(strongest baseline − fleetpilot) / (strongest baseline − oracle), in GPU-hours to meet the SLA: 100% "
         "is the oracle's cost, 0% the baseline's, below 0 dearer than the baseline. fleetpilot's default "
         "predictor is ARIMA (`spec.planner.predictor`). The static baselines are sized with hindsight: "
         "static-peak for the run's busiest planning interval, which on a seed with a flash crowd is the crowd "
         "itself, before it has come; a causal policy meets the first crowd with what the history before it "
         "showed."), "",
        "| policy | seeds with a share | median | worst | met where no baseline did |", "|---|---:|---:|---:|---:|",
    ]
    for g in fleetpilots:
        median, worst = _median_worst(shares[g], worst="min", spec=".0%")
        lines.append(f"| {g} | {len(shares[g])}/{n} | {median} | {worst} | {alone[g]} |")
    lines += ["", "| seed | strongest baseline (÷ oracle) | " + " | ".join(fleetpilots) + " |",
              "|---|---|" + "---:|" * len(fleetpilots), *per_seed, ""]
    return lines


def write_report(args: argparse.Namespace, headline: list[tuple[Row, dict[str, evaluate.Summary]]],
                 sections: list[str], fidelity: list[str], skipped: bool, total: float, *, finished: bool) -> None:
    groups = list(dict.fromkeys(g for _, summary in headline for g in summary))
    what = "seed, startup" if args.family else "trace, rate, startup"
    table = [f"| {what} | " + " | ".join(g for g in groups if g != "oracle") + " | oracle GPU-h |",
             "|---|" + "---:|" * len(groups)]
    for row, summary in headline:
        cells = []
        for g in groups:
            if g == "oracle":
                continue
            if g not in summary:
                cells.append("—")
                continue
            ratio = evaluate.ratio_to_oracle(summary, g)
            mark = "" if summary[g].to_meet.bracketed or ratio is None else "*"
            cells.append("not met" if ratio is None else f"{ratio:.2f}{mark}")
        oracle = summary["oracle"].gpu_hours_at_target
        table.append(f"| {row.label} | " + " | ".join(cells) + f" | {'not met' if oracle is None else f'{oracle:.2f}'} |")
    defaults = [f"| {what} | " + " | ".join(
                    f"{g} ({evaluate.DEFAULT_KNOBS[evaluate.knob_kind(g)]:g})" for g in groups
                    if evaluate.knob_kind(g) in evaluate.DEFAULT_KNOBS) + " |",
                "|---|" + "---:|" * sum(evaluate.knob_kind(g) in evaluate.DEFAULT_KNOBS for g in groups)]
    for row, summary in headline:
        defaults.append(f"| {row.label} | " + " | ".join(
            evaluate.default_cell(summary, g) if g in summary else "—"
            for g in groups if evaluate.knob_kind(g) in evaluate.DEFAULT_KNOBS) + " |")
    header = [
        "# Planner backtest" + (": the synthetic traffic family" if args.family else ""), "",
        (f"Generated by `~/.cache/fleetpilot/venv/bin/python benchmarks/backtest.py{' --quick' if args.quick else ''}"
         f"{' --large' if args.large else ''}"
         f"{f' --family {args.family}' if args.family else ''}"
         f"{f' --family-seed-base {args.family_seed_base}' if args.family and args.family_seed_base else ''}"
         f"{''.join(f' --row {text!r}' for text in args.row)}` "
         f"({args.workers} workers, {total / 60:.1f} min on the 2-core development machine"
         f"{'' if finished else '; stopped before every row ran'}). Policies, knobs and "
         "scores: planner/backtest/policies.py and planner/backtest/scores.py; every fleetpilot row is the real "
         "planning step (`step.step` every interval, and for its fast path every 5 s between; "
         "`fleetpilot-constant-predictive` runs without the fast path), every dynamo row Dynamo's documented "
         "two-loop planner."), "",
        ("A policy **meets the SLA** when at least 90% of the servable requests meet both TTFT and mean ITL targets "
         "and no 5-minute window falls below 85%. Each cell: the GPU-hours a policy needs to meet the SLA (read "
         "off its knob sweep, from the dearest setting that missed the target to the cheapest that met it) "
         "divided by the oracle's; the oracle "
         "knows the trace and sizes each interval for a share of its requests, asked for one startup ahead. "
         "Lower is better; below 1 would undercut the oracle (flagged in the detail). `*`: the sweep did not "
         "bracket the target, so the figure is an end of the sweep, not an interpolation. Replica bounds scale "
         "with each trace's busiest interval (4× the planner's sizing, at least 8, and at least twice the "
         "oracle's largest need); the detail flags any "
         f"policy that touched one. The first {evaluate.BURN_IN_S / 60:g} minutes of every trace (or "
         f"{evaluate.BURN_IN_INTERVALS} planning intervals, where that is longer: ServeGen's ten-minute ones) are replayed as "
         "every policy's history (a burn-in: a running planner warm-starts from Prometheus, a replay would "
         "otherwise start each causal policy knowing nothing) and are neither scored nor costed, for any policy "
         "or the oracle."), "",
        *([("Rate ×K copies each request K − 1 times within one mean gap of it, so each burst of the trace comes K "
            "times over at once (every client's burst the whole population's). A **tenants** row reads ×K as K "
            f"tenants with the trace's habits instead: each copy shifted whole by up to {TENANT_SHIFT_S:g} s "
            "(`--tenant-shift`), keeping its own bursts and the trace's minute-to-minute time line, but not "
            "landing its bursts on the others'. Same requests for every policy in a row; the two readings "
            "bracket how bursty a bigger fleet's traffic is."), ""]
          if any(row.tenant_shift_s is not None for row, _ in headline) else []),
        *([("Each row is one seed of the synthetic traffic family (`planner/backtest/family.py`, whose docstring "
            "gives every component and the range of each parameter drawn per seed, taken from the public traces): "
            "3–5 h of diurnal and weekly cycles, ramps, flash crowds, an outage, on/off minutes, minute noise and a "
            "shift of the prompt/output mix, on the fluid fleet model in one-minute steps, the SLA Mooncake's "
            f"(TTFT {FAMILY_SLA.ttft_ms:g} ms, ITL {FAMILY_SLA.itl_ms:g} ms, p{FAMILY_SLA.percentile:g}: the family's "
            "long prompts reach Mooncake's). Every policy runs as on the real fluid rows: the same knobs and "
            "sweeps, fleetpilot with the constant and ARIMA predictors, the same scores. No PNGs: the per-seed "
            "detail is in the tables below."), "",
           *([("The family's fluid step is its planning interval, so no fast-path tick falls between two plans "
               "(`driver.react_until` ticks at the fleet model's step boundaries inside an interval): here every "
               "fleetpilot variant runs its predictive loop alone, and `fleetpilot-constant-predictive` matches "
               "`fleetpilot-constant` on every seed. The fast path is measured on the traces' rows "
               "(backtest.md)."), ""] if family.STEP_S >= family.INTERVAL_S else []),
           *family_board(headline)] if args.family else []),
        ("## Per seed: GPU-hours to meet the SLA, as a ratio to the oracle" if args.family
         else "## Headline: GPU-hours to meet the SLA, as a ratio to the oracle"), "", *table, "",
        "## Without tuning: every policy at its default setting", "",
        ("What a user gets who sets no knob, on traffic nobody tuned for: each policy at the setting it ships "
         "with or documents (in brackets: static sizes for the peak or mean interval as it is, HPA at the 50% "
         "utilisation target of Kubernetes' HPA walkthrough, Dynamo's forecast as it comes, fleetpilot at "
         "`spec.planner.risk`'s default). Each cell: that run's GPU-hours over the oracle's to meet the SLA, and "
         "whether it met the SLA (else its score). The table above gives each policy its best setting per trace, "
         "which nobody can choose in advance."), "", *defaults, "",
    ]
    footer = [
        "## Fluid model against the per-request simulator", "",
        ("Every sweep point of static-peak, fleetpilot-constant and the oracle on the 1-hour traces at ×4 and up: "
         "the run's fleet, interval by interval, replayed on the fluid model (one fleet, two models), and the share "
         "of requests meeting the SLA in each. The fluid sees the trace's arrivals per half-second (its bursts) "
         "and queues prompt work between half-seconds; ServeGen, which has only 10-minute rates, runs it with "
         "Poisson arrivals within each minute (an M/G/c wait). The bar is 5 points wherever the per-request "
         "score lies between 70% and 100%."), "",
        "| scenario | policy | knob | GPU-hours | per request | fluid | |", "|---|---|---:|---:|---:|---:|---|",
        *fidelity, "",
    ]
    if args.family:  # every row runs on the fluid: nothing to check it against, and coverage is the full report's
        footer = []
    elif not args.large:  # a property of the predictors: the full report has it
        footer += coverage_section()
    if skipped:
        note = plots.skipped_note("timelines and cost curves")
        header += [note, ""]
        if finished:
            print(note)
    (args.out / report_name(args)).write_text("\n".join(header + sections + footer))


def report_name(args: argparse.Namespace) -> str:
    """The large fleets and the family have reports of their own, so the full run's stays whole."""
    return "backtest_family.md" if args.family else "backtest_large.md" if args.large else "backtest.md"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2, help="processes (one policy group each)")
    modes = parser.add_mutually_exclusive_group()
    modes.add_argument("--quick", action="store_true", help="two scenarios, one predictor: for CI")
    modes.add_argument("--large", action="store_true",
                       help="only the large fleets: ×16 and ×64 as tenants, ×64 as copies (Azure ×64: 24 min; "
                            "Mooncake ×64: hours), into backtest_large.md")
    modes.add_argument("--family", type=int, default=0, metavar="N",
                       help="N seeds of the synthetic traffic family instead of the traces (about 3 min a seed "
                            "on one core), into backtest_family.md")
    parser.add_argument("--family-seed-base", type=int, default=0, metavar="B",
                        help="with --family: seeds B..B+N-1 (default 0)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--row", action="append", default=[], metavar="TEXT",
                        help="only the rows whose label contains TEXT (repeatable)")
    args = parser.parse_args()
    if args.family < 0:
        parser.error("--family takes a number of seeds, at least 1")
    if args.family_seed_base and not args.family:
        parser.error("--family-seed-base needs --family N")
    args.out.mkdir(parents=True, exist_ok=True)
    predictors = ("constant",) if args.quick else evaluate.PREDICTORS
    # Kalman and Prophet refit on 2,016 ten-minute intervals cost 80–170 s per run on 14 days (measured):
    # the long series run fleetpilot with the constant and ARIMA predictors only.
    long_predictors = ("constant",) if args.quick else ("constant", "arima")
    profile = evaluate.load_profile(str(PROFILE))

    began = time.perf_counter()
    headline: list[tuple[Row, dict[str, evaluate.Summary]]] = []
    sections: list[str] = []
    fidelity: list[str] = []
    skipped = False
    seeds = range(args.family_seed_base, args.family_seed_base + args.family)
    chosen_rows = [row for row in rows(args.quick, args.large, seeds)
                   if not args.row or any(text in row.label for text in args.row)]
    if not chosen_rows:
        parser.error(f"no row's label contains any of {args.row}; labels look like "
                     f"{next(rows(False)).label!r}")
    for row in chosen_rows:
        scenario_ = scenario(row, profile, workers=args.workers)
        print(f"== {row.label}: {scenario_.description}", flush=True)
        started = time.perf_counter()
        chosen_predictors = long_predictors if scenario_.fidelity == "fluid" else predictors
        done = evaluate.run_all(scenario_, predictors=chosen_predictors, workers=args.workers,
                                predictive_only=() if args.quick else ("constant",),
                                mean_lengths=() if args.quick else ("constant",), progress=lambda g: print(
            f"   {g.name:22} {len(g.results):2d} runs, {g.seconds_per_run:6.2f} s/run, best score "
            f"{max(r.effective for r in g.results):.1%}", flush=True))
        elapsed = time.perf_counter() - started
        summary = evaluate.summarise(done, scenario_)
        headline.append((row, summary))
        name = slug(row.label)
        drawn: dict[str, str] = {}
        # The family draws no PNGs: twenty seeds' timelines would bury the report; its tables carry the detail.
        for policy in () if args.family else (evaluate.best_fleetpilot(summary) or f"fleetpilot-{predictors[0]}", "dynamo", "oracle"):
            chosen = summary[policy].cheapest_meeting or max(done[policy].results, key=lambda r: r.effective)
            if evaluate.plot_timeline(chosen, scenario_, args.out / f"backtest_{name}_{policy}.png",
                                      title=f"{row.label}: {policy}, knob {chosen.knob:g}"):
                drawn[f"{policy} timeline"] = f"backtest_{name}_{policy}.png"
        if not args.family and evaluate.plot_curves(scenario_, done, args.out / f"backtest_{name}_curves.png",
                                                    target=SLA.percentile / 100):
            drawn["cost vs score"] = f"backtest_{name}_curves.png"
        skipped = skipped or (not drawn and not args.family)
        sections.append(evaluate.markdown_section(scenario_, done, png=drawn)
                        + f"\nWhole sweep: {elapsed:.0f} s with {args.workers} worker(s).\n")
        print(f"   done in {elapsed:.0f} s", flush=True)
        # Written after every scenario: a long run that is stopped still leaves what it measured.
        write_report(args, headline, sections, fidelity, skipped, time.perf_counter() - began, finished=False)
        if not args.quick and scenario_.fidelity == "request" and row.rate > 1 and row.startup_s == 120.0:
            print("   fluid model against the per-request simulator", flush=True)
            for policy, knob, gpu_hours, exact, approx in fidelity_rows(scenario_, done):
                near_knee = 0.7 <= exact <= 1.0
                verdict = ("within 5 pts" if abs(exact - approx) <= 0.05 else "**off by more than 5 pts**") \
                    if near_knee else "outside 70–100%"
                fidelity.append(f"| {row.label} | {policy} | {knob:g} | {gpu_hours:.2f} | {exact:.1%} | {approx:.1%} "
                                f"| {verdict} |")
            write_report(args, headline, sections, fidelity, skipped, time.perf_counter() - began, finished=False)

    total = time.perf_counter() - began
    write_report(args, headline, sections, fidelity, skipped, total, finished=True)
    print(f"wrote {args.out / report_name(args)} in {total / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
