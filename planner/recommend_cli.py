"""`fleetpilot recommend`: the cheapest layouts that hold an SLA at a load, and the graph that runs the best.

Where it sits: the entry point above `recommend` (the pure search). It turns flags into the performance
model's candidates (or a measured profile), prints the ranking with rich, and with `--emit` writes the
DynamoGraph (and its profile's ConfigMap) as YAML that `kubectl apply -f` takes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from fleetpilot import perfmodel, yamlio
from fleetpilot.api import profile as profiles
from fleetpilot.planner import recommend, sizing
from fleetpilot.planner.backtest.cli import parse_sla

DEFAULT_ISL, DEFAULT_OSL = 1024, 256
DEFAULT_IMAGES = {"vllm": "vllm/vllm-openai:v0.11.0", "sglang": "lmsysorg/sglang:v0.5.3",
                  "trtllm": "nvcr.io/nvidia/tensorrt-llm/release:1.0.0"}


def parse_load(text: str) -> sizing.Load:
    """`RATE[,ISL,OSL]` → Load (requests/s, mean prompt and output tokens)."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) not in (1, 3):
        raise argparse.ArgumentTypeError(f"--load {text!r}: write RATE or RATE,ISL,OSL, e.g. 20 or 20,2048,256")
    try:
        rate = float(parts[0])
        isl, osl = (float(parts[1]), float(parts[2])) if len(parts) == 3 else (DEFAULT_ISL, DEFAULT_OSL)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"--load {text!r}: {error}") from error
    if rate <= 0 or isl < 1 or osl < 1:
        raise argparse.ArgumentTypeError(f"--load {text!r}: the rate must be > 0 and ISL, OSL at least 1 token")
    return sizing.Load(rate_rps=rate, isl=isl, osl=osl)


def find_model(name: str) -> perfmodel.ModelSpec:
    """A performance-model preset by its name or its checkpoint's hub name (case does not matter)."""
    wanted = name.lower()
    for spec in perfmodel.MODELS.values():
        if wanted in (spec.name, spec.repository.lower()):
            return spec
    names = ", ".join(sorted(perfmodel.MODELS))
    raise argparse.ArgumentTypeError(f"--model {name!r}: not a performance-model preset; choose from {names}")


def find_gpu(name: str) -> perfmodel.GpuSpec:
    """`H100`, `h100`, `h100-sxm` → the GPU preset."""
    wanted = name.lower()
    for key, spec in perfmodel.GPUS.items():
        if wanted in (key, key.removesuffix("-sxm")):
            return spec
    raise argparse.ArgumentTypeError(f"--gpu {name!r}: choose from {', '.join(sorted(perfmodel.GPUS))}")


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "recommend", help="rank parallelism, aggregated vs disaggregated and P:D layouts by GPU cost at an SLA",
        description=__doc__)
    parser.add_argument("--model", required=True, type=find_model,
                        help=f"performance-model preset or hub name: {', '.join(sorted(perfmodel.MODELS))}")
    parser.add_argument("--gpu", required=True, type=find_gpu, help="H100 or H200")
    parser.add_argument("--sla", required=True, type=parse_sla, help="ttft=500ms,itl=50ms[,p=90]")
    parser.add_argument("--load", required=True, type=parse_load,
                        help=f"RATE[,ISL,OSL]: requests/s and mean lengths (default {DEFAULT_ISL},{DEFAULT_OSL})")
    parser.add_argument("--engine", default="vllm", choices=["vllm", "sglang", "trtllm"],
                        help="serving engine: its calibration times the model, and --emit runs it")
    parser.add_argument("--profile", type=Path, default=None,
                        help="a measured Profile (JSON, e.g. from `fleetpilot profile`): search its parallelism only")
    parser.add_argument("--mode", choices=["both", *recommend.MODES], default="both")
    parser.add_argument("--mixed", action="store_true",
                        help="also let prefill and decode run different parallelisms (the live planner cannot "
                             "plan such a graph from one profile: --emit then turns its planner off)")
    parser.add_argument("--top", type=int, default=5, help="layouts to print (default 5)")
    parser.add_argument("--json", action="store_true", help="print the ranking as JSON")
    parser.add_argument("--emit", default=None, metavar="FILE",
                        help="write the best layout's DynamoGraph and profile ConfigMap as YAML ('-': stdout)")
    parser.add_argument("--name", default=None, help="the emitted graph's name (default: from the model)")
    parser.add_argument("--namespace", default=None, help="the emitted objects' namespace")
    parser.add_argument("--image", default=None, help="engine image (default: the engine's release image)")
    parser.set_defaults(func=run)


def _candidates(args: argparse.Namespace) -> tuple[list[recommend.Candidate], list[str], profiles.Profile | None]:
    load: sizing.Load = args.load
    if args.profile is not None:
        measured = profiles.Profile.model_validate_json(args.profile.read_text())
        return [recommend.measured_candidate(measured)], [], measured
    calibration = perfmodel.CALIBRATIONS[args.engine]
    found, excluded = recommend.modelled_candidates(args.model, args.gpu, isl=load.isl, osl=load.osl,
                                                    calibration=calibration)
    return found, excluded, None


def _as_json(result: recommend.Recommendation, top: int) -> str:
    def layout(entry: recommend.Ranked) -> dict[str, Any]:
        pools = {name: {"replicas": pool.replicas, "tensor": pool.parallelism.tensor,
                        "pipeline": pool.parallelism.pipeline} for name, pool in entry.layout.pools.items()}
        return {"mode": entry.layout.mode, "gpus": entry.layout.gpus, "meetsSla": entry.layout.meets_sla,
                "pools": pools, "loses": entry.loses, "sizing": entry.layout.sizing}
    return json.dumps({"ranked": [layout(e) for e in result.ranked[:top]], "excluded": list(result.excluded)},
                      indent=2)


def _print(console: Console, args: argparse.Namespace, result: recommend.Recommendation, seconds: float,
           searched: int) -> None:
    load, sla = result.load, result.sla
    source = f"measured profile {args.profile}" if args.profile else f"performance model, {args.engine} calibration"
    console.print(f"[bold]{args.model.name}[/bold] on {args.gpu.name} ({source}): {load.words()}; "
                  f"SLA TTFT {sla.ttft_ms:g} ms, ITL {sla.itl_ms:g} ms at p{sla.percentile:g}")
    console.print(f"searched {searched} parallelisms, {len(result.ranked)} layouts in {seconds:.2f} s")
    table = Table(show_lines=False)
    for column in ("#", "layout", "GPUs", "why not first"):
        table.add_column(column, overflow="fold")
    for index, entry in enumerate(result.ranked[:args.top], start=1):
        gpus = str(entry.layout.gpus) if entry.layout.meets_sla else f"({entry.layout.gpus})"
        table.add_row(str(index), entry.layout.words(), gpus, entry.loses or "best")
    console.print(table)
    best = result.best
    if best is None:
        console.print("[red]no layout holds the SLA[/red]: relax the targets or try another GPU")
    else:
        console.print(f"#1 sized as the planner sizes it: {best.sizing}")
    for line in result.excluded:
        console.print(f"left out: {line}")


def run(args: argparse.Namespace) -> int:
    console = Console(width=160)
    started = time.perf_counter()
    try:
        candidates, excluded, measured = _candidates(args)
        modes = recommend.MODES if args.mode == "both" else (args.mode,)
        result = recommend.recommend(candidates, args.load, args.sla, modes=modes, mixed=args.mixed,
                                     excluded=excluded)
    except (ValueError, OSError) as error:
        print(f"fleetpilot recommend: {error}", file=sys.stderr)
        return 2
    seconds = time.perf_counter() - started
    if args.json:
        print(_as_json(result, args.top))
    else:
        _print(console, args, result, seconds, len(candidates) + len(excluded))
    if args.emit is None:
        return 0
    best = result.best
    if best is None:
        print("fleetpilot recommend: nothing to emit: no layout holds the SLA", file=sys.stderr)
        return 1
    text = yamlio.dump_all(emit(args, best, measured))
    if args.emit == "-":
        sys.stdout.write(text)
    else:
        Path(args.emit).write_text(text)
        console.print(f"wrote {args.emit}")
    return 0


def emit(args: argparse.Namespace, best: recommend.Layout, measured: profiles.Profile | None) -> list[dict[str, Any]]:
    """The best layout's objects: the graph, and the profile its planner sizes from (the measured one,
    or the performance model's for the chosen parallelism)."""
    model: perfmodel.ModelSpec = args.model
    split = next(iter(best.pools.values())).parallelism
    profile = measured
    if profile is None:
        engine = perfmodel.PerformanceModel(model, args.gpu, split.tensor, split.pipeline,
                                            calibration=perfmodel.CALIBRATIONS[args.engine])
        profile = recommend.model_profile(engine, isl=args.load.isl, osl=args.load.osl, engine=args.engine)
    name = args.name or model.name.replace(".", "-")
    return recommend.manifests(best, name=name, model=model.repository or model.name, served_name=model.name,
                               framework=args.engine, image=args.image or DEFAULT_IMAGES[args.engine], sla=args.sla,
                               profile=profile, namespace=args.namespace)
