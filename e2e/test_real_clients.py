"""The graph's frontend as users benchmark it: NVIDIA's aiperf, streaming chat, against the pod.

A graph of one prefill and one decode simulator pod (planner off), the frontend found by its pod IP
as the other scenarios do, and one aiperf run with fixed input and output lengths. What aiperf
measured at the client is compared with what the frontend exported for the same requests: counts and
token totals must agree exactly; the frontend's TTFT can only be shorter than the client's (it cannot
see the connect, the request's way in, or the first chunk's way out) and must still cover the prefill
and the KV transfer. The measured difference is written to e2e/results/aiperf.json for the record.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path

import aiperf_run
import harness as harness_mod
import httpx
import scenario as scenario_mod
from conftest import Graph
from prometheus_client.parser import text_string_to_metric_families

REQUESTS = 48
CONCURRENCY = 4
ISL, OSL = 256, 24


def frontend_totals(url: str) -> dict[str, float]:
    """The frontend's counters and histogram sums/counts, by sample name (labels summed over)."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=10).text):
        for sample in family.samples:
            if sample.name.startswith("fleetpilot_frontend_") and sample.name.endswith(("_total", "_sum", "_count")):
                key = sample.name + ("{status=" + sample.labels["status"] + "}" if "status" in sample.labels else "")
                totals[key] = totals.get(key, 0.0) + sample.value
    return totals


def test_aiperf_sees_what_the_frontend_counts(harness: harness_mod.Harness, results: Path) -> None:
    s = dataclasses.replace(scenario_mod.ClosedLoop(), namespace="e2e-aiperf", graph="aiperf", speedup=0.5)
    graph = Graph(harness, s)
    graph.kubectl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": s.namespace}})
    graph.kubectl.apply([s.profile_config_map(), s.graph_manifest(mode="off")])
    try:
        url = graph.wait_ready()
        before = frontend_totals(url)
        run = aiperf_run.profile(url, model=s.served_model, out=results / "aiperf", requests=REQUESTS,
                                 concurrency=CONCURRENCY, isl=ISL, osl=OSL)
        after = frontend_totals(url)
    finally:
        graph.delete()
    delta = {key: after.get(key, 0.0) - before.get(key, 0.0) for key in after}
    records = run["records"]
    client_ttft_ms = [r["metrics"]["time_to_first_token"]["value"] for r in records]
    frontend_ttft_ms = 1000 * delta["fleetpilot_frontend_time_to_first_token_seconds_sum"] / REQUESTS
    client_mean_ms = statistics.fmean(client_ttft_ms)
    comparison = {
        "requests": REQUESTS, "concurrency": CONCURRENCY, "isl": ISL, "osl": OSL, "engine_speedup": s.speedup,
        "client_ttft_mean_ms": client_mean_ms, "client_ttft_p50_ms": run["time_to_first_token"]["p50"],
        "frontend_ttft_mean_ms": frontend_ttft_ms,
        "frontend_lower_by": (client_mean_ms - frontend_ttft_ms) / client_mean_ms,
        "client_connect_and_send_mean_ms": statistics.fmean(
            r["metrics"].get("http_req_connecting", {}).get("value", 0.0)
            + r["metrics"].get("http_req_sending", {}).get("value", 0.0) for r in records),
        "client_itl_mean_ms": run["inter_token_latency"]["avg"],
        "frontend_itl_mean_ms": 1000 * delta["fleetpilot_frontend_inter_token_latency_seconds_sum"] / REQUESTS,
        "errors": run.get("error_summary"),
    }
    (results / "aiperf.json").write_text(json.dumps(comparison, indent=2) + "\n")

    # Every request succeeded, at exactly the lengths asked for (the tokenizer counts as the engine does).
    assert len(records) == REQUESTS and not run.get("error_summary"), comparison
    assert run["input_sequence_length"]["avg"] == ISL and run["output_sequence_length"]["avg"] == OSL, run
    # The frontend counted the same requests and tokens.
    assert delta["fleetpilot_frontend_requests_total{status=ok}"] == REQUESTS, delta
    assert delta["fleetpilot_frontend_input_tokens_sum"] == REQUESTS * ISL, delta
    assert delta["fleetpilot_frontend_output_tokens_sum"] == REQUESTS * OSL, delta
    # TTFT: never more than the client saw, and not a part of it (a clock started after the prefill
    # hop would miss most of it: the prefill is the larger share at this ISL).
    assert frontend_ttft_ms <= client_mean_ms, comparison
    assert frontend_ttft_ms >= 0.5 * client_mean_ms, comparison
    prefill_ms = 1000 * delta["fleetpilot_frontend_prefill_seconds_sum"] / REQUESTS
    assert prefill_ms < frontend_ttft_ms, (prefill_ms, comparison)
