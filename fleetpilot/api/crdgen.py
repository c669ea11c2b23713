"""Generate the CustomResourceDefinitions in ``crds/`` from the pydantic API models.

Pydantic emits JSON Schema (draft 2020-12, with ``$ref`` and ``anyOf`` for optional fields);
Kubernetes wants a *structural* OpenAPI v3 schema: every node typed, no references, no
``anyOf`` for nullability, ``exclusiveMinimum`` as a boolean. ``structural_schema`` does that
translation; the CRD documents add printer columns and subresources. Pure functions, no I/O:
``fleetpilot crds`` writes the result and a test fails when ``crds/`` drifts from it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from fleetpilot.api import v1alpha1

_DROPPED_KEYS = {"title", "$defs"}


def structural_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of a model, as the apiserver accepts it."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return _translate(raw, raw.get("$defs", {}))


def _translate(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        # Keys beside the $ref (description, default) refine the referenced schema.
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _translate(merged, defs)

    if "anyOf" in node:
        branches = [b for b in node["anyOf"] if b.get("type") != "null"]
        outer = {k: v for k, v in node.items() if k != "anyOf"}
        if len(branches) == 1:
            # Optional[X]: in Kubernetes an absent field is the "none" value, not null.
            return _translate({**branches[0], **outer}, defs)
        raise ValueError(f"cannot express anyOf with several non-null branches in a CRD: {node}")

    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED_KEYS:
            continue
        if key == "default" and value is None:
            continue
        if key == "additionalProperties":
            if value is True or value == {}:
                out["x-kubernetes-preserve-unknown-fields"] = True  # dict[str, Any]
            elif value is not False and not node.get("x-kubernetes-preserve-unknown-fields"):
                out[key] = _translate(value, defs)
        elif key == "properties":
            out[key] = {name: _translate(sub, defs) for name, sub in value.items()}
        elif key == "items":
            out[key] = _translate(value, defs)
        elif key == "exclusiveMinimum":
            out["minimum"], out["exclusiveMinimum"] = value, True
        elif key == "exclusiveMaximum":
            out["maximum"], out["exclusiveMaximum"] = value, True
        elif key == "const":
            out["enum"] = [value]
        else:
            out[key] = value

    if out.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
    elif "enum" in out and "type" not in out:
        out["type"] = "string"
    elif "type" not in out and ("properties" in out or out.get("x-kubernetes-preserve-unknown-fields")):
        out["type"] = "object"
    if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
        out["x-kubernetes-preserve-unknown-fields"] = True
    return out


def _resource_schema(spec: type[BaseModel], status: type[BaseModel], *, status_default: dict[str, Any] | None = None,
                     **extra: Any) -> dict[str, Any]:
    status_schema = structural_schema(status)
    if status_default is not None:
        status_schema["default"] = status_default
    return {
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            # Only metadata.name may be constrained here; listed so root rules can name it as their field.
            "metadata": {"type": "object", "properties": {"name": {"type": "string"}}},
            "spec": structural_schema(spec),
            "status": status_schema,
        },
        **extra,
    }


def _crd(
    *,
    kind: str,
    plural: str,
    short_names: list[str],
    schema: dict[str, Any],
    columns: list[dict[str, Any]],
    subresources: dict[str, Any],
) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{v1alpha1.GROUP}",
            "labels": {"app.kubernetes.io/part-of": "fleetpilot"},
        },
        "spec": {
            "group": v1alpha1.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": short_names,
                "categories": ["fleetpilot"],
            },
            "versions": [
                {
                    "name": v1alpha1.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": subresources,
                    "additionalPrinterColumns": columns,
                }
            ],
        },
    }


def _column(name: str, json_path: str, type_: str = "string", priority: int = 0) -> dict[str, Any]:
    column: dict[str, Any] = {"name": name, "type": type_, "jsonPath": json_path}
    if priority:
        column["priority"] = priority
    return column


def dynamograph_crd() -> dict[str, Any]:
    name_rules = [
        {
            "rule": f"self.metadata.name.size() <= {v1alpha1.MAX_GRAPH_NAME_LENGTH}",
            "message": f"metadata.name must be at most {v1alpha1.MAX_GRAPH_NAME_LENGTH} characters"
            " so that child names like <name>-aggregated fit in 63",
            "fieldPath": ".metadata.name",
        },
        {
            "rule": " || ".join(f"(has(self.spec.components.{worker}) && self.spec.components.{worker}.nodes > 1)"
                                for worker in v1alpha1.WORKER_COMPONENTS)
            + f" ? self.metadata.name.size() <= {v1alpha1.MAX_MULTINODE_GRAPH_NAME_LENGTH} : true",
            "message": f"metadata.name must be at most {v1alpha1.MAX_MULTINODE_GRAPH_NAME_LENGTH} characters when a"
            " component spans nodes: its groups' StatefulSets are named"
            f" <name>-<component>-<generation>-<index>, at most {v1alpha1.MAX_STATEFULSET_NAME_LENGTH}",
            "fieldPath": ".metadata.name",
        },
        {
            "rule": f"self.metadata.name.matches('{v1alpha1.DNS1035_LABEL}')",
            "message": "metadata.name must be a DNS-1035 label (lower-case letters, digits and '-',"
            " starting with a letter) because it names Services",
            "fieldPath": ".metadata.name",
        },
    ]
    return _crd(
        kind=v1alpha1.GRAPH_KIND,
        plural=v1alpha1.GRAPH_PLURAL,
        short_names=["dg"],
        schema=_resource_schema(
            v1alpha1.DynamoGraphSpec, v1alpha1.DynamoGraphStatus,
            # The apiserver fills this default in whenever it serves a graph without status, so a graph
            # no operator has seen yet reads as observed at generation 0: kstatus (Flux, kpt) and Argo CD
            # call it InProgress rather than Current, by their generic observedGeneration rule.
            status_default={"observedGeneration": 0},
            **{"x-kubernetes-validations": name_rules},
        ),
        columns=[
            _column("Ready", '.status.conditions[?(@.type=="Ready")].status'),
            _column("Frontend", ".status.components.frontend.summary"),
            _column("Prefill", ".status.components.prefill.summary"),
            _column("Decode", ".status.components.decode.summary"),
            _column("Aggregated", ".status.components.aggregated.summary", priority=1),
            _column("Planner", ".status.planner.summary"),
            _column("Framework", ".spec.engine.framework", priority=1),
            _column("Reason", '.status.conditions[?(@.type=="Ready")].reason', priority=1),
            _column("Age", ".metadata.creationTimestamp", "date"),
        ],
        subresources={"status": {}},
    )


def dynamographcomponent_crd() -> dict[str, Any]:
    return _crd(
        kind=v1alpha1.COMPONENT_KIND,
        plural=v1alpha1.COMPONENT_PLURAL,
        short_names=["dgc"],
        schema=_resource_schema(v1alpha1.DynamoGraphComponentSpec, v1alpha1.DynamoGraphComponentStatus),
        columns=[
            _column("Graph", ".spec.graph"),
            _column("Component", ".spec.component"),
            _column("Desired", ".spec.replicas", "integer"),
            _column("Ready", ".status.readyReplicas", "integer"),
            _column("Nodes", ".status.nodes", "integer"),
            _column("Min", ".spec.minReplicas", "integer", priority=1),
            _column("Max", ".spec.maxReplicas", "integer", priority=1),
            _column("Age", ".metadata.creationTimestamp", "date"),
        ],
        subresources={
            "status": {},
            "scale": {
                "specReplicasPath": ".spec.replicas",
                "statusReplicasPath": ".status.replicas",
                "labelSelectorPath": ".status.selector",
            },
        },
    )


def all_crds() -> dict[str, dict[str, Any]]:
    """File name in ``crds/`` → CRD document."""
    return {
        f"{v1alpha1.GROUP}_{v1alpha1.GRAPH_PLURAL}.yaml": dynamograph_crd(),
        f"{v1alpha1.GROUP}_{v1alpha1.COMPONENT_PLURAL}.yaml": dynamographcomponent_crd(),
    }
