"""Trace replay: drive an OpenAI-compatible frontend with a public workload trace, open loop.

The flow is `fleetpilot.traces` (read and reshape a trace into requests; the planner backtest reads
traces through it too) → prompts (text of the right length, with the trace's shared prefixes) →
client (fire each request at its arrival time, measure TTFT, ITL and latency from the stream) →
report (percentiles, throughput and goodput against an SLA). `cli` puts them behind `fleetpilot
replay`. Prompts and the report are pure; only the client talks to the network.

Library use::

    from fleetpilot import traces
    from fleetpilot.replay import client, report

    requests = traces.load(path, shape=traces.Shape(duration_s=60, time_factor=2))
    results = await client.replay(requests, url="http://127.0.0.1:8000", model="llama-8b")
    summary = report.summarise(results, report.parse_sla("ttft=500ms,itl=50ms"))
"""

from __future__ import annotations

from fleetpilot.replay.client import Result, replay
from fleetpilot.replay.report import Sla, Summary, parse_sla, summarise
from fleetpilot.traces import Request, Shape, Synthesis, load, prepare

__all__ = [
    "Request",
    "Result",
    "Shape",
    "Sla",
    "Summary",
    "Synthesis",
    "load",
    "parse_sla",
    "prepare",
    "replay",
    "summarise",
]
