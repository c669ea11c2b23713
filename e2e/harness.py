"""The closed-loop environment: control plane, pod runner, Prometheus, operator and planner.

Where it sits: under the e2e scenarios (pytest's `e2e/conftest.py` and the hand-run `e2e/run.py`
both use `Harness`). It starts, in order:

1. the `e2e` cluster (fleetpilot.devcluster, port base 29400; `$FLEETPILOT_E2E_CLUSTER` and
   `$FLEETPILOT_CLUSTER_PORT_BASE` choose another, beside the dev and test clusters; one e2e at a
   time, as the pod runner's pod IPs are fixed) with kwok's pod stages narrowed so the simulator's
   pods are left to the pod runner (`ClusterConfig.external_pod_labels`);
2. the CRDs from `crds/`, and the operator's and planner's ServiceAccounts and RBAC — the Helm
   chart's own templates rendered by `helm template`, or `e2e/rbac.yaml` when they cannot be;
3. the pod runner (`e2e/podrunner.py`), which runs those pods as local processes on 127.2.0.0/16 (`$FLEETPILOT_E2E_POD_NETWORK`);
4. upstream Prometheus (scripts/install-prometheus.sh), discovering pods with `kubernetes_sd_configs`
   (role pod) from the apiserver with a ServiceAccount that may only list and watch pods, relabelled
   as the Prometheus Operator does for the chart's PodMonitor (`graph`, `component`, `namespace`,
   `pod`), scraping the operator and the planner as the chart's ServiceMonitors do, and evaluating
   the chart's own rules and alerts (charts/fleetpilot/rules/);
5. `fleetpilot operator run` and `fleetpilot planner run`, each with its ServiceAccount's token.

Every process is started with its own session and its PID saved under the state folder, so
`Harness.down()` (or `e2e/run.py down` after `--keep`) stops exactly those. Nothing here imports
the repository's `operator/` folder, so `python e2e/run.py` is safe from the repository root.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import podrunner
import podspec
import yaml

from fleetpilot.devcluster import cluster as devcluster
from fleetpilot.devcluster import processes

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
FLEETPILOT = BIN / "fleetpilot"
SYSTEM_NAMESPACE = "fleetpilot-system"
MONITORING_NAMESPACE = "monitoring"
HELM = devcluster.CACHE / "bin" / "helm"
SCRAPE_INTERVAL_S = 2
#: The image the operator renders for simulator workers and frontends (render.RenderSettings).
FLEETPILOT_IMAGE = "fleetpilot/fleetpilot:0.1.0"


def wait_for(check: Callable[[], Any], *, timeout: float, what: str | Callable[[], str], interval: float = 0.5) -> Any:
    """Poll until `check()` is truthy; fail with the last value (and `what()` when callable)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except (subprocess.CalledProcessError, httpx.HTTPError, KeyError, IndexError, TypeError, ValueError) as error:
            last = error
        else:
            if last:
                return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what() if callable(what) else what};"
                         f" last seen: {last!r}")


@dataclasses.dataclass
class Kubectl:
    binary: Path
    kubeconfig: Path

    def run(self, *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.binary), *args], input=stdin, capture_output=True, text=True, check=check,
                              env={**os.environ, "KUBECONFIG": str(self.kubeconfig)}, timeout=120)

    def json(self, *args: str) -> Any:
        return json.loads(self.run(*args, "-o", "json").stdout)

    def apply(self, documents: list[dict[str, Any]] | dict[str, Any], *, server_side: bool = False) -> None:
        docs = documents if isinstance(documents, list) else [documents]
        text = yaml.safe_dump_all(docs)
        self.run("apply", *(["--server-side", "--force-conflicts"] if server_side else []), "-f", "-", stdin=text)


class ManagedProcess:
    """One child process with its own session, a log file and a saved PID (stopped by that PID)."""

    def __init__(self, name: str, argv: list[str], *, state: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.log_path = state / "logs" / f"{name}.log"
        self.pid_path = state / "pids" / f"{name}.pid"
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.pid_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"--- {time.strftime('%H:%M:%S')} start {' '.join(self.argv)}\n".encode())
            log.flush()
            self.popen = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          start_new_session=True, env=self.env)
        processes.record(self.pid_path, self.popen.pid)

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self, *, timeout: float = 20.0) -> None:
        """SIGTERM its process group by the saved PID, SIGKILL what is left after `timeout`."""
        pid = self.saved_pid()
        if pid is not None:
            processes.terminate_group(pid, timeout=timeout)
        if self.popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=1)
        self.pid_path.unlink(missing_ok=True)

    def saved_pid(self) -> int | None:
        """The saved PID while that very process still runs (guards against PID reuse)."""
        return processes.alive(self.pid_path)

    def log(self, tail: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-tail:]
        except OSError:
            return ""


class Harness:
    """Brings the closed loop up and down; see the module docstring for what runs."""

    def __init__(self, *, cluster_name: str | None = None, planner_args: list[str] | None = None) -> None:
        # FLEETPILOT_E2E_CLUSTER (with FLEETPILOT_CLUSTER_PORT_BASE): another name, beside dev and test.
        config = devcluster.config_from_env(cluster_name or os.environ.get("FLEETPILOT_E2E_CLUSTER", "e2e"))
        self.config = dataclasses.replace(config, external_pod_labels=(podspec.OWNED_LABEL,))
        self.cluster = devcluster.Cluster(self.config)
        self.state = self.config.folder / "e2e"
        self.kubectl = Kubectl(devcluster.k8s_bin("kubectl"), self.config.kubeconfig)
        self.prometheus_port = self.config.port_base + 90
        self.prometheus_url = f"http://127.0.0.1:{self.prometheus_port}"
        self.planner_args = planner_args or []
        self.identities: dict[str, tuple[str, str]] = {}  # operator/planner -> (namespace, service account)
        self.rbac_source = ""
        self.started_unix = time.time()  # when up() began: Prometheus holds nothing older
        self.processes = {
            "prometheus": ManagedProcess("prometheus", [
                str(devcluster.prometheus_bin()),
                f"--config.file={self.state / 'prometheus' / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.state / 'prometheus' / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.prometheus_port}",
                "--storage.tsdb.retention.time=2h", "--log.level=warn"], state=self.state),
        }

    # -- up ----------------------------------------------------------------------------------------------

    def up(self, *, log: Callable[[str], None] = print) -> dict[str, float]:
        """Start everything from scratch (a running e2e cluster is replaced); returns seconds per step."""
        timings: dict[str, float] = {}

        def step(name: str, action: Callable[[], object]) -> None:
            started = time.monotonic()
            action()
            timings[name] = round(time.monotonic() - started, 1)
            log(f"e2e: {name} in {timings[name]}s")

        self.down(quiet=True)
        self.started_unix = time.time()
        shutil.rmtree(self.state, ignore_errors=True)
        for sub in ("logs", "pids", "prometheus", "credentials"):
            (self.state / sub).mkdir(parents=True, exist_ok=True)
        step("cluster", lambda: self.cluster.up(fresh=True, log=lambda _: None))
        step("crds and rbac", self._install)
        step("pod runner", self._start_podrunner)
        step("prometheus", self.start_prometheus)
        step("operator", self._start_operator)
        step("planner", self._start_planner)
        return timings

    def _install(self) -> None:
        self.kubectl.run("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
        self.kubectl.run("wait", "--for", "condition=Established", "crd", "--all", "--timeout=60s")
        for namespace in (SYSTEM_NAMESPACE, MONITORING_NAMESPACE):
            self.kubectl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        documents = self._chart_rbac()
        if documents:
            self.rbac_source = "the Helm chart (charts/fleetpilot/templates/*-rbac.yaml)"
        else:
            documents = [d for d in yaml.safe_load_all((Path(__file__).parent / "rbac.yaml").read_text()) if d]
            self.rbac_source = "e2e/rbac.yaml (the chart's templates could not be rendered)"
        self.kubectl.apply(documents)
        for document in documents:
            if document["kind"] == "ServiceAccount":
                component = document["metadata"].get("labels", {}).get("app.kubernetes.io/component", "")
                self.identities[component] = (document["metadata"]["namespace"], document["metadata"]["name"])
        missing = {"operator", "planner"} - set(self.identities)
        if missing:
            raise RuntimeError(f"no ServiceAccount for {', '.join(sorted(missing))} in {self.rbac_source}")
        self.kubectl.apply(prometheus_rbac())

    def _start_podrunner(self) -> None:
        argv = [sys.executable, str(Path(__file__).parent / "podrunner.py"), "--kubeconfig",
                str(self.config.kubeconfig), "--state", str(self.state / "pods"), "--env", "OPENBLAS_NUM_THREADS=1",
                # The node has fleetpilot's image only: another (a typo, a tag never pushed) cannot be pulled.
                "--image", FLEETPILOT_IMAGE,
                # `kubectl logs`: the runner is the nodes' kubelet API for its pods.
                "--kubelet-port", str(self.config.kubelet_port), "--pki", str(self.config.folder / "pki")]
        self.processes["podrunner"] = ManagedProcess("podrunner", argv, state=self.state)
        self.processes["podrunner"].start()

    def _chart_rbac(self) -> list[dict[str, Any]]:
        """The chart's ServiceAccounts and RBAC for the operator and the planner, or [] when unavailable."""
        chart = REPO / "charts" / "fleetpilot"
        templates = [t for t in ("operator-rbac.yaml", "planner-rbac.yaml") if (chart / "templates" / t).is_file()]
        if not HELM.is_file() or len(templates) < 2:
            return []
        argv = [str(HELM), "template", "fleetpilot", str(chart), "--namespace", SYSTEM_NAMESPACE,
                "--set", "leaderElection.enabled=false"]
        for template in templates:
            argv += ["--show-only", f"templates/{template}"]
        try:
            rendered = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
            return []
        return [d for d in yaml.safe_load_all(rendered) if d]

    def token_kubeconfig(self, namespace: str, account: str, name: str) -> Path:
        """A kubeconfig with a token of that ServiceAccount (the identity its pod would have)."""
        token = self.kubectl.run("create", "token", account, "-n", namespace, "--duration=12h").stdout.strip()
        return self._kubeconfig(name, token)

    def _kubeconfig(self, name: str, token: str) -> Path:
        path = self.state / "credentials" / f"{name}.kubeconfig"
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": name,
            "clusters": [{"name": "e2e", "cluster": {"server": self.config.server,
                                                     "certificate-authority": str(self.config.folder / "pki" / "ca.crt")}}],
            "users": [{"name": name, "user": {"token": token}}],
            "contexts": [{"name": name, "context": {"cluster": "e2e", "user": name}}],
        }))
        path.chmod(0o600)
        return path

    def _child_env(self, kubeconfig: Path) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
        return {**env, "KUBECONFIG": str(kubeconfig), "OPENBLAS_NUM_THREADS": "1"}

    # -- prometheus --------------------------------------------------------------------------------------

    def start_prometheus(self) -> None:
        """Prometheus, discovering pods as its own identity (list and watch pods, nothing else)."""
        folder = self.state / "prometheus"
        kubeconfig = self.token_kubeconfig(MONITORING_NAMESPACE, "prometheus", "prometheus")
        (folder / "prometheus.yml").write_text(yaml.safe_dump(prometheus_config(
            kubeconfig=kubeconfig, operator=f"127.0.0.1:{self.operator_metrics_port}",
            planner=f"127.0.0.1:{self.planner_metrics_port}")))
        self.processes["prometheus"].start()
        wait_for(lambda: httpx.get(self.prometheus_url + "/-/ready", timeout=2).status_code == 200, timeout=60,
                 what=lambda: f"prometheus ready; log:\n{self.processes['prometheus'].log()}")

    def stop_prometheus(self) -> None:
        self.processes["prometheus"].stop()

    def query(self, promql: str, *, start: float, end: float, step_s: float = 15.0) -> list[dict[str, Any]]:
        """A PromQL range query against the e2e Prometheus: its series, as the HTTP API gives them."""
        response = httpx.get(f"{self.prometheus_url}/api/v1/query_range", timeout=60,
                             params={"query": promql, "start": start, "end": end, "step": step_s})
        body = response.json()
        if body.get("status") != "success":
            raise AssertionError(f"Prometheus refused {promql!r}: {body.get('error')}")
        series: list[dict[str, Any]] = body["data"]["result"]
        return series

    def pod_targets(self) -> list[dict[str, Any]]:
        """Prometheus' active targets found by kubernetes_sd (its targets API): one per scraped pod."""
        body = httpx.get(f"{self.prometheus_url}/api/v1/targets", params={"state": "active"}, timeout=10).json()
        return [t for t in body["data"]["activeTargets"] if "__meta_kubernetes_pod_name" in t["discoveredLabels"]]

    # -- operator and planner ----------------------------------------------------------------------------

    @property
    def operator_metrics_port(self) -> int:
        return self.config.port_base + 91

    @property
    def planner_metrics_port(self) -> int:
        return self.config.port_base + 92

    @property
    def planner_metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.planner_metrics_port}/metrics"

    def crash_planner(self) -> None:
        """Kill the planner as a node failure would (no SIGTERM handler runs), then start a new one."""
        planner = self.processes["planner"]
        pid = planner.saved_pid()
        if pid is not None:
            os.killpg(pid, signal.SIGKILL)
        planner.stop(timeout=5)
        self._start_planner()

    def _start_operator(self) -> None:
        namespace, account = self.identities["operator"]
        kubeconfig = self.token_kubeconfig(namespace, account, "operator")
        self.processes["operator"] = ManagedProcess("operator", [
            str(FLEETPILOT), "operator", "run", "--metrics-port", str(self.operator_metrics_port)],
            state=self.state, env={**self._child_env(kubeconfig), "FLEETPILOT_RESYNC_SECONDS": "30"})
        self.processes["operator"].start()

    def _start_planner(self) -> None:
        namespace, account = self.identities["planner"]
        kubeconfig = self.token_kubeconfig(namespace, account, "planner")
        self.processes["planner"] = ManagedProcess("planner", [
            str(FLEETPILOT), "planner", "run", "--prometheus-url", self.prometheus_url,
            "--metrics-port", str(self.planner_metrics_port), *self.planner_args],
            state=self.state, env=self._child_env(kubeconfig))
        self.processes["planner"].start()

    # -- down --------------------------------------------------------------------------------------------

    def down(self, *, quiet: bool = False) -> None:
        """Stop every process by its saved PID (the pod runner kills its pods' processes), then the cluster."""
        for name in ("planner", "operator", "prometheus", "podrunner"):
            process = self.processes.get(name) or ManagedProcess(name, ["?"], state=self.state)
            process.stop()
            if not quiet:
                print(f"e2e: stopped {name}")
        if (self.state / "pods").is_dir():
            podrunner.reap(self.state / "pods")  # whatever a killed runner left
        self.cluster.down(quiet=True)

    def logs(self) -> dict[str, str]:
        return {name: process.log() for name, process in self.processes.items()}

    def errors_in_logs(self) -> list[str]:
        """Lines where our own code logged an unexpected error (tracebacks, ERROR from fleetpilot)."""
        found = []
        for name in ("operator", "planner"):
            process = self.processes.get(name)
            text = process.log(tail=10**9) if process else ""
            found += [f"{name}: {line}" for line in text.splitlines()
                      if "Traceback" in line or "ERROR fleetpilot" in line]
        return found


def prometheus_rbac() -> list[dict[str, Any]]:
    """Prometheus' identity: list and watch pods, nothing else."""
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "prometheus",
                                                                    "namespace": MONITORING_NAMESPACE}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "e2e-prometheus"},
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "e2e-prometheus"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "e2e-prometheus"},
         "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": MONITORING_NAMESPACE}]},
    ]


RULES = REPO / "charts" / "fleetpilot" / "rules" / "fleetpilot.rules.yaml"


def prometheus_config(*, kubeconfig: Path, operator: str, planner: str) -> dict[str, Any]:
    """What the Prometheus Operator makes of the chart's PodMonitor, ServiceMonitors and PrometheusRule.

    Pods: `kubernetes_sd_configs` (role pod) against the apiserver, kept when they carry
    fleetpilot.dev/graph (the PodMonitor's selector) on their `http` port, with the PodMonitor's
    relabelling (`graph`, `component`) after the Operator's own (`namespace`, `pod`, `container`,
    `job`). The operator and planner run as local processes here, not behind a Service: static
    targets with `honor_labels`, as their ServiceMonitors say, so the graph's `namespace` label stays.
    """

    def copy(source: str, target: str) -> dict[str, Any]:
        return {"source_labels": [source], "target_label": target}

    interval = f"{SCRAPE_INTERVAL_S}s"
    pods = {
        "job_name": "podMonitor/fleetpilot-system/fleetpilot-graphs/0",
        "kubernetes_sd_configs": [{"role": "pod", "kubeconfig_file": str(kubeconfig)}],
        "relabel_configs": [
            # The PodMonitor's selector: fleetpilot.dev/graph exists; ...
            {"source_labels": ["__meta_kubernetes_pod_labelpresent_fleetpilot_dev_graph"], "regex": "true",
             "action": "keep"},
            # ... its endpoint: the container port named `http` (frontend and engines serve /metrics there); ...
            {"source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": "http", "action": "keep"},
            # ... and, as the Operator adds, no finished pods.
            {"source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)", "action": "drop"},
            copy("__meta_kubernetes_namespace", "namespace"),
            copy("__meta_kubernetes_pod_container_name", "container"),
            copy("__meta_kubernetes_pod_name", "pod"),
            {"target_label": "job", "replacement": "fleetpilot-system/fleetpilot-graphs"},
            # The PodMonitor's own relabelings.
            copy("__meta_kubernetes_pod_label_fleetpilot_dev_graph", "graph"),
            copy("__meta_kubernetes_pod_label_fleetpilot_dev_component", "component"),
        ],
    }
    components = [{"job_name": f"serviceMonitor/fleetpilot-system/fleetpilot-{name}/0", "honor_labels": True,
                   "static_configs": [{"targets": [target], "labels": {"job": f"fleetpilot-{name}"}}]}
                  for name, target in (("operator", operator), ("planner", planner))]
    return {
        "global": {"scrape_interval": interval, "scrape_timeout": interval, "evaluation_interval": interval},
        "rule_files": [str(RULES)],
        "scrape_configs": [pods, *components],
    }
