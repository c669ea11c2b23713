"""`fleetpilot planner backtest`: how each scaling policy would have done on a trace, before going live.

    fleetpilot planner backtest --trace azure_code.csv --profile h200_llama31_8b_fp8_vllm \\
        --sla ttft=500ms,itl=50ms,p=90 [--rate-scale 4] [--startup-seconds 600] [--interval 60] \\
        [--prefill-replicas 1:64 --decode-replicas 1:32] [--model m-mid] [--out results/]
        [--replica llama-3.1-70b,tp=16,nodes=2 --profile perfmodel]   # multinode group replicas

Replays the trace through the simulated fleet with every policy at every knob setting (the real
planner core among them), prints SLA attainment, GPU-hours, goodput per GPU-hour and scaling actions,
the GPU-hours each policy needs for the target attainment, and writes them as Markdown with a timeline
and a cost–attainment PNG (the PNGs need the `plots` extra; without it the report says they were
skipped). A ServeGen rate series runs on the fluid fleet model; request traces run request by request.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
from pathlib import Path
from typing import Any

from fleetpilot.api import v1alpha1 as api

_DURATION = re.compile(r"^(?P<value>\d+(?:\.\d+)?)(?P<unit>ms|s)?$")


def parse_sla(text: str) -> api.SlaTarget:
    """`ttft=500ms,itl=50ms,p=90` → SlaTarget; a bare number is milliseconds."""
    fields: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, _, value = part.partition("=")
        key = key.strip().lower()
        if key in ("ttft", "itl"):
            match = _DURATION.match(value.strip())
            if match is None:
                raise argparse.ArgumentTypeError(f"--sla {key}={value!r}: write a duration like 500ms or 0.5s")
            number = float(match["value"])
            fields[key] = number * 1000 if match["unit"] == "s" else number
        elif key in ("p", "percentile"):
            fields["p"] = float(value)
        else:
            raise argparse.ArgumentTypeError(f"--sla: unknown field {key!r}; use ttft=, itl= and p=")
    missing = {"ttft", "itl"} - set(fields)
    if missing:
        raise argparse.ArgumentTypeError(f"--sla needs {' and '.join(sorted(missing))}, e.g. ttft=500ms,itl=50ms,p=90")
    try:
        return api.SlaTarget(ttft_ms=fields["ttft"], itl_ms=fields["itl"], percentile=fields.get("p", 90.0))
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"--sla: {error}") from error


@dataclasses.dataclass(frozen=True)
class GraphArg:
    """`--graph NAME=TRACE[,priority=P][,rate=X]`: one graph of a shared-budget backtest."""

    name: str
    trace: Path
    priority: int = 0
    rate_scale: float = 1.0


def parse_graph(text: str) -> GraphArg:
    name, _, rest = text.partition("=")
    trace, *options = rest.split(",")
    if not name.strip() or not trace.strip():
        raise argparse.ArgumentTypeError(f"--graph {text!r}: write NAME=TRACE[,priority=P][,rate=X]")
    fields: dict[str, str] = {}
    for option in options:
        key, _, value = option.partition("=")
        if key.strip() not in ("priority", "rate"):
            raise argparse.ArgumentTypeError(f"--graph: unknown option {key.strip()!r}; use priority= and rate=")
        fields[key.strip()] = value.strip()
    try:
        return GraphArg(name.strip(), Path(trace.strip()), priority=int(fields.get("priority", 0)),
                        rate_scale=float(fields.get("rate", 1.0)))
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"--graph {text!r}: {error}") from error


def parse_bounds(text: str) -> tuple[int, int]:
    """`1:64` → (1, 64)."""
    low, _, high = text.partition(":")
    try:
        bounds = int(low), int(high)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: write MIN:MAX, e.g. 1:64") from None
    if not 0 <= bounds[0] <= bounds[1] or bounds[1] < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: need 0 ≤ MIN ≤ MAX and MAX ≥ 1")
    return bounds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("backtest")
    group.add_argument("--trace", type=Path, help="Azure CSV, Mooncake JSONL or ServeGen rate series")
    group.add_argument("--graph", type=parse_graph, action="append", default=[],
                       metavar="NAME=TRACE[,priority=P][,rate=X]", help="a graph sharing the one --gpu-budget NAME=GPUS with the others (repeatable; "
                            "instead of --trace): the planner on each under the budget, and on each alone")
    group.add_argument("--risk", type=float, default=0.9, help="the forecast quantile the planner sizes for with --graph")
    group.add_argument("--profile", help="profile JSON, a Dynamo CSV pair's common prefix, or `perfmodel`: the "
                                         "performance model of the --replica the fleet runs")
    group.add_argument("--replica", default=None, metavar="MODEL[,tp=N][,pp=N][,nodes=N][,gpu=G][,engine=E]",
                       help="what one replica of each pool runs (default llama-3.1-8b on one H200); e.g. "
                            "llama-3.1-70b,tp=16,nodes=2: a group of two 8-GPU nodes, 16 GPUs a replica")
    group.add_argument("--sla", type=parse_sla, default=None, help="e.g. ttft=500ms,itl=50ms,p=90")
    group.add_argument("--rate-scale", type=float, default=1.0, help="multiply the trace's request rate")
    group.add_argument("--tenant-shift", type=float, default=None, metavar="SECONDS",
                       help="with --rate-scale above 1 on a request trace: each copy of the trace is another "
                            "tenant, shifted as a whole by up to SECONDS, so copies keep their bursts but not "
                            "each other's (default: every request's copies arrive within one mean gap)")
    group.add_argument("--rate-reading", choices=("step", "smooth"), default=None,
                       help="a ServeGen series: the rate within each window constant (step, the default: it "
                            "jumps at every boundary) or smooth (a monotone cubic through the counts, each "
                            "window's mean kept)")
    group.add_argument("--interval", type=float, default=None,
                       help="planning interval, s (default 60; 600 for a ServeGen series)")
    group.add_argument("--predictors", default="constant,arima,kalman,prophet", help="comma-separated")
    group.add_argument("--model", default="m-large", help="which model's series of a ServeGen file")
    group.add_argument("--prefill-replicas", type=parse_bounds, default=None, metavar="MIN:MAX",
                       help="prefill replica bounds (default: 1 to 4× what the trace's busiest interval needs)")
    group.add_argument("--decode-replicas", type=parse_bounds, default=None, metavar="MIN:MAX",
                       help="decode replica bounds (default as for prefill)")
    group.add_argument("--workers", type=int, default=1, help="processes: the oracle's search split between them, then one policy at a time each")
    group.add_argument("--burn-in-minutes", type=float, default=None, metavar="MINUTES",
                       help="replay the trace's first MINUTES as every policy's history, neither scored nor costed "
                            "(default: 10 when the replay is at least 30 minutes long, else 0)")
    group.add_argument("--out", type=Path, default=Path("backtest-results"), help="folder for the PNGs and report")


def run(args: argparse.Namespace) -> int:
    from fleetpilot import plots, traces
    from fleetpilot.planner.backtest import evaluate  # numpy, statsmodels, prophet: only when asked
    from fleetpilot.planner.backtest.fleetsim import FleetPool

    if (args.trace is None and not args.graph) or args.profile is None or args.sla is None:
        raise SystemExit("fleetpilot planner backtest: --trace (or --graph), --profile and --sla are required")
    try:
        timing = evaluate.replica_timing(args.replica) if args.replica else evaluate.default_timing()
    except ValueError as error:
        raise SystemExit(f"fleetpilot planner backtest: {error}") from None
    profile = evaluate.model_profile(timing) if args.profile == "perfmodel" else evaluate.load_profile(args.profile)
    predictors = tuple(p.strip() for p in args.predictors.split(",") if p.strip())
    unknown = set(predictors) - set(evaluate.PREDICTORS)
    if unknown:
        raise SystemExit(f"fleetpilot planner backtest: unknown predictor(s) {', '.join(sorted(unknown))}; "
                         f"choose from {', '.join(evaluate.PREDICTORS)}")
    sources = [args.trace] if args.trace is not None else [graph.trace for graph in args.graph]
    if args.tenant_shift is not None and any(traces.file_format(path) == "servegen" for path in sources):
        raise SystemExit(f"fleetpilot planner backtest: {traces.NO_TENANTS_IN_A_RATE_SERIES}")
    if args.rate_reading is not None and any(traces.file_format(path) != "servegen" for path in sources):
        raise SystemExit("fleetpilot planner backtest: --rate-reading reads a ServeGen rate series; a request "
                         "trace has each request's arrival time already: drop --rate-reading")
    if args.graph:
        return _run_budget(args, profile, predictors[0], timing)
    bounds: dict[FleetPool, tuple[int, int]] | None = None
    if args.prefill_replicas or args.decode_replicas:
        bounds = {"prefill": args.prefill_replicas or (1, 64), "decode": args.decode_replicas or (1, 64)}
    burn_in_s = None if args.burn_in_minutes is None else args.burn_in_minutes * 60.0
    try:
        if traces.file_format(args.trace) == "servegen":
            scenario = evaluate.scenario_from_servegen(
                args.trace.stem, args.trace, profile=profile, sla=args.sla, rate_factor=args.rate_scale,
                model=args.model, interval_s=args.interval or 600.0, startup_s=args.startup_seconds, bounds=bounds,
                timing=timing, burn_in_s=burn_in_s, reading=args.rate_reading or "step")
        else:
            scenario = evaluate.scenario_from_trace(
                args.trace.stem, args.trace, profile=profile, sla=args.sla, rate_factor=args.rate_scale,
                interval_s=args.interval or 60.0, startup_s=args.startup_seconds, bounds=bounds, timing=timing,
                burn_in_s=burn_in_s, workers=args.workers, tenant_shift_s=args.tenant_shift)
    except ValueError as error:
        raise SystemExit(f"fleetpilot planner backtest: {error}") from None
    print(f"{scenario.description}; {scenario.fidelity} fleet model; {evaluate.burn_in_note(scenario)}", flush=True)
    done = evaluate.run_all(scenario, predictors=predictors, workers=args.workers, progress=_progress)
    summary = evaluate.summarise(done, scenario)
    _print_table(done, summary, scenario.sla.percentile / 100.0)
    args.out.mkdir(parents=True, exist_ok=True)
    best = evaluate.best_fleetpilot(summary) or f"fleetpilot-{predictors[0]}"
    chosen = summary[best].cheapest_meeting or max(done[best].results, key=lambda r: r.effective)
    drawn = evaluate.draw(scenario, done, args.out, target=scenario.sla.percentile / 100.0, chosen=chosen,
                          title=f"{scenario.name}: {best}")
    report = evaluate.markdown_section(scenario, done, png=drawn)
    if not drawn:
        note = plots.skipped_note("timeline.png, curves.png")
        report += f"\n{note}\n"
        print(note)
    (args.out / "backtest.md").write_text(report)
    print(f"wrote {args.out / 'backtest.md'}" + "".join(f", {name}" for name in drawn.values()))
    return 0


def _progress(group: Any) -> None:
    print(f"  {group.name:22} {len(group.results)} runs, {group.seconds_per_run:.2f} s/run", flush=True)


def _print_table(done: Any, summary: Any, target: float) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"GPU-hours to meet the SLA ({target:.0%} of requests, every 5 minutes within 5 points), "
                        "and each policy's sweep")
    for column in ("policy", "GPU-h to meet", "knob", "GPU-h", "requests met", "worst 5 min", "score",
                   "good req/GPU-h", "actions"):
        table.add_column(column, justify="left" if column in ("policy",) else "right")
    for name, group in done.items():
        at = summary[name].gpu_hours_at_target
        for i, r in enumerate(sorted(group.results, key=lambda r: r.gpu_hours)):
            worst = r.scores.worst_window if r.scores is not None else math.nan
            table.add_row(name if i == 0 else "", ("—" if at is None else f"{at:.2f}") if i == 0 else "",
                          f"{r.knob:g}", f"{r.gpu_hours:.2f}", f"{r.request_attainment:.1%}",
                          "—" if math.isnan(worst) else f"{worst:.1%}", f"{r.effective:.1%}",
                          f"{r.goodput_per_gpu_hour:,.0f}", str(r.actions))
    Console().print(table)


def _run_budget(args: argparse.Namespace, profile: Any, predictor: str, timing: Any) -> int:
    """`--graph ... --gpu-budget NAME=GPUS`: several graphs under one budget, as the live planner runs them."""
    from fleetpilot import plots, traces
    from fleetpilot.planner.backtest import evaluate

    if args.trace is not None or len(args.gpu_budget) != 1:
        raise SystemExit("fleetpilot planner backtest: --graph takes exactly one --gpu-budget NAME=GPUS, "
                         "and no --trace")
    budget_name, _, gpus = args.gpu_budget[0].partition("=")
    if not gpus.isdigit():
        raise SystemExit(f"fleetpilot planner backtest: --gpu-budget takes NAME=GPUS, not {args.gpu_budget[0]!r}")
    names = [graph.name for graph in args.graph]
    if len(set(names)) != len(names):
        raise SystemExit(f"fleetpilot planner backtest: --graph names must differ, got {', '.join(names)}")
    fluid = any(traces.file_format(graph.trace) == "servegen" for graph in args.graph)
    interval_s = args.interval or (600.0 if fluid else 60.0)
    graphs = []
    for seed, graph in enumerate(args.graph):
        # Its own seed: two graphs cut from one trace at one rate get different requests.
        if traces.file_format(graph.trace) == "servegen":
            scenario = evaluate.scenario_from_servegen(
                graph.name, graph.trace, profile=profile, sla=args.sla, rate_factor=graph.rate_scale,
                interval_s=interval_s, startup_s=args.startup_seconds, seed=seed, timing=timing,
                reading=args.rate_reading or "step")
        else:
            scenario = evaluate.scenario_from_trace(
                graph.name, graph.trace, profile=profile, sla=args.sla, rate_factor=graph.rate_scale,
                interval_s=interval_s, startup_s=args.startup_seconds, seed=seed, timing=timing,
                tenant_shift_s=args.tenant_shift)
        print(f"{graph.name} (priority {graph.priority}): {scenario.description}; {scenario.fidelity} fleet model",
              flush=True)
        graphs.append(evaluate.BudgetGraph(scenario, graph.priority))
    result = evaluate.run_budget(graphs, budget=int(gpus), predictor=predictor, risk=args.risk)
    _print_budget_table(result, budget_name)
    args.out.mkdir(parents=True, exist_ok=True)
    drawn = {"GPUs per graph": "budget.png"} if evaluate.plot_budget(result, args.out / "budget.png") else {}
    report = evaluate.budget_markdown(result, png=drawn)
    if not drawn:
        note = plots.skipped_note("budget.png")
        report += f"\n{note}\n"
        print(note)
    (args.out / "backtest.md").write_text(report)
    print(f"wrote {args.out / 'backtest.md'}" + "".join(f", {name}" for name in drawn.values()))
    return 0


def _print_budget_table(result: Any, budget_name: str) -> None:
    from rich.console import Console
    from rich.table import Table

    shared = result.shared
    table = Table(title=f"GPU budget {budget_name} = {shared.budget}: each graph under it, and alone")
    for column in ("graph", "priority", "attainment", "alone", "GPU-h", "alone GPU-h", "capped", "mean granted"):
        table.add_column(column, justify="left" if column == "graph" else "right")
    for graph in result.graphs:
        name = graph.scenario.name
        run, solo = shared.runs[name], result.alone[name]
        table.add_row(name, str(graph.priority), f"{run.attainment:.1%}", f"{solo.attainment:.1%}",
                      f"{run.gpu_hours:.2f}", f"{solo.gpu_hours:.2f}", f"{shared.capped_share(name):.0%}",
                      f"{shared.granted[name].mean():.1f}")
    Console().print(table)
