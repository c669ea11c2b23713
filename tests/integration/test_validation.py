"""Bad DynamoGraphs are refused by the apiserver itself, with a message that names the field.

Every case goes through `kubectl create --dry-run=server`, so the real schema, defaulting and CEL
rules of the generated CRD run, and nothing is stored.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from .conftest import Kubectl

pytestmark = pytest.mark.integration

Graph = dict[str, Any]


def valid() -> Graph:
    return {
        "apiVersion": "fleetpilot.dev/v1alpha1",
        "kind": "DynamoGraph",
        "metadata": {"name": "llama"},
        "spec": {
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
            "engine": {"framework": "vllm", "image": "vllm/vllm-openai:v0.11.0"},
            "components": {
                "prefill": {"replicas": 1, "gpus": 1},
                "decode": {"replicas": 2, "gpus": 2, "parallelism": {"tensor": 2}},
            },
        },
    }


def edit(change: Callable[[Graph], None]) -> Graph:
    graph = copy.deepcopy(valid())
    change(graph)
    return graph


def _set(path: str, value: Any) -> Callable[[Graph], None]:
    def apply(graph: Graph) -> None:
        *parents, leaf = path.split(".")
        node = graph
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return apply


def _delete(path: str) -> Callable[[Graph], None]:
    def apply(graph: Graph) -> None:
        *parents, leaf = path.split(".")
        node = graph
        for key in parents:
            node = node[key]
        del node[leaf]
    return apply


INVALID: dict[str, tuple[Callable[[Graph], None], list[str]]] = {
    "both-disaggregated-and-aggregated": (
        _set("spec.components.aggregated", {"replicas": 1}),
        ["spec.components", "set prefill and decode (disaggregated) or aggregated alone"],
    ),
    "no-workers-at-all": (
        lambda g: g["spec"].__setitem__("components", {"frontend": {"replicas": 1}}),
        ["spec.components", "not both and not neither"],
    ),
    "prefill-without-decode": (
        _delete("spec.components.decode"),
        ["spec.components", "set prefill and decode"],
    ),
    "scaling-min-above-max": (
        _set("spec.components.decode.scaling", {"min": 5, "max": 3}),
        ["spec.components.decode.scaling.min: Invalid value", "scaling.min must not exceed scaling.max"],
    ),
    "replicas-above-max": (
        _set("spec.components.prefill.replicas", 12),
        ["spec.components.prefill.replicas: Invalid value", "replicas must lie within scaling.min and scaling.max"],
    ),
    "replicas-below-min": (
        _set("spec.components.prefill.scaling", {"min": 3, "max": 6}),
        ["spec.components.prefill.replicas: Invalid value", "replicas must lie within scaling.min and scaling.max"],
    ),
    "parallelism-does-not-match-gpus": (
        _set("spec.components.decode.parallelism", {"tensor": 4}),
        ["spec.components.decode", "gpus × nodes must equal parallelism.tensor × parallelism.pipeline"],
    ),
    "multinode-gpus-do-not-match-parallelism": (
        _set("spec.components.decode.nodes", 2),
        ["spec.components.decode", "gpus × nodes must equal parallelism.tensor × parallelism.pipeline"],
    ),
    "zero-nodes": (
        _set("spec.components.prefill.nodes", 0),
        ["spec.components.prefill.nodes", "should be greater than or equal to 1"],
    ),
    "trtllm-multinode": (
        lambda g: (g["spec"]["engine"].update(framework="trtllm", image="nvcr.io/nvidia/tensorrt-llm/release:1.0.0"),
                   g["spec"]["components"]["decode"].update(nodes=2, gpus=1)),
        ["spec.engine.framework: Invalid value", "nodes must be 1 with engine.framework trtllm", "use vllm or sglang for multinode replicas"],
    ),
    "multinode-name-too-long-for-group-statefulsets": (
        lambda g: (g["metadata"].update(name="a" * 29),
                   g["spec"]["components"]["decode"].update(nodes=2, gpus=1)),
        ["metadata.name: Invalid value", "metadata.name must be at most 28 characters when a component spans nodes"],
    ),
    "placement-topology-key-not-a-label-key": (
        _set("spec.placement", {"topologyKey": "rack name"}),
        ["spec.placement.topologyKey", "should match"],
    ),
    "placement-timeout-too-short": (
        _set("spec.placement", {"groupSchedulingTimeoutSeconds": 1}),
        ["spec.placement.groupSchedulingTimeoutSeconds", "should be greater than or equal to 5"],
    ),
    "name-too-long-for-children": (
        _set("metadata.name", "a" * 53),
        ["metadata.name: Invalid value", "metadata.name must be at most 52 characters"],
    ),
    "name-not-dns-1035": (
        _set("metadata.name", "8b-llama"),
        ["metadata.name: Invalid value", "metadata.name must be a DNS-1035 label"],
    ),
    "unknown-framework": (
        _set("spec.engine.framework", "tgi"),
        ["spec.engine.framework", "Unsupported value: \"tgi\"", "vllm", "simulator"],
    ),
    "image-missing-for-real-engine": (
        _delete("spec.engine.image"),
        ["spec.engine.image: Invalid value", "engine.image is required unless engine.framework is simulator"],
    ),
    "zero-gpus": (
        _set("spec.components.prefill.gpus", 0),
        ["spec.components.prefill.gpus", "should be greater than or equal to 1"],
    ),
    "unknown-router-policy": (
        _set("spec.components.frontend", {"router": {"policy": "random"}}),
        ["spec.components.frontend.router.policy", "Unsupported value: \"random\""],
    ),
    "sla-mode-without-targets": (
        _set("spec.planner", {"mode": "sla"}),
        ["spec.planner.sla: Invalid value", "planner.sla is required when planner.mode is advisory or sla"],
    ),
    "percentile-out-of-range": (
        _set("spec.planner", {"mode": "sla", "sla": {"ttftMs": 500, "itlMs": 50, "percentile": 100}}),
        ["spec.planner.sla.percentile", "should be less than 100"],
    ),
    "non-positive-ttft-target": (
        _set("spec.planner", {"mode": "advisory", "sla": {"ttftMs": 0, "itlMs": 50}}),
        ["spec.planner.sla.ttftMs", "should be greater than 0"],
    ),
    "planner-interval-too-short": (
        _set("spec.planner", {"intervalSeconds": 1}),
        ["spec.planner.intervalSeconds", "should be greater than or equal to 10"],
    ),
    "risk-above-range": (
        _set("spec.planner", {"mode": "sla", "sla": {"ttftMs": 500, "itlMs": 50}, "risk": 1.0}),
        ["spec.planner.risk: Invalid value", "planner.risk must lie from 0.5 to 0.999"],
    ),
    "risk-below-the-median": (
        _set("spec.planner", {"risk": 0.3}),
        ["spec.planner.risk: Invalid value", "planner.risk must lie from 0.5 to 0.999",
         "0.9 for the load exceeded one interval in ten"],
    ),
    "sla-mode-without-a-profile-for-a-real-engine": (
        _set("spec.planner", {"mode": "sla", "sla": {"ttftMs": 500, "itlMs": 50}}),
        ["spec.planner.profileRef: Invalid value", ("planner.profileRef is required when planner.mode is advisory or sla and engine.framework is not"
                  " simulator")],
    ),
    "advisory-mode-without-a-profile-for-a-real-engine": (
        _set("spec.planner", {"mode": "advisory", "sla": {"ttftMs": 500, "itlMs": 50}}),
        ["spec.planner.profileRef: Invalid value", "planner.profileRef is required"],
    ),
    "gpu-budget-below-the-minimums": (
        # prefill min 1 × 1 GPU + decode min 1 × 2 GPUs = 3
        _set("spec.planner", {"gpuBudget": 2}),
        ["spec.planner.gpuBudget: Invalid value", "planner.gpuBudget must cover the worker pools' minimums"],
    ),
    "gpu-budget-below-a-multinode-minimum": (
        # prefill 1 × 1 GPU + decode 1 group × 1 GPU × 2 pods = 3: a budget of 2 would cover gpus alone
        lambda g: (g["spec"]["components"]["decode"].update(nodes=2, gpus=1),
                   g["spec"].update(planner={"gpuBudget": 2})),
        ["spec.planner.gpuBudget: Invalid value",
         "planner.gpuBudget must cover the worker pools' minimums (scaling.min × gpus × nodes"],
    ),
    "missing-model": (
        _delete("spec.model"),
        ["spec.model", "Required value"],
    ),
    "misspelled-field": (
        _set("spec.components.prefill.replica", 3),
        ["unknown field \"spec.components.prefill.replica\""],
    ),
    "bad-env-var-name": (
        _set("spec.engine.env", [{"name": "1 BAD", "value": "x"}]),
        ["spec.engine.env[0].name", "should match"],
    ),
    "literal-hub-token": (
        _set("spec.engine.env", [{"name": "LOG_LEVEL", "value": "debug"}, {"name": "HF_TOKEN", "value": "hf_abc"}]),
        ["spec.engine.env[1].value: Invalid value", "this name holds a credential", "valueFrom.secretKeyRef"],
    ),
    "literal-api-key-in-lower-case": (
        _set("spec.engine.env", [{"name": "ngc_api_key", "value": "nvapi-abc"}]),
        ["spec.engine.env[0].value: Invalid value", "this name holds a credential"],
    ),
    "env-value-and-value-from": (
        _set("spec.engine.env", [{"name": "MODE", "value": "x",
                                   "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}]),
        ["spec.engine.env[0].valueFrom: Invalid value", "set value or valueFrom, not both"],
    ),
}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_apiserver_rejects_invalid_graph(kubectl: Kubectl, crds: None, case: str) -> None:
    change, expected = INVALID[case]
    result = kubectl.run("create", "--dry-run=server", "-n", "default", "-f", "-",
                         stdin=yaml.safe_dump(edit(change)), check=False)
    assert result.returncode != 0, f"{case} was accepted"
    for fragment in expected:
        assert fragment in result.stderr, f"{case}: {fragment!r} not in {result.stderr!r}"
    # Every error of ours begins with the field it is about, never with no field or the whole spec (the
    # apiserver's own notice that it skipped the CEL rules of an object already invalid has no field).
    ours = [line for line in result.stderr.splitlines() if "some validation rules were not checked" not in line]
    assert not [line for line in ours if "<nil>:" in line or "spec: Invalid value" in line], result.stderr


def test_credentials_from_a_secret_and_ordinary_literals_are_accepted(kubectl: Kubectl, crds: None) -> None:
    """The credential rule reads names: a token from a Secret passes, and so do literals whose names only
    look alike (`MAX_NUM_BATCHED_TOKENS`) or that are empty."""
    graph = edit(_set("spec.engine.env", [
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hub", "key": "token"}}},
        {"name": "MAX_NUM_BATCHED_TOKENS", "value": "8192"},
        {"name": "OPENAI_API_KEY", "value": ""},
    ]))
    result = kubectl.run("create", "--dry-run=server", "-n", "default", "-f", "-", stdin=yaml.safe_dump(graph))
    assert "created (server dry run)" in result.stdout


def test_the_valid_baseline_is_accepted(kubectl: Kubectl, crds: None) -> None:
    """Guards the table above: each case fails for its own reason, not because the base is bad."""
    result = kubectl.run("create", "--dry-run=server", "-n", "default", "-f", "-", stdin=yaml.safe_dump(valid()))
    assert "created (server dry run)" in result.stdout


def test_a_profile_and_a_budget_that_covers_the_minimums_are_accepted(kubectl: Kubectl, crds: None) -> None:
    """The two planner rules let the right graphs through: a real engine with its profile in sla mode, a
    budget exactly at the minimums (3 GPUs), and the simulator without a profile."""
    with_profile = edit(_set("spec.planner", {"mode": "sla", "sla": {"ttftMs": 500, "itlMs": 50}, "gpuBudget": 3,
                                              "profileRef": {"configMap": "llama-profile"}}))
    simulator = edit(_set("spec.planner", {"mode": "sla", "sla": {"ttftMs": 500, "itlMs": 50}}))
    simulator["spec"]["engine"] = {"framework": "simulator"}
    for graph in (with_profile, simulator):
        result = kubectl.run("create", "--dry-run=server", "-n", "default", "-f", "-", stdin=yaml.safe_dump(graph))
        assert "created (server dry run)" in result.stdout


def test_a_valid_multinode_graph_is_accepted(kubectl: Kubectl, crds: None) -> None:
    """The multinode cases above fail for their own reason: a 28-character name, decode TP16 over two
    pods of 8 GPUs and a rack topology key pass."""
    graph = edit(lambda g: (g["metadata"].update(name="a" * 28),
                            g["spec"]["components"]["decode"].update(nodes=2, gpus=8, parallelism={"tensor": 16}),
                            g["spec"].update(placement={"topologyKey": "example.com/rack",
                                                        "groupSchedulingTimeoutSeconds": 60})))
    result = kubectl.run("create", "--dry-run=server", "-n", "default", "-f", "-", stdin=yaml.safe_dump(graph))
    assert "created (server dry run)" in result.stdout


def test_component_bounds_are_enforced_on_direct_edits(kubectl: Kubectl, crds: None) -> None:
    dgc = {
        "apiVersion": "fleetpilot.dev/v1alpha1", "kind": "DynamoGraphComponent",
        "metadata": {"name": "x-decode"},
        "spec": {"graph": "x", "component": "decode", "replicas": 9, "minReplicas": 1, "maxReplicas": 8},
    }
    result = kubectl.run("create", "--dry-run=server", "-n", "default", "-f", "-", stdin=yaml.safe_dump(dgc),
                         check=False)
    assert result.returncode != 0
    assert "spec.replicas: Invalid value" in result.stderr
    assert "replicas must lie within minReplicas and maxReplicas" in result.stderr


def test_a_graph_no_operator_has_seen_is_served_as_observed_at_generation_zero(
    kubectl: Kubectl, crds: None, namespace: str
) -> None:
    """The CRD's status default, filled in by the apiserver: a graph nothing has written status on reads
    `observedGeneration: 0` below its generation, which kstatus and Argo CD call in progress
    (tests/unit/test_gitops_health.py judges that object with their code)."""
    result = kubectl.run("create", "-n", namespace, "-o", "json", "-f", "-", stdin=yaml.safe_dump(valid()))
    created = json.loads(result.stdout)
    assert created["metadata"]["generation"] == 1 and created["status"] == {"observedGeneration": 0}, created
