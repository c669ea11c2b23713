"""The demo: fleetpilot doing its main job on a real trace, in a few minutes, on a laptop-sized machine.

    python e2e/demo.py up      # scripts/demo.sh up: everything below, left running
    python e2e/demo.py down    # scripts/demo.sh down: stop every process it started, by PID

`up` brings up the closed loop of the e2e scenarios (harness.py) as the `dev` cluster: a real control
plane with simulated GPU nodes, upstream Prometheus discovering pods with kubernetes_sd and
evaluating the chart's alerts, the operator and the planner (with the chart's RBAC), and the pod
runner, so the graph's frontend and simulator engines really serve. It applies a disaggregated
simulator graph with the planner in `sla` mode at the API's default risk and replays fifteen minutes
of the Azure LLM code trace (../shared/traces), four times faster and thinned to what two cores
serve, with a progress bar. The first five minutes are the planner's history, as a planner that has
been running has seen the traffic before the minutes one looks at: they are replayed, drawn and not
scored. It ends with a table (requests, SLA attainment, GPU-hours, the planner's scaling decisions,
and what a static fleet sized for the scored minutes' peak would have cost over the same minutes)
and a PNG timeline (load, prefill/decode replicas beside that static fleet, TTFT/ITL p90 against the
targets), and leaves it all up to explore (kubectl, Prometheus' API) until `down`.

The engines run at 0.1× an H200's speed (scenario.py says why), so two cores hold a fleet that needs
several replicas at the trace's peaks; the SLA targets are wall-clock targets for that engine.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import harness as harness_mod
import loadgen
import scenario as scenario_mod
from conftest import Graph
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from fleetpilot import traces

HERE = Path(__file__).resolve().parent
TRACES = Path(os.environ.get("FLEETPILOT_TRACES", harness_mod.REPO.parent / "shared" / "traces"))
TRACE = TRACES / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv"
# Minutes 22-32 of the trace are scored: load rises, falls to nothing, rises again and fades, so the
# fleet has to grow, shrink and grow again. Minutes 17-22 before them (a quiet minute, a burst, a
# fall) are the planner's history.
TRACE_START_S, TRACE_DURATION_S = 1320.0, 600.0
WARMUP_S = 300.0
TIME_SCALE = 4.0  # ten minutes of trace in 150 s
RATE_SCALE = 0.1  # a tenth of the requests: about 3 req/s at the peaks after the time scale, what two cores serve
CLUSTER = os.environ.get("FLEETPILOT_DEMO_CLUSTER", "dev")


def demo_requests() -> list[traces.Request]:
    """Every request the demo sends, the warm-up's first; arrivals in wall seconds from the replay's start."""
    shape = traces.Shape(start_s=TRACE_START_S - WARMUP_S, duration_s=WARMUP_S + TRACE_DURATION_S,
                         rate_factor=RATE_SCALE, time_factor=TIME_SCALE, seed=1)
    return loadgen.load_requests(TRACE, model="", isl=0, osl=0, sigma=0, seed=1, shape=shape)


def demo_scenario(requests: list[traces.Request]) -> scenario_mod.ClosedLoop:
    """The e2e closed loop's graph and planner timings, its load being the trace's (in 5-s steps)."""
    step = 5.0
    end = max(r.arrival_s for r in requests)
    # One point per window at its middle: the timeline reads the rate at each window's middle.
    shape = tuple(((t + 0.5) * step, sum(1 for r in requests if t * step <= r.arrival_s < (t + 1) * step) / step)
                  for t in range(int(end // step) + 1))
    return dataclasses.replace(scenario_mod.ClosedLoop(), namespace="demo", graph="llama-8b", shape=shape,
                               window_s=step, risk=None)


def new_harness() -> harness_mod.Harness:
    s = scenario_mod.ClosedLoop
    return harness_mod.Harness(cluster_name=CLUSTER, planner_args=[
        "--startup-seconds", str(s.startup_s), "--hold-seconds", str(s.hold_s)])


def decisions(samples: list[dict[str, Any]], t0: float) -> list[tuple[float, str, int, int]]:
    """(seconds, component, from, to) for each change of a component's replicas the planner made."""
    changes = []
    for component in scenario_mod.COMPONENTS:
        previous = None
        for sample in samples:
            now = sample.get(f"{component}_desired")
            if previous is not None and now is not None and now != previous:
                changes.append((sample["t_unix"] - t0, component, previous, now))
            previous = now if now is not None else previous
    return sorted(changes)


def gpu_hours(samples: list[dict[str, Any]], *, since: float, until: float) -> float:
    """Ready worker replicas (one GPU each) integrated over the load's wall-clock time."""
    inside = [x for x in samples if since <= x["t_unix"] <= until]
    total = 0.0
    for before, after in itertools.pairwise(inside):
        ready = sum(before.get(f"{c}_ready") or 0 for c in scenario_mod.COMPONENTS)
        total += ready * (after["t_unix"] - before["t_unix"])
    return total / 3600


def up(console: Console) -> int:
    if not TRACE.is_file():
        console.print(f"[red]demo: the trace {TRACE} is missing (set FLEETPILOT_TRACES to the traces folder)")
        return 1
    started = time.monotonic()
    requests = demo_requests()
    s = demo_scenario(requests)
    environment = new_harness()
    with console.status("starting the control plane, Prometheus, the operator and the planner"):
        timings = environment.up(log=lambda line: console.print(f"  {line}"))
    graph = Graph(environment, s)
    with console.status(f"applying DynamoGraph {s.namespace}/{s.graph} (planner mode sla)"):
        graph.create()
        url = graph.wait_ready()
    console.print(f"  graph {s.namespace}/{s.graph} Ready; frontend {url}")

    out = environment.config.folder / "demo"
    out.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, str(HERE / "loadgen.py"), "--trace", str(TRACE), "--url", url,
            "--model", s.served_model, "--out", str(out / "load.json"), "--sla", s.sla, "--seed", "1",
            "--start", str(TRACE_START_S - WARMUP_S), "--duration", str(WARMUP_S + TRACE_DURATION_S),
            "--warmup", str(WARMUP_S), "--rate-scale", str(RATE_SCALE), "--time-scale", str(TIME_SCALE)]
    sampler = scenario_mod.Sampler(server=environment.config.server, pki=environment.config.folder / "pki",
                                   scenario=s, every_s=scenario_mod.SAMPLE_S)
    t0 = time.time()
    sampler.start()
    with (out / "load.log").open("wb") as log:
        load = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    span = max(r.arrival_s for r in requests)
    scored_from_s = WARMUP_S / TIME_SCALE
    console.print(f"replaying minutes {(TRACE_START_S - WARMUP_S) / 60:.0f}-{(TRACE_START_S + TRACE_DURATION_S) / 60:.0f}"
                  f" of {TRACE.name} ×{TIME_SCALE:g} faster, {RATE_SCALE:.0%} of its requests: {len(requests)}"
                  f" requests in {span:.0f} s; the first {scored_from_s:.0f} s (minutes"
                  f" {(TRACE_START_S - WARMUP_S) / 60:.0f}-{TRACE_START_S / 60:.0f}) are the planner's history, not scored")
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[fleet]}"), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("trace", total=span, fleet="")
        while load.poll() is None:
            elapsed = time.time() - t0
            last = sampler.samples[-1] if sampler.samples else {}
            sent = sum(1 for r in requests if r.arrival_s <= elapsed)
            progress.update(task, completed=min(elapsed, span), description=f"{min(sent, len(requests))} sent",
                            fleet=f"prefill {last.get('prefill_ready')}/{last.get('prefill_desired')}"
                                  f"  decode {last.get('decode_ready')}/{last.get('decode_desired')}")
            time.sleep(0.5)
            if elapsed > span + 300:
                load.kill()
                console.print("[red]demo: the load generator did not finish")
                return 1
    sampler.stop()
    report = json.loads((out / "load.json").read_text())
    rows = scenario_mod.timeline(s, sampler.samples, report, t0_unix=t0)
    changes = decisions(sampler.samples, t0)
    scored_start = report["started_unix"] + report["scored_from_s"]
    summary = report["summary"]
    ended = time.time()
    gpu_h = gpu_hours(sampler.samples, since=scored_start, until=ended)
    static = scenario_mod.static_fleet(requests, s, scored_from_s=report["scored_from_s"])
    static_gpu_h = sum(static.values()) * (ended - scored_start) / 3600
    can_meet = scenario_mod.servable(requests, s)
    scored = [r for r in report["requests"] if r["scheduled_ms"] >= report["scored_from_s"] * 1000]
    judged = [r for r in scored if can_meet[r["index"]]]
    attained = scenario_mod.attainment(judged, s)
    png = out / "timeline.png"
    (out / "timeline.json").write_text(json.dumps({
        "scenario": dataclasses.asdict(s), "timeline": rows, "samples": sampler.samples,
        "summary": {"load": summary, "servable": len(judged), "attainment_servable": attained,
                    "gpu_hours": gpu_h, "static_fleet": static, "static_gpu_hours": static_gpu_h,
                    "scaling_decisions": changes, "setup_seconds": timings},
    }, indent=1) + "\n")
    title = (f"fleetpilot demo: {TRACE.name}, minutes {(TRACE_START_S - WARMUP_S) / 60:.0f}-"
             f"{(TRACE_START_S + TRACE_DURATION_S) / 60:.0f} x{TIME_SCALE:g}, {RATE_SCALE:.0%} of requests")
    scenario_mod.plot(rows, png, scenario=s, title=title, marks={"scored from here": scored_start - t0},
                      static=static)

    table = Table(title=f"fleetpilot demo: {s.namespace}/{s.graph}, planner sla, default risk "
                        f"(TTFT {s.ttft_ms} ms, ITL {s.itl_ms} ms, p{s.percentile}); scored minutes"
                        f" {TRACE_START_S / 60:.0f}-{(TRACE_START_S + TRACE_DURATION_S) / 60:.0f}")
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("requests (ok / errors)", f"{summary['count']} ({summary['ok']} / {summary['errors']})")
    unservable = len(scored) - len(judged)
    table.add_row("longer than the targets allow on an idle replica", f"{unservable} ({unservable / len(scored):.0%})")
    table.add_row("SLA attainment of the others (TTFT and ITL within target)", f"{attained:.1%}")
    table.add_row("SLA attainment of all requests", f"{summary['goodput_fraction']:.1%}")
    if summary["ttft_ms"] and summary["itl_ms"]:
        table.add_row("TTFT p90 / ITL p90",
                      f"{summary['ttft_ms']['p90']:.0f} ms / {summary['itl_ms']['p90']:.1f} ms")
    table.add_row("GPU-hours (simulated H200s, wall clock)", f"{gpu_h:.3f}")
    table.add_row(f"static fleet for the peak ({static['prefill']} prefill + {static['decode']} decode, not run)",
                  f"{static_gpu_h:.3f} GPU-h ({gpu_h / static_gpu_h:.0%} of it)" if static_gpu_h else "—")
    for component in scenario_mod.COMPONENTS:
        mine = [c for c in changes if c[1] == component]
        ups = sum(1 for c in mine if c[3] > c[2])
        peak = max((x[f"{component}_desired"] or 0 for x in sampler.samples), default=0)
        table.add_row(f"planner: {component} scalings (up / down), peak",
                      f"{ups} / {len(mine) - ups}, {peak} replicas")
    console.print(table)
    steps = ", ".join(f"{t:.0f}s {c} {a}→{b}" for t, c, a, b in changes)
    console.print(f"scaling decisions: {steps or 'none'}")
    console.print(f"timeline: {png}" if png.exists() else "timeline: skipped (matplotlib missing)")
    console.print(f"demo took {time.monotonic() - started:.0f} s; everything is still running:"
                  f" KUBECONFIG={environment.config.kubeconfig}, Prometheus {environment.prometheus_url};"
                  " stop it with scripts/demo.sh down")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", nargs="?", choices=["up", "down"], default="up")
    args = parser.parse_args()
    console = Console()
    # Pod IPs of its own (the pod runner, a child, reads it), so the demo runs beside an e2e session,
    # whose default is 127.2.0.0/16.
    os.environ.setdefault("FLEETPILOT_E2E_POD_NETWORK", "127.3.0.0/16")
    if args.action == "down":
        new_harness().down()
        return 0
    return up(console)


if __name__ == "__main__":
    sys.exit(main())
