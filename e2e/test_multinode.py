"""Multinode replicas end to end: every prefill and decode replica a group of two pods on two nodes.

The simulator's pods run as processes (the pod runner plays kubelet and the cluster's DNS for the
ranks' leader address); each group's leader serves only once its rank has joined its TCP rendezvous.
A replayed load ramps up through the frontend and back down; the planner, reading Prometheus, scales
the decode groups (each new one a leader and a rank on another node) and the frontend sends requests
to group leaders only. Results: e2e/results/multinode.json (and .png).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import harness as harness_mod
import httpx
import scenario as scenario_mod
from conftest import Graph, run_load

GROUP_ROLE = "fleetpilot.dev/group-role"


def whole_ready_groups(pods_by_name: dict[str, dict[str, Any]]) -> set[str]:
    """The groups (by leader pod) whose leader and rank are both Ready."""
    return {name for name, p in pods_by_name.items()
            if p["metadata"]["labels"][GROUP_ROLE] == "leader" and scenario_mod.is_ready(p)
            and (rank := pods_by_name.get(f"{name}-1")) is not None and scenario_mod.is_ready(rank)}


def test_a_multinode_graph_serves_replayed_load_while_the_planner_scales_decode_groups(
    harness: harness_mod.Harness, results: Path
) -> None:
    s = dataclasses.replace(scenario_mod.ClosedLoop(), namespace="e2e-multinode", graph="groups", nodes=2,
                            bounds=(("prefill", 1, 3), ("decode", 1, 3)),
                            shape=((0, 0.3), (20, 0.3), (30, 2.0), (90, 2.0), (120, 0.3), (150, 0.3)))
    graph = Graph(harness, s)
    graph.create()
    seen: dict[str, Any] = {"routed_to": set(), "groups": None}

    def pods(component: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = graph.kubectl.json(
            "get", "pods", "-n", s.namespace, "-l", f"fleetpilot.dev/graph={s.graph},fleetpilot.dev/component={component}"
        )["items"]
        return items

    def frontend_routes() -> set[str]:
        """The worker pods the frontend has requests in flight on, from its own /metrics."""
        names: set[str] = set()
        for frontend in pods("frontend"):
            text = httpx.get(f"http://{frontend['status']['podIP']}:8000/metrics", timeout=2).text
            for line in text.splitlines():
                if line.startswith("fleetpilot_frontend_worker_inflight_requests{"):
                    names.add(line.split('worker="', 1)[1].split('"', 1)[0])
        return names

    def during(t0: float, sampler: scenario_mod.Sampler) -> None:
        def two_decode_groups() -> bool:
            seen["routed_to"] |= frontend_routes()
            last = sampler.samples[-1] if sampler.samples else {}
            return (last.get("decode_ready") or 0) >= 2

        harness_mod.wait_for(two_decode_groups, timeout=s.duration_s, interval=1.0,
                             what=lambda: f"two decode groups Ready; samples: {sampler.samples[-3:]}")

        def two_whole_groups_listed() -> bool:
            # The status counts a group Ready once all its pods are; a pod list read after it may also
            # hold a group the planner has just started, or a rank whose Ready condition lags a beat.
            seen["groups"] = {p["metadata"]["name"]: p for p in pods("decode")}
            return len(whole_ready_groups(seen["groups"])) >= 2

        harness_mod.wait_for(two_whole_groups_listed, timeout=30, interval=1.0,
                             what=lambda: f"two whole decode groups Ready in the pod list: {sorted(seen['groups'])}")
        seen["all"] = {p["metadata"]["name"]: p for c in ("prefill", "decode") for p in pods(c)}
        for _ in range(10):  # requests keep flowing meanwhile: keep watching where they go
            seen["routed_to"] |= frontend_routes()

    try:
        run = run_load(graph, scenario_mod.write_trace(s, results / "multinode.trace.csv"),
                       results / "multinode.load.json", during=during)
        table = graph.kubectl.run("get", "dg", s.graph, "-n", s.namespace).stdout
    finally:
        graph.delete()
    samples, load, t0 = run["samples"], run["load"], run["t0"]
    rows = scenario_mod.timeline(s, samples, load, t0_unix=t0)
    statuses = [r["status"] for r in load["requests"]]
    decode_pods = seen["groups"] or {}
    leaders = whole_ready_groups(decode_pods)
    summary = {
        "requests": len(statuses), "ok": statuses.count("ok"), "errors": statuses.count("error"),
        "client_sla_attainment": load["summary"]["goodput_fraction"],
        "peak_desired": {c: max(x[f"{c}_desired"] or 0 for x in samples) for c in scenario_mod.COMPONENTS},
        "peak_ready": {c: max(x[f"{c}_ready"] or 0 for x in samples) for c in scenario_mod.COMPONENTS},
        "decode_pods_at_two_groups": {name: p["spec"]["nodeName"] for name, p in decode_pods.items()},
        "frontend_routed_to": sorted(seen["routed_to"]), "kubectl_get_dg": table,
    }
    scenario_mod.write_results("multinode", results, scenario=s, rows=rows, summary=summary,
                               extra={"samples": samples})

    # The planner scaled the decode groups up with the load and back down after it.
    assert summary["peak_desired"]["decode"] >= 2 and summary["peak_ready"]["decode"] >= 2, summary
    peak_at = next(i for i, x in enumerate(samples) if (x["decode_desired"] or 0) == summary["peak_desired"]["decode"])
    assert any((x["decode_desired"] or 0) < summary["peak_desired"]["decode"] for x in samples[peak_at:]), rows
    # Each decode replica was a whole group: a leader and its rank, on two nodes, both Ready.
    assert len(leaders) >= 2, summary
    for leader in leaders:
        rank = decode_pods.get(f"{leader}-1")
        assert rank is not None and rank["metadata"]["labels"]["fleetpilot.dev/group"] == leader, summary
        assert rank["spec"]["nodeName"] != decode_pods[leader]["spec"]["nodeName"], summary
    # The frontend sent requests to group leaders only, never to a rank (of prefill or decode).
    workers = {name for name, p in seen.get("all", {}).items() if p["metadata"]["labels"][GROUP_ROLE] == "worker"}
    assert seen["routed_to"] & leaders and not seen["routed_to"] & workers, summary
    # Served through it all, scale-downs included.
    assert summary["errors"] == 0 and summary["ok"] == summary["requests"], load["summary"].get("error_kinds")
