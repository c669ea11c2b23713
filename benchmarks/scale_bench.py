"""The operator and the planner at scale on the real control plane (kwok nodes, 8 simulated GPUs each).

For each operator variant — this checkout, and with `--compare-rev REV` the operator of an earlier
commit, run in the same benchmark on the same cluster — and for each graph count:

1. **cold start**: N simulator graphs (4 pods each) are created while the operator is down; then it
   starts. Time until every graph's status is reconciled (`observedGeneration`) and until every graph
   is Ready (read from a watch on the graphs); the operator's peak RSS and CPU seconds; its API requests
   meanwhile; the CPU seconds of every control-plane process and how busy the machine's cores were, since
   here they all share them. The graphs sit in one namespace, or `--namespaces N` deals them over N (a
   namespace per team); `--controller-qps` raises kube-controller-manager's client rate limit. With
   `--foreign-pods`/`--foreign-configmaps` every cold start runs again in a cluster that also holds other
   teams' objects, and the two are compared (medians over `--repeats` cold starts each).
2. **at rest**: `--rest-seconds` with nothing changing. The operator's API requests, by verb and
   resource, from the apiserver's audit log (the operator runs as its own ServiceAccount, so its
   requests are told apart from kwok's, the controllers' and this script's).
3. **one scale under that load**: `kubectl scale dgc/... --replicas` (a PATCH of /scale, as kubectl
   sends) on random graphs, time until the Deployment's `spec.replicas` says so (p50 and p99 of
   `--scale-samples`).
4. **the planner** (this checkout only): every graph switched to `planner.mode: advisory` (constant
   predictor, 60-s interval), a real Prometheus scraping the frontend metric contract of every graph
   (one synthetic exporter, `--serve-contract`, writes the series N frontends would), and the live
   planner (`planner/live.py`, in this process) planning every graph once: its first interval (each
   graph's warm start reads its history too), then a steady one with batched queries, then the same
   with one set of queries per graph (how the planner asked before). Seconds for all graphs, and the
   Prometheus queries sent.

Run: `~/.cache/fleetpilot/venv/bin/python benchmarks/scale_bench.py --graphs 100,300,1000`
(about 10 minutes per graph count at 100 graphs with the default 5-minute rest window), or `--quick`
(10 graphs, 20-s rest: a smoke test of every phase, as CI runs it). The cluster's ports are
FLEETPILOT_CLUSTER_PORT_BASE (default 28100) + 500. Writes benchmarks/results/scale.json (or --out)
and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import concurrent.futures
import datetime
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from fleetpilot import informer, kube
from fleetpilot.api import contract
from fleetpilot.api import v1alpha1 as api
from fleetpilot.devcluster import cluster as devcluster
from fleetpilot.devcluster import processes
from fleetpilot.frontend import metrics as frontend_metrics

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
IDENTITY_NAMESPACE = "fleetpilot-system"
IDENTITY = "fleetpilot-operator"
USER = f"system:serviceaccount:{IDENTITY_NAMESPACE}:{IDENTITY}"
PODS_PER_GRAPH = 4  # frontend, 1 prefill, 2 decode
GPUS_PER_GRAPH = 3
DEFAULT_CONTROLLER_QPS = 20  # kube-controller-manager's --kube-api-qps when not set
#: Between the last graph turning Ready and the rest window: the Event the operator posts after the status
#: write that the watch saw belongs to the cold start.
REST_SETTLE_S = 5.0
RUN_LABEL = "scale-bench.fleetpilot.dev/run"  # on every graph of one measurement


def simulator_graph(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.GRAPH_KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "servedName": "llama-8b"},
            "engine": {"framework": "simulator"},
            "components": {"prefill": {"replicas": 1, "scaling": {"min": 1, "max": 4}},
                           "decode": {"replicas": 2, "scaling": {"min": 1, "max": 4}}},
        },
    }


class Api:
    """This script's own requests, as the cluster admin, with a user agent the audit count leaves out."""

    def __init__(self, cluster: devcluster.Cluster) -> None:
        self.http = cluster.client()
        self.http.timeout = httpx.Timeout(120.0)
        self.http.headers["User-Agent"] = "fleetpilot-scale-bench"

    def request(self, method: str, path: str, body: Any = None, ok: tuple[int, ...] = (200, 201)) -> Any:
        response = self.http.request(method, path, json=body)
        if response.status_code not in ok:
            raise RuntimeError(f"{method} {path}: {response.status_code} {response.text[:300]}")
        return response.json()

    def graphs(self, namespace: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.request(
            "GET", f"/apis/{api.API_VERSION}/namespaces/{namespace}/{api.GRAPH_PLURAL}")["items"]
        return items

    def pods(self, namespace: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.request("GET", f"/api/v1/namespaces/{namespace}/pods")["items"]
        return items


def wait_for_graphs(cluster: devcluster.Cluster, run: str, check: Callable[[list[dict[str, Any]]], bool], *,
                    timeout: float, what: str) -> float:
    """Seconds until `check(graphs of this run)` holds, read from a watch (`informer.Informer`).

    Polling for it — a LIST of every graph twice a second, 4 MB at 1,000 graphs, each read from etcd and
    encoded by the apiserver, then decoded here — loaded the apiserver, etcd and the two cores that the
    operator's writes go through, as the Deployment polling of the `/scale` samples did.
    """
    async def watch() -> float:
        start = time.monotonic()
        met = asyncio.Event()
        api_client = kube.KubeApi(kube.load_configuration(str(cluster.config.kubeconfig)))
        graphs = informer.Informer(api_client, api.GRAPH_KIND, labels={RUN_LABEL: run}, timeout_s=30,
                                   on_event=lambda _type, _obj: met.set() if check(graphs.store.objects()) else None)
        await graphs.start()
        try:
            await asyncio.wait_for(met.wait(), timeout)
        except TimeoutError:
            raise TimeoutError(f"benchmark: {what} not reached within {timeout:.0f}s") from None
        finally:
            await graphs.stop()
            await api_client.aclose()
        return time.monotonic() - start

    return asyncio.run(watch())


def control_plane_cpu(cluster: devcluster.Cluster) -> dict[str, float]:
    """CPU seconds so far of each control-plane process (etcd, apiserver, controller-manager, scheduler, kwok)."""
    seconds = {}
    for name in devcluster.Cluster.PROCESSES:
        pid = processes.alive(cluster.pids / f"{name}.pid")
        if pid is not None:
            seconds[name] = process_stats(pid)[1]
    return seconds


def machine_busy_seconds() -> float:
    """CPU seconds every core of this machine has spent busy since boot (all but idle and iowait)."""
    fields = [int(f) for f in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def wait(check: Any, *, timeout: float, interval: float = 0.5, what: str = "condition") -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if check():
            return time.monotonic() - start
        time.sleep(interval)
    raise TimeoutError(f"benchmark: {what} not reached within {timeout:.0f}s")


def operator_identity(cluster: devcluster.Cluster, client: Api, folder: Path) -> Path:
    """A ServiceAccount bound to cluster-admin (the bench measures requests, not RBAC) and a kubeconfig for it."""
    client.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                  "metadata": {"name": IDENTITY_NAMESPACE}}, ok=(201, 409))
    client.request("POST", f"/api/v1/namespaces/{IDENTITY_NAMESPACE}/serviceaccounts",
                   {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": IDENTITY}}, ok=(201, 409))
    client.request("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "fleetpilot-scale-bench"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": IDENTITY, "namespace": IDENTITY_NAMESPACE}],
    }, ok=(201, 409))
    token = client.request(
        "POST", f"/api/v1/namespaces/{IDENTITY_NAMESPACE}/serviceaccounts/{IDENTITY}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 86400}},
    )["status"]["token"]
    admin = yaml.safe_load(cluster.config.kubeconfig.read_text())
    path = folder / "operator.kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "bench",
        "clusters": [{"name": "bench", "cluster": admin["clusters"][0]["cluster"]}],
        "users": [{"name": USER, "user": {"token": token}}],
        "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": USER}}],
    }))
    path.chmod(0o600)
    return path


@dataclass
class Variant:
    """An operator to measure: this checkout, or an earlier commit unpacked beside it."""

    label: str
    pythonpath: str | None = None  # a tree laid out as the installed package, for an earlier commit
    crds: Path | None = None  # that commit's CRDs: its operator parses graphs with that commit's models

    def command(self) -> list[str]:
        if self.pythonpath is None:
            return [str(Path(sys.executable).parent / "fleetpilot"), "operator", "run", "--metrics-port", "0"]
        return [sys.executable, "-c", "import sys; from fleetpilot.cli import main; sys.exit(main())",
                "operator", "run", "--metrics-port", "0"]


def unpack_rev(rev: str, folder: Path) -> Variant:
    """`git archive REV`, laid out as the installed package (operator/ and planner/ inside fleetpilot/)."""
    source = folder / f"src-{rev}"
    source.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive, check=True)
    tree = folder / f"tree-{rev}"
    package = tree / "fleetpilot"
    package.mkdir(parents=True)
    for entry in (source / "fleetpilot").iterdir():
        (package / entry.name).symlink_to(entry)
    (package / "operator").symlink_to(source / "operator")
    (package / "planner").symlink_to(source / "planner")
    return Variant(label=rev, pythonpath=str(tree), crds=source / "crds")


def process_stats(pid: int) -> tuple[float, float]:
    """(peak RSS in MB, CPU seconds) of a live process."""
    rss = float("nan")
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            rss = int(line.split()[1]) / 1024
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return rss, cpu


@dataclass
class AuditCount:
    """Requests one user made in a time window, from the apiserver's audit log."""

    total: int = 0
    by_call: collections.Counter[str] = field(default_factory=collections.Counter)
    #: LISTs and WATCHes with no labelSelector, by resource: the API server sends every object of the kind.
    unselected: collections.Counter[str] = field(default_factory=collections.Counter)

    def per_second(self, seconds: float) -> float:
        return self.total / seconds if seconds > 0 else math.nan


def count_requests(audit_logs: list[Path], *, user: str, start: datetime.datetime,
                   end: datetime.datetime) -> AuditCount:
    """Requests (one per auditID) whose user is `user` and that the apiserver received in [start, end),
    over the audit log and its rotated parts."""
    seen: set[str] = set()
    count = AuditCount()
    for path in audit_logs:
        with path.open() as lines:
            for line in lines:
                event = json.loads(line)
                if event.get("user", {}).get("username") != user or event["auditID"] in seen:
                    continue
                received = datetime.datetime.fromisoformat(event["requestReceivedTimestamp"])
                if not start <= received < end:
                    continue
                seen.add(event["auditID"])
                ref = event.get("objectRef", {})
                resource = ref.get("resource", "?") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
                count.total += 1
                count.by_call[f"{event['verb']} {resource}"] += 1
                if event["verb"] in ("list", "watch") and "labelSelector=" not in event.get("requestURI", ""):
                    count.unselected[resource] += 1
    return count


def utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


# -- the planner phase: N graphs' metric contract in a real Prometheus ---------------------------------

CONTRACT_HISTOGRAMS = {
    # name: (buckets, the value every observation has)
    "fleetpilot_frontend_time_to_first_token_seconds": (frontend_metrics.LATENCY_BUCKETS, 0.2),
    "fleetpilot_frontend_prefill_seconds": (frontend_metrics.LATENCY_BUCKETS, 0.15),
    "fleetpilot_frontend_inter_token_latency_seconds": (frontend_metrics.LATENCY_BUCKETS, 0.02),
    "fleetpilot_frontend_arrival_burst_rps": (frontend_metrics.RATE_BUCKETS, 3.0),
    "fleetpilot_frontend_input_tokens": (frontend_metrics.TOKEN_BUCKETS, 2000.0),
    "fleetpilot_frontend_output_tokens": (frontend_metrics.TOKEN_BUCKETS, 200.0),
}


def contract_exposition(namespace: str, graphs: int, *, now: float) -> str:
    """The metric contract as N frontends export it (what the planner queries), in the text format: graph i
    takes 0.5 + (i mod 10) / 2 requests/s, every request the same lengths and latencies."""
    lines: list[str] = []
    for i in range(graphs):
        labels = f'namespace="{namespace}",graph="g{i:04d}",model="llama-8b"'
        count = (0.5 + (i % 10) / 2) * now
        lines.append(f"fleetpilot_frontend_requests_started_total{{{labels}}} {count:.3f}")
        for phase in ("prefill", "first_token", "decoding"):
            lines.append(f'{contract.PHASE_METRIC}{{{labels},phase="{phase}"}} 1')
        for name, (buckets, value) in CONTRACT_HISTOGRAMS.items():
            for bound in buckets:
                le = "+Inf" if math.isinf(bound) else repr(float(bound))
                lines.append(f'{name}_bucket{{{labels},le="{le}"}} {count if value <= bound else 0:.3f}')
            if not math.isinf(buckets[-1]):
                lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {count:.3f}')
            lines.append(f"{name}_sum{{{labels}}} {count * value:.3f}")
            lines.append(f"{name}_count{{{labels}}} {count:.3f}")
    return "\n".join(lines) + "\n"


def serve_contract(port: int, namespace: str, graphs: int) -> int:
    """`--serve-contract`: answer scrapes with `contract_exposition` until killed."""
    import http.server

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = contract_exposition(namespace, graphs, now=time.time()).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
    return 0


class PlannerStage:
    """The synthetic exporter and a real Prometheus scraping it (every `scrape_s`, labels kept as exported)."""

    def __init__(self, folder: Path, *, namespace: str, graphs: int, port_base: int, scrape_s: int) -> None:
        self.folder = folder
        self.exporter_port, self.port = port_base + 91, port_base + 90
        self.url = f"http://127.0.0.1:{self.port}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": f"{scrape_s}s", "scrape_timeout": f"{scrape_s}s"},
            "scrape_configs": [{"job_name": "frontends", "honor_labels": True,
                                "static_configs": [{"targets": [f"127.0.0.1:{self.exporter_port}"]}]}]}))
        log = (folder / "exporter.log").open("wb")
        self.exporter = subprocess.Popen(
            [sys.executable, __file__, "--serve-contract", str(self.exporter_port), "--namespace", namespace,
             "--graphs", str(graphs)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.prometheus = subprocess.Popen(
            [str(devcluster.prometheus_bin()), f"--config.file={folder / 'prometheus.yml'}",
             f"--storage.tsdb.path={folder / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=(folder / "prometheus.log").open("wb"), stderr=subprocess.STDOUT, start_new_session=True)

    def wait_for_series(self, graphs: int, *, timeout: float = 600) -> None:
        """Until rate() answers for every graph (two scrapes in the window)."""
        def answered() -> bool:
            try:
                found = httpx.get(f"{self.url}/api/v1/query", timeout=30, params={
                    "query": "count(sum by (graph) (rate(fleetpilot_frontend_requests_started_total[60s])) > 0)"})
                result = found.json()["data"]["result"]
                return bool(result) and int(float(result[0]["value"][1])) >= graphs
            except (httpx.HTTPError, KeyError, ValueError):
                return False
        wait(answered, timeout=timeout, interval=2, what=f"Prometheus to hold {graphs} graphs' series")

    def stop(self) -> None:
        for process in (self.prometheus, self.exporter):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()


class PerGraph:
    """The planner's observer as it was before batches: one set of queries per graph (no `observe_many`)."""

    def __init__(self, observer: Any) -> None:
        self.inner = observer
        self.url = observer.url

    def observe(self, **kwargs: Any) -> Any:
        return self.inner.observe(**kwargs)

    def history(self, **kwargs: Any) -> Any:
        return self.inner.history(**kwargs)


async def plan_every_graph(planner: Any, observer: Any) -> dict[str, float]:
    """One tick with every graph due: seconds, graphs planned from data, Prometheus queries sent."""
    for kept in planner.planned.values():
        kept.next_plan = 0.0
    sent = observer.queries_sent
    seen = {key: len(kept.state.memory.rates) for key, kept in planner.planned.items()}
    started = time.monotonic()
    await planner.tick()
    took = time.monotonic() - started
    planned = sum(1 for key, kept in planner.planned.items() if len(kept.state.memory.rates) > seen.get(key, 0))
    return {"seconds": round(took, 1), "graphs_with_data": planned, "queries": observer.queries_sent - sent}


def measure_planner(*, cluster: devcluster.Cluster, client: Api, namespace: str, graphs: int, folder: Path,
                    scrape_s: int) -> dict[str, Any]:
    """Switch every graph to advisory planning and time the live planner over all of them (see module doc)."""
    from fleetpilot.planner import live, observe

    for i in range(graphs):
        client.http.patch(f"/apis/{api.API_VERSION}/namespaces/{namespace}/{api.GRAPH_PLURAL}/g{i:04d}",
                          json={"spec": {"planner": {"mode": "advisory", "predictor": "constant",
                                                     "intervalSeconds": 60, "fastPathSeconds": 0,
                                                     "sla": {"ttftMs": 500, "itlMs": 50}}}},
                          headers={"Content-Type": "application/merge-patch+json"}).raise_for_status()
    stage = PlannerStage(folder, namespace=namespace, graphs=graphs, port_base=cluster.config.port_base,
                         scrape_s=scrape_s)
    try:
        stage.wait_for_series(graphs)

        async def run() -> dict[str, Any]:
            api_client = kube.KubeApi(kube.load_configuration(str(cluster.config.kubeconfig)),
                                      field_manager=contract.PLANNER)
            observer = observe.PrometheusObserver(stage.url, timeout_s=60)
            planner = live.LivePlanner(api_client, observer, namespaces=[namespace])
            try:
                await planner.sync()
                first = await plan_every_graph(planner, observer)
                batched = await plan_every_graph(planner, observer)
                planner.observer = PerGraph(observer)
                per_graph = await plan_every_graph(planner, observer)
                return {"first_interval": first, "batched": batched, "per_graph": per_graph}
            finally:
                await planner.close()
                await api_client.aclose()

        return asyncio.run(run())
    finally:
        stage.stop()


FOREIGN_NAMESPACE = "other-teams"


def fill_foreign(client: Api, *, pods: int, configmaps: int, workers: int = 16) -> float:
    """Other teams' objects, none of them the operator's: `pods` Pods held before scheduling (a scheduling
    gate: no node runs them, the scheduler only queues them) and `configmaps` ConfigMaps of 1 KiB, in
    FOREIGN_NAMESPACE. Returns the seconds it took."""
    started = time.monotonic()
    client.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                  "metadata": {"name": FOREIGN_NAMESPACE}})

    def pod(i: int) -> None:
        client.request("POST", f"/api/v1/namespaces/{FOREIGN_NAMESPACE}/pods", {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"web-{i:06d}", "labels": {"app.kubernetes.io/name": "web", "team": f"t{i % 50}"}},
            "spec": {"schedulingGates": [{"name": "example.com/hold"}],
                     "containers": [{"name": "web", "image": "nginx:1.27", "ports": [{"containerPort": 80}],
                                     "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]}})

    def configmap(i: int) -> None:
        client.request("POST", f"/api/v1/namespaces/{FOREIGN_NAMESPACE}/configmaps", {
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": f"settings-{i:06d}", "labels": {"team": f"t{i % 50}"}},
            "data": {"settings.yaml": "x" * 1024}})

    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        list(pool.map(pod, range(pods)))
        list(pool.map(configmap, range(configmaps)))
    return time.monotonic() - started


def install_crds(cluster: devcluster.Cluster, folder: Path) -> None:
    env = {**os.environ, "KUBECONFIG": str(cluster.config.kubeconfig)}
    kubectl = str(devcluster.k8s_bin("kubectl"))
    subprocess.run([kubectl, "apply", "--server-side", "--force-conflicts", "-f", str(folder)], env=env, check=True,
                   capture_output=True)
    subprocess.run([kubectl, "wait", "--for", "condition=Established", "crd", "--all"], env=env, check=True,
                   capture_output=True)


def measure(variant: Variant, *, cluster: devcluster.Cluster, client: Api, kubeconfig: Path, graphs: int,
            rest_seconds: float, scale_samples: int, log_dir: Path, planner: bool = False,
            scrape_s: int = 15, namespaces_n: int = 1) -> dict[str, Any]:
    run = uuid.uuid4().hex[:6]
    # One namespace, or graphs dealt round-robin over several (a namespace per team): the controller-manager's
    # controllers match selectors against every object of a namespace, so the layout changes their cost.
    namespaces = [f"scale-{run}"] if namespaces_n == 1 else [f"scale-{run}-{j:03d}" for j in range(namespaces_n)]
    namespace_of = [namespaces[i % namespaces_n] for i in range(graphs)]
    namespace = namespaces[0]
    # An earlier commit's operator parses graphs with its own models (unknown fields refused): serve it the
    # CRDs of its time, so the apiserver defaults no field it does not know.
    install_crds(cluster, variant.crds or REPO / "crds")
    for name in namespaces:
        client.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                      "metadata": {"name": name}})
    for i in range(graphs):
        manifest = simulator_graph(f"g{i:04d}", namespace_of[i])
        manifest["metadata"]["labels"] = {RUN_LABEL: run}
        client.request("POST", f"/apis/{api.API_VERSION}/namespaces/{namespace_of[i]}/{api.GRAPH_PLURAL}", manifest)

    def reconciled(items: list[dict[str, Any]]) -> bool:
        return len(items) == graphs and all(
            g.get("status", {}).get("observedGeneration") == g["metadata"]["generation"] for g in items)

    def all_ready(items: list[dict[str, Any]]) -> bool:
        return all(any(c["type"] == "Ready" and c["status"] == "True" for c in g.get("status", {}).get("conditions", []))
                   for g in items)

    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    if variant.pythonpath:
        env["PYTHONPATH"] = variant.pythonpath
    log = (log_dir / f"operator-{variant.label}-{graphs}.log").open("wb")
    operator = subprocess.Popen(variant.command(), stdout=log, stderr=subprocess.STDOUT, env=env,
                                cwd=tempfile.gettempdir(), start_new_session=True)
    cold_start = utcnow()
    started = time.monotonic()
    control_plane_before, busy_before = control_plane_cpu(cluster), machine_busy_seconds()
    try:
        wait_for_graphs(cluster, run, reconciled, timeout=3600, what="all graphs reconciled")
        t_reconciled = time.monotonic() - started
        wait_for_graphs(cluster, run, all_ready, timeout=3600, what="all graphs Ready")
        t_ready = time.monotonic() - started
        cold_end = utcnow()
        _, cpu_cold = process_stats(operator.pid)
        control_plane = {name: round(seconds - control_plane_before.get(name, 0.0), 1)
                         for name, seconds in control_plane_cpu(cluster).items()}
        machine_busy = (machine_busy_seconds() - busy_before) / (t_ready * (os.cpu_count() or 1))
        print(f"  [{variant.label}] {graphs} graphs: reconciled {t_reconciled:.1f}s, Ready {t_ready:.1f}s;"
              f" at rest for {rest_seconds:.0f}s", flush=True)

        time.sleep(REST_SETTLE_S)
        rest_start = utcnow()
        time.sleep(rest_seconds)
        rest_end = utcnow()
        rss, cpu_rest_end = process_stats(operator.pid)

        scale_times = []
        rng = random.Random(graphs)
        for sample in range(scale_samples):
            index = rng.randrange(graphs)
            graph, graph_namespace = f"g{index:04d}", namespace_of[index]
            replicas = 2 + sample % 2
            # The prefill Deployment of the graph's (one) generation, <graph>-prefill-<generation>, found
            # before the clock starts; then polled by name. (A label-selector LIST every 20 ms is a quorum read
            # of every Deployment in the namespace from etcd: at 1,000 graphs the polling itself loaded the
            # apiserver and etcd that the operator's write goes through.)
            listed = client.request("GET", f"/apis/apps/v1/namespaces/{graph_namespace}/deployments?labelSelector="
                                    f"fleetpilot.dev/graph={graph},fleetpilot.dev/component=prefill")["items"]
            assert len(listed) == 1, f"{graph}: {len(listed)} prefill Deployments"
            deployment = listed[0]["metadata"]["name"]
            start = time.monotonic()
            client.http.patch(f"/apis/{api.API_VERSION}/namespaces/{graph_namespace}/{api.COMPONENT_PLURAL}/"
                              f"{graph}-prefill/scale", json={"spec": {"replicas": replicas}},
                              headers={"Content-Type": "application/merge-patch+json"}).raise_for_status()

            def updated(deployment: str = deployment, replicas: int = replicas, where: str = graph_namespace) -> bool:
                found = client.request("GET", f"/apis/apps/v1/namespaces/{where}/deployments/{deployment}")
                return int(found["spec"]["replicas"]) == replicas

            wait(updated, timeout=120, interval=0.02, what=f"{graph}-prefill scaled to {replicas}")
            scale_times.append(time.monotonic() - start)
    finally:
        operator.terminate()
        try:
            operator.wait(timeout=30)
        except subprocess.TimeoutExpired:
            operator.kill()
    time.sleep(2)  # the audit log is written in batches, at most a second late
    cold = count_requests(cluster.audit_logs(), user=USER, start=cold_start, end=cold_end)
    rest = count_requests(cluster.audit_logs(), user=USER, start=rest_start, end=rest_end)
    planning = None
    if planner:
        print(f"  [{variant.label}] {graphs} graphs: the planner over all of them", flush=True)
        planning = measure_planner(cluster=cluster, client=client, namespace=namespace, graphs=graphs,
                                   folder=log_dir / f"planner-{graphs}", scrape_s=scrape_s)
    for name in namespaces:
        client.request("DELETE", f"/api/v1/namespaces/{name}")
    for name in namespaces:
        wait(lambda name=name: not client.pods(name), timeout=1800, what=f"pods of {name} gone")
    scale_times.sort()
    return {
        "variant": variant.label,
        "graphs": graphs,
        "pods": graphs * PODS_PER_GRAPH,
        "namespaces": namespaces_n,
        "windows": {"cold": [cold_start.isoformat(), cold_end.isoformat()],
                    "rest": [rest_start.isoformat(), rest_end.isoformat()]},
        "all_reconciled_s": round(t_reconciled, 1),
        "all_ready_s": round(t_ready, 1),
        "peak_rss_mb": round(rss, 1),
        "cpu_seconds_cold": round(cpu_cold, 1),
        "cpu_seconds_at_rest": round(cpu_rest_end - cpu_cold, 1),
        # Until all Ready: who else used the cores the operator shares (this machine runs the whole cluster).
        "control_plane_cpu_seconds_cold": control_plane,
        "machine_busy_cold": round(machine_busy, 3),
        "api_requests_cold": cold.total,
        "api_requests_cold_per_s": round(cold.per_second((cold_end - cold_start).total_seconds()), 2),
        "rest_seconds": rest_seconds,
        "api_requests_at_rest": rest.total,
        "api_requests_at_rest_per_s": round(rest.per_second(rest_seconds), 3),
        "at_rest_by_call": dict(rest.by_call.most_common()),
        "unselected_list_watch_cold": dict(cold.unselected.most_common()),
        "scale_reflected_p50_s": round(statistics.median(scale_times), 3) if scale_times else None,
        "scale_reflected_p99_s": round(scale_times[min(len(scale_times) - 1, math.ceil(0.99 * len(scale_times)) - 1)], 3)
        if scale_times else None,
        "planner": planning,
    }


def planner_only(*, cluster: devcluster.Cluster, client: Api, graphs: int, log_dir: Path,
                 scrape_s: int) -> dict[str, Any]:
    """`--planner-only`: N graphs (no operator: no pods, no components) and the planner phase over them."""
    install_crds(cluster, REPO / "crds")
    namespace = f"plan-{uuid.uuid4().hex[:6]}"
    client.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                  "metadata": {"name": namespace}})
    for i in range(graphs):
        client.request("POST", f"/apis/{api.API_VERSION}/namespaces/{namespace}/{api.GRAPH_PLURAL}",
                       simulator_graph(f"g{i:04d}", namespace))
    try:
        planning = measure_planner(cluster=cluster, client=client, namespace=namespace, graphs=graphs,
                                   folder=log_dir / f"planner-only-{graphs}", scrape_s=scrape_s)
    finally:
        client.request("DELETE", f"/api/v1/namespaces/{namespace}")
    return {"variant": "planner only", "graphs": graphs, "planner": planning}


def print_foreign(rows: list[dict[str, Any]]) -> None:
    """Each operator's figures in the crowded cluster as a ratio to the same graphs in the empty one: the median
    of each figure over the `--repeats` cold starts of each cluster."""
    def crowded(row: dict[str, Any]) -> bool:
        return bool(row.get("foreign", {}).get("pods") or row.get("foreign", {}).get("configmaps"))

    for variant, graphs in sorted({(r["variant"], r["graphs"]) for r in rows if crowded(r)}):
        alike = [r for r in rows if r["variant"] == variant and r["graphs"] == graphs]
        empty, full = [r for r in alike if not crowded(r)], [r for r in alike if crowded(r)]
        if not empty:
            continue
        figures = [(name, statistics.median(r[key] for r in empty), statistics.median(r[key] for r in full))
                   for name, key in [("peak RSS MB", "peak_rss_mb"), ("CPU-s cold", "cpu_seconds_cold"),
                                     ("CPU-s at rest", "cpu_seconds_at_rest"), ("requests cold", "api_requests_cold"),
                                     ("requests/s at rest", "api_requests_at_rest_per_s")]]
        foreign = full[0]["foreign"]
        print(f"  {variant}, {graphs} graphs, empty cluster vs {foreign['pods']} foreign pods and"
              f" {foreign['configmaps']} configmaps (median of {len(empty)} and {len(full)} cold starts): " + "; ".join(
                  f"{name} {a:g} -> {b:g} ({b / a:.2f}x)" if a else f"{name} {a:g} -> {b:g}" for name, a, b in figures))
        unselected = sorted({kind for r in full for kind in r["unselected_list_watch_cold"]})
        print(f"    LIST/WATCH without a labelSelector at cold start: {', '.join(unselected) or 'none'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--graphs", default="100", help="comma-separated graph counts (default 100)")
    parser.add_argument("--rest-seconds", type=float, default=300.0)
    parser.add_argument("--scale-samples", type=int, default=20)
    parser.add_argument("--scrape-seconds", type=int, default=15, help="Prometheus' scrape interval (planner phase)")
    parser.add_argument("--no-planner", action="store_true", help="skip the planner phase")
    parser.add_argument("--planner-only", action="store_true",
                        help="only the planner phase, on graphs that have no pods (no operator runs)")
    parser.add_argument("--quick", action="store_true", help="10 graphs, 20-s rest, 5 scale samples (CI)")
    parser.add_argument("--compare-rev", default=None, help="also measure the operator of this git revision")
    parser.add_argument("--compare-graphs", default=None,
                        help="graph counts at which to measure --compare-rev too (default: all of --graphs)")
    parser.add_argument("--only-rev", action="store_true", help="measure only --compare-rev, not this checkout")
    parser.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/scale.json, or"
                        " scale-quick.json in the system's temporary folder with --quick")
    parser.add_argument("--keep", action="store_true", help="leave the bench cluster running")
    parser.add_argument("--namespaces", type=int, default=1,
                        help="deal the graphs round-robin over this many namespaces (a namespace per team; needs"
                             " --no-planner when above 1)")
    parser.add_argument("--controller-qps", type=int, default=None,
                        help="kube-controller-manager's --kube-api-qps (burst twice that); default: Kubernetes' 20")
    parser.add_argument("--foreign-pods", type=int, default=0,
                        help="measure again after creating this many Pods of other teams (and --foreign-configmaps)")
    parser.add_argument("--foreign-configmaps", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=1,
                        help="cold starts of each variant and graph count in each cluster (the comparison takes medians)")
    parser.add_argument("--serve-contract", type=int, default=None, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--namespace", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_contract is not None:
        return serve_contract(args.serve_contract, args.namespace, int(args.graphs))
    if args.namespaces > 1 and not args.no_planner and not args.planner_only:
        parser.error("--namespaces above 1 needs --no-planner: the planner phase reads one namespace")
    if args.quick:
        args.graphs, args.rest_seconds, args.scale_samples, args.scrape_seconds = "10", 20.0, 5, 5
    out = args.out or (Path(tempfile.gettempdir()) / "scale-quick.json" if args.quick else RESULTS / "scale.json")
    counts = [int(n) for n in args.graphs.split(",")]

    nodes = math.ceil(max(counts) * GPUS_PER_GRAPH / 8) + 2
    port_base = int(os.environ.get("FLEETPILOT_CLUSTER_PORT_BASE", "28100")) + 500
    # Hundreds of kwok nodes on a shared machine renew their leases late: a node declared NotReady has its
    # pods marked not Ready for good (kwok sets Ready once), and the run would wait for them forever.
    config = devcluster.ClusterConfig(name="scale", port_base=port_base, nodes=nodes, audit_log=True,
                                      node_monitor_grace_s=600, controller_qps=args.controller_qps)
    cluster = devcluster.Cluster(config)
    cluster.up(fresh=True)
    client = Api(cluster)
    rows = []
    with tempfile.TemporaryDirectory(prefix="scale-bench-") as scratch:
        kubeconfig = operator_identity(cluster, client, Path(scratch))
        variants = [] if args.only_rev else [Variant(label="this checkout")]
        if args.compare_rev:
            variants.append(unpack_rev(args.compare_rev, Path(scratch)))
        try:
            compare_at = {int(n) for n in args.compare_graphs.split(",")} if args.compare_graphs else set(counts)
            for graphs in counts if args.planner_only else []:
                rows.append(planner_only(cluster=cluster, client=client, graphs=graphs, log_dir=config.folder / "logs",
                                         scrape_s=args.scrape_seconds))
                print(f"  {json.dumps(rows[-1])}", flush=True)
            # The cluster empty but for the graphs; then, with --foreign-pods/--foreign-configmaps, the same again
            # in a cluster that also holds other teams' objects.
            crowds = [(0, 0)] + ([(args.foreign_pods, args.foreign_configmaps)]
                                 if args.foreign_pods or args.foreign_configmaps else [])
            for foreign_pods, foreign_configmaps in [] if args.planner_only else crowds:
                if foreign_pods or foreign_configmaps:
                    took = fill_foreign(client, pods=foreign_pods, configmaps=foreign_configmaps)
                    print(f"  {foreign_pods} foreign pods and {foreign_configmaps} foreign configmaps made in"
                          f" {took:.0f}s", flush=True)
                for graphs in [n for n in counts for _ in range(args.repeats)]:
                    for variant in variants:
                        if variant.pythonpath is not None and graphs not in compare_at:
                            continue
                        rows.append(measure(variant, cluster=cluster, client=client, kubeconfig=kubeconfig,
                                            graphs=graphs, rest_seconds=args.rest_seconds,
                                            scale_samples=args.scale_samples, log_dir=config.folder / "logs",
                                            planner=not args.no_planner and variant.pythonpath is None,
                                            scrape_s=args.scrape_seconds, namespaces_n=args.namespaces))
                        rows[-1]["controller_manager_qps"] = args.controller_qps or DEFAULT_CONTROLLER_QPS
                        rows[-1]["foreign"] = {"pods": foreign_pods, "configmaps": foreign_configmaps}
                        out.parent.mkdir(parents=True, exist_ok=True)
                        out.write_text(json.dumps({"rows": rows}, indent=2) + "\n")  # a long run keeps its rows
                        print(f"  {json.dumps(rows[-1])}", flush=True)
        finally:
            if not args.keep:
                cluster.down(quiet=True)

    if args.planner_only:
        out.write_text(json.dumps({"rows": rows}, indent=2) + "\n")
        print(f"\nwrote {out}")
        return 0
    print_foreign(rows)
    header = (f"{'operator':16} {'graphs':>6} {'reconciled':>10} {'Ready':>7} {'RSS MB':>7} {'CPU cold':>8}"
              f" {'req cold':>8} {'req/s rest':>10} {'scale p50':>9} {'scale p99':>9}")
    print("\n" + header)
    for row in rows:
        print(f"{row['variant']:16} {row['graphs']:>6} {row['all_reconciled_s']:>9.1f}s {row['all_ready_s']:>6.1f}s"
              f" {row['peak_rss_mb']:>7.0f} {row['cpu_seconds_cold']:>7.1f}s {row['api_requests_cold']:>8}"
              f" {row['api_requests_at_rest_per_s']:>10.3f} {row['scale_reflected_p50_s']:>8.2f}s"
              f" {row['scale_reflected_p99_s']:>8.2f}s")
    for row in rows:
        others = ", ".join(f"{name} {seconds:.0f}" for name, seconds in row["control_plane_cpu_seconds_cold"].items())
        print(f"  cold start, {row['variant']} with {row['graphs']} graphs in {row['namespaces']} namespace(s)"
              f" (controller-manager at "
              f"{row['controller_manager_qps']} requests/s): the machine's cores "
              f"{100 * row['machine_busy_cold']:.0f}% busy; control plane CPU-s: {others}")
    for row in rows:
        calls = ", ".join(f"{call} {n}" for call, n in row["at_rest_by_call"].items()) or "none"
        print(f"  at rest, {row['variant']} with {row['graphs']} graphs over {row['rest_seconds']:.0f}s: {calls}")
    for row in rows:
        if row.get("planner"):
            print(f"  planner, {row['graphs']} graphs: " + "; ".join(
                f"{phase} {figures['seconds']}s, {figures['queries']} queries, {figures['graphs_with_data']} with data"
                for phase, figures in row["planner"].items()))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rows": rows}, indent=2) + "\n")
    print(f"\nwrote {out}")
    failed = [row["graphs"] for row in rows if row.get("planner") and
              row["planner"]["batched"]["graphs_with_data"] < row["graphs"]]
    if failed:
        print(f"scale_bench: the planner did not see every graph's metrics at {failed} graphs", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
