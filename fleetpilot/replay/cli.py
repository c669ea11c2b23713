"""`fleetpilot replay`: the command line over traces → client → report.

Reads and shapes the trace, sends it open loop with a progress bar on the terminal, prints the
summary table, and optionally writes it (and every request's record) as JSON. Ctrl-C cancels the
requests in flight and still reports what finished. `add_parser` hangs the subcommand on the
`fleetpilot` parser; `main` runs it alone (`python -m fleetpilot.replay`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from fleetpilot import traces
from fleetpilot.replay import client, report

EXIT_INTERRUPTED = 130  # what a shell reports for a process ended by SIGINT


DESCRIPTION = (
    "Replay a workload trace (Azure LLM 2023 CSV, Mooncake JSONL, or a ServeGen rate series) against an "
    "OpenAI-compatible frontend, open loop: each request is sent at its arrival time whatever the server "
    "is doing. Prints TTFT/ITL/latency percentiles, throughput and goodput against --sla."
)


def add_parser(sub: Any) -> None:
    """The `replay` subcommand, on the subparsers of the `fleetpilot` command."""
    parser = sub.add_parser(
        "replay",
        help="replay a workload trace against an OpenAI-compatible frontend",
        description=DESCRIPTION,
    )
    add_arguments(parser)
    parser.set_defaults(func=cli)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    trace = parser.add_argument_group("trace")
    trace.add_argument("--trace", required=True, type=Path, help="the trace file")
    trace.add_argument("--format", choices=traces.FORMATS, default=None, help="default: told by the file")
    trace.add_argument("--start", type=float, default=0.0, help="window start, seconds of trace time (0)")
    trace.add_argument("--duration", type=float, default=None, help="window length, seconds of trace time")
    trace.add_argument("--time-scale", type=float, default=1.0, help="compress time: arrival / K (1)")
    trace.add_argument(
        "--rate-scale",
        type=float,
        default=1.0,
        help="scale the request rate: thin (<1) or replicate (>1); for ServeGen, the series' rate (1)",
    )
    trace.add_argument(
        "--tenant-shift",
        type=float,
        default=None,
        metavar="SECONDS",
        help="replicate as other tenants: each copy of the trace shifted as a whole by up to SECONDS "
        "(default: each request's copies within one mean gap, its bursts repeated at once)",
    )
    trace.add_argument("--max-requests", type=int, default=None, help="send at most the first N")
    trace.add_argument("--seed", type=int, default=0, help="seed of thinning, replication and synthesis (0)")

    synth = parser.add_argument_group("ServeGen synthesis (the series has rates only)")
    synth.add_argument("--trace-model", default="m-large", help="which series: m-large (default) or m-mid")
    synth.add_argument("--isl", type=float, default=2048, help="mean input length, tokens (2048)")
    synth.add_argument("--osl", type=float, default=256, help="mean output length, tokens (256)")
    synth.add_argument(
        "--length-dist",
        choices=traces.LENGTH_KINDS,
        default="lognormal",
        help="length distribution (lognormal)",
    )
    synth.add_argument(
        "--length-sigma", type=float, default=1.0, help="lognormal shape, std of log length (1)"
    )

    target = parser.add_argument_group("target")
    target.add_argument("--url", default=None, help="the frontend, e.g. http://127.0.0.1:8000 (or .../v1)")
    target.add_argument("--model", default=None, help="model name to send (default: the first of /v1/models)")
    target.add_argument("--no-stream", dest="stream", action="store_false", help="wait for whole responses")
    target.add_argument("--timeout", type=float, default=300.0, help="seconds one request may take (300)")
    target.add_argument("--max-connections", type=int, default=4096, help="client connection pool (4096)")
    target.add_argument(
        "--prompt-seed", type=int, default=0, help="other prompts, to miss a warmed cache (0)"
    )

    out = parser.add_argument_group("report")
    out.add_argument("--sla", default="ttft=500ms,itl=50ms", help="goodput bounds (ttft=500ms,itl=50ms)")
    out.add_argument("--json", type=Path, default=None, help="write the summary to this file")
    out.add_argument("--per-request", action="store_true", help="with --json: add every request's record")
    out.add_argument("--quiet", action="store_true", help="no progress bar")
    out.add_argument("--dry-run", action="store_true", help="describe the shaped trace; send nothing")


def _requests(args: argparse.Namespace) -> list[traces.Request]:
    shape = traces.Shape(
        start_s=args.start,
        duration_s=args.duration,
        rate_factor=args.rate_scale,
        tenant_shift_s=args.tenant_shift,
        time_factor=args.time_scale,
        max_requests=args.max_requests,
        seed=args.seed,
    )
    defaults = traces.Synthesis()
    synthesis = traces.Synthesis(
        model=args.trace_model,
        input_length=traces.LengthDistribution(
            mean=args.isl,
            kind=args.length_dist,
            sigma=args.length_sigma,
            maximum=defaults.input_length.maximum,
        ),
        output_length=traces.LengthDistribution(
            mean=args.osl,
            kind=args.length_dist,
            sigma=args.length_sigma,
            maximum=defaults.output_length.maximum,
        ),
    )
    return traces.load(args.trace, shape=shape, synthesis=synthesis, trace_format=args.format)


async def _first_model(url: str) -> str:
    served = await client.served_models(url)
    if not served:
        raise ValueError("it lists none")
    return served[0]


def _write_json(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")


def cli(args: argparse.Namespace) -> int:
    """Run one replay from parsed arguments; 0 when any request succeeded, 1 when none, 130 on Ctrl-C."""
    out, err = Console(), Console(stderr=True)
    try:
        sla = report.parse_sla(args.sla)
        requests = _requests(args)
    except (OSError, ValueError) as error:  # TraceError is a ValueError
        print(f"fleetpilot replay: {error}", file=sys.stderr)
        return 2
    if args.dry_run:
        out.print(report.render_trace(report.describe(requests)))
        return 0
    if not args.url:
        print("fleetpilot replay: --url is required (or --dry-run)", file=sys.stderr)
        return 2
    if not requests:
        print("fleetpilot replay: no requests in the chosen window", file=sys.stderr)
        return 1

    model = args.model
    if model is None:
        try:
            model = asyncio.run(_first_model(args.url))
        except (httpx.HTTPError, ValueError, KeyError) as error:
            print(
                f"fleetpilot replay: no --model, and {args.url}/v1/models did not name one: {error}",
                file=sys.stderr,
            )
            return 1
    finished: list[client.Result] = []
    interrupted = False
    progress = Progress(
        TextColumn("[bold]replay"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[counts]}"),
        console=err,
        disable=args.quiet or not err.is_terminal,
    )
    with progress:
        bar = progress.add_task("replay", total=len(requests), counts="")
        errors = 0

        def record(result: client.Result) -> None:
            nonlocal errors
            finished.append(result)
            errors += result.status == "error"
            progress.update(bar, advance=1, counts=f"[red]{errors} errors" if errors else "")

        replaying = client.replay(
            requests,
            url=args.url,
            model=model,
            stream=args.stream,
            timeout_s=args.timeout,
            max_connections=args.max_connections,
            prompt_seed=args.prompt_seed,
            on_result=record,
        )
        try:
            asyncio.run(replaying)
        except KeyboardInterrupt:  # asyncio.run has cancelled the replay, which cancelled its requests
            interrupted = True

    finished.sort(key=lambda result: result.index)
    summary = report.summarise(finished, sla)
    if interrupted:
        err.print(f"[yellow]interrupted: {len(finished)} of {len(requests)} requests finished or cancelled")
    out.print(report.render(summary))
    if args.json is not None:
        document: dict[str, Any] = {
            "trace": str(args.trace),
            "url": args.url,
            "model": model,
            "requests_planned": len(requests),
            "interrupted": interrupted,
            "summary": report.summary_dict(summary),
        }
        if args.per_request:
            document["requests"] = [report.result_dict(result) for result in finished]
        _write_json(args.json, document)
    if interrupted:
        return EXIT_INTERRUPTED
    return 0 if summary.ok > 0 else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fleetpilot replay", description=DESCRIPTION)
    add_arguments(parser)
    return cli(parser.parse_args(argv))
