"""The scenarios' load: fleetpilot's replay client sending a trace, with wall-clock anchors.

Where it sits: a child process of a scenario (so the client's event loop never shares a core's
time slice with the test's own polling). It is `fleetpilot replay` minus the terminal UI, plus what
a timeline needs: the Unix time at which the replay's clock started, so each request's send time
and latency can be laid next to the replicas the planner chose at that moment. With `--warmup`, the
replay's first part is the planner's history: sent, in the per-request records, left out of the summary.

Run: `python e2e/loadgen.py --trace FILE --url URL --model NAME --out report.json [trace options]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from fleetpilot import traces
from fleetpilot.replay import client, report


def load_requests(trace: Path, *, model: str, isl: float, osl: float, sigma: float, seed: int,
                  shape: traces.Shape | None = None) -> list[traces.Request]:
    """The requests the scenario sends: a rate series' with lognormal lengths, or a request trace's own
    (the backtest of the same run reads them from here too); `shape` cuts and scales the trace."""
    synthesis = traces.Synthesis(
        model=model,
        input_length=traces.LengthDistribution(mean=isl, sigma=sigma, maximum=8192),
        output_length=traces.LengthDistribution(mean=osl, sigma=sigma, maximum=2048),
    )
    return traces.load(trace, shape=shape or traces.Shape(seed=seed), synthesis=synthesis)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--trace-model", default="m-large", help="which series of a ServeGen-format file")
    parser.add_argument("--isl", type=float, default=1024)
    parser.add_argument("--osl", type=float, default=256)
    parser.add_argument("--length-sigma", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sla", default="ttft=1000ms,itl=75ms")
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--start", type=float, default=0.0, help="trace seconds to skip")
    parser.add_argument("--duration", type=float, default=None, help="trace seconds to replay")
    parser.add_argument("--rate-scale", type=float, default=1.0, help="keep this share of the requests (or copy)")
    parser.add_argument("--time-scale", type=float, default=1.0, help="replay this many times faster")
    parser.add_argument("--warmup", type=float, default=0.0,
                        help="trace seconds from --start that are sent but left out of the summary: the "
                             "history a running planner would have seen before the scored part")
    args = parser.parse_args(argv)

    shape = traces.Shape(start_s=args.start, duration_s=args.duration, rate_factor=args.rate_scale,
                         time_factor=args.time_scale, seed=args.seed)
    requests = load_requests(args.trace, model=args.trace_model, isl=args.isl, osl=args.osl,
                             sigma=args.length_sigma, seed=args.seed, shape=shape)
    started_unix = time.time()
    results = asyncio.run(client.replay(requests, url=args.url, model=args.model, timeout_s=args.timeout))
    # A request's arrival is in replay seconds (the trace's, divided by the time scale).
    scored_from_s = args.warmup / args.time_scale
    summary = report.summarise([r for r in results if r.scheduled_s >= scored_from_s], report.parse_sla(args.sla))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "trace": str(args.trace), "url": args.url, "model": args.model, "started_unix": started_unix,
        "scored_from_s": scored_from_s, "requests_planned": len(requests), "summary": report.summary_dict(summary),
        "requests": [report.result_dict(r) for r in sorted(results, key=lambda r: r.index)],
    }, indent=1) + "\n")
    return 0 if summary.ok > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
