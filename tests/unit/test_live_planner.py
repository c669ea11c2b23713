"""The live planner's bookkeeping between intervals, with its watches already filled (no API, no Prometheus)."""

from __future__ import annotations

import asyncio
from typing import Any

from fleetpilot.planner import budget, live


def graph(name: str, *, mode: str = "sla", deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "resourceVersion": "1"}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-24T00:00:00Z"
    return {"kind": "DynamoGraph", "metadata": meta,
            "spec": {"planner": {"mode": mode, "budget": "shared", "intervalSeconds": 10}}}


def planner_with(*graphs: dict[str, Any]) -> live.LivePlanner:
    planner = live.LivePlanner(None, None, budgets={"shared": 8},  # type: ignore[arg-type]
                               may_act=lambda: False)  # a standby: bookkeeping only, no planning
    planner._started = True
    for watcher in planner._informers:
        watcher.synced.set()
    for body in graphs:
        planner.graphs.upsert(body)
    return planner


def claim(planner: live.LivePlanner, name: str) -> None:
    planner.ledger.claim("shared", budget.BudgetClaim(graph=f"ns/{name}", priority=0, min_gpus=1, wanted_gpus=4))
    planner.next_due[("ns", name)] = 0.0


def test_graphs_that_left_give_their_budget_share_back_and_their_history_goes() -> None:
    planner = planner_with(graph("kept"), graph("off", mode="off"), graph("going", deleting=True))
    for name in ("kept", "off", "going", "deleted"):
        claim(planner, name)
    asyncio.run(planner.tick())
    assert [c.graph for c in planner.ledger.claims("shared")] == ["ns/kept"]
    assert set(planner.next_due) == {("ns", "kept")}


def test_the_observer_reads_the_prefill_part_the_mean_itl_and_the_burst() -> None:
    """The PromQL behind TTFT's blame, the profile's calibration and prefill's bursts: each on the graph's
    series only; the burst per frontend is scaled by the frontends serving."""
    from fleetpilot.planner import observe

    found = observe.queries(namespace="ns", graph="g", window_s=60, percentile=90, labels=observe.Labels())
    selector = 'namespace="ns",graph="g"'
    assert found["prefill_s"] == (
        f"histogram_quantile(0.9, sum by (le) (rate(fleetpilot_frontend_prefill_seconds_bucket{{{selector}}}[60s])))")
    assert found["itl_mean_s"].startswith("sum(rate(fleetpilot_frontend_inter_token_latency_seconds_sum{")
    assert "fleetpilot_frontend_arrival_burst_rps_bucket" in found["burst_rate_rps"]
    assert found["burst_rate_rps"].endswith(f"* count(fleetpilot_frontend_requests_started_total{{{selector}}})")
