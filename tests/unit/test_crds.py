"""The CRDs in ``crds/`` are generated from the pydantic models and must be valid structural schemas.

These tests pin three things: the committed files match the generator (drift), the generated
OpenAPI schemas follow Kubernetes' structural-schema rules, and the CRDs carry the validation
rules, subresources and printer columns the operator and users rely on.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from fleetpilot import cli, yamlio
from fleetpilot.api import crdgen
from fleetpilot.api import v1alpha1 as api

REPO_ROOT = Path(__file__).resolve().parents[2]
CRDS_DIR = REPO_ROOT / "crds"

GRAPH_CRD_FILE = f"{api.GROUP}_{api.GRAPH_PLURAL}.yaml"
COMPONENT_CRD_FILE = f"{api.GROUP}_{api.COMPONENT_PLURAL}.yaml"


# -- helpers -----------------------------------------------------------------------------------------


def openapi_schema(crd: dict[str, Any]) -> dict[str, Any]:
    """The single served version's openAPIV3Schema."""
    (version,) = crd["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]


def schema_nodes(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema node below (and including) ``node``, with a readable path.

    Walks the schema keywords that hold sub-schemas, so a property that happens to be *named*
    like a keyword (``type``, ``title``) is treated as a property, not as a keyword.
    """
    yield path or "<root>", node
    for name, sub in node.get("properties", {}).items():
        yield from schema_nodes(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from schema_nodes(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from schema_nodes(node["additionalProperties"], f"{path}{{*}}")
    for keyword in ("anyOf", "oneOf", "allOf"):
        for index, sub in enumerate(node.get(keyword, [])):
            yield from schema_nodes(sub, f"{path}<{keyword}[{index}]>")
    if isinstance(node.get("not"), dict):
        yield from schema_nodes(node["not"], f"{path}<not>")


def node_at(schema: dict[str, Any], dotted: str) -> dict[str, Any]:
    """The schema node of a field path like ``spec.components.decode``."""
    node = schema
    for part in dotted.split("."):
        node = node["properties"][part]
    return node


def cel_rules(node: dict[str, Any]) -> list[str]:
    return [validation["rule"] for validation in node.get("x-kubernetes-validations", [])]


def structural_violations(schema: dict[str, Any]) -> list[str]:
    """Everything in a schema that a Kubernetes structural schema does not allow."""
    problems = []
    for path, node in schema_nodes(schema):
        for keyword in ("$ref", "$defs", "anyOf", "oneOf", "allOf", "not", "title", "nullable"):
            if keyword in node:
                problems.append(f"{path}: has {keyword!r}")
        type_ = node.get("type")
        if type_ == "null" or isinstance(type_, list):
            problems.append(f"{path}: null or multiple types {type_!r}")
        if "default" in node and node["default"] is None:
            problems.append(f"{path}: default null")
        exempt = node.get("x-kubernetes-int-or-string") or node.get("x-kubernetes-preserve-unknown-fields")
        if type_ is None and not exempt:
            problems.append(f"{path}: no type")
        if "properties" in node and "additionalProperties" in node:
            problems.append(f"{path}: both properties and additionalProperties")
        for bound in ("exclusiveMinimum", "exclusiveMaximum"):
            if bound in node and not isinstance(node[bound], bool):
                problems.append(f"{path}: {bound} must be a boolean in OpenAPI v3.0, got {node[bound]!r}")
    return problems


@pytest.fixture(scope="module")
def crds() -> dict[str, dict[str, Any]]:
    return crdgen.all_crds()


@pytest.fixture(scope="module")
def graph_schema(crds: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return openapi_schema(crds[GRAPH_CRD_FILE])


@pytest.fixture(scope="module")
def component_crd(crds: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return crds[COMPONENT_CRD_FILE]


# -- drift -------------------------------------------------------------------------------------------


def test_committed_crds_match_the_generator() -> None:
    """crds/ holds exactly the files `fleetpilot crds` would write, byte for byte."""
    generated = cli._crd_files()
    committed = {path.name: path.read_text() for path in sorted(CRDS_DIR.glob("*.yaml"))}

    assert sorted(committed) == sorted(generated), (
        f"crds/ has {sorted(committed)}, the models generate {sorted(generated)}; run `fleetpilot crds`"
    )
    for name, text in generated.items():
        if committed[name] != text:
            diff = "".join(
                difflib.unified_diff(
                    committed[name].splitlines(keepends=True),
                    text.splitlines(keepends=True),
                    fromfile=f"crds/{name} (committed)",
                    tofile=f"crds/{name} (generated)",
                )
            )
            pytest.fail(
                f"crds/{name} drifted from fleetpilot/api/v1alpha1.py; run `fleetpilot crds`.\n{diff}"
            )


def test_committed_crd_files_parse_to_the_generated_documents(crds: dict[str, dict[str, Any]]) -> None:
    """The committed YAML loads back to the generator's documents (the YAML itself is well formed)."""
    import yaml

    for name, document in crds.items():
        assert yaml.safe_load((CRDS_DIR / name).read_text()) == document, name


def test_crds_check_command_detects_drift(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`fleetpilot crds --check` passes on fresh files and fails, naming the file, once one changes."""
    assert cli.main(["crds", "--out", str(tmp_path)]) == 0
    assert cli.main(["crds", "--check", "--out", str(tmp_path)]) == 0

    stale = tmp_path / GRAPH_CRD_FILE
    original = stale.read_text()
    edited = original.replace("shortNames:\n    - dg\n", "shortNames:\n    - dgx\n")
    assert edited != original
    stale.write_text(edited)
    capsys.readouterr()
    assert cli.main(["crds", "--check", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert GRAPH_CRD_FILE in err
    assert COMPONENT_CRD_FILE not in err
    assert "run `fleetpilot crds`" in err


def test_crds_check_command_fails_when_a_file_is_missing(tmp_path: Path) -> None:
    """A missing CRD file counts as drift."""
    assert cli.main(["crds", "--out", str(tmp_path)]) == 0
    (tmp_path / COMPONENT_CRD_FILE).unlink()
    assert cli.main(["crds", "--check", "--out", str(tmp_path)]) == 1


def test_generated_files_carry_the_do_not_edit_header() -> None:
    for name, text in cli._crd_files().items():
        assert text.startswith("# Generated by `fleetpilot crds`"), name
        assert text.endswith("\n")


# -- structural schemas ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "deep_field"),
    [(GRAPH_CRD_FILE, ".spec.planner.sla.ttftMs"), (COMPONENT_CRD_FILE, ".status.selector")],
)
def test_generated_schemas_are_structural(
    crds: dict[str, dict[str, Any]], name: str, deep_field: str
) -> None:
    """No $ref/anyOf/title/null types; every node typed unless int-or-string or preserve-unknown."""
    schema = openapi_schema(crds[name])
    visited = {path for path, _ in schema_nodes(schema)}
    assert deep_field in visited, "the walker did not reach the nested fields"
    assert structural_violations(schema) == []


def test_structural_check_catches_pydantic_raw_schema() -> None:
    """The checker above is not vacuous: pydantic's own JSON schemas ($ref, anyOf, title) fail it."""
    spec_problems = structural_violations(api.DynamoGraphSpec.model_json_schema(by_alias=True))
    assert any("'title'" in p for p in spec_problems)
    assert any("'$ref'" in p for p in spec_problems)
    model_problems = structural_violations(api.ModelSpec.model_json_schema(by_alias=True))
    assert any(p.startswith(".servedName: has 'anyOf'") for p in model_problems)


def test_optional_fields_become_plain_typed_fields(graph_schema: dict[str, Any]) -> None:
    """`str | None` becomes a string field that may be absent; optional sub-models keep their properties."""
    served_name = node_at(graph_schema, "spec.model.servedName")
    assert served_name["type"] == "string"
    assert served_name["minLength"] == 1

    sla = node_at(graph_schema, "spec.planner.sla")
    assert sla["type"] == "object"
    assert set(sla["required"]) == {"ttftMs", "itlMs"}
    ttft = node_at(graph_schema, "spec.planner.sla.ttftMs")  # gt=0 in pydantic
    assert (ttft["type"], ttft["minimum"], ttft["exclusiveMinimum"]) == ("number", 0, True)


def test_quantities_are_int_or_string(graph_schema: dict[str, Any]) -> None:
    requests = node_at(graph_schema, "spec.components.decode.resources.requests")
    assert requests["type"] == "object"
    assert requests["additionalProperties"] == {"x-kubernetes-int-or-string": True}


def test_pass_through_fields_preserve_unknown_fields(graph_schema: dict[str, Any]) -> None:
    """Embedded core/v1 structures (affinity, tolerations, volumes) are kept, not pruned."""
    for field in ("affinity", "tolerations", "volumes", "volumeMounts"):
        node = node_at(graph_schema, f"spec.podTemplate.{field}")
        preserved = node.get("x-kubernetes-preserve-unknown-fields") or node.get("items", {}).get(
            "x-kubernetes-preserve-unknown-fields"
        )
        assert preserved, field


def test_camel_case_wire_names(graph_schema: dict[str, Any]) -> None:
    """Properties use the camelCase aliases, never the Python names."""
    spec = node_at(graph_schema, "spec")
    assert "podTemplate" in spec["properties"] and "pod_template" not in spec["properties"]
    assert set(node_at(graph_schema, "spec.components.decode.scaling")["properties"]) == {"min", "max"}
    assert "intervalSeconds" in node_at(graph_schema, "spec.planner")["properties"]


def test_defaulted_sub_objects_carry_their_defaults(graph_schema: dict[str, Any]) -> None:
    """Always-present sub-objects spell out their defaults so CEL rules see the fields."""
    assert node_at(graph_schema, "spec.components.decode.scaling")["default"] == {"min": 1, "max": 8}
    assert node_at(graph_schema, "spec.components.decode.parallelism")["default"] == {
        "tensor": 1,
        "pipeline": 1,
    }
    assert node_at(graph_schema, "spec.components.frontend")["default"] == {
        "replicas": 1,
        "router": {"policy": "prefix-aware"},
        "drainSeconds": 120,
        "holdQueue": 256,
    }
    assert node_at(graph_schema, "spec.planner")["default"]["mode"] == "off"
    assert node_at(graph_schema, "spec.rollout")["default"] == {"progressDeadlineSeconds": 600}


def test_several_non_null_branches_are_refused() -> None:
    """A union the apiserver cannot express is an error, not a silently wrong schema."""

    class Ambiguous(BaseModel):
        value: int | str

    with pytest.raises(ValueError, match="anyOf"):
        crdgen.structural_schema(Ambiguous)


# -- CEL validation rules ----------------------------------------------------------------------------


def test_cel_prefill_decode_or_aggregated(graph_schema: dict[str, Any]) -> None:
    rules = cel_rules(node_at(graph_schema, "spec.components"))
    assert any(
        all(
            term in rule
            for term in (
                "has(self.prefill)",
                "has(self.decode)",
                "!has(self.aggregated)",
                "!has(self.prefill)",
                "!has(self.decode)",
            )
        )
        for rule in rules
    ), rules


@pytest.mark.parametrize("worker", api.WORKER_COMPONENTS)
def test_cel_replicas_within_scaling_bounds(graph_schema: dict[str, Any], worker: str) -> None:
    rules = cel_rules(node_at(graph_schema, f"spec.components.{worker}"))
    assert "self.replicas >= self.scaling.min && self.replicas <= self.scaling.max" in rules


@pytest.mark.parametrize("worker", api.WORKER_COMPONENTS)
def test_cel_gpus_times_nodes_equal_tensor_times_pipeline(graph_schema: dict[str, Any], worker: str) -> None:
    rules = cel_rules(node_at(graph_schema, f"spec.components.{worker}"))
    assert "self.parallelism.tensor * self.parallelism.pipeline == self.gpus * self.nodes" in rules


def test_cel_multinode_graph_names_leave_room_for_group_statefulsets(graph_schema: dict[str, Any]) -> None:
    """28 = 52 - len("-aggregated-<8-hex generation>-999"): a group's worker StatefulSet name must
    leave its pods' controller-revision-hash label within 63 characters."""
    assert api.MAX_MULTINODE_GRAPH_NAME_LENGTH == 28
    (rule,) = [r for r in cel_rules(graph_schema) if "nodes > 1" in r]
    for worker in api.WORKER_COMPONENTS:
        assert f"self.spec.components.{worker}.nodes > 1" in rule
    assert "self.metadata.name.size() <= 28" in rule


def test_cel_scaling_min_not_above_max(graph_schema: dict[str, Any]) -> None:
    assert "self.min <= self.max" in cel_rules(node_at(graph_schema, "spec.components.decode.scaling"))


def test_cel_graph_name_at_most_52_characters(graph_schema: dict[str, Any]) -> None:
    """52 = 63 - len("-aggregated"): the longest child name must still be a DNS label."""
    assert api.MAX_GRAPH_NAME_LENGTH == 52
    assert "self.metadata.name.size() <= 52" in cel_rules(graph_schema)


def test_cel_planner_sla_required_unless_off(graph_schema: dict[str, Any]) -> None:
    rules = cel_rules(node_at(graph_schema, "spec.planner"))
    assert "self.mode == 'off' || has(self.sla)" in rules


def test_cel_engine_image_required_unless_simulator(graph_schema: dict[str, Any]) -> None:
    rules = cel_rules(node_at(graph_schema, "spec"))
    assert "self.engine.framework == 'simulator' || has(self.engine.image)" in rules


def test_cel_profile_required_when_a_real_engine_is_planned(graph_schema: dict[str, Any]) -> None:
    rules = cel_rules(node_at(graph_schema, "spec"))
    assert ("self.planner.mode == 'off' || self.engine.framework == 'simulator' || has(self.planner.profileRef)"
            in rules)


def test_cel_gpu_budget_covers_every_pools_minimum(graph_schema: dict[str, Any]) -> None:
    """Every pod of a multinode replica holds GPUs: a pool's minimum is scaling.min × gpus × nodes."""
    (rule,) = [r for r in cel_rules(node_at(graph_schema, "spec")) if "gpuBudget" in r]
    assert rule.startswith("!has(self.planner.gpuBudget) || self.planner.gpuBudget >= ")
    for pool in api.WORKER_COMPONENTS:
        assert (f"(has(self.components.{pool}) ? self.components.{pool}.scaling.min * self.components.{pool}.gpus"
                f" * self.components.{pool}.nodes : 0)") in rule


def test_every_cel_rule_has_a_message(crds: dict[str, dict[str, Any]]) -> None:
    for name, crd in crds.items():
        for path, node in schema_nodes(openapi_schema(crd)):
            for validation in node.get("x-kubernetes-validations", []):
                assert validation.get("message"), f"{name} {path}: {validation['rule']}"


def test_component_graph_and_component_are_immutable(component_crd: dict[str, Any]) -> None:
    rules = cel_rules(node_at(openapi_schema(component_crd), "spec"))
    assert "self.graph == oldSelf.graph" in rules
    assert "self.component == oldSelf.component" in rules


# -- subresources and printer columns ----------------------------------------------------------------


def test_component_crd_has_scale_subresource(component_crd: dict[str, Any]) -> None:
    """`kubectl scale`, HPAs and the planner scale a DynamoGraphComponent through /scale."""
    (version,) = component_crd["spec"]["versions"]
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    assert "status" in version["subresources"]
    schema = openapi_schema(component_crd)
    assert node_at(schema, "spec.replicas")["type"] == "integer"
    assert node_at(schema, "status.replicas")["type"] == "integer"
    assert node_at(schema, "status.selector")["type"] == "string"


def test_graph_crd_has_status_subresource_but_no_scale(crds: dict[str, dict[str, Any]]) -> None:
    (version,) = crds[GRAPH_CRD_FILE]["spec"]["versions"]
    assert version["subresources"] == {"status": {}}


def test_graph_printer_columns(crds: dict[str, dict[str, Any]]) -> None:
    """`kubectl get dg` shows readiness and per-component summaries by default."""
    (version,) = crds[GRAPH_CRD_FILE]["spec"]["versions"]
    columns = {column["name"]: column for column in version["additionalPrinterColumns"]}
    for name in ("Ready", "Frontend", "Prefill", "Decode", "Age"):
        assert name in columns, f"missing printer column {name}"
        assert columns[name].get("priority", 0) == 0, f"{name} should show without -o wide"
    assert columns["Ready"]["jsonPath"] == '.status.conditions[?(@.type=="Ready")].status'
    assert columns["Decode"]["jsonPath"] == ".status.components.decode.summary"
    assert columns["Age"] == {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}


def test_crd_names_and_group(crds: dict[str, dict[str, Any]]) -> None:
    graph, component = crds[GRAPH_CRD_FILE], crds[COMPONENT_CRD_FILE]
    assert graph["metadata"]["name"] == "dynamographs.fleetpilot.dev"
    assert component["metadata"]["name"] == "dynamographcomponents.fleetpilot.dev"
    assert graph["spec"]["names"]["kind"] == api.GRAPH_KIND
    assert component["spec"]["names"]["kind"] == api.COMPONENT_KIND
    for crd in (graph, component):
        assert crd["spec"]["group"] == api.GROUP
        assert crd["spec"]["scope"] == "Namespaced"
        (version,) = crd["spec"]["versions"]
        assert version["name"] == api.VERSION and version["served"] and version["storage"]


def test_yaml_dump_writes_no_anchors(crds: dict[str, dict[str, Any]]) -> None:
    """Repeated sub-schemas (prefill/decode/aggregated) are written out, never as YAML aliases."""
    text = yamlio.dump(crds[GRAPH_CRD_FILE])
    assert "&id" not in text and "*id" not in text
