"""The Helm chart, the kustomize manifests, the dashboards and the alerts, checked without a cluster.

Real tools do the rendering: Helm (built by scripts/install-k8s.sh), kubectl's kustomize and
promtool (upstream's, built by scripts/install-prometheus.sh). A missing tool fails these tests; none is skipped. What is pinned:
the objects the chart renders by default and with other values, the Pod Security fields, the RBAC
verbs rule by rule, the monitoring objects only where the Prometheus Operator's API exists, the
chart's CRDs and the kustomize base against their sources (drift), kustomize against Helm, every
alert's promtool unit tests, and every metric name the dashboards and alerts query.

`promql_expressions()` lists every PromQL expression of the dashboards and the rules, with the
dashboard variables filled in, so a test against a live Prometheus can evaluate each one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import prometheus_client
import yaml
from gotools import go_tool

from fleetpilot import cli
from fleetpilot.api import contract
from fleetpilot.devcluster import cluster as devcluster
from fleetpilot.frontend import metrics as frontend_metrics
from fleetpilot.operator import metrics as operator_metrics
from fleetpilot.operator import render
from fleetpilot.planner import live as planner_live
from fleetpilot.sim import metrics as sim_metrics

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "fleetpilot"
MANIFESTS = REPO / "manifests"
RULES = CHART / "rules" / "fleetpilot.rules.yaml"
RULE_TESTS = sorted((CHART / "rules-tests").glob("*.test.yaml"))
DASHBOARDS = sorted((CHART / "dashboards").glob("*.json"))
RELEASE, NAMESPACE = "fleetpilot", "fleetpilot-system"
MONITORING = "monitoring.coreos.com/v1"

# The flags of Lease-based leader election (fleetpilot/leader.py).
LEADER_FLAGS = {"--leader-elect", "--lease-name", "--lease-namespace"}

# -- tools -------------------------------------------------------------------------------------------


def _tool(name: str, cached: Path) -> str:
    found = shutil.which(name) or (str(cached) if cached.is_file() else None)
    assert found, f"{name} is missing: scripts/setup.sh installs it ({cached})"
    return found


def helm() -> str:
    cache = Path(os.environ.get("FLEETPILOT_CACHE", Path.home() / ".cache" / "fleetpilot"))
    return _tool("helm", cache / "bin" / "helm")


def kubectl() -> str:
    return _tool("kubectl", devcluster.k8s_bin("kubectl"))


def promtool() -> str:
    # Upstream's, not whatever `promtool` is on PATH (Debian's 2.42 parses PromQL of an older day).
    cached = devcluster.prometheus_bin("promtool")
    assert cached.is_file(), f"promtool is missing: scripts/setup.sh installs it ({cached})"
    return str(cached)


def run(*args: str) -> str:
    result = subprocess.run(args, capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"{' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def documents(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def render_chart(*args: str, api_versions: tuple[str, ...] = (), namespace: str = NAMESPACE,
                 release: str = RELEASE) -> list[dict[str, Any]]:
    """`helm template` of the chart; args are more helm flags (--set, --include-crds)."""
    extra = [flag for version in api_versions for flag in ("--api-versions", version)]
    return documents(run(helm(), "template", release, str(CHART), "--namespace", namespace, *extra, *args))


def kustomize(path: Path) -> list[dict[str, Any]]:
    return documents(run(kubectl(), "kustomize", str(path)))


def by_identity(docs: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    index = {}
    for doc in docs:
        key = (doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"])
        assert key not in index, f"{key} rendered twice"
        index[key] = doc
    return index


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def container(docs: list[dict[str, Any]], component: str) -> dict[str, Any]:
    deployment = one(docs, "Deployment", f"{RELEASE}-{component}")
    (found,) = deployment["spec"]["template"]["spec"]["containers"]
    return dict(found)


# -- PromQL ------------------------------------------------------------------------------------------


def _variable_values(dashboard: dict[str, Any]) -> dict[str, str]:
    """What each dashboard variable stands for when an expression is evaluated outside Grafana."""
    values = {"__rate_interval": "5m", "__interval": "1m", "__range": "1h"}
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable["type"] in ("custom", "textbox", "constant"):
            values[variable["name"]] = str(variable["current"]["value"])
        elif variable["type"] == "query":
            values[variable["name"]] = variable.get("allValue") or ".+"
    return values


def substitute(expr: str, values: dict[str, str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: values.get(m.group(1), m.group(0)), expr)


def dashboard_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    panels = []
    for panel in dashboard["panels"]:
        panels.append(panel)
        panels += panel.get("panels", [])
    return panels


def dashboard_expressions(path: Path) -> list[tuple[str, str]]:
    """(panel title, PromQL with the variables filled in) for each target of one dashboard."""
    dashboard = json.loads(path.read_text())
    values = _variable_values(dashboard)
    return [(panel["title"], substitute(target["expr"], values))
            for panel in dashboard_panels(dashboard) for target in panel.get("targets", [])]


def rule_expressions() -> list[tuple[str, str]]:
    """(rule name, PromQL) for each recording rule and alert of the rules file."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [(rule.get("alert") or rule["record"], rule["expr"].strip()) for group in groups for rule in group["rules"]]


def promql_expressions() -> list[tuple[str, str]]:
    """Every PromQL expression the chart ships: ("dashboard <name>: <panel>" or "rule <name>", expr)."""
    found = [(f"dashboard {path.stem}: {title}", expr) for path in DASHBOARDS for title, expr in dashboard_expressions(path)]
    return found + [(f"rule {name}", expr) for name, expr in rule_expressions()]


PROMQL_WORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool",
                "offset", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects (functions, keywords, labels and strings left out)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # range and subquery durations
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)  # label lists
    names = set()
    for match in re.finditer(r"(?<![\w.:$])([a-zA-Z_:][\w:]*)\s*(\()?", text):
        word, call = match.group(1), match.group(2)
        if not call and word.lower() not in PROMQL_WORDS and not re.fullmatch(r"\d+[smhdwy]", word):
            names.add(word)
    return names


def _family_samples(families: list[Any]) -> set[str]:
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"], "gauge": [""],
                "summary": ["_count", "_sum", ""], "info": ["_info"]}
    return {family.name + suffix for family in families for suffix in suffixes.get(family.type, [""])}


def exported_metrics() -> set[str]:
    """Every series name fleetpilot's processes export, read from their registries, plus Prometheus' `up`."""
    assert operator_metrics.RECONCILES and planner_live.DESIRED  # their module-level metrics are registered
    names = _family_samples(list(prometheus_client.REGISTRY.collect()))  # operator, planner, process_*
    names |= _family_samples(list(frontend_metrics.FrontendMetrics().registry.collect()))
    snapshot = types.SimpleNamespace(running=0, waiting=0, kv_usage=0.0, preemptions=0, prompt_tokens=0,
                                     generation_tokens=0, finished={}, kv_blocks_total=0, prefix_cache_queries=0,
                                     prefix_cache_hits=0, prefix_caching=True)
    sim = sim_metrics.SimMetrics(model_name="m", snapshot=lambda: snapshot)  # type: ignore[arg-type, return-value]
    names |= _family_samples(list(sim.registry.collect()))
    return names | {"up"}


def test_metric_names_are_found_in_promql() -> None:
    expr = ('sum by (graph, le) (rate(vllm:time_to_first_token_seconds_bucket{namespace=~".+",le="0.5"}[5m]))'
            ' and on (instance) fleetpilot_operator_queue_depth > 1e3 * vector(0.5) offset 5m')
    assert metric_names(expr) == {"vllm:time_to_first_token_seconds_bucket", "fleetpilot_operator_queue_depth"}


def test_every_dashboard_and_rule_expression_queries_exported_metrics_only() -> None:
    exported = exported_metrics()
    recorded = {name for name, _ in rule_expressions() if ":" in name}  # the rules' own recordings
    unknown = {(where, name) for where, expr in promql_expressions() for name in metric_names(expr)
               if name not in exported | recorded}
    assert not unknown, f"expressions query metrics nothing exports: {sorted(unknown)}"
    # The variables' own queries too.
    for path in DASHBOARDS:
        for variable in json.loads(path.read_text())["templating"]["list"]:
            if variable["type"] == "query":
                inner = re.search(r"label_values\((.*),\s*\w+\)$", variable["definition"])
                assert inner and metric_names(inner.group(1)) <= exported, (path.name, variable["name"])


def test_promql_expressions_are_concrete() -> None:
    expressions = promql_expressions()
    assert len(expressions) > 60
    for where, expr in expressions:
        assert "$" not in expr.replace("$labels", "").replace("$value", ""), (where, expr)


# -- dashboards --------------------------------------------------------------------------------------


def test_dashboards_are_valid_grafana_json() -> None:
    assert {p.stem for p in DASHBOARDS} == {"sla", "planner", "fleet", "operator"}
    uids = set()
    for path in DASHBOARDS:
        dashboard = json.loads(path.read_text())
        assert dashboard["uid"] not in uids
        uids.add(dashboard["uid"])
        assert dashboard["title"].startswith("fleetpilot / ")
        panels = dashboard_panels(dashboard)
        ids = [p["id"] for p in panels]
        assert len(ids) == len(set(ids)), f"{path.name}: duplicate panel ids"
        for panel in panels:
            assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, (path.name, panel["title"])
            if panel["type"] in ("row", "text"):
                continue
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            refs = [t["refId"] for t in panel["targets"]]
            assert panel["targets"] and len(refs) == len(set(refs)), (path.name, panel["title"])
            assert all(t["expr"].strip() for t in panel["targets"])


def test_dashboards_pass_grafanas_dashboard_model(tmp_path: Path) -> None:
    """Grafana's own dashboard schema, through the Grafana Foundation SDK's strict decoding
    (tests/grafana/dashboardcheck): unknown fields, wrong types and missing required ones fail."""
    checker = str(go_tool("dashboardcheck"))
    out = run(checker, *map(str, DASHBOARDS))
    reports = [json.loads(line) for line in out.splitlines()]
    assert [Path(r["file"]).name for r in reports] == [p.name for p in DASHBOARDS]
    for report, path in zip(reports, DASHBOARDS, strict=True):
        assert report["errors"] == [] and report["panels"] == len(json.loads(path.read_text())["panels"]), report
    # ... and the checker can fail: a misspelt field in a panel is refused, by name.
    broken = json.loads(DASHBOARDS[0].read_text())
    broken["panels"][1]["fieldConfg"] = broken["panels"][1].pop("fieldConfig")
    (tmp_path / "broken.json").write_text(json.dumps(broken))
    result = subprocess.run([checker, str(tmp_path / "broken.json")], capture_output=True, text=True, check=False)
    assert result.returncode == 1 and "fieldConfg" in result.stdout, result.stdout


def test_every_bucket_bound_named_is_one_the_frontend_exports() -> None:
    """An `le` that is not one of the frontend's bounds selects nothing: the alert or panel reads empty."""
    bounds = {prometheus_client.utils.floatToGoString(b) for b in frontend_metrics.LATENCY_BUCKETS} | {"+Inf"}
    files = [RULES, *RULE_TESTS, *DASHBOARDS]
    # le="0.5" (PromQL, rule tests), le=\"0.5\" (JSON), "le", "0.5" (label_replace).
    pattern = re.compile(r'\ble\\?"?\s*=\s*\\?"([^"\\]+)|"le",\s*"([^"]+)"')
    named = {(path.name, a or b) for path in files for a, b in pattern.findall(path.read_text())}
    assert named, "no bucket bound found: the pattern is wrong"
    assert {value for _, value in named} <= bounds, sorted((f, v) for f, v in named if v not in bounds)
    assert {value for _, value in named} >= {"0.468495", "0.050066"}  # the samples' SLA, in the rule tests
    # The rules hold no SLA of their own: a graph's targets are the planner's series, or none.
    assert not pattern.findall(RULES.read_text())


def test_rule_tests_feed_the_sla_series_the_planner_exports() -> None:
    """Each target the rule tests give a graph has the `le` the planner's `_export_sla` writes for it: a
    made-up bound would pass promtool while every live burn rate read nothing."""
    fed: list[tuple[str, float, str]] = []  # (metric, target in seconds, le)
    for path in RULE_TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for series in case.get("input_series", []):
                if series["series"].startswith("fleetpilot_planner_sla_target_seconds{"):
                    labels = dict(re.findall(r'(\w+)="([^"]*)"', series["series"]))
                    target_s = float(series["values"].split("x")[0])  # a constant: '0.5x120'
                    fed.append((labels["metric"], target_s, labels["le"]))
    assert {metric for metric, _, _ in fed} == {"ttft", "itl"}
    for metric, target_s, le in fed:
        exported = prometheus_client.utils.floatToGoString(contract.latency_bucket(target_s))
        assert le == exported, (metric, target_s, le)


def test_sla_dashboard_shows_what_the_issue_asks_for() -> None:
    titles = {title for title, _ in dashboard_expressions(CHART / "dashboards" / "sla.json")}
    assert {"Time to first token", "Inter-token latency", "TTFT attainment", "ITL attainment", "Goodput"} <= titles
    planner = {title for title, _ in dashboard_expressions(CHART / "dashboards" / "planner.json")}
    assert {"Forecast vs actual load", "Desired vs serving replicas", "GPUs used vs budget", "Scaling decisions"} <= planner


# -- alerts ------------------------------------------------------------------------------------------


def test_promtool_checks_the_rules() -> None:
    out = run(promtool(), "check", "rules", str(RULES))
    assert "SUCCESS" in out


def test_promtool_unit_tests_pass() -> None:
    assert RULE_TESTS
    out = run(promtool(), "test", "rules", *map(str, RULE_TESTS))
    assert out.count("SUCCESS") == len(RULE_TESTS), out


def test_every_alert_has_firing_and_quiet_unit_tests() -> None:
    alerts = {name for name, _ in rule_expressions() if ":" not in name}
    assert len(alerts) >= 10
    firing: set[str] = set()
    quiet: set[str] = set()
    for path in RULE_TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    assert alerts - firing == set(), "alerts never tested firing"
    assert alerts - quiet == set(), "alerts never tested quiet"


def test_every_alert_has_a_severity_and_explanation() -> None:
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
                assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]


# -- the chart ---------------------------------------------------------------------------------------


def test_helm_lint_passes_with_default_and_other_values() -> None:
    run(helm(), "lint", "--strict", str(CHART))
    run(helm(), "lint", "--strict", str(CHART), "--set", "watchNamespaces={a,b}", "--set", "planner.enabled=false",
        "--set", "leaderElection.enabled=false")


def test_default_render_has_the_expected_objects() -> None:
    docs = render_chart()
    assert sorted((kind, ns, name) for kind, ns, name in by_identity(docs)) == sorted([
        ("ServiceAccount", NAMESPACE, "fleetpilot-operator"),
        ("ServiceAccount", NAMESPACE, "fleetpilot-planner"),
        ("ClusterRole", "", "fleetpilot-operator"),
        ("ClusterRole", "", "fleetpilot-operator-cluster"),
        ("ClusterRole", "", "fleetpilot-planner"),
        ("ClusterRoleBinding", "", "fleetpilot-operator"),
        ("ClusterRoleBinding", "", "fleetpilot-operator-cluster"),
        ("ClusterRoleBinding", "", "fleetpilot-planner"),
        ("Role", NAMESPACE, "fleetpilot-operator-leader-election"),
        ("Role", NAMESPACE, "fleetpilot-planner-leader-election"),
        ("RoleBinding", NAMESPACE, "fleetpilot-operator-leader-election"),
        ("RoleBinding", NAMESPACE, "fleetpilot-planner-leader-election"),
        ("Deployment", NAMESPACE, "fleetpilot-operator"),
        ("Deployment", NAMESPACE, "fleetpilot-planner"),
        ("Service", NAMESPACE, "fleetpilot-operator-metrics"),
        ("Service", NAMESPACE, "fleetpilot-planner-metrics"),
        ("PodDisruptionBudget", NAMESPACE, "fleetpilot-operator"),
        ("PodDisruptionBudget", NAMESPACE, "fleetpilot-planner"),
        ("NetworkPolicy", NAMESPACE, "fleetpilot-operator"),
        ("NetworkPolicy", NAMESPACE, "fleetpilot-planner"),
        ("ValidatingAdmissionPolicy", "", "fleetpilot-component-bounds"),
        ("ValidatingAdmissionPolicyBinding", "", "fleetpilot-component-bounds"),
        *[("ConfigMap", NAMESPACE, f"fleetpilot-dashboard-{p.stem}") for p in DASHBOARDS],
    ])
    for component in ("operator", "planner"):
        assert one(docs, "Deployment", f"fleetpilot-{component}")["spec"]["replicas"] == 2


def test_pods_meet_pod_security_restricted() -> None:
    for component in ("operator", "planner"):
        pod = one(render_chart(), "Deployment", f"fleetpilot-{component}")["spec"]["template"]["spec"]
        assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                                          "fsGroup": 65532, "seccompProfile": {"type": "RuntimeDefault"}}
        (main,) = pod["containers"]
        assert main["securityContext"] == {
            "runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532, "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"}}
        assert all(set(v) == {"name", "emptyDir"} for v in pod["volumes"])  # no hostPath or the like
        assert "hostNetwork" not in pod and "hostPID" not in pod
        assert main["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]
        port = main["ports"][0]["name"]
        assert main["readinessProbe"]["httpGet"]["port"] == main["livenessProbe"]["httpGet"]["port"] == port
        assert main["resources"]["requests"] and main["resources"]["limits"]["memory"]


def test_commands_are_the_fleetpilot_cli_the_image_runs() -> None:
    docs = render_chart("--set", "watchNamespaces={serving,batch}", "--set", "planner.gpuBudgets.shared=16",
                        "--set", "planner.holdSeconds=600")
    parser = cli.build_parser()
    for component in ("operator", "planner"):
        main = container(docs, component)
        assert main["command"] == ["fleetpilot"]
        args, unknown = parser.parse_known_args(main["args"])
        assert not unknown, unknown  # every argument the chart passes is one the command knows
        assert args.leader_elect
        assert args.namespace == ["serving", "batch"]
        assert args.metrics_port == {"operator": 8080, "planner": 8081}[component]
        assert main["ports"] == [{"name": "metrics", "containerPort": args.metrics_port, "protocol": "TCP"}]
        if component == "operator":  # what every graph's NetworkPolicies admit (render.RenderSettings)
            assert args.monitoring_namespace == "monitoring"
            assert args.control_plane_namespace == "$(POD_NAMESPACE)"
            assert {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}} in main["env"]
        if component == "planner":
            assert args.gpu_budget == ["shared=16"] and args.hold_seconds == 600
            assert args.prometheus_url == "http://prometheus-operated.monitoring.svc:9090"
    dockerfile = (REPO / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["fleetpilot"]' in dockerfile and "USER 65532:65532" in dockerfile
    # The chart's image is the one the operator renders frontends and simulator workers with.
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert container(docs, "operator")["image"] == render.RenderSettings.fleetpilot_image == f"fleetpilot/fleetpilot:{chart['appVersion']}"
    env = {e["name"]: e.get("value") for e in container(docs, "operator")["env"]}
    assert env["FLEETPILOT_IMAGE"] == render.RenderSettings.fleetpilot_image
    pyproject = (REPO / "pyproject.toml").read_text()
    assert f'version = "{chart["appVersion"]}"' in pyproject


def test_image_values_are_used() -> None:
    docs = render_chart("--set", "image.repository=registry.example/fp", "--set", "image.tag=1.2.3",
                        "--set", "image.pullPolicy=Always", "--set", "imagePullSecrets[0].name=regcred")
    for component in ("operator", "planner"):
        main = container(docs, component)
        assert (main["image"], main["imagePullPolicy"]) == ("registry.example/fp:1.2.3", "Always")
        pod = one(docs, "Deployment", f"fleetpilot-{component}")["spec"]["template"]["spec"]
        assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert {"name": "FLEETPILOT_IMAGE", "value": "registry.example/fp:1.2.3"} in container(docs, "operator")["env"]


def test_leader_election_args_and_identity() -> None:
    docs = render_chart()
    for component in ("operator", "planner"):
        main = container(docs, component)
        assert main["args"][-3:] == ["--leader-elect", f"--lease-name=fleetpilot-{component}",
                                     "--lease-namespace=$(POD_NAMESPACE)"]
        env = {e["name"]: e for e in main["env"]}
        assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
        assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
        role = one(docs, "Role", f"fleetpilot-{component}-leader-election")
        assert role["metadata"]["namespace"] == NAMESPACE
        assert role["rules"] == [
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
             "resourceNames": [f"fleetpilot-{component}"], "verbs": ["get", "update"]},
        ]
    off = render_chart("--set", "leaderElection.enabled=false", "--set", "operator.replicas=1")
    assert not [d for d in off if d["kind"] in ("Role", "RoleBinding")]
    assert not LEADER_FLAGS & {a.split("=")[0] for a in container(off, "operator")["args"]}
    assert [d["metadata"]["name"] for d in off if d["kind"] == "PodDisruptionBudget"] == ["fleetpilot-planner"]


def _rules(docs: list[dict[str, Any]], name: str) -> list[tuple[str, str, str]]:
    """A role's rules flattened to (apiGroup, resource, verb) triples, in order."""
    role = one(docs, "ClusterRole", name)
    return [(group, resource, verb) for rule in role["rules"] for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]]


def _grants(triples: list[tuple[str, str, str]]) -> dict[tuple[str, str], set[str]]:
    grants: dict[tuple[str, str], set[str]] = {}
    for group, resource, verb in triples:
        grants.setdefault((group, resource), set()).add(verb)
    return grants


def test_operator_rbac_is_exactly_what_it_uses() -> None:
    docs = render_chart()
    # Every kind it makes is watched into its cache (list, watch), written (create, patch, delete),
    # and read directly only when a create finds the name taken (get).
    writes = {"get", "list", "watch", "create", "patch", "delete"}
    assert _grants(_rules(docs, "fleetpilot-operator")) == {
        ("fleetpilot.dev", "dynamographs"): {"list", "watch"},
        ("fleetpilot.dev", "dynamographs/status"): {"patch"},
        ("fleetpilot.dev", "dynamographcomponents/status"): {"patch"},
        ("fleetpilot.dev", "dynamographcomponents"): writes,
        ("apps", "deployments"): writes,
        ("apps", "statefulsets"): writes,  # multinode groups: leaders, and each group's workers
        ("", "services"): writes,
        ("", "serviceaccounts"): writes,
        ("", "configmaps"): writes,
        ("policy", "poddisruptionbudgets"): writes,
        ("rbac.authorization.k8s.io", "roles"): writes,
        ("rbac.authorization.k8s.io", "rolebindings"): writes,
        ("networking.k8s.io", "networkpolicies"): writes,  # each component's ingress boundary (spec.network)
        # patch: the pod-deletion-cost written before a scale-down (operator/scaledown.py), a multinode
        # group's admission (gate, members); delete: a group restarted or released whole (operator/groups.py).
        ("", "pods"): {"get", "list", "watch", "patch", "delete"},
        ("", "events"): {"create"},
        # Never sent: held so that it may grant a frontend its API-key Secret (docs/adr/0072-frontend-api-keys.md).
        ("", "secrets"): {"list", "watch"},
    }
    assert _grants(_rules(docs, "fleetpilot-operator-cluster")) == {
        ("", "nodes"): {"list"},
        ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
        ("", "pods"): {"list"},
    }
    # The frontend Role the operator creates grants nothing the operator lacks (RBAC's escalation check).
    granted = _grants(_rules(docs, "fleetpilot-operator"))
    frontend_rules = _frontend_role_rules()
    assert ("", "secrets", "watch") in frontend_rules
    for group, resource, verb in frontend_rules:
        assert verb in granted[(group, resource)]


def _frontend_role_rules() -> list[tuple[str, str, str]]:
    from fleetpilot.api import v1alpha1 as api

    body = yaml.safe_load((MANIFESTS / "samples" / "simulator.yaml").read_text())
    # With API keys: the Role then also lists and watches the key Secret, which the operator must hold too.
    body["spec"]["components"]["frontend"]["auth"] = {"apiKeySecretRef": {"name": "keys"}}
    graph = api.DynamoGraph.model_validate(body | {"metadata": {"name": "g", "namespace": "n", "uid": "u"}})
    owner = render.OwnerRef("v1", "X", "x", "u")
    (role,) = [o for o in render.frontend_rbac(graph, owner) if o["kind"] == "Role"]
    return [(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]]


def test_network_policies_admit_only_the_monitoring_namespace_to_the_metrics_ports() -> None:
    """The operator's and planner's pods serve nothing but their metrics port: one ingress rule each, from the
    monitoring namespace (the same value the operator admits to every graph's pods), to that port alone."""
    docs = render_chart("--set", "networkPolicy.monitoringNamespace=prom", "--set", "operator.metricsPort=9100")
    for component, port in (("operator", 9100), ("planner", 8081)):
        policy = one(docs, "NetworkPolicy", f"fleetpilot-{component}")
        deployment = one(docs, "Deployment", f"fleetpilot-{component}")
        assert policy["metadata"]["namespace"] == NAMESPACE
        assert policy["spec"] == {
            "podSelector": {"matchLabels": deployment["spec"]["selector"]["matchLabels"]},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "prom"}}}],
                         "ports": [{"protocol": "TCP", "port": port}]}],
        }
        (main,) = deployment["spec"]["template"]["spec"]["containers"]
        assert [p["containerPort"] for p in main["ports"]] == [port]
    assert "--monitoring-namespace=prom" in container(docs, "operator")["args"]
    # Without a monitoring namespace nothing may connect; without the planner, only the operator's.
    closed = render_chart("--set", "networkPolicy.monitoringNamespace=", "--set", "planner.enabled=false")
    assert [d["metadata"]["name"] for d in closed if d["kind"] == "NetworkPolicy"] == ["fleetpilot-operator"]
    assert one(closed, "NetworkPolicy", "fleetpilot-operator")["spec"]["ingress"] == []
    assert "--monitoring-namespace=" in container(closed, "operator")["args"]
    off = render_chart("--set", "networkPolicy.enabled=false")
    assert not [d for d in off if d["kind"] == "NetworkPolicy"]


def test_planner_rbac_never_writes_a_graph_spec() -> None:
    docs = render_chart()
    assert _grants(_rules(docs, "fleetpilot-planner")) == {
        ("fleetpilot.dev", "dynamographs"): {"list", "watch"},
        ("fleetpilot.dev", "dynamographs/status"): {"patch"},
        ("fleetpilot.dev", "dynamographcomponents"): {"list", "watch"},
        ("fleetpilot.dev", "dynamographcomponents/scale"): {"patch"},
        ("", "pods"): {"list", "watch"},  # the frontends, whose queues the fast path reads
        ("", "configmaps"): {"get"},
        ("", "events"): {"create"},
    }


def test_bindings_follow_watched_namespaces() -> None:
    cluster_wide = render_chart()
    for component in ("operator", "planner"):
        binding = one(cluster_wide, "ClusterRoleBinding", f"fleetpilot-{component}")
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": f"fleetpilot-{component}", "namespace": NAMESPACE}]
        assert binding["roleRef"]["name"] == f"fleetpilot-{component}"
    scoped = render_chart("--set", "watchNamespaces={serving,batch}", api_versions=(MONITORING,))
    kinds = {(d["kind"], d["metadata"]["name"]) for d in scoped}
    assert ("ClusterRoleBinding", "fleetpilot-operator") not in kinds
    assert ("ClusterRoleBinding", "fleetpilot-planner") not in kinds
    assert ("ClusterRoleBinding", "fleetpilot-operator-cluster") in kinds  # nodes and CRDs stay cluster-wide
    for component in ("operator", "planner"):
        bindings = [d for d in scoped if d["kind"] == "RoleBinding" and d["metadata"]["name"] == f"fleetpilot-{component}"]
        assert sorted(b["metadata"]["namespace"] for b in bindings) == ["batch", "serving"]
        assert all(b["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                    "name": f"fleetpilot-{component}"} for b in bindings)
    assert one(scoped, "PodMonitor", "fleetpilot-graphs")["spec"]["namespaceSelector"] == {"matchNames": ["serving", "batch"]}


def test_monitoring_objects_only_where_the_prometheus_operator_is() -> None:
    assert not [d for d in render_chart() if d["apiVersion"].startswith("monitoring.coreos.com/")]
    docs = render_chart("--set", "monitoring.labels.release=kube-prometheus-stack", api_versions=(MONITORING,))
    monitoring = {(d["kind"], d["metadata"]["name"]) for d in docs if d["apiVersion"] == MONITORING}
    assert monitoring == {("ServiceMonitor", "fleetpilot-operator"), ("ServiceMonitor", "fleetpilot-planner"),
                          ("PodMonitor", "fleetpilot-graphs"), ("PrometheusRule", "fleetpilot")}
    for kind, name in monitoring:
        assert one(docs, kind, name)["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    rule = one(docs, "PrometheusRule", "fleetpilot")
    assert rule["spec"] == yaml.safe_load(RULES.read_text())
    for component in ("operator", "planner"):
        monitor = one(docs, "ServiceMonitor", f"fleetpilot-{component}")
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["port"] == "metrics" and endpoint["honorLabels"] is True
        service = one(docs, "Service", f"fleetpilot-{component}-metrics")
        assert monitor["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    (pods,) = one(docs, "PodMonitor", "fleetpilot-graphs")["spec"]["podMetricsEndpoints"]
    assert {(r["sourceLabels"][0], r["targetLabel"]) for r in pods["relabelings"]} == {
        ("__meta_kubernetes_pod_label_fleetpilot_dev_graph", "graph"),
        ("__meta_kubernetes_pod_label_fleetpilot_dev_component", "component")}
    assert pods["port"] == "http"  # the port name of every frontend and worker the operator renders
    off = render_chart("--set", "monitoring.serviceMonitor.enabled=false", "--set", "monitoring.podMonitor.enabled=false",
                       "--set", "monitoring.prometheusRule.enabled=false", api_versions=(MONITORING,))
    assert not [d for d in off if d["apiVersion"] == MONITORING]


def test_dashboards_are_configmaps_for_the_grafana_sidecar() -> None:
    docs = render_chart("--set", "dashboards.namespace=monitoring")
    maps = [d for d in docs if d["kind"] == "ConfigMap"]
    assert len(maps) == len(DASHBOARDS) == 4
    for config_map in maps:
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert config_map["metadata"]["namespace"] == "monitoring"
        ((key, text),) = config_map["data"].items()
        stem = key.removeprefix("fleetpilot-").removesuffix(".json")
        assert json.loads(text) == json.loads((CHART / "dashboards" / f"{stem}.json").read_text())
    assert not [d for d in render_chart("--set", "dashboards.enabled=false") if d["kind"] == "ConfigMap"]


def test_planner_needs_a_prometheus_url() -> None:
    result = subprocess.run([helm(), "template", RELEASE, str(CHART), "--set", "planner.prometheusUrl="],
                            capture_output=True, text=True, check=False)
    assert result.returncode != 0 and "planner.prometheusUrl is required" in result.stderr
    docs = render_chart("--set", "planner.enabled=false")
    assert not [d for d in docs if "planner" in d["metadata"]["name"] and d["kind"] != "ConfigMap"]


def test_chart_crds_are_the_generated_ones() -> None:
    generated = {p.name: p.read_text() for p in (REPO / "crds").glob("*.yaml")}
    in_chart = {p.name: p.read_text() for p in (CHART / "crds").glob("*.yaml")}
    assert in_chart == generated, "charts/fleetpilot/crds/ drifted from crds/: copy crds/*.yaml there"
    assert generated == cli._crd_files()  # and those match the models (test_crds.py says so in detail)


# -- kustomize ---------------------------------------------------------------------------------------


def test_kustomize_base_is_generated_from_the_chart(tmp_path: Path) -> None:
    env = {**os.environ, "HELM": helm()}
    subprocess.run([str(MANIFESTS / "generate-base.sh"), str(tmp_path)], check=True, capture_output=True, env=env)
    for name in ("base/fleetpilot.yaml", "components/monitoring/monitoring.yaml"):
        assert (tmp_path / name).read_text() == (MANIFESTS / name).read_text(), (
            f"manifests/{name} drifted from the chart: run manifests/generate-base.sh")


def _without_helm_bookkeeping(docs: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    for doc in docs:
        for labels in (doc["metadata"].get("labels", {}),
                       doc.get("spec", {}).get("template", {}).get("metadata", {}).get("labels", {})):
            labels.pop("helm.sh/chart", None)
            labels.pop("app.kubernetes.io/managed-by", None)
    return by_identity(docs)


def test_kustomize_gives_the_objects_helm_gives() -> None:
    helm_objects = _without_helm_bookkeeping(render_chart("--include-crds"))
    base = _without_helm_bookkeeping(kustomize(MANIFESTS / "base"))
    namespace = base.pop(("Namespace", "", NAMESPACE))
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert base.keys() == helm_objects.keys()
    for key, obj in helm_objects.items():
        assert base[key] == obj, f"{key} differs between kustomize and helm"
    assert by_identity(kustomize(MANIFESTS)).keys() == by_identity(kustomize(MANIFESTS / "base")).keys()


def test_overlays_build() -> None:
    with_monitoring = by_identity(render_chart("--include-crds", api_versions=(MONITORING,)))
    production = by_identity(kustomize(MANIFESTS / "overlays" / "production"))
    assert production.keys() - {("Namespace", "", NAMESPACE)} == with_monitoring.keys()
    for component in ("operator", "planner"):
        deployment = production[("Deployment", NAMESPACE, f"fleetpilot-{component}")]
        assert deployment["spec"]["replicas"] == 2
        assert deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    dev = by_identity(kustomize(MANIFESTS / "overlays" / "dev"))
    for component in ("operator", "planner"):
        deployment = dev[("Deployment", NAMESPACE, f"fleetpilot-{component}")]
        assert deployment["spec"]["replicas"] == 1
        (main,) = deployment["spec"]["template"]["spec"]["containers"]
        assert main["image"] == "fleetpilot/fleetpilot:dev"
        assert main["securityContext"]["readOnlyRootFilesystem"] is True
    assert not [key for key in dev if key[0] == "PodDisruptionBudget"]


def test_samples_are_dynamographs() -> None:
    samples = sorted((MANIFESTS / "samples").glob("*.yaml"))
    assert len(samples) >= 4
    from fleetpilot.api import v1alpha1 as api

    for path in samples:
        for doc in documents(path.read_text()):
            if doc["kind"] == "DynamoGraph":
                api.DynamoGraph.model_validate(doc | {"metadata": {**doc["metadata"], "namespace": "n", "uid": "u"}})


if __name__ == "__main__":  # print the expressions, for a person or a script evaluating them elsewhere
    for where, expr in promql_expressions():
        sys.stdout.write(f"{where}\t{' '.join(expr.split())}\n")


def test_component_bounds_are_the_operators_alone_to_write() -> None:
    """The admission policy lets only the release's operator ServiceAccount change a DGC's bounds, and its
    binding covers the watched namespaces only when the chart is told them; it can be left out."""
    docs = render_chart()
    policy = one(docs, "ValidatingAdmissionPolicy", "fleetpilot-component-bounds")
    (operator,) = policy["spec"]["variables"]
    assert operator["expression"] == f'request.userInfo.username == "system:serviceaccount:{NAMESPACE}:fleetpilot-operator"'
    assert [rule["resources"] for rule in policy["spec"]["matchConstraints"]["resourceRules"]] == [["dynamographcomponents"]]
    fields = [v["messageExpression"].split(":")[0].strip('"') for v in policy["spec"]["validations"]]
    assert fields == ["spec.minReplicas", "spec.maxReplicas"]
    binding = one(docs, "ValidatingAdmissionPolicyBinding", "fleetpilot-component-bounds")
    assert binding["spec"]["validationActions"] == ["Deny"] and "matchResources" not in binding["spec"]
    scoped = render_chart("--set", "watchNamespaces={a,b}")
    selector = one(scoped, "ValidatingAdmissionPolicyBinding", "fleetpilot-component-bounds")["spec"]["matchResources"]
    assert selector["namespaceSelector"]["matchExpressions"][0]["values"] == ["a", "b"]
    off = render_chart("--set", "admissionPolicy.enabled=false")
    assert not [d for d in off if d["kind"].startswith("ValidatingAdmissionPolicy")]
