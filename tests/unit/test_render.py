"""Rendering a DynamoGraph into Kubernetes manifests.

Golden files pin the complete output for one representative graph per engine (and a multinode
one); the behaviour tests below pin the properties that must hold for any graph (selectors, GPUs,
ownership, engine flags, RBAC). test_render_engines.py tests each engine module on its own.

To regenerate the golden files after an intended change::

    FLEETPILOT_UPDATE_GOLDEN=1 python -m pytest tests/unit/test_render.py
"""

from __future__ import annotations

import copy
import difflib
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetpilot import yamlio
from fleetpilot.api import contract
from fleetpilot.api import v1alpha1 as api
from fleetpilot.operator import engine_sglang, engine_vllm, render
from fleetpilot.operator.engine import Worker

GOLDEN_DIR = Path(__file__).parent / "golden"
UPDATE_GOLDEN = os.environ.get("FLEETPILOT_UPDATE_GOLDEN") == "1"
SETTINGS = render.RenderSettings()
GPU = "nvidia.com/gpu"


# -- sample graphs -----------------------------------------------------------------------------------


def graph_dict(name: str, namespace: str, uid: str, generation: int, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.GRAPH_KIND,
        "metadata": {"name": name, "namespace": namespace, "uid": uid, "generation": generation},
        "spec": spec,
    }


VLLM_DISAGG = graph_dict(
    "llama-disagg",
    "inference",
    "uid-graph-llama-disagg",
    3,
    {
        "model": {"name": "meta-llama/Llama-3.1-70B-Instruct", "servedName": "llama-70b"},
        "engine": {
            "framework": "vllm",
            "image": "vllm/vllm-openai:v0.9.1",
            "args": ["--max-model-len", "16384"],
            "env": [
                {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}
            ],
        },
        "components": {
            "frontend": {"replicas": 2,
                         "auth": {"apiKeySecretRef": {"name": "llama-api-keys"}, "maxInFlightPerKey": 64}},
            "prefill": {"replicas": 2, "scaling": {"min": 1, "max": 6}},
            "decode": {
                "replicas": 1,
                "gpus": 2,
                "parallelism": {"tensor": 2},
                "scaling": {"min": 1, "max": 4},
                "args": ["--gpu-memory-utilization", "0.92"],
            },
        },
        "podTemplate": {
            "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "labels": {"team": "inference"},
            "annotations": {"prometheus.io/scrape": "true"},
        },
    },
)

SGLANG_AGG = graph_dict(
    "qwen-agg",
    "serving",
    "uid-graph-qwen-agg",
    1,
    {
        "model": {"name": "Qwen/Qwen2.5-32B-Instruct"},
        "engine": {"framework": "sglang", "image": "lmsysorg/sglang:v0.4.6"},
        "components": {
            "frontend": {
                "router": {"policy": "round-robin"},
                "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
            },
            "aggregated": {
                "replicas": 2,
                "gpus": 4,
                "parallelism": {"tensor": 4},
                "resources": {"requests": {"cpu": 16, "memory": "128Gi"}},
            },
        },
        "podTemplate": {
            "serviceAccountName": "inference-runner",
            "imagePullSecrets": ["regcred"],
            "priorityClassName": "inference-high",
            "volumes": [{"name": "models", "persistentVolumeClaim": {"claimName": "model-cache"}}],
            "volumeMounts": [{"name": "models", "mountPath": "/models", "readOnly": True}],
        },
    },
)

SIM_DISAGG = graph_dict(
    "sim-disagg",
    "default",
    "uid-graph-sim-disagg",
    7,
    {
        "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
        "engine": {"framework": "simulator"},
        "components": {
            "prefill": {},
            "decode": {"replicas": 3, "scaling": {"min": 2, "max": 10}},
        },
        "planner": {"mode": "sla", "sla": {"ttftMs": 500, "itlMs": 25}, "intervalSeconds": 30},
    },
)

TRTLLM_DISAGG = graph_dict(
    "llama-trtllm",
    "inference",
    "uid-graph-llama-trtllm",
    4,
    {
        "model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "servedName": "llama-8b"},
        "engine": {
            "framework": "trtllm",
            "image": "nvcr.io/nvidia/tensorrt-llm/release:1.0.0",
            "args": ["--max_batch_size", "64"],
        },
        "components": {
            "prefill": {"replicas": 1},
            "decode": {"replicas": 2, "gpus": 2, "parallelism": {"tensor": 2}, "drainSeconds": 60},
        },
    },
)

SAMPLES = {"vllm-disagg": VLLM_DISAGG, "sglang-agg": SGLANG_AGG, "sim-disagg": SIM_DISAGG,
           "trtllm-disagg": TRTLLM_DISAGG}


def parse(body: dict[str, Any]) -> api.DynamoGraph:
    return api.DynamoGraph.model_validate(copy.deepcopy(body))


def with_spec(body: dict[str, Any], **changes: Any) -> api.DynamoGraph:
    """A sample graph with top-level spec keys replaced."""
    body = copy.deepcopy(body)
    body["spec"].update(copy.deepcopy(changes))
    return parse(body)


def owner_for(graph: api.DynamoGraph, component: str) -> render.OwnerRef:
    """The DynamoGraphComponent that owns a component's workload."""
    name = f"{graph.metadata.name}-{component}"
    return render.OwnerRef(api.API_VERSION, api.COMPONENT_KIND, name, f"uid-{component}")


def render_workload(
    graph: api.DynamoGraph, component: api.ComponentName, replicas: int | None = None
) -> list[dict[str, Any]]:
    if replicas is None:
        replicas = render.effective_replicas(graph, component, render.initial_replicas(graph, component))
    return render.workload(
        graph, component, replicas=replicas, owner=owner_for(graph, component), settings=SETTINGS
    )


def render_component(graph: api.DynamoGraph, component: api.ComponentName) -> list[dict[str, Any]]:
    """The DynamoGraphComponent followed by everything the component runs on."""
    return [render.component_object(graph, component, with_replicas=True), *render_workload(graph, component)]


def render_all(graph: api.DynamoGraph) -> list[dict[str, Any]]:
    return [obj for component in render.components_of(graph) for obj in render_component(graph, component)]


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = by_kind(objects, kind)
    return found


def engine_container(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def flag_value(args: list[str], flag: str) -> str:
    assert flag in args, f"{flag} missing from {args}"
    return args[args.index(flag) + 1]


def all_sample_components() -> list[tuple[str, api.ComponentName]]:
    return [(sample, c) for sample, body in SAMPLES.items() for c in render.components_of(parse(body))]


# -- golden files ------------------------------------------------------------------------------------


def assert_matches_golden(file_name: str, rendered: str) -> None:
    """Compare with golden/<file_name>, or rewrite it when FLEETPILOT_UPDATE_GOLDEN=1."""
    __tracebackhide__ = True
    path = GOLDEN_DIR / file_name
    if UPDATE_GOLDEN:
        GOLDEN_DIR.mkdir(exist_ok=True)
        path.write_text(rendered)
        return
    if not path.is_file():
        pytest.fail(
            f"golden file {path} is missing; create it with "
            "FLEETPILOT_UPDATE_GOLDEN=1 python -m pytest tests/unit/test_render.py"
        )
    expected = path.read_text()
    if rendered != expected:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True),
                rendered.splitlines(keepends=True),
                fromfile=f"golden/{file_name}",
                tofile="rendered",
            )
        )
        pytest.fail(
            f"rendered manifests differ from golden/{file_name}:\n{diff}\n"
            "If the change is intended, regenerate with "
            "FLEETPILOT_UPDATE_GOLDEN=1 python -m pytest tests/unit/test_render.py and review the diff."
        )


def golden_file_name(sample: str, component: str) -> str:
    return f"{sample}.{component}.yaml"


@pytest.mark.parametrize(("sample", "component"), all_sample_components())
def test_render_matches_golden(sample: str, component: api.ComponentName) -> None:
    """The full output for each sample component is pinned (DynamoGraphComponent + workload)."""
    graph = parse(SAMPLES[sample])
    assert_matches_golden(
        golden_file_name(sample, component), yamlio.dump_all(render_component(graph, component))
    )


def test_no_stale_golden_files() -> None:
    """Every golden file belongs to a rendered sample, so renamed samples do not leave dead files."""
    expected = {golden_file_name(sample, component) for sample, component in all_sample_components()}
    expected |= set(MULTINODE_GOLDEN)
    present = {path.name for path in GOLDEN_DIR.glob("*.yaml")}
    assert present == expected


@pytest.mark.parametrize(("sample", "component"), all_sample_components())
def test_golden_files_are_valid_yaml_streams(sample: str, component: str) -> None:
    """The pinned output loads back to the same documents the renderer produced."""
    if UPDATE_GOLDEN:
        pytest.skip("golden files are being rewritten")
    graph = parse(SAMPLES[sample])
    loaded = list(yaml.safe_load_all((GOLDEN_DIR / golden_file_name(sample, component)).read_text()))
    assert loaded == render_component(graph, component)


# -- labels and selectors ----------------------------------------------------------------------------


def graph_with_hostile_labels() -> api.DynamoGraph:
    """A graph whose podTemplate.labels try to take over the selector labels."""
    return with_spec(
        VLLM_DISAGG,
        podTemplate={
            "labels": {
                contract.LABEL_GRAPH: "someone-else",
                contract.LABEL_COMPONENT: "decode",
                "team": "inference",
            }
        },
    )


@pytest.mark.parametrize("component", ["frontend", "prefill", "decode"])
def test_selector_is_a_subset_of_pod_labels_despite_user_labels(component: api.ComponentName) -> None:
    """User labels cannot change the labels the Deployment, Service and PDB select on."""
    graph = graph_with_hostile_labels()
    objects = render_workload(graph, component)
    deployment = one(objects, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = deployment["spec"]["selector"]["matchLabels"]

    component_selector = {contract.LABEL_GRAPH: "llama-disagg", contract.LABEL_COMPONENT: component}
    if component != "frontend":  # one Deployment and PDB per generation; the Service selects them all
        assert selector == {**component_selector,
                            contract.LABEL_GENERATION: render.generation_of(graph, SETTINGS)}
    else:
        assert selector == component_selector
    assert selector.items() <= pod_labels.items()
    assert pod_labels["team"] == "inference"  # harmless user labels are kept
    assert one(objects, "Service")["spec"]["selector"] == component_selector
    assert one(objects, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"] == selector


@pytest.mark.parametrize(("sample", "component"), all_sample_components())
def test_selector_is_a_subset_of_pod_labels_for_every_sample(
    sample: str, component: api.ComponentName
) -> None:
    deployment = one(render_workload(parse(SAMPLES[sample]), component), "Deployment")
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()


def test_selectors_of_different_components_do_not_overlap() -> None:
    """A component's selector never matches another component's pods."""
    graph = parse(VLLM_DISAGG)
    pods = {
        c: one(render_workload(graph, c), "Deployment")["spec"]["template"]["metadata"]["labels"]
        for c in render.components_of(graph)
    }
    for component in pods:
        selector = render.selector_labels(graph.metadata.name, component)
        matched = [other for other, labels in pods.items() if selector.items() <= labels.items()]
        assert matched == [component]


# -- resources ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sample", "component"), [(s, c) for s, c in all_sample_components() if c != "frontend"]
)
def test_gpu_requests_equal_limits_equal_worker_gpus(sample: str, component: api.ComponentName) -> None:
    graph = parse(SAMPLES[sample])
    gpus = graph.spec.components.workers()[component].gpus
    resources = engine_container(one(render_workload(graph, component), "Deployment"))["resources"]
    assert resources["requests"][GPU] == resources["limits"][GPU] == gpus


def test_decode_with_tensor_parallel_two_gets_two_gpus() -> None:
    resources = engine_container(one(render_workload(parse(VLLM_DISAGG), "decode"), "Deployment"))[
        "resources"
    ]
    assert resources["requests"][GPU] == 2


def test_gpu_count_comes_from_gpus_not_from_resources() -> None:
    """A GPU figure in resources is overridden by `gpus`, so requests and limits can never disagree."""
    body = copy.deepcopy(SGLANG_AGG)
    body["spec"]["components"]["aggregated"]["resources"] = {
        "requests": {GPU: 1, "cpu": 8},
        "limits": {GPU: 8, "memory": "100Gi"},
    }
    resources = engine_container(one(render_workload(parse(body), "aggregated"), "Deployment"))["resources"]
    assert resources["requests"] == {GPU: 4, "cpu": 8}
    assert resources["limits"] == {GPU: 4, "memory": "100Gi"}


def test_frontend_requests_no_gpu_and_merges_user_resources() -> None:
    """The frontend gets the operator's CPU/memory defaults, overridden by the user's, and no GPU."""
    default = engine_container(one(render_workload(parse(VLLM_DISAGG), "frontend"), "Deployment"))[
        "resources"
    ]
    assert default == {"requests": dict(SETTINGS.frontend_requests)}

    custom = engine_container(one(render_workload(parse(SGLANG_AGG), "frontend"), "Deployment"))["resources"]
    assert custom == {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "2Gi"}}


# -- ownership ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("sample", "component"), all_sample_components())
def test_every_workload_object_is_controlled_by_its_component(
    sample: str, component: api.ComponentName
) -> None:
    graph = parse(SAMPLES[sample])
    owner = owner_for(graph, component)
    for obj in render_workload(graph, component):
        (reference,) = obj["metadata"]["ownerReferences"]
        assert reference == owner.as_manifest(), obj["kind"]
        assert reference["controller"] is True and reference["blockOwnerDeletion"] is True
        assert reference["kind"] == api.COMPONENT_KIND
        assert obj["metadata"]["namespace"] == graph.metadata.namespace


@pytest.mark.parametrize(("sample", "component"), all_sample_components())
def test_component_object_is_controlled_by_the_graph(sample: str, component: api.ComponentName) -> None:
    graph = parse(SAMPLES[sample])
    (reference,) = render.component_object(graph, component, with_replicas=True)["metadata"][
        "ownerReferences"
    ]
    assert reference == {
        "apiVersion": api.API_VERSION,
        "kind": api.GRAPH_KIND,
        "name": graph.metadata.name,
        "uid": graph.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


# -- engine flags ------------------------------------------------------------------------------------


def test_vllm_disaggregated_workers_use_nixl_connector() -> None:
    graph = parse(VLLM_DISAGG)
    for component in ("prefill", "decode"):
        container = engine_container(one(render_workload(graph, component), "Deployment"))
        config = json.loads(flag_value(container["args"], "--kv-transfer-config"))
        assert config["kv_connector"] == "NixlConnector"
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == str(engine_vllm.NIXL_SIDE_CHANNEL_PORT)
        assert "nixl" in [p["name"] for p in container["ports"]]


def test_vllm_aggregated_worker_has_no_kv_transfer() -> None:
    graph = with_spec(VLLM_DISAGG, components={"aggregated": {"gpus": 2, "parallelism": {"tensor": 2}}})
    container = engine_container(one(render_workload(graph, "aggregated"), "Deployment"))
    assert "--kv-transfer-config" not in container["args"]
    assert not any(e["name"].startswith("VLLM_NIXL") for e in container["env"])
    assert flag_value(container["args"], "--tensor-parallel-size") == "2"


def test_vllm_command_carries_model_parallelism_and_extra_args_in_order() -> None:
    """Engine-wide args come before component args, both after the operator's flags."""
    container = engine_container(one(render_workload(parse(VLLM_DISAGG), "decode"), "Deployment"))
    args = container["args"]
    assert container["command"] == ["vllm"]
    assert args[:2] == ["serve", "meta-llama/Llama-3.1-70B-Instruct"]
    assert flag_value(args, "--served-model-name") == "llama-70b"
    assert flag_value(args, "--tensor-parallel-size") == "2"
    assert flag_value(args, "--pipeline-parallel-size") == "1"
    assert args[-4:] == ["--max-model-len", "16384", "--gpu-memory-utilization", "0.92"]


def sglang_disaggregated() -> api.DynamoGraph:
    return with_spec(SGLANG_AGG, components={"prefill": {}, "decode": {}})


def test_sglang_prefill_is_in_prefill_mode_with_bootstrap_port() -> None:
    container = engine_container(one(render_workload(sglang_disaggregated(), "prefill"), "Deployment"))
    assert flag_value(container["args"], "--disaggregation-mode") == "prefill"
    assert flag_value(container["args"], "--disaggregation-bootstrap-port") == str(
        engine_sglang.BOOTSTRAP_PORT
    )
    assert {
        "name": "bootstrap",
        "containerPort": engine_sglang.BOOTSTRAP_PORT,
        "protocol": "TCP",
    } in container["ports"]


def test_sglang_decode_is_in_decode_mode_without_bootstrap_port() -> None:
    container = engine_container(one(render_workload(sglang_disaggregated(), "decode"), "Deployment"))
    assert flag_value(container["args"], "--disaggregation-mode") == "decode"
    assert "--disaggregation-bootstrap-port" not in container["args"]
    assert "bootstrap" not in [p["name"] for p in container["ports"]]


def test_sglang_aggregated_has_no_disaggregation_flags() -> None:
    container = engine_container(one(render_workload(parse(SGLANG_AGG), "aggregated"), "Deployment"))
    assert not any(arg.startswith("--disaggregation") for arg in container["args"])
    assert flag_value(container["args"], "--tp-size") == "4"


def trtllm_graph(components: dict[str, Any]) -> api.DynamoGraph:
    return with_spec(
        VLLM_DISAGG,
        engine={"framework": "trtllm", "image": "nvcr.io/nvidia/tensorrt-llm:1.0"},
        components=components,
    )


@pytest.mark.parametrize("component", ["prefill", "decode"])
def test_trtllm_disaggregated_renders_and_mounts_its_config_map(component: api.ComponentName) -> None:
    """The options file the engine is pointed at is exactly the ConfigMap key, mounted where it looks."""
    objects = render_workload(trtllm_graph({"prefill": {}, "decode": {}}), component)
    config_map = one(objects, "ConfigMap")
    deployment = one(objects, "Deployment")
    container = engine_container(deployment)

    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    (volume_name,) = [
        name
        for name, v in volumes.items()
        if v.get("configMap", {}).get("name") == config_map["metadata"]["name"]
    ]
    mount_path = mounts[volume_name]["mountPath"]
    (key,) = config_map["data"]
    assert flag_value(container["args"], "--extra_llm_api_options") == f"{mount_path}/{key}"
    assert "cache_transceiver_config:" in config_map["data"][key]
    assert ("disable_overlap_scheduler: true" in config_map["data"][key]) == (component == "prefill")


def test_trtllm_aggregated_has_no_config_map() -> None:
    objects = render_workload(trtllm_graph({"aggregated": {}}), "aggregated")
    assert by_kind(objects, "ConfigMap") == []
    assert "--extra_llm_api_options" not in engine_container(one(objects, "Deployment"))["args"]


def test_simulator_needs_no_engine_image_and_no_shared_memory() -> None:
    """The simulator runs fleetpilot's own image and skips the /dev/shm volume real engines need."""
    deployment = one(render_workload(parse(SIM_DISAGG), "decode"), "Deployment")
    container = engine_container(deployment)
    assert container["image"] == SETTINGS.fleetpilot_image
    assert flag_value(container["args"], "--role") == "decode"
    assert "volumes" not in deployment["spec"]["template"]["spec"]
    assert "volumeMounts" not in container


def test_frontend_mode_follows_the_graph_shape() -> None:
    def mode(graph: api.DynamoGraph) -> str:
        return flag_value(
            engine_container(one(render_workload(graph, "frontend"), "Deployment"))["args"], "--mode"
        )

    assert mode(parse(VLLM_DISAGG)) == "disaggregated"
    assert mode(parse(SGLANG_AGG)) == "aggregated"


# -- frontend RBAC -----------------------------------------------------------------------------------


def test_frontend_gets_its_own_service_account_and_pod_reader_role() -> None:
    graph = parse(VLLM_DISAGG)
    objects = render_workload(graph, "frontend")
    account, role, binding = one(objects, "ServiceAccount"), one(objects, "Role"), one(objects, "RoleBinding")
    name = "llama-disagg-frontend"

    assert one(objects, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == name
    assert account["metadata"]["name"] == role["metadata"]["name"] == name
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
        # Its API-key Secret, that one alone: what a watch selected by metadata.name needs.
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["llama-api-keys"], "verbs": ["list", "watch"]},
    ]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": name, "namespace": "inference"}]


def test_a_frontend_without_auth_reads_no_secret_and_gets_no_key_flags() -> None:
    objects = render_workload(parse(SIM_DISAGG), "frontend")
    assert one(objects, "Role")["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    args = engine_container(one(objects, "Deployment"))["args"]
    assert not [a for a in args if a.startswith("--api-key") or a == "--max-in-flight-per-key"]


def test_a_frontend_with_auth_watches_its_key_secret_by_name_in_its_namespace() -> None:
    args = engine_container(one(render_workload(parse(VLLM_DISAGG), "frontend"), "Deployment"))["args"]
    assert flag_value(args, "--api-key-secret") == "llama-api-keys"
    assert flag_value(args, "--namespace") == "$(POD_NAMESPACE)"  # the graph's: the Secret is looked up there
    assert flag_value(args, "--max-in-flight-per-key") == "64"
    unlimited = _changed(VLLM_DISAGG, "components.frontend.auth", {"apiKeySecretRef": {"name": "k"}})
    unlimited_args = engine_container(one(render_workload(unlimited, "frontend"), "Deployment"))["args"]
    assert flag_value(unlimited_args, "--api-key-secret") == "k" and "--max-in-flight-per-key" not in unlimited_args


def test_user_service_account_replaces_frontend_rbac() -> None:
    """With podTemplate.serviceAccountName the operator creates no account or role and uses the user's."""
    objects = render_workload(parse(SGLANG_AGG), "frontend")
    assert {o["kind"] for o in objects} == {"Deployment", "Service", "PodDisruptionBudget", "NetworkPolicy"}
    assert one(objects, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "inference-runner"


def test_workers_get_no_rbac_and_no_service_account_by_default() -> None:
    graph = parse(VLLM_DISAGG)
    for component in ("prefill", "decode"):
        objects = render_workload(graph, component)
        assert {o["kind"] for o in objects} == {"Deployment", "Service", "PodDisruptionBudget", "NetworkPolicy"}
        assert "serviceAccountName" not in one(objects, "Deployment")["spec"]["template"]["spec"]


# -- replicas ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("low", [0, 1, 3])
@pytest.mark.parametrize("high", [3, 5, 8])
def test_effective_replicas_clamps_to_scaling_bounds(low: int, high: int) -> None:
    """For every request, the result is the request clamped to [min, max] (exhaustive small grid)."""
    graph = with_spec(
        SIM_DISAGG,
        components={
            "prefill": {},
            "decode": {"scaling": {"min": low, "max": high}},
        },
    )
    for requested in range(12):
        effective = render.effective_replicas(graph, "decode", requested)
        assert low <= effective <= high, requested
        assert effective == min(max(requested, low), high), requested
        if low <= requested <= high:
            assert effective == requested


def test_effective_replicas_of_frontend_is_at_least_one_and_unbounded_above() -> None:
    """A frontend scaled to zero would leave a graph that holds GPUs and serves nothing: one runs."""
    graph = parse(VLLM_DISAGG)
    assert render.effective_replicas(graph, "frontend", 0) == 1
    assert render.effective_replicas(graph, "frontend", 50) == 50


def test_deployment_runs_the_replicas_it_is_given() -> None:
    assert (
        one(render_workload(parse(SIM_DISAGG), "decode", replicas=5), "Deployment")["spec"]["replicas"] == 5
    )


def test_component_object_with_replicas_carries_initial_replicas_and_bounds() -> None:
    graph = parse(SIM_DISAGG)
    assert render.component_object(graph, "decode", with_replicas=True)["spec"] == {
        "graph": "sim-disagg",
        "component": "decode",
        "replicas": 3,
        "minReplicas": 2,
        "maxReplicas": 10,
    }
    assert render.component_object(graph, "frontend", with_replicas=True)["spec"] == {
        "graph": "sim-disagg",
        "component": "frontend",
        "replicas": 1,
        "minReplicas": 1,
        "maxReplicas": api.FRONTEND_MAX_REPLICAS,
    }


@pytest.mark.parametrize(("sample", "component"), all_sample_components())
def test_component_object_without_replicas_leaves_them_to_others(
    sample: str, component: api.ComponentName
) -> None:
    """After creation the planner/HPA owns spec.replicas, so the operator's apply must not send it."""
    graph = parse(SAMPLES[sample])
    created = render.component_object(graph, component, with_replicas=True)
    updated = render.component_object(graph, component, with_replicas=False)
    assert "replicas" not in updated["spec"]
    assert updated["spec"] == {k: v for k, v in created["spec"].items() if k != "replicas"}
    assert updated["metadata"] == created["metadata"]


# -- services ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("sample", "component"), all_sample_components())
def test_worker_services_are_headless_and_frontend_service_is_not(
    sample: str, component: api.ComponentName
) -> None:
    service = one(render_workload(parse(SAMPLES[sample]), component), "Service")
    if component == "frontend":
        assert "clusterIP" not in service["spec"]
    else:
        assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["ports"] == [
        {"name": "http", "port": render.HTTP_PORT, "targetPort": "http", "protocol": "TCP"}
    ]


def test_endpoint_points_at_the_frontend_service() -> None:
    assert render.endpoint(parse(VLLM_DISAGG)) == "http://llama-disagg-frontend.inference.svc:8000/v1"


# -- determinism and purity --------------------------------------------------------------------------


@pytest.mark.parametrize("sample", list(SAMPLES))
def test_rendering_is_deterministic(sample: str) -> None:
    """Same input, same output: no random names, no set ordering, nothing time-dependent."""
    first = render_all(parse(SAMPLES[sample]))
    second = render_all(parse(SAMPLES[sample]))
    assert first == second
    assert yamlio.dump_all(first) == yamlio.dump_all(second)


@pytest.mark.parametrize("sample", list(SAMPLES))
def test_rendering_does_not_mutate_the_graph(sample: str) -> None:
    """Rendering twice from one parsed graph gives the same result and leaves the graph as parsed."""
    graph = parse(SAMPLES[sample])
    before = graph.model_dump()
    first = copy.deepcopy(render_all(graph))
    second = render_all(graph)
    assert graph.model_dump() == before
    assert first == second


def test_components_of_lists_frontend_then_workers() -> None:
    assert render.components_of(parse(VLLM_DISAGG)) == ["frontend", "prefill", "decode"]
    assert render.components_of(parse(SGLANG_AGG)) == ["frontend", "aggregated"]


# -- generations, drain, scale to zero -----------------------------------------------------------------


def _changed(sample: dict[str, Any], path: str, value: Any) -> api.DynamoGraph:
    body = copy.deepcopy(sample)
    node = body["spec"]
    *parents, leaf = path.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value
    return parse(body)


@pytest.mark.parametrize(("path", "value"), [
    ("engine.image", "vllm/vllm-openai:v0.10.0"),
    ("engine.args", ["--max-model-len", "8192"]),
    ("model.name", "meta-llama/Llama-3.1-70B-Instruct-FP8"),
    ("components.prefill.args", ["--enforce-eager"]),
    ("components.decode.parallelism", {"tensor": 1}),
])
def test_what_the_engine_runs_is_a_new_generation_of_both_pools(path: str, value: Any) -> None:
    before = render.generation_of(parse(VLLM_DISAGG), SETTINGS)
    graph = _changed(VLLM_DISAGG, path, value)
    if path.endswith("parallelism"):
        graph = _changed(VLLM_DISAGG, "components.decode", {
            **VLLM_DISAGG["spec"]["components"]["decode"], "parallelism": value, "gpus": 1})
    after = render.generation_of(graph, SETTINGS)
    assert after != before
    for component in ("prefill", "decode"):  # graph-wide: a change to one pool rolls both
        name = one(render_workload(graph, component), "Deployment")["metadata"]["name"]
        assert name == contract.generation_child_name("llama-disagg", component, after)


@pytest.mark.parametrize(("path", "value"), [
    ("components.decode.resources", {"requests": {"memory": "64Gi"}}),
    ("components.decode.drainSeconds", 600),
    ("components.prefill.replicas", 3),
    ("podTemplate.nodeSelector", {"pool": "b"}),
    ("planner.mode", "advisory"),
    ("components.frontend.auth", {"apiKeySecretRef": {"name": "other-keys"}}),
])
def test_what_does_not_change_the_kv_cache_rolls_in_place(path: str, value: Any) -> None:
    graph = _changed(VLLM_DISAGG, path, value)
    if path == "planner.mode":
        graph = _changed(VLLM_DISAGG, "planner", {"mode": "advisory", "sla": {"ttftMs": 500, "itlMs": 50}})
    assert render.generation_of(graph, SETTINGS) == render.generation_of(parse(VLLM_DISAGG), SETTINGS)


def test_the_simulators_image_is_part_of_its_generation() -> None:
    graph = parse(SAMPLES["sim-disagg"])
    assert render.generation_of(graph, SETTINGS) != render.generation_of(
        graph, render.RenderSettings(fleetpilot_image="fleetpilot/fleetpilot:0.2.0"))


def test_drain_seconds_set_the_grace_period_and_the_engines_own_drain() -> None:
    graph = _changed(SAMPLES["sim-disagg"], "components.decode.drainSeconds", 45)
    pod = one(render_workload(graph, "decode"), "Deployment")["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 45 + render.EXIT_MARGIN_SECONDS
    args = pod["containers"][0]["args"]
    assert args[args.index("--shutdown-timeout") + 1] == "45"  # the simulator drains on SIGTERM itself
    assert "lifecycle" not in pod["containers"][0]
    frontend = one(render_workload(graph, "frontend"), "Deployment")["spec"]["template"]["spec"]
    assert frontend["terminationGracePeriodSeconds"] == api.DEFAULT_DRAIN_SECONDS + render.EXIT_MARGIN_SECONDS


def test_vllm_workers_wait_for_their_requests_before_sigterm() -> None:
    container = one(render_workload(parse(VLLM_DISAGG), "decode"), "Deployment")["spec"]["template"]["spec"][
        "containers"][0]
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:2] == ["python3", "-c"]
    assert command[3:] == ["8000", "120", "vllm:num_requests_running", "vllm:num_requests_waiting"]


def _frontend_args(graph: api.DynamoGraph) -> list[str]:
    args: list[str] = one(render_workload(graph, "frontend"), "Deployment")["spec"]["template"]["spec"][
        "containers"][0]["args"]
    return args


def test_a_graph_that_may_scale_to_zero_holds_requests_in_its_frontend() -> None:
    held = _changed(SAMPLES["sim-disagg"], "components.decode.scaling", {"min": 0, "max": 4})
    args = _frontend_args(held)
    assert args[args.index("--hold-seconds") + 1] == str(api.DEFAULT_HOLD_SECONDS)
    args = _frontend_args(parse(SAMPLES["sim-disagg"]))
    assert args[args.index("--hold-seconds") + 1] == "0"  # no pool at zero: 503 at once, as before
    explicit = _changed(SAMPLES["sim-disagg"], "components.frontend", {"holdSeconds": 30, "holdQueue": 20})
    args = _frontend_args(explicit)
    assert args[args.index("--hold-seconds") + 1] == "30" and args[args.index("--hold-queue") + 1] == "20"


def test_the_drain_hook_waits_until_the_engine_has_nothing_left() -> None:
    """The preStop script itself, against a /metrics that says busy twice and then idle."""
    import http.server
    import subprocess
    import sys
    import threading

    answers: list[str] = []

    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            running = 3 if len(answers) < 2 else 0
            answers.append(f"running={running}")
            body = (f'# HELP vllm:num_requests_running x\nvllm:num_requests_running{{model_name="m"}} {running}.0\n'
                    'vllm:num_requests_waiting{model_name="m"} 0.0\nvllm:other 5.0\n').encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        worker = Worker(model="m", served_name="m", role="decode", tensor=1, pipeline=1, port=render.HTTP_PORT,
                        drain_seconds=1)
        hook = engine_vllm.ENGINE.drain_hook(worker)
        assert hook is not None
        command = hook["exec"]["command"]
        # The port is the pod's; here the test server's. 60 s to drain: it stops polling once idle, then
        # waits 5 s for KV transfers the gauges do not count.
        argv = [sys.executable, *command[1:3], str(server.server_address[1]), "60", *command[5:]]
        finished = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    finally:
        server.shutdown()
    assert finished.returncode == 0, finished.stderr
    assert answers == ["running=3", "running=3", "running=0"]  # polled until idle, then stopped polling


# -- multinode groups ----------------------------------------------------------------------------------

MULTINODE = graph_dict(
    "llama-405b",
    "inference",
    "uid-graph-llama-405b",
    2,
    {
        "model": {"name": "meta-llama/Llama-3.1-405B-Instruct-FP8", "servedName": "llama-405b"},
        "engine": {"framework": "vllm", "image": "vllm/vllm-openai:v0.11.0"},
        "components": {
            "prefill": {"replicas": 1, "nodes": 2, "gpus": 8, "parallelism": {"tensor": 8, "pipeline": 2}},
            "decode": {"replicas": 2, "nodes": 2, "gpus": 8, "parallelism": {"tensor": 16},
                       "scaling": {"min": 1, "max": 4}},
        },
        "placement": {"topologyKey": "example.com/rack"},
    },
)
MULTINODE_GOLDEN = ("llama-405b.decode-leaders.yaml", "llama-405b.decode-workers.yaml")


def leader_pod(graph: api.DynamoGraph, component: api.ComponentName, index: int = 0) -> dict[str, Any]:
    """A leader pod as its StatefulSet makes it: enough of it to own a worker set."""
    generation = render.generation_of(graph, SETTINGS)
    name = f"{contract.generation_child_name(graph.metadata.name, component, generation)}-{index}"
    return {"metadata": {"name": name, "uid": f"uid-{name}",
                         "labels": {contract.LABEL_GENERATION: generation}}}


def group_workers(graph: api.DynamoGraph, component: api.ComponentName, index: int = 0) -> dict[str, Any]:
    return render.group_workers(graph, component, leader=leader_pod(graph, component, index),
                                generation=render.generation_of(graph, SETTINGS), settings=SETTINGS)


def test_multinode_leaders_and_workers_match_golden() -> None:
    graph = parse(MULTINODE)
    assert_matches_golden(MULTINODE_GOLDEN[0], yamlio.dump_all(render_component(graph, "decode")))
    assert_matches_golden(MULTINODE_GOLDEN[1], yamlio.dump(group_workers(graph, "decode")))


def test_a_multinode_component_runs_a_leader_statefulset_of_groups() -> None:
    graph = parse(MULTINODE)
    objects = render_workload(graph, "decode")
    assert not by_kind(objects, "Deployment")
    leaders = one(objects, "StatefulSet")
    generation = render.generation_of(graph, SETTINGS)
    assert leaders["metadata"]["name"] == f"llama-405b-decode-{generation}"
    assert leaders["spec"]["replicas"] == 2  # groups, not pods
    assert leaders["spec"]["serviceName"] == "llama-405b-decode"
    assert leaders["spec"]["podManagementPolicy"] == "Parallel"
    template = leaders["spec"]["template"]
    assert leaders["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    assert template["metadata"]["labels"][contract.LABEL_GROUP_ROLE] == "leader"
    assert template["spec"]["schedulingGates"] == [{"name": contract.GROUP_SCHEDULING_GATE}]
    assert engine_container(leaders)["resources"]["limits"][GPU] == 8  # per pod
    # The Service publishes pods before they are Ready: ranks find the leader by DNS while it waits for them.
    assert one(objects, "Service")["spec"]["publishNotReadyAddresses"] is True
    # One PodDisruptionBudget covers the generation's leaders and workers alike.
    pdb = one(objects, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"] == render.generation_selector("llama-405b", "decode", generation)
    workers = group_workers(graph, "decode")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= workers["spec"]["template"]["metadata"]["labels"].items()


def test_a_groups_workers_are_owned_by_its_leader_and_ranked_by_ordinal() -> None:
    graph = parse(MULTINODE)
    workers = group_workers(graph, "decode", index=1)
    leader = leader_pod(graph, "decode", 1)["metadata"]
    assert workers["metadata"]["name"] == leader["name"]
    (owner,) = workers["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == ("Pod", leader["name"], leader["uid"], True)
    assert workers["spec"]["replicas"] == 1 and workers["spec"]["ordinals"] == {"start": 1}
    assert workers["spec"]["updateStrategy"] == {"type": "OnDelete"}
    template = workers["spec"]["template"]
    assert workers["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    assert template["metadata"]["labels"][contract.LABEL_GROUP] == leader["name"]
    assert "schedulingGates" not in template["spec"]
    env = {e["name"]: e for e in engine_container(workers)["env"]}
    assert env["FLEETPILOT_NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.labels['apps.kubernetes.io/pod-index']"
    assert env["FLEETPILOT_LEADER_ADDRESS"]["value"] == f"{leader['name']}.llama-405b-decode.inference.svc"
    # A worker waits for nothing: its leader drains, and it goes once the leader has gone.
    assert template["spec"]["terminationGracePeriodSeconds"] == render.EXIT_MARGIN_SECONDS
    assert "lifecycle" not in engine_container(workers)


def test_a_groups_pods_take_a_node_each_in_the_leaders_topology_domain() -> None:
    graph = parse(MULTINODE)
    affinity = group_workers(graph, "decode")["spec"]["template"]["spec"]["affinity"]
    leader = leader_pod(graph, "decode")["metadata"]["name"]
    (apart,) = affinity["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert apart == {"labelSelector": {"matchLabels": {contract.LABEL_GRAPH: "llama-405b", contract.LABEL_GROUP: leader}},
                     "topologyKey": "kubernetes.io/hostname"}
    (together,) = affinity["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert together["topologyKey"] == "example.com/rack"
    assert together["labelSelector"]["matchLabels"]["statefulset.kubernetes.io/pod-name"] == leader
    # Without a topology key only the one-per-node rule; a user's own affinity is kept beside ours.
    user = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["h200"]}]}]}}}
    plain = with_spec(MULTINODE, placement={}, podTemplate={"affinity": user})
    affinity = group_workers(plain, "decode")["spec"]["template"]["spec"]["affinity"]
    assert "podAffinity" not in affinity and affinity["nodeAffinity"] == user["nodeAffinity"]


@pytest.mark.parametrize(("framework", "leader_flags", "worker_flags"), [
    ("vllm",
     ["--distributed-executor-backend", "mp", "--nnodes", "2", "--node-rank", "0",
      "--master-addr", "$(FLEETPILOT_LEADER_ADDRESS)", "--master-port", "29500"],
     ["--distributed-executor-backend", "mp", "--nnodes", "2", "--node-rank", "$(FLEETPILOT_NODE_RANK)",
      "--master-addr", "$(FLEETPILOT_LEADER_ADDRESS)", "--master-port", "29500", "--headless"]),
    ("sglang",
     ["--nnodes", "2", "--node-rank", "0", "--dist-init-addr", "$(FLEETPILOT_LEADER_ADDRESS):29500"],
     ["--nnodes", "2", "--node-rank", "$(FLEETPILOT_NODE_RANK)", "--dist-init-addr",
      "$(FLEETPILOT_LEADER_ADDRESS):29500"]),
    ("simulator",
     ["--nnodes", "2", "--node-rank", "0", "--master-addr", "$(FLEETPILOT_LEADER_ADDRESS)", "--master-port", "29500"],
     ["--nnodes", "2", "--node-rank", "$(FLEETPILOT_NODE_RANK)", "--master-addr", "$(FLEETPILOT_LEADER_ADDRESS)",
      "--master-port", "29500"]),
])
def test_every_rank_gets_the_engines_own_multinode_flags(framework: str, leader_flags: list[str],
                                                          worker_flags: list[str]) -> None:
    engine = {"framework": framework, **({} if framework == "simulator" else {"image": "engine:1"})}
    graph = with_spec(MULTINODE, engine=engine)
    leaders = one(render_workload(graph, "decode"), "StatefulSet")

    def contains(args: list[str], flags: list[str]) -> bool:
        return any(args[i:i + len(flags)] == flags for i in range(len(args)))

    leader_args = engine_container(leaders)["args"]
    worker_args = engine_container(group_workers(graph, "decode"))["args"]
    assert contains(leader_args, leader_flags), leader_args
    assert contains(worker_args, worker_flags), worker_args
    assert flag_value(leader_args, "--tensor-parallel-size" if framework != "sglang" else "--tp-size") == "16"
    leader_env = {e["name"]: e for e in engine_container(leaders)["env"]}
    assert leader_env["FLEETPILOT_NODE_RANK"]["value"] == "0"
    assert leader_env["FLEETPILOT_LEADER_ADDRESS"]["value"] == "$(POD_NAME).llama-405b-decode.$(POD_NAMESPACE).svc"
    # Kubernetes expands $(VAR) only from variables defined before: the group's come after the downward API's.
    names = [e["name"] for e in engine_container(leaders)["env"]]
    assert names.index("POD_NAME") < names.index("FLEETPILOT_LEADER_ADDRESS")


def test_only_the_simulators_workers_answer_probes() -> None:
    vllm_workers = engine_container(group_workers(parse(MULTINODE), "decode"))
    assert not {"readinessProbe", "livenessProbe", "startupProbe"} & set(vllm_workers)
    assert "http" not in [p["name"] for p in vllm_workers.get("ports", [])]
    sim = with_spec(MULTINODE, engine={"framework": "simulator"})
    sim_workers = engine_container(group_workers(sim, "decode"))
    assert sim_workers["readinessProbe"]["httpGet"]["path"] == "/health"


def test_scale_counts_group_leaders_only() -> None:
    graph = parse(MULTINODE)
    assert render.scale_selector(graph, "decode") == {**render.selector_labels("llama-405b", "decode"),
                                                      contract.LABEL_GROUP_ROLE: "leader"}
    single = parse(VLLM_DISAGG)
    assert render.scale_selector(single, "decode") == render.selector_labels("llama-disagg", "decode")


def test_the_group_size_is_part_of_the_generation() -> None:
    graph = parse(MULTINODE)
    wider = with_spec(MULTINODE, components={
        **MULTINODE["spec"]["components"],
        "decode": {**MULTINODE["spec"]["components"]["decode"], "nodes": 4, "gpus": 4}})
    assert render.generation_of(wider, SETTINGS) != render.generation_of(graph, SETTINGS)
