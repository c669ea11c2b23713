"""A DynamoGraph's health as GitOps tools judge it, by those tools' own code.

The statuses are the operator's own (`status.graph_status` on observations of a graph in each
situation), not hand-written. Argo CD judges them with the Lua health check the chart ships
(charts/fleetpilot/gitops/argocd-cm-health.yaml) run by Argo CD's util/lua, and kstatus (Flux, kpt,
cli-utils) with its `status.Compute`: both in tests/gitops/healthcheck, a Go program built by
scripts/install.sh. The two must agree on every fixture the operator has written status on
(Healthy = Current, Progressing = InProgress, Degraded = Failed), and Argo CD must carry the
operator's message.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from gotools import go_tool
from test_status import component, healthy_components, observe, pod

from fleetpilot.api import v1alpha1 as api
from fleetpilot.operator import status

REPO = Path(__file__).resolve().parents[2]
ARGOCD_SNIPPET = REPO / "charts" / "fleetpilot" / "gitops" / "argocd-cm-health.yaml"
FLUX_SAMPLE = REPO / "manifests" / "gitops" / "flux-kustomization.yaml"
NOW = "2026-01-01T00:00:00Z"
KSTATUS_FOR = {"Healthy": "Current", "Progressing": "InProgress", "Degraded": "Failed"}


def graph(observation: status.Observation | None, *, generation: int = 5) -> dict[str, Any]:
    """A DynamoGraph as the apiserver serves it, with the status the operator writes for `observation`."""
    body: dict[str, Any] = {
        "apiVersion": api.API_VERSION, "kind": api.GRAPH_KIND,
        "metadata": {"name": "llama", "namespace": "serving", "generation": generation},
        "spec": {},
    }
    if observation is not None:
        written = status.graph_status(observation, previous=api.DynamoGraphStatus(), endpoint=None, now=NOW)
        body["status"] = written.model_dump(by_alias=True, exclude_none=True)
    return body


def served_before_any_status() -> dict[str, Any]:
    """A graph no operator has written status on, as the apiserver serves it: with the generated
    CRD's default for status filled in."""
    crd = yaml.safe_load((REPO / "crds" / "fleetpilot.dev_dynamographs.yaml").read_text())
    default = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["default"]
    return {**graph(None), "status": default}


def unschedulable_observation() -> status.Observation:
    stuck = pod({"name": "c", "resources": {"requests": {"nvidia.com/gpu": 2}}}, unschedulable=True)
    return observe([component("frontend", 1), component("prefill", 2, 1), component("decode", 2)], pods=[stuck],
                   capacity=status.GpuCapacity(free=1, total=32, largest_node=8))


# (name, the object, Argo CD's verdict, a text its message must hold)
FIXTURES: list[tuple[str, dict[str, Any], str, str]] = [
    ("no status yet", graph(None), "Progressing", "Waiting for the fleetpilot operator"),
    ("spec changed, not yet observed", graph(observe(healthy_components()), generation=6), "Progressing",
     "observe generation 6"),
    ("scaling up: replicas not ready", graph(observe([component("frontend", 1), component("prefill", 4, 2),
                                                      component("decode", 2)])), "Progressing", "rolling out prefill"),
    ("rolling out a new template", graph(observe([component("frontend", 1), component("prefill", 2, updated=1),
                                                  component("decode", 2)])), "Progressing", "rolling out prefill"),
    ("all components ready", graph(observe(healthy_components())), "Healthy", "every component"),
    ("pods cannot be scheduled", graph(unschedulable_observation()), "Degraded",
     "Unschedulable: needs 2 nvidia.com/gpu, 1 free"),
    ("replicas outside the bounds", graph(observe([component("frontend", 1), component("prefill", 8, clamped_from=12),
                                                   component("decode", 2)])), "Degraded",
     "asks for 12 replicas, outside the graph's scaling bounds"),
    ("reconcile failed", graph(observe([], error=("NameConflict", "Deployment llama-decode exists and is not ours"))),
     "Degraded", "Deployment llama-decode exists and is not ours"),
    ("no status yet, as served", served_before_any_status(), "Progressing",
     "Waiting for the fleetpilot operator to observe generation 5"),
]


def healthcheck(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    binary = go_tool("healthcheck")
    config_map = yaml.safe_load(ARGOCD_SNIPPET.read_text())
    result = subprocess.run([str(binary)], input=json.dumps({"argocdConfigMap": config_map, "objects": objects}),
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    verdicts: list[dict[str, Any]] = json.loads(result.stdout)
    return verdicts


@pytest.fixture(scope="module")
def verdicts() -> dict[str, dict[str, Any]]:
    found = healthcheck([body for _, body, _, _ in FIXTURES])
    return {name: verdict for (name, _, _, _), verdict in zip(FIXTURES, found, strict=True)}


@pytest.mark.parametrize(("name", "expected", "says"), [(n, e, s) for n, _, e, s in FIXTURES])
def test_argocd_judges_the_operators_status(verdicts: dict[str, dict[str, Any]], name: str, expected: str,
                                            says: str) -> None:
    argocd = verdicts[name]["argocd"]
    assert not argocd.get("error"), argocd
    assert argocd["status"] == expected, (name, verdicts[name])
    assert says in argocd["message"], (name, argocd)


@pytest.mark.parametrize(("name", "expected"), [(n, e) for n, _, e, _ in FIXTURES if n != "no status yet"])
def test_kstatus_agrees_with_argocd(verdicts: dict[str, dict[str, Any]], name: str, expected: str) -> None:
    kstatus = verdicts[name]["kstatus"]
    assert not kstatus.get("error"), kstatus
    assert kstatus["status"] == KSTATUS_FOR[expected], (name, verdicts[name])


def test_kstatus_calls_a_graph_no_operator_has_seen_in_progress(verdicts: dict[str, dict[str, Any]]) -> None:
    """kstatus takes an object with no status at all as Current (its documented limit: no condition to
    read). The CRD's status default makes the apiserver serve such a graph as observed at generation 0,
    which kstatus' generic rule calls InProgress; without the default (a graph read from an older CRD)
    it would be Current, as the bare fixture shows."""
    served = verdicts["no status yet, as served"]
    assert served["kstatus"]["status"] == "InProgress" and served["argocd"]["status"] == "Progressing", served
    assert verdicts["no status yet"]["kstatus"]["status"] == "Current", verdicts["no status yet"]


def test_the_fixtures_cover_what_gitops_users_see() -> None:
    verdicts = {expected for _, _, expected, _ in FIXTURES}
    assert verdicts == {"Healthy", "Progressing", "Degraded"} and len(FIXTURES) >= 6


def test_argocd_reads_degraded_from_an_operator_before_stalled() -> None:
    """A status written before Stalled existed (Ready, Progressing, Degraded only) is still Degraded in Argo
    CD. kstatus falls back to Ready=False, InProgress: it cannot tell stuck from rolling out, which is
    what Stalled tells it."""
    body = graph(unschedulable_observation())
    body["status"]["conditions"] = [c for c in body["status"]["conditions"]
                                    if c["type"] in ("Ready", "Progressing", "Degraded")]
    (verdict,) = healthcheck([body])
    assert verdict["argocd"]["status"] == "Degraded" and "Unschedulable" in verdict["argocd"]["message"], verdict
    assert verdict["kstatus"]["status"] == "InProgress", verdict


def test_a_broken_script_is_an_error_not_healthy() -> None:
    """The harness itself can fail: a script that does not return a health table is reported."""
    binary = go_tool("healthcheck")
    config_map = {"data": {"resource.customizations.health.fleetpilot.dev_DynamoGraph": "return 42"}}
    result = subprocess.run([str(binary)], input=json.dumps({"argocdConfigMap": config_map,
                                                              "objects": [FIXTURES[4][1]]}),
                            capture_output=True, text=True, timeout=60, check=True)
    (verdict,) = json.loads(result.stdout)
    assert verdict["argocd"].get("error") and verdict["kstatus"]["status"] == "Current", verdict


def test_flux_health_check_exprs_read_the_kstatus_conditions() -> None:
    """The Flux sample's healthCheckExprs name the DynamoGraph and the conditions the operator writes."""
    documents = [d for d in yaml.safe_load_all(FLUX_SAMPLE.read_text()) if d]
    kustomization = next(d for d in documents if d["kind"] == "Kustomization")
    (expressions,) = [e for e in kustomization["spec"]["healthCheckExprs"] if e["kind"] == api.GRAPH_KIND]
    assert expressions["apiVersion"] == api.API_VERSION
    written = {c["type"] for _, body, _, _ in FIXTURES for c in body.get("status", {}).get("conditions", [])}
    for key in ("inProgress", "failed", "current"):
        named = {t for t in status.OPERATOR_CONDITIONS if f"'{t}'" in expressions[key]}
        assert named and named <= written, (key, expressions[key])
