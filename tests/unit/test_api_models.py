"""Parsing DynamoGraphs with the pydantic API models: wire names, defaults, strictness, helpers."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from pydantic import ValidationError

from fleetpilot.api import v1alpha1 as api


def graph_body(**spec_overrides: Any) -> dict[str, Any]:
    """A DynamoGraph as the API returns it (a disaggregated vLLM graph), with spec keys replaced."""
    spec: dict[str, Any] = {
        "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
        "engine": {"framework": "vllm", "image": "vllm/vllm-openai:v0.9.1"},
        "components": {"prefill": {}, "decode": {}},
    }
    spec.update(spec_overrides)
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.GRAPH_KIND,
        "metadata": {"name": "llama", "namespace": "inference", "uid": "uid-llama", "generation": 4},
        "spec": spec,
    }


def parse(body: dict[str, Any]) -> api.DynamoGraph:
    return api.DynamoGraph.model_validate(body)


def error_locations(error: ValidationError) -> list[tuple[Any, ...]]:
    return [tuple(e["loc"]) for e in error.errors()]


FULL_SPEC: dict[str, Any] = {
    "model": {"name": "meta-llama/Llama-3.1-70B-Instruct", "servedName": "llama-70b"},
    "engine": {
        "framework": "sglang",
        "image": "lmsysorg/sglang:v0.4.6",
        "args": ["--context-length", "32768"],
        "env": [
            {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
            {"name": "NCCL_DEBUG", "value": "WARN"},
        ],
    },
    "components": {
        "frontend": {
            "replicas": 3,
            "router": {"policy": "least-loaded"},
            "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}},
        },
        "prefill": {"replicas": 2, "gpus": 2, "parallelism": {"tensor": 2}, "scaling": {"min": 2, "max": 6}},
        "decode": {
            "replicas": 4,
            "gpus": 4,
            "parallelism": {"tensor": 2, "pipeline": 2},
            "args": ["--max-running-requests", "256"],
            "resources": {"requests": {"cpu": 16, "memory": "64Gi"}, "limits": {"memory": "80Gi"}},
        },
    },
    "podTemplate": {
        "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "priorityClassName": "inference",
        "serviceAccountName": "runner",
        "imagePullSecrets": ["regcred"],
        "labels": {"team": "ml"},
        "annotations": {"owner": "ml-platform"},
        "volumes": [{"name": "models", "persistentVolumeClaim": {"claimName": "model-cache"}}],
        "volumeMounts": [{"name": "models", "mountPath": "/models"}],
    },
    "planner": {
        "mode": "sla",
        "sla": {"ttftMs": 400, "itlMs": 20, "percentile": 95},
        "predictor": "kalman",
        "intervalSeconds": 30,
        "gpuBudget": 32,
        "profileRef": {"configMap": "llama-70b-h100"},
    },
}


# -- camelCase wire names ----------------------------------------------------------------------------


def test_full_graph_parses_camel_case_fields() -> None:
    """Every camelCase wire name lands in the matching snake_case attribute."""
    spec = parse(graph_body(**copy.deepcopy(FULL_SPEC))).spec

    assert spec.model.served_name == "llama-70b"
    assert spec.engine.env[0].value_from == {"secretKeyRef": {"name": "hf", "key": "token"}}
    assert spec.engine.env[1].value == "WARN"
    assert spec.components.frontend.router.policy == "least-loaded"
    assert spec.components.frontend.resources is not None
    assert spec.components.frontend.resources.requests == {"cpu": "500m", "memory": "1Gi"}
    assert spec.components.prefill is not None and spec.components.decode is not None
    assert (spec.components.prefill.scaling.min_replicas, spec.components.prefill.scaling.max_replicas) == (
        2,
        6,
    )
    assert (spec.components.decode.parallelism.tensor, spec.components.decode.parallelism.pipeline) == (2, 2)
    assert spec.components.decode.args == ["--max-running-requests", "256"]

    pod = spec.pod_template
    assert pod.node_selector == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert pod.priority_class_name == "inference"
    assert pod.service_account_name == "runner"
    assert pod.image_pull_secrets == ["regcred"]
    assert pod.volume_mounts == [{"name": "models", "mountPath": "/models"}]

    planner = spec.planner
    assert planner.interval_seconds == 30
    assert planner.gpu_budget == 32
    assert planner.sla is not None
    assert (planner.sla.ttft_ms, planner.sla.itl_ms, planner.sla.percentile) == (400, 20, 95)
    assert planner.profile_ref is not None
    assert (planner.profile_ref.config_map, planner.profile_ref.key) == ("llama-70b-h100", "profile.json")


def test_quantities_accept_ints_and_strings() -> None:
    """Resource quantities keep their type: 16 stays an int, "64Gi" a string."""
    decode = parse(graph_body(**copy.deepcopy(FULL_SPEC))).spec.components.decode
    assert decode is not None and decode.resources is not None
    assert decode.resources.requests == {"cpu": 16, "memory": "64Gi"}
    assert decode.resources.limits == {"memory": "80Gi"}


def test_dump_by_alias_round_trips_to_the_wire_form() -> None:
    """Serialising by alias gives back camelCase keys, and re-parsing gives an equal model."""
    graph = parse(graph_body(**copy.deepcopy(FULL_SPEC)))
    wire = graph.spec.model_dump(by_alias=True, exclude_none=True)

    assert wire["model"]["servedName"] == "llama-70b"
    assert wire["podTemplate"]["imagePullSecrets"] == ["regcred"]
    assert wire["planner"]["intervalSeconds"] == 30
    assert wire["components"]["prefill"]["scaling"] == {"min": 2, "max": 6}
    assert "pod_template" not in wire and "served_name" not in wire["model"]
    assert api.DynamoGraphSpec.model_validate(wire) == graph.spec


def test_metadata_fields_are_read_and_unknown_metadata_is_ignored() -> None:
    """Real API objects carry resourceVersion, managedFields, ...; the operator reads only what it needs."""
    body = graph_body()
    body["metadata"].update(
        {
            "resourceVersion": "123",
            "creationTimestamp": "2025-01-01T00:00:00Z",
            "managedFields": [{"manager": "kubectl"}],
            "labels": {"env": "prod"},
        }
    )
    body["status"] = {
        "observedGeneration": 3,
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "AllComponentsReady", "lastTransitionTime": "t0"}
        ],
    }
    graph = parse(body)

    assert (graph.metadata.name, graph.metadata.namespace) == ("llama", "inference")
    assert (graph.metadata.uid, graph.metadata.generation) == ("uid-llama", 4)
    assert graph.metadata.labels == {"env": "prod"}
    assert graph.status.observed_generation == 3
    assert graph.status.conditions[0].last_transition_time == "t0"


# -- defaults ----------------------------------------------------------------------------------------


def test_minimal_graph_gets_documented_defaults() -> None:
    """Frontend: 1 replica, prefix-aware. Workers: 1 replica, 1 GPU, 1x1 parallelism, scaling 1..8."""
    spec = parse(graph_body()).spec

    frontend = spec.components.frontend
    assert frontend.replicas == 1
    assert frontend.router.policy == "prefix-aware"
    assert frontend.resources is None

    for name, worker in spec.components.workers().items():
        assert worker.replicas == 1, name
        assert worker.gpus == 1, name
        assert (worker.parallelism.tensor, worker.parallelism.pipeline) == (1, 1), name
        assert (worker.scaling.min_replicas, worker.scaling.max_replicas) == (1, 8), name
        assert worker.args == [] and worker.resources is None, name

    assert spec.model.served_name is None
    assert spec.engine.args == [] and spec.engine.env == []
    assert spec.pod_template == api.PodTemplateOverrides()
    assert (spec.planner.mode, spec.planner.predictor, spec.planner.interval_seconds) == ("off", "arima", 60)
    assert spec.planner.sla is None
    assert parse(graph_body()).status == api.DynamoGraphStatus()  # status is optional on input


def test_partial_sub_objects_are_completed_with_defaults() -> None:
    """Setting one field of a defaulted sub-object keeps the defaults of the others."""
    spec = parse(
        graph_body(
            components={
                "frontend": {"replicas": 2},
                "aggregated": {"scaling": {"max": 3}, "parallelism": {"pipeline": 2}, "gpus": 2},
            }
        )
    ).spec

    assert spec.components.frontend.router.policy == "prefix-aware"
    aggregated = spec.components.aggregated
    assert aggregated is not None
    assert (aggregated.scaling.min_replicas, aggregated.scaling.max_replicas) == (1, 3)
    assert (aggregated.parallelism.tensor, aggregated.parallelism.pipeline) == (1, 2)


def test_snake_case_names_are_accepted_too() -> None:
    """populate_by_name: Python callers may use attribute names."""
    model = api.ModelSpec.model_validate({"name": "m", "served_name": "alias"})
    assert model.served_name == "alias"
    scaling = api.ScalingBounds.model_validate({"min_replicas": 0, "max_replicas": 2})
    assert (scaling.min_replicas, scaling.max_replicas) == (0, 2)


# -- strictness --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "typo"),
    [
        (("spec",), "replica"),
        (("spec", "model"), "servedname"),
        (("spec", "components"), "worker"),
        (("spec", "components", "decode"), "gpu"),
        (("spec", "components", "decode", "scaling"), "maxReplicas"),
        (("spec", "podTemplate"), "pod_labels"),
        (("spec", "planner"), "interval"),
    ],
)
def test_unknown_spec_fields_are_rejected_and_named(path: tuple[str, ...], typo: str) -> None:
    """A typo anywhere in the spec is an error that names the offending field and where it is."""
    body = graph_body()
    target = body
    for key in path:
        target = target.setdefault(key, {})
    target[typo] = 1

    with pytest.raises(ValidationError) as caught:
        parse(body)

    errors = caught.value.errors()
    assert [e["type"] for e in errors] == ["extra_forbidden"]
    assert errors[0]["loc"][-1] == typo
    assert typo in str(caught.value)


def test_snake_case_field_on_the_wire_is_not_confused_with_a_typo() -> None:
    """The snake_case spelling of a real field is accepted (populate_by_name), not rejected as extra."""
    body = graph_body(pod_template={"node_selector": {"zone": "a"}})
    assert parse(body).spec.pod_template.node_selector == {"zone": "a"}


@pytest.mark.parametrize(
    ("spec_change", "location"),
    [
        ({"engine": {"framework": "tensorflow"}}, ("spec", "engine", "framework")),
        ({"model": {"name": ""}}, ("spec", "model", "name")),
        (
            {"components": {"decode": {"parallelism": {"tensor": 0}}, "prefill": {}}},
            ("spec", "components", "decode", "parallelism", "tensor"),
        ),
        ({"components": {"decode": {"gpus": 65}, "prefill": {}}}, ("spec", "components", "decode", "gpus")),
        (
            {"components": {"frontend": {"router": {"policy": "random"}}, "aggregated": {}}},
            ("spec", "components", "frontend", "router", "policy"),
        ),
        (
            {"planner": {"mode": "sla", "sla": {"ttftMs": 0, "itlMs": 10}}},
            ("spec", "planner", "sla", "ttftMs"),
        ),
        (
            {"engine": {"framework": "vllm", "image": "x", "env": [{"name": "1BAD"}]}},
            ("spec", "engine", "env", 0, "name"),
        ),
        (
            {"components": {"frontend": {"auth": {"apiKeySecretRef": {"name": "Keys_1"}}}, "aggregated": {}}},
            ("spec", "components", "frontend", "auth", "apiKeySecretRef", "name"),
        ),
        (
            {"components": {"frontend": {"auth": {"apiKeySecretRef": {"name": "keys"}, "maxInFlightPerKey": 0}},
                            "aggregated": {}}},
            ("spec", "components", "frontend", "auth", "maxInFlightPerKey"),
        ),
        (
            {"components": {"frontend": {"auth": {"maxInFlightPerKey": 4}}, "aggregated": {}}},
            ("spec", "components", "frontend", "auth", "apiKeySecretRef"),
        ),
    ],
)
def test_field_constraints_are_enforced(spec_change: dict[str, Any], location: tuple[Any, ...]) -> None:
    """Enums, lengths, ranges and patterns reject bad values at the field's wire location."""
    with pytest.raises(ValidationError) as caught:
        parse(graph_body(**spec_change))
    assert location in error_locations(caught.value)


def test_required_fields_are_reported() -> None:
    body = graph_body()
    del body["spec"]["engine"]
    with pytest.raises(ValidationError) as caught:
        parse(body)
    assert ("spec", "engine") in error_locations(caught.value)
    assert caught.value.errors()[0]["type"] == "missing"


def test_component_spec_parses_scale_fields() -> None:
    component = api.DynamoGraphComponent.model_validate(
        {
            "apiVersion": api.API_VERSION,
            "kind": api.COMPONENT_KIND,
            "metadata": {"name": "llama-decode", "namespace": "inference"},
            "spec": {
                "graph": "llama",
                "component": "decode",
                "replicas": 3,
                "minReplicas": 1,
                "maxReplicas": 8,
            },
            "status": {"replicas": 2, "readyReplicas": 1, "selector": "fleetpilot.dev/graph=llama"},
        }
    )
    assert (component.spec.replicas, component.spec.min_replicas, component.spec.max_replicas) == (3, 1, 8)
    assert component.status.ready_replicas == 1
    with pytest.raises(ValidationError):
        api.DynamoGraphComponentSpec.model_validate({"graph": "llama", "component": "router", "replicas": 1})


# -- ComponentsSpec.workers() ------------------------------------------------------------------------


def test_workers_of_a_disaggregated_graph_are_prefill_then_decode() -> None:
    """Order is prefill, decode regardless of the order in the manifest; the frontend is not a worker."""
    components = api.ComponentsSpec.model_validate(
        {"decode": {"gpus": 2, "parallelism": {"tensor": 2}}, "prefill": {"replicas": 3}}
    )
    workers = components.workers()

    assert list(workers) == ["prefill", "decode"]
    assert workers["prefill"] is components.prefill
    assert workers["decode"] is components.decode
    assert workers["prefill"].replicas == 3
    assert workers["decode"].gpus == 2


def test_workers_of_an_aggregated_graph() -> None:
    components = api.ComponentsSpec.model_validate({"aggregated": {"replicas": 2}})
    workers = components.workers()
    assert list(workers) == ["aggregated"]
    assert workers["aggregated"] is components.aggregated


def test_workers_lists_every_pool_present_in_stable_order() -> None:
    """With every pool set (the CRD forbids it, Python does not): prefill, decode, aggregated."""
    components = api.ComponentsSpec.model_validate({"aggregated": {}, "decode": {}, "prefill": {}})
    assert list(components.workers()) == list(api.WORKER_COMPONENTS)
    assert api.ComponentsSpec().workers() == {}


def test_name_length_limit_leaves_room_for_the_longest_child_name() -> None:
    """The longest graph name plus the longest component suffix is exactly a 63-char DNS label."""
    longest_suffix = max(len(f"-{c}") for c in api.ALL_COMPONENTS)
    assert api.MAX_GRAPH_NAME_LENGTH + longest_suffix == 63


# -- DynamoGraphSpec.decode_batch_cap() ----------------------------------------------------------------


def _spec_with(framework: str, engine_args: list[str], decode_args: list[str] | None = None,
               ) -> api.DynamoGraphSpec:
    components: dict[str, Any] = {"prefill": {}, "decode": {"args": decode_args or []}}
    if decode_args is None:
        components = {"aggregated": {}}
    return api.DynamoGraphSpec.model_validate({
        "model": {"name": "m"}, "engine": {"framework": framework, "image": "img", "args": engine_args},
        "components": components})


@pytest.mark.parametrize(("framework", "engine_args", "decode_args", "cap"), [
    ("vllm", ["--max-num-seqs", "128"], [], 128),
    ("vllm", ["--max-num-seqs=128"], ["--max-num-seqs", "64"], 64),  # the component's flag comes last
    ("vllm", ["--max_num_seqs", "96", "--enforce-eager"], [], 96),
    ("vllm", [], [], None),  # vLLM's default depends on its version and GPU: not guessed
    ("vllm", ["--max-num-seqs"], [], None),  # no value: nothing stated
    ("sglang", ["--max-running-requests", "48"], [], 48),
    ("trtllm", ["--max_batch_size=32"], [], 32),
    ("trtllm", ["--max-num-seqs", "32"], [], None),  # another engine's flag
    ("simulator", [], [], 256),  # the simulator's own default
    ("simulator", ["--max-num-seqs", "8"], [], 8),
    ("vllm", ["--max-num-seqs", "128"], None, None),  # aggregated: no decode pool
])
def test_the_decode_batch_cap_is_read_from_the_engine_flags(framework: str, engine_args: list[str],
                                                            decode_args: list[str] | None, cap: int | None) -> None:
    assert _spec_with(framework, engine_args, decode_args).decode_batch_cap() == cap


def test_the_simulators_default_batch_cap_is_the_one_the_api_assumes() -> None:
    import argparse

    from fleetpilot.sim import cli as sim_cli
    from fleetpilot.sim import scheduler

    parser = argparse.ArgumentParser()
    sim_cli.add_parser(parser.add_subparsers())
    parsed = parser.parse_args(["sim", "worker", "--model", "m"])
    assert parsed.max_num_seqs == scheduler.SchedulerConfig().max_num_seqs == api.SIMULATOR_MAX_NUM_SEQS


def test_frontend_auth_is_off_unless_set_and_reads_its_secret_ref() -> None:
    assert parse(graph_body()).spec.components.frontend.auth is None
    keyed = parse(graph_body(components={"frontend": {"auth": {"apiKeySecretRef": {"name": "llama.keys"}}},
                                         "aggregated": {}}))
    auth = keyed.spec.components.frontend.auth
    assert auth is not None and auth.api_key_secret_ref.name == "llama.keys" and auth.max_in_flight_per_key is None
