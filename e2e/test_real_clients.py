"""The graph's frontend as users benchmark it: NVIDIA's aiperf, streaming chat, against the pod.

A graph of one prefill and one decode simulator pod (planner off), the frontend found by its pod IP
as the other scenarios do, and one aiperf run with fixed input and output lengths. What aiperf
measured at the client is compared with what the frontend exported for the same requests: counts and
token totals must agree exactly; the frontend's TTFT can only be shorter than the client's (it cannot
see the connect, the request's way in, or the first chunk's way out) and must still cover the prefill
and the KV transfer. The measured difference is written to e2e/results/aiperf.json for the record.

The graph's engines take a model-hub token from a Secret (`engine.env` with `valueFrom.secretKeyRef`), as
a real graph would: the workers' Deployments carry the reference and never the token, and the running
worker processes have it in their environment (the pod runner resolves it as a kubelet does).
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

from fleetpilot.devcluster import processes

REQUESTS = 48
CONCURRENCY = 4
ISL, OSL = 256, 24
HUB_SECRET, HUB_TOKEN = "hub-token", "hf_e2e_0d6c2f8e41b7a953"


def frontend_totals(url: str) -> dict[str, float]:
    """The frontend's counters and histogram sums/counts, by sample name (labels summed over)."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=10).text):
        for sample in family.samples:
            if sample.name.startswith("fleetpilot_frontend_") and sample.name.endswith(("_total", "_sum", "_count")):
                key = sample.name + ("{status=" + sample.labels["status"] + "}" if "status" in sample.labels else "")
                totals[key] = totals.get(key, 0.0) + sample.value
    return totals


def assert_hub_token_from_the_secret(harness: harness_mod.Harness, namespace: str) -> None:
    """Every worker Deployment names the Secret and holds no token; every worker process has the token."""
    deployments = harness.kubectl.json("get", "deployments", "-n", namespace, "-l", "fleetpilot.dev/component in (prefill,decode)")
    assert len(deployments["items"]) == 2, [d["metadata"]["name"] for d in deployments["items"]]
    for deployment in deployments["items"]:
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        hub = [item for item in container.get("env", []) if item["name"] == "HF_TOKEN"]
        assert hub == [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": HUB_SECRET, "key": "token"}}}], hub
        assert HUB_TOKEN not in json.dumps(deployment)
    pods = harness.kubectl.json("get", "pods", "-n", namespace, "-l", "fleetpilot.dev/component in (prefill,decode)")
    for pod in pods["items"]:
        pid = processes.alive(harness.state / "pods" / "pids" / f"{pod['metadata']['uid']}.pid")
        assert pid is not None, f"{pod['metadata']['name']} has no running process"
        environ = dict(entry.split("=", 1) for entry in
                       Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in entry)
        assert environ.get("HF_TOKEN") == HUB_TOKEN, pod["metadata"]["name"]


def test_aiperf_sees_what_the_frontend_counts(harness: harness_mod.Harness, results: Path) -> None:
    s = dataclasses.replace(scenario_mod.ClosedLoop(), namespace="e2e-aiperf", graph="aiperf", speedup=0.5)
    graph = Graph(harness, s)
    graph.kubectl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": s.namespace}})
    manifest = s.graph_manifest(mode="off")
    manifest["spec"]["engine"]["env"] = [
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": HUB_SECRET, "key": "token"}}}]
    graph.kubectl.apply([{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": HUB_SECRET, "namespace": s.namespace},
                          "stringData": {"token": HUB_TOKEN}}, s.profile_config_map(), manifest])
    try:
        url = graph.wait_ready()
        assert_hub_token_from_the_secret(harness, s.namespace)
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
