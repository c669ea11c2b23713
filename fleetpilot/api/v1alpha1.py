"""The fleetpilot.dev/v1alpha1 API: DynamoGraph (the user's object) and DynamoGraphComponent.

These pydantic models are the one definition of the API. The CRDs in ``crds/`` are generated from
them (``fleetpilot.api.crdgen``), so the rules the apiserver enforces (schema, defaults, CEL) and
the rules the operator parses with are the same text. Python attribute names are snake_case; the
wire names are the camelCase aliases Kubernetes users expect.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, field_validator
from pydantic.alias_generators import to_camel

GROUP = "fleetpilot.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

GRAPH_KIND = "DynamoGraph"
GRAPH_PLURAL = "dynamographs"
COMPONENT_KIND = "DynamoGraphComponent"
COMPONENT_PLURAL = "dynamographcomponents"

Framework = Literal["vllm", "sglang", "trtllm", "simulator"]
ComponentName = Literal["frontend", "prefill", "decode", "aggregated"]
WorkerName = Literal["prefill", "decode", "aggregated"]
WORKER_COMPONENTS: tuple[WorkerName, ...] = ("prefill", "decode", "aggregated")
ALL_COMPONENTS: tuple[ComponentName, ...] = ("frontend", *WORKER_COMPONENTS)

# Child objects are named "<graph>-<component>" and Services must be DNS-1035 labels (63 chars).
MAX_GRAPH_NAME_LENGTH = 63 - len("-aggregated")
DNS1035_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
# A multinode group's workers are a StatefulSet named "<graph>-<component>-<generation>-<group index>"
# (index < 1000); a StatefulSet's name must leave room for its pods' controller-revision-hash label
# ("<name>-<10 characters>", a label value of at most 63): 52 characters.
MAX_STATEFULSET_NAME_LENGTH = 52
MAX_MULTINODE_GRAPH_NAME_LENGTH = MAX_STATEFULSET_NAME_LENGTH - len("-aggregated-12345678-999")
#: A Kubernetes label key: an optional DNS-subdomain prefix and "/", then a name of at most 63 characters.
LABEL_KEY = (r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
             r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def _preserve_unknown(description: str) -> Any:
    """A field holding an embedded Kubernetes structure we pass through without modelling it."""
    return Field(
        default=None,
        description=description,
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )


def _cel(*rules: tuple[str, str] | tuple[str, str, str]) -> dict[str, Any]:
    """CEL rules (expression, message[, field]) for a model's ``x-kubernetes-validations``. `field`, a
    path below the model (".engine.image"), is where the apiserver reports a broken rule: the error
    then begins with the field it names (`spec.engine.image: Invalid value: ...`), not the object."""
    out = []
    for rule, message, *field in rules:
        out.append({"rule": rule, "message": message, **({"fieldPath": field[0]} if field else {})})
    return {"x-kubernetes-validations": out}


def _defaulted(factory: type[BaseModel]) -> Any:
    """A sub-object that is always present. The apiserver checks a default against the CEL rules
    as written, before nested defaults apply, so the default spells out every defaulted field."""
    written = factory().model_dump(by_alias=True, exclude_none=True)
    default = {k: v for k, v in written.items() if v not in ({}, [])}
    return Field(default_factory=factory, json_schema_extra={"default": default})


# A Kubernetes resource quantity: "500m", "16Gi" or a bare integer.
Quantity = Annotated[int | str, WithJsonSchema({"x-kubernetes-int-or-string": True})]


class ApiModel(BaseModel):
    """Base for every API struct: camelCase on the wire, unknown fields rejected."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class ModelSpec(ApiModel):
    """The model the graph serves."""

    name: str = Field(min_length=1, description="Model to load, e.g. meta-llama/Llama-3.1-8B-Instruct.")
    served_name: str | None = Field(
        default=None, min_length=1, description="Name clients use in the OpenAI API; defaults to name."
    )


# Names that say a variable holds a credential (HF_TOKEN, NGC_API_KEY, AWS_SECRET_ACCESS_KEY, ...): such a
# variable comes from a Secret. A literal value would be copied into every Deployment and pod spec, where
# anyone who may read those (far more people than may read Secrets) reads it too.
CREDENTIAL_ENV_NAME = r"(?i)^(.*_)?(TOKEN|API_KEY|APIKEY|SECRET|SECRET_KEY|ACCESS_KEY|PASSWORD|CREDENTIALS)$"


class EnvVar(ApiModel):
    """An environment variable for the engine container (the core/v1 EnvVar shape)."""

    model_config = ConfigDict(json_schema_extra=_cel(
        ("!(has(self.value) && has(self.valueFrom))", "set value or valueFrom, not both", ".valueFrom"),
        (f"!(has(self.value) && self.value != '' && self.name.matches('{CREDENTIAL_ENV_NAME}'))",
         ("this name holds a credential: take it from a Secret with valueFrom.secretKeyRef "
          "({name: <secret>, key: <key>}) instead of a literal value, which every Deployment would carry "
          "in clear"), ".value"),
    ))

    name: str = Field(pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$", max_length=128, description="Variable name.")
    value: str | None = None
    value_from: dict[str, Any] | None = _preserve_unknown("A core/v1 EnvVarSource.")


class EngineSpec(ApiModel):
    """Which inference engine the workers run, and with what image and extra flags."""

    framework: Framework = Field(description="vllm, sglang, trtllm, or simulator (no GPU needed).")
    image: str | None = Field(
        default=None, min_length=1, description="Engine image; the simulator defaults to fleetpilot's own."
    )
    args: list[str] = Field(default_factory=list, description="Extra engine flags for every worker.")
    env: list[EnvVar] = Field(default_factory=list, max_length=64, description="Extra environment for every worker.")


class Parallelism(ApiModel):
    """How one replica's model is split across its GPUs."""

    tensor: int = Field(default=1, ge=1, le=64, description="Tensor-parallel size.")
    pipeline: int = Field(default=1, ge=1, le=64, description="Pipeline-parallel size.")


class ScalingBounds(ApiModel):
    """The replica range the planner, an HPA or `kubectl scale` may choose from."""

    model_config = ConfigDict(json_schema_extra=_cel(("self.min <= self.max", "scaling.min must not exceed scaling.max", ".min")))

    min_replicas: int = Field(default=1, ge=0, le=1000, alias="min", description="Fewest replicas.")
    max_replicas: int = Field(default=8, ge=1, le=1000, alias="max", description="Most replicas.")


class ResourceRequirements(ApiModel):
    """CPU and memory for a container; GPUs come from `gpus`."""

    requests: dict[str, Quantity] = Field(default_factory=dict)
    limits: dict[str, Quantity] = Field(default_factory=dict)


class RouterSpec(ApiModel):
    """How the frontend picks a worker for each request."""

    policy: Literal["round-robin", "least-loaded", "prefix-aware"] = Field(
        default="prefix-aware", description="round-robin, least-loaded, or prefix-aware (KV-block hashes)."
    )


#: Seconds a pod may take to finish what it serves before it goes (the default of `drainSeconds`).
DEFAULT_DRAIN_SECONDS = 120
#: How long a frontend holds a request for a worker when a pool may scale to zero and none is ready.
DEFAULT_HOLD_SECONDS = 300


def _drain_seconds() -> Any:
    return Field(
        default=DEFAULT_DRAIN_SECONDS, ge=0, le=3600,
        description=("Seconds a pod that is going away (scale-down, rollout, node drain) may take to finish the "
                     "requests it serves — prefills, KV transfers, decode streams — after it stopped getting new "
                     "ones; its terminationGracePeriodSeconds. Longer than the longest generation you serve."),
    )


#: The most frontend replicas a graph runs: its `replicas` field's limit, and the bound its
#: DynamoGraphComponent enforces on `kubectl scale` and on an HPA.
FRONTEND_MAX_REPLICAS = 100


#: A DNS-1123 subdomain: the names of Secrets and most other objects.
DNS1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


class SecretRef(ApiModel):
    """A Secret in the graph's namespace."""

    name: str = Field(min_length=1, max_length=253, pattern=DNS1123_SUBDOMAIN, description="The Secret's name.")


class FrontendAuthSpec(ApiModel):
    """Who may send the frontend requests: API keys, checked before anything else sees a request."""

    api_key_secret_ref: SecretRef = Field(
        description=("A Secret in the graph's namespace whose every data value is one valid API key (the data "
                     "keys only name them). Clients send one as `Authorization: Bearer <key>`; without a valid one "
                     "they get OpenAI's 401 (invalid_api_key). The frontend watches the Secret, so an edit takes "
                     "effect within seconds without a restart: to rotate, add the new key, move the clients, remove "
                     "the old one. While the Secret is missing or empty every request is refused. /health, /ready "
                     "and /metrics need no key."),
    )
    max_in_flight_per_key: int | None = Field(
        default=None, ge=1, le=100_000,
        description=("Most requests in flight at once per API key and frontend replica; one more gets 429 with "
                     "Retry-After. Unset: no limit."),
    )


class FrontendSpec(ApiModel):
    """The OpenAI-compatible router in front of the workers."""

    replicas: int = Field(default=1, ge=1, le=FRONTEND_MAX_REPLICAS, description="Initial frontend replicas.")
    router: RouterSpec = _defaulted(RouterSpec)
    resources: ResourceRequirements | None = None
    drain_seconds: int = _drain_seconds()
    hold_seconds: int | None = Field(
        default=None, ge=0, le=3600,
        description=("How long a request waits in the frontend for a worker when none is ready (a pool scaled to "
                     "zero and starting, a rollout's gap), then 503 with Retry-After. Default: "
                     f"{DEFAULT_HOLD_SECONDS} when a worker pool may scale to zero (scaling.min 0), else 0 "
                     "(503 at once)."),
    )
    hold_queue: int = Field(
        default=256, ge=1, le=100_000,
        description="Most requests held at once per frontend; one more gets 503 with Retry-After at once.",
    )
    auth: FrontendAuthSpec | None = Field(
        default=None, description="API keys the frontend requires. Unset: it serves any request.")


class WorkerSpec(ApiModel):
    """A pool of engine workers: prefill, decode, or aggregated (both in one)."""

    model_config = ConfigDict(
        json_schema_extra=_cel(
            (
                "self.replicas >= self.scaling.min && self.replicas <= self.scaling.max",
                "replicas must lie within scaling.min and scaling.max",
                ".replicas",
            ),
            (
                "self.parallelism.tensor * self.parallelism.pipeline == self.gpus * self.nodes",
                ("gpus × nodes must equal parallelism.tensor × parallelism.pipeline (the GPUs one replica's engine "
                 "uses: gpus on each of its nodes pods)"),
            ),
        )
    )

    replicas: int = Field(
        default=1,
        ge=0,
        le=1000,
        description="Initial replicas only: afterwards the DynamoGraphComponent's spec.replicas is the truth.",
    )
    gpus: int = Field(default=1, ge=1, le=64,
                      description="nvidia.com/gpu per pod: a replica of `nodes` pods uses gpus × nodes.")
    nodes: int = Field(
        default=1, ge=1, le=64,
        description=("Pods in one replica, each on its own GPU node: a leader, which serves, and nodes − 1 workers "
                     "holding the rest of its tensor and pipeline ranks. Such a replica is a group, started, placed "
                     "(spec.placement), scaled, healed and updated as one: replicas and /scale count groups."),
    )
    parallelism: Parallelism = _defaulted(Parallelism)
    scaling: ScalingBounds = _defaulted(ScalingBounds)
    args: list[str] = Field(default_factory=list, description="Extra engine flags for this component.")
    resources: ResourceRequirements | None = None
    drain_seconds: int = _drain_seconds()

    def gpus_per_replica(self) -> int:
        """The GPUs one replica holds: every pod of its group."""
        return self.gpus * self.nodes


class ComponentsSpec(ApiModel):
    """The graph's components: a frontend, and prefill + decode pools or one aggregated pool."""

    model_config = ConfigDict(
        json_schema_extra=_cel(
            (
                (
                    "(has(self.prefill) && has(self.decode) && !has(self.aggregated))"
                    " || (!has(self.prefill) && !has(self.decode) && has(self.aggregated))"
                ),
                "set prefill and decode (disaggregated) or aggregated alone, not both and not neither",
            )
        )
    )

    frontend: FrontendSpec = _defaulted(FrontendSpec)
    prefill: WorkerSpec | None = None
    decode: WorkerSpec | None = None
    aggregated: WorkerSpec | None = None

    def workers(self) -> dict[WorkerName, WorkerSpec]:
        """The worker pools present, in a stable order."""
        pools: dict[WorkerName, WorkerSpec | None] = {
            "prefill": self.prefill, "decode": self.decode, "aggregated": self.aggregated}
        return {name: spec for name, spec in pools.items() if spec is not None}

    def multinode(self) -> bool:
        """Whether some worker pool's replicas span several nodes (groups of pods)."""
        return any(worker.nodes > 1 for worker in self.workers().values())

    def may_scale_to_zero(self) -> bool:
        """Whether some worker pool may have no replica at all (its scaling.min is 0)."""
        return any(worker.scaling.min_replicas == 0 for worker in self.workers().values())

    def hold_seconds(self) -> int:
        """How long the frontend holds a request for a worker: the spec's, or its default."""
        if self.frontend.hold_seconds is not None:
            return self.frontend.hold_seconds
        return DEFAULT_HOLD_SECONDS if self.may_scale_to_zero() else 0


class PodTemplateOverrides(ApiModel):
    """Pod-level settings merged into every pod the graph runs."""

    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict[str, Any]] | None = _preserve_unknown("core/v1 Tolerations.")
    affinity: dict[str, Any] | None = _preserve_unknown("A core/v1 Affinity.")
    priority_class_name: str | None = None
    service_account_name: str | None = None
    image_pull_secrets: list[str] = Field(default_factory=list, description="Secret names.")
    labels: dict[str, str] = Field(default_factory=dict, description="Extra pod labels.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Extra pod annotations.")
    volumes: list[dict[str, Any]] | None = _preserve_unknown("core/v1 Volumes added to every pod.")
    volume_mounts: list[dict[str, Any]] | None = _preserve_unknown("core/v1 VolumeMounts for the engine.")


class SlaTarget(ApiModel):
    """Latency targets the planner keeps, at a percentile."""

    ttft_ms: float = Field(gt=0, description="Time to first token target, milliseconds.")
    itl_ms: float = Field(gt=0, description="Inter-token latency target, milliseconds.")
    percentile: float = Field(default=90, ge=50, lt=100, description="Percentile the targets apply to (50 to under 100).")


class ProfileRef(ApiModel):
    """Where the capacity profile for this model/engine/GPU lives."""

    config_map: str = Field(min_length=1)
    key: str = Field(default="profile.json", min_length=1)


class ProfileSettings(ApiModel):
    """How the planner holds the capacity profile against the running fleet."""

    model_config = ConfigDict(
        json_schema_extra=_cel(
            ("!has(self.driftThreshold) || (self.driftThreshold >= 0.05 && self.driftThreshold <= 1.0)",
             ("planner.profile.driftThreshold must lie from 0.05 to 1.0: the share by which measured TTFT or ITL may "
             "differ from the profile's before ProfileDrift is set, e.g. 0.2"), ".driftThreshold"),
        )
    )

    auto_correct: bool = Field(
        default=True,
        description=("Size with the speed factors and latency offsets the planner learns from the fleet (bounded; "
                     "exported as fleetpilot_planner_correction_factor and _latency_offset_seconds). false: size "
                     "from the profile as written; drift is still measured and reported."),
    )
    drift_threshold: float = Field(
        default=0.2,
        description=("How far measured TTFT or ITL may differ from what the profile predicts at the observed load "
                     "(a share: 0.2 is 20%), sustained over the planner's calibration window, before the graph's "
                     "ProfileDrift condition turns True."),
    )

    @field_validator("drift_threshold")
    @classmethod
    def _threshold_in_range(cls, threshold: float) -> float:
        if not 0.05 <= threshold <= 1.0:
            raise ValueError("planner.profile.driftThreshold must lie from 0.05 to 1.0: the share by which measured "
                             "TTFT or ITL may differ from the profile's before ProfileDrift is set, e.g. 0.2")
        return threshold


class PlannerSpec(ApiModel):
    """How the SLA planner treats this graph."""

    model_config = ConfigDict(
        json_schema_extra=_cel(
            ("self.mode == 'off' || has(self.sla)", "planner.sla is required when planner.mode is advisory or sla",
             ".sla"),
            # A CEL rule rather than minimum/maximum: the apiserver prints a fractional maximum as "0".
            ("!has(self.risk) || (self.risk >= 0.5 && self.risk <= 0.999)",
             ("planner.risk must lie from 0.5 to 0.999: the forecast quantile to provision for, e.g. 0.9 for the "
             "load exceeded one interval in ten"), ".risk"),
        )
    )

    mode: Literal["off", "advisory", "sla"] = Field(
        default="off", description="off, advisory (decide and report only), or sla (scale)."
    )
    sla: SlaTarget | None = None
    predictor: Literal["constant", "arima", "prophet", "kalman"] = "arima"
    interval_seconds: int = Field(default=60, ge=10, le=3600)
    risk: float = Field(
        default=0.9,
        description=("The forecast quantile the planner sizes for: at 0.9 it provisions for the load it expects "
                     "to be exceeded one interval in ten (0.99: one in a hundred, more GPUs). Calibrated online "
                     "against the load that came, so it means the same on any traffic."),
    )
    gpu_budget: int | None = Field(default=None, ge=1, description="Most GPUs the planner may use for this graph.")
    fast_path_seconds: int = Field(
        default=5, ge=0, le=300,
        description=("How often, between planning intervals, the planner looks at the engines' queues and adds "
                     "replicas where a burst no forecast saw would break the SLA (only up; never below the last "
                     "plan). 0 turns the fast path off: only the interval's forecast scales."),
    )

    @field_validator("risk")
    @classmethod
    def _risk_in_range(cls, risk: float) -> float:
        if not 0.5 <= risk <= 0.999:
            raise ValueError("planner.risk must lie from 0.5 to 0.999: the forecast quantile to provision for, "
                             "e.g. 0.9 for the load exceeded one interval in ten")
        return risk
    budget: str | None = Field(
        default=None, pattern=DNS1035_LABEL, max_length=63,
        description="A GPU budget shared with other graphs naming it; its size is the planner's --gpu-budget.",
    )
    priority: int = Field(default=0, ge=-1000, le=1000,
                          description="Within a shared budget, higher priority is served first.")
    profile_ref: ProfileRef | None = None
    idle_seconds: int = Field(
        default=300, ge=10, le=86_400,
        description=("Scale to zero: after no request for this long, the planner (mode sla) scales the worker pools "
                     "whose scaling.min is 0 to no replica; the frontend stays, holds the next request and wakes "
                     "the planner, which starts them again."),
    )
    profile: ProfileSettings | None = Field(
        default=None, description="How the planner treats the profile's drift from the fleet (defaults when absent).")


class RolloutSpec(ApiModel):
    """How a new generation of the workers replaces the old one."""

    progress_deadline_seconds: int = Field(
        default=600, ge=30, le=86_400,
        description=("A new generation that makes no progress (no new replica Ready) for this long stalls the "
                     "rollout: the old generation keeps serving and the graph says Degraded=RolloutStalled. A "
                     "crash-looping or unpullable new generation stalls at once."),
    )


#: How long a multinode group may hold some of its nodes' GPUs while others cannot be placed.
DEFAULT_GROUP_SCHEDULING_TIMEOUT_SECONDS = 300


class PlacementSpec(ApiModel):
    """Where the pods of a multinode replica go: each on its own node, all in one topology domain."""

    topology_key: str | None = Field(
        default=None, max_length=316, pattern=LABEL_KEY,
        description=("A node label naming a topology domain (a rack, an NVLink domain), e.g. "
                     "topology.kubernetes.io/zone or example.com/rack: every pod of a multinode replica runs on a "
                     "node with the leader's value of it (required affinity). Unset: anywhere, one pod per node."),
    )
    group_scheduling_timeout_seconds: int = Field(
        default=DEFAULT_GROUP_SCHEDULING_TIMEOUT_SECONDS, ge=5, le=3600,
        description=("A multinode replica partly placed for this long (some pods hold GPUs, others cannot be "
                     "scheduled) is reported (Degraded=GroupUnschedulable) and its pods are released, so that "
                     "their GPUs do not deadlock other groups; it is tried again after about as long. Kubernetes "
                     "1.30 has no gang scheduling: this is the stand-in."),
    )


class LabelSelectorRequirement(ApiModel):
    """One expression of a label selector (the meta/v1 LabelSelectorRequirement shape)."""

    model_config = ConfigDict(json_schema_extra=_cel(
        (("self.operator in ['In', 'NotIn'] ? has(self.values) && size(self.values) > 0"
          " : !has(self.values) || size(self.values) == 0"),
         "values must be non-empty with operator In or NotIn, and empty with Exists or DoesNotExist", ".values"),
    ))

    key: str = Field(min_length=1, max_length=316, pattern=LABEL_KEY, description="The label key.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[Annotated[str, Field(max_length=63)]] = Field(default_factory=list, max_length=64)


class LabelSelector(ApiModel):
    """A meta/v1 LabelSelector; empty (`{}`), it selects everything."""

    match_labels: dict[str, str] = Field(default_factory=dict, max_length=32)
    match_expressions: list[LabelSelectorRequirement] = Field(default_factory=list, max_length=16)


class NetworkPeer(ApiModel):
    """Pods the frontend admits, selected as a NetworkPolicyPeer selects them."""

    model_config = ConfigDict(json_schema_extra=_cel(
        ("has(self.namespaceSelector) || has(self.podSelector)", "set namespaceSelector, podSelector or both"),
    ))

    namespace_selector: LabelSelector | None = Field(
        default=None, description=("Namespaces: alone, every pod in them; with podSelector, those pods in them. "
                                   "{} is every namespace."))
    pod_selector: LabelSelector | None = Field(
        default=None, description="Pods: alone, those in the graph's own namespace; {} is every pod.")


class NetworkSpec(ApiModel):
    """Who may reach the graph's pods: the NetworkPolicies the operator renders (a CNI must enforce them)."""

    policy: Literal["default", "none"] = Field(
        default="default",
        description=("default: an ingress NetworkPolicy per component. Workers admit their graph's frontend, its "
                     "other workers (KV transfers, a multinode group's ranks) and the operator's monitoring "
                     "namespace; the frontend admits frontendFrom, fleetpilot's operator and planner and the "
                     "monitoring namespace. none: no NetworkPolicy (those the operator made are deleted)."),
    )
    frontend_from: list[NetworkPeer] = Field(
        default_factory=list, max_length=32,
        description=("Who may send the frontend requests (port 8000). Empty: every pod of every namespace, "
                     "rendered as `namespaceSelector: {}`."),
    )


# The GPUs a graph's worker pools need at their scaling.min, in CEL over DynamoGraphSpec (scaling, gpus
# and nodes are defaulted, so present on every stored pool; a replica holds gpus × nodes).
_MIN_GPUS_CEL = " + ".join(
    f"(has(self.components.{pool}) ? self.components.{pool}.scaling.min * self.components.{pool}.gpus"
    f" * self.components.{pool}.nodes : 0)"
    for pool in WORKER_COMPONENTS)


class DynamoGraphSpec(ApiModel):
    """What the user wants served, and how."""

    model_config = ConfigDict(
        json_schema_extra=_cel(
            ("self.engine.framework == 'simulator' || has(self.engine.image)",
             "engine.image is required unless engine.framework is simulator", ".engine.image"),
            # Only the simulator's capacity is known without a profile: any other engine would be
            # accepted and then never planned (PlannerActive=False NoProfile).
            ("self.planner.mode == 'off' || self.engine.framework == 'simulator' || has(self.planner.profileRef)",
             ("planner.profileRef is required when planner.mode is advisory or sla and engine.framework is not "
              "simulator: point it at a ConfigMap holding the engine's capacity profile, or set planner.mode: off"),
             ".planner.profileRef"),
            (f"!has(self.planner.gpuBudget) || self.planner.gpuBudget >= {_MIN_GPUS_CEL}",
             ("planner.gpuBudget must cover the worker pools' minimums (scaling.min × gpus × nodes, summed): raise "
              "gpuBudget or lower scaling.min"), ".planner.gpuBudget"),
            (
                "self.engine.framework != 'trtllm' || "
                + " && ".join(f"(!has(self.components.{w}) || self.components.{w}.nodes == 1)" for w in WORKER_COMPONENTS),
                ("nodes must be 1 with engine.framework trtllm: TensorRT-LLM's multinode launch (mpirun over SSH "
                 "between a group's pods) is not rendered by fleetpilot; use vllm or sglang for multinode replicas"),
                ".engine.framework",
            ),
        )
    )

    model: ModelSpec
    engine: EngineSpec
    components: ComponentsSpec
    pod_template: PodTemplateOverrides = _defaulted(PodTemplateOverrides)
    planner: PlannerSpec = _defaulted(PlannerSpec)
    rollout: RolloutSpec = _defaulted(RolloutSpec)
    placement: PlacementSpec = _defaulted(PlacementSpec)
    network: NetworkSpec = _defaulted(NetworkSpec)

    def decode_batch_cap(self) -> int | None:
        """The most sequences one decode replica runs at once, as its engine flags set it (engine.args,
        then the decode component's, the last one winning as in the engine's own parser); the
        simulator's default when it is not set; None where the engine's default is not known (vLLM's
        depends on its version and the GPU) or the graph has no decode pool."""
        decode = self.components.decode
        if decode is None:
            return None
        flags = _BATCH_CAP_FLAGS[self.engine.framework]
        found: int | None = None
        args = [*self.engine.args, *decode.args]
        for i, arg in enumerate(args):
            name, equals, value = arg.partition("=")
            if name not in flags:
                continue
            text = value if equals else (args[i + 1] if i + 1 < len(args) else "")
            found = int(text) if text.isdigit() and int(text) > 0 else found
        if found is not None:
            return found
        return SIMULATOR_MAX_NUM_SEQS if self.engine.framework == "simulator" else None


# Each engine's flag for its running-batch cap (vLLM's and the simulator's max_num_seqs, SGLang's
# max_running_requests, TensorRT-LLM's max_batch_size), in the spellings its CLI accepts.
_BATCH_CAP_FLAGS: dict[str, tuple[str, ...]] = {
    "vllm": ("--max-num-seqs", "--max_num_seqs"),
    "simulator": ("--max-num-seqs",),
    "sglang": ("--max-running-requests", "--max_running_requests"),
    "trtllm": ("--max_batch_size", "--max-batch-size"),
}
SIMULATOR_MAX_NUM_SEQS = 256  # fleetpilot-sim worker's --max-num-seqs default


class Condition(ApiModel):
    """A Kubernetes-style condition (metav1.Condition)."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""
    last_transition_time: str | None = None
    observed_generation: int | None = None


class ComponentStatus(ApiModel):
    """Replica counts for one component, as the workload reports them."""

    desired: int = 0
    ready: int = 0
    updated: int = 0
    summary: str = Field(default="0/0", description="ready/desired, for kubectl get.")
    message: str | None = None
    nodes: int | None = Field(default=None, description="Pods per replica of a multinode component (replicas are groups).")


class GenerationStatus(ApiModel):
    """One generation of the graph's workers: its replicas per component."""

    name: str = Field(description="The generation: a hash of the engine, image, model and arguments it runs.")
    components: dict[str, ComponentStatus] = Field(default_factory=dict)


class RolloutStatus(ApiModel):
    """Where the workers stand between generations."""

    target: str = Field(description="The generation the spec asks for.")
    phase: Literal["Complete", "Progressing", "Stalled"] = "Complete"
    message: str = ""
    reason: str | None = Field(default=None, description="Why the rollout stalled.")
    generations: list[GenerationStatus] = Field(default_factory=list, description="Newest (the target) first.")


class DynamoGraphStatus(ApiModel):
    """What the operator (and planner) observed; never written by users."""

    observed_generation: int | None = None
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    components: dict[str, ComponentStatus] = Field(default_factory=dict)
    endpoint: str | None = None
    planner: dict[str, Any] | None = _preserve_unknown("The planner's last decision and why.")
    rollout: RolloutStatus | None = None


class DynamoGraphComponentSpec(ApiModel):
    """One scalable component of a graph; `spec.replicas` is the single source of truth for its size."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    # Checked only when replicas change, so tightening the graph's bounds never makes
                    # the object unwritable; the operator clamps what it runs instead.
                    "rule": "(oldSelf.hasValue() && oldSelf.value().replicas == self.replicas)"
                    " || ((!has(self.minReplicas) || self.replicas >= self.minReplicas)"
                    " && (!has(self.maxReplicas) || self.replicas <= self.maxReplicas))",
                    "message": "replicas must lie within minReplicas and maxReplicas"
                    " (the graph's scaling.min/max); change the DynamoGraph's scaling to go beyond",
                    "optionalOldSelf": True,
                    "fieldPath": ".replicas",
                },
                {"rule": "self.graph == oldSelf.graph", "message": "graph is immutable", "fieldPath": ".graph"},
                {"rule": "self.component == oldSelf.component", "message": "component is immutable",
                 "fieldPath": ".component"},
            ]
        }
    )

    graph: str = Field(min_length=1, description="The owning DynamoGraph.")
    component: ComponentName
    replicas: int = Field(ge=0, le=1000, description="Desired replicas: written by planner, HPA or kubectl scale.")
    min_replicas: int | None = Field(default=None, ge=0, description="From the graph's scaling.min.")
    max_replicas: int | None = Field(default=None, ge=0, description="From the graph's scaling.max.")


class DynamoGraphComponentStatus(ApiModel):
    """Observed size of the component, for /scale and kubectl."""

    replicas: int = 0
    ready_replicas: int = 0
    selector: str = Field(default="", description="Label selector of the component's pods (for /scale).")
    observed_generation: int | None = None
    nodes: int | None = Field(
        default=None, description="Pods per replica: a multinode replica is a group of this many; replicas count groups.")
    released_groups: dict[str, str] | None = Field(
        default=None,
        description=("Multinode groups released because they could not be placed whole, and when (RFC 3339); each "
                     "is tried again after about spec.placement.groupSchedulingTimeoutSeconds."),
    )


class ObjectMeta(ApiModel):
    """The metadata fields the operator reads; everything else passes through untouched."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    name: str
    namespace: str = "default"
    uid: str = ""
    generation: int = 0
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class DynamoGraph(ApiModel):
    """A DynamoGraph as read from the API."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    metadata: ObjectMeta
    spec: DynamoGraphSpec
    status: DynamoGraphStatus = Field(default_factory=DynamoGraphStatus)


class DynamoGraphComponent(ApiModel):
    """A DynamoGraphComponent as read from the API."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    metadata: ObjectMeta
    spec: DynamoGraphComponentSpec
    status: DynamoGraphComponentStatus = Field(default_factory=DynamoGraphComponentStatus)
