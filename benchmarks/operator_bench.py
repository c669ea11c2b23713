"""Operator benchmark on the real control plane, each figure beside a same-run baseline.

1. apply → all pods Running, for a 3-component simulator graph (median of N), against the same
   Deployments applied directly (what Kubernetes alone needs: scheduler, controllers, kwok).
2. 100 graphs created while the operator is down, then the operator started cold: time until
   every graph's status is reconciled and until every graph is Ready, and the operator's peak RSS;
   against the rendered objects of the same 100 graphs applied directly.

Run: `~/.cache/fleetpilot/venv/bin/python benchmarks/operator_bench.py` (about 3-4 minutes).
Writes benchmarks/results/operator.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from fleetpilot.api import v1alpha1 as api
from fleetpilot.devcluster import cluster as devcluster
from fleetpilot.operator import render

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"


def simulator_graph(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.GRAPH_KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "servedName": "llama-8b"},
            "engine": {"framework": "simulator"},
            "components": {"prefill": {"replicas": 1}, "decode": {"replicas": 2}},
        },
    }


def rendered_without_operator(name: str, namespace: str) -> list[dict[str, Any]]:
    """The same workload objects the operator would make, with no owner: the baseline."""
    body = simulator_graph(name, namespace)
    body["metadata"]["uid"] = "baseline"
    graph = api.DynamoGraph.model_validate(body)
    objects = []
    for component in render.components_of(graph):
        owner = render.OwnerRef("v1", "ConfigMap", "unused", "unused")
        for manifest in render.workload(graph, component, replicas=render.initial_replicas(graph, component),
                                        owner=owner, settings=render.RenderSettings()):
            manifest["metadata"].pop("ownerReferences")
            objects.append(manifest)
    return objects


class Api:
    def __init__(self, cluster: devcluster.Cluster) -> None:
        self.http = cluster.client()
        self.http.timeout = httpx.Timeout(60.0)

    def create(self, path: str, body: dict[str, Any]) -> None:
        response = self.http.post(path, json=body)
        if response.status_code not in (200, 201):
            raise RuntimeError(f"POST {path}: {response.status_code} {response.text[:300]}")

    def namespace(self, name: str) -> None:
        self.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

    def pods(self, namespace: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.http.get(f"/api/v1/namespaces/{namespace}/pods").json()["items"]
        return items

    def graphs(self, namespace: str) -> list[dict[str, Any]]:
        path = f"/apis/{api.API_VERSION}/namespaces/{namespace}/{api.GRAPH_PLURAL}"
        items: list[dict[str, Any]] = self.http.get(path).json()["items"]
        return items

    def apply_objects(self, objects: list[dict[str, Any]]) -> None:
        paths = {"Deployment": "apis/apps/v1", "Service": "api/v1", "PodDisruptionBudget": "apis/policy/v1",
                 "ServiceAccount": "api/v1", "Role": "apis/rbac.authorization.k8s.io/v1",
                 "RoleBinding": "apis/rbac.authorization.k8s.io/v1"}
        plurals = {"Deployment": "deployments", "Service": "services", "PodDisruptionBudget": "poddisruptionbudgets",
                   "ServiceAccount": "serviceaccounts", "Role": "roles", "RoleBinding": "rolebindings"}
        for obj in objects:
            ns = obj["metadata"]["namespace"]
            self.create(f"/{paths[obj['kind']]}/namespaces/{ns}/{plurals[obj['kind']]}", obj)

    def create_graph(self, body: dict[str, Any]) -> None:
        ns = body["metadata"]["namespace"]
        self.create(f"/apis/{api.API_VERSION}/namespaces/{ns}/{api.GRAPH_PLURAL}", body)

    def delete_namespace(self, name: str) -> None:
        self.http.delete(f"/api/v1/namespaces/{name}")


def running(pods: list[dict[str, Any]], expected: int) -> bool:
    up = [p for p in pods if p.get("status", {}).get("phase") == "Running"
          and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))]
    return len(up) >= expected


def wait(check: Any, *, timeout: float, interval: float = 0.05) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if check():
            return time.monotonic() - start
        time.sleep(interval)
    raise TimeoutError(f"benchmark condition not met within {timeout}s")


def start_operator(kubeconfig: Path, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [str(Path(sys.executable).parent / "fleetpilot"), "operator", "run", "--metrics-port", "0"],
        stdout=log.open("wb"), stderr=subprocess.STDOUT,
        env={**os.environ, "KUBECONFIG": str(kubeconfig)},
    )


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def bench_latency(client: Api, kubeconfig: Path, runs: int, log_dir: Path) -> dict[str, Any]:
    operator_times, baseline_times = [], []
    operator = start_operator(kubeconfig, log_dir / "operator-latency.log")
    try:
        time.sleep(3)  # let kopf's watches start; not part of any figure
        for i in range(runs):
            ns = f"lat-{uuid.uuid4().hex[:6]}"
            client.namespace(ns)
            time.sleep(0.5)  # the namespace's default ServiceAccount
            start = time.monotonic()
            client.create_graph(simulator_graph(f"g{i}", ns))
            wait(lambda ns=ns: running(client.pods(ns), 4), timeout=120)
            operator_times.append(time.monotonic() - start)

            bns = f"base-{uuid.uuid4().hex[:6]}"
            client.namespace(bns)
            time.sleep(0.5)
            start = time.monotonic()
            client.apply_objects(rendered_without_operator(f"g{i}", bns))
            wait(lambda bns=bns: running(client.pods(bns), 4), timeout=120)
            baseline_times.append(time.monotonic() - start)
            client.delete_namespace(ns)
            client.delete_namespace(bns)
            print(f"  run {i + 1}: operator {operator_times[-1]:.2f}s, baseline {baseline_times[-1]:.2f}s", flush=True)
            wait(lambda ns=ns, bns=bns: not client.pods(ns) and not client.pods(bns), timeout=120)
    finally:
        operator.terminate()
        operator.wait(timeout=30)
    return {
        "runs": runs,
        "operator_median_s": statistics.median(operator_times),
        "operator_max_s": max(operator_times),
        "baseline_median_s": statistics.median(baseline_times),
        "baseline_max_s": max(baseline_times),
    }


def bench_cold_start(client: Api, kubeconfig: Path, graphs: int, log_dir: Path) -> dict[str, Any]:
    ns = f"cold-{uuid.uuid4().hex[:6]}"
    client.namespace(ns)
    for i in range(graphs):
        client.create_graph(simulator_graph(f"g{i:03d}", ns))

    def reconciled() -> bool:
        items = client.graphs(ns)
        return len(items) == graphs and all(
            g.get("status", {}).get("observedGeneration") == g["metadata"]["generation"] for g in items)

    def all_ready() -> bool:
        return all(any(c["type"] == "Ready" and c["status"] == "True" for c in g.get("status", {}).get("conditions", []))
                   for g in client.graphs(ns))

    operator = start_operator(kubeconfig, log_dir / "operator-cold.log")
    start = time.monotonic()
    try:
        wait(reconciled, timeout=600, interval=0.5)
        t_reconciled = time.monotonic() - start
        wait(all_ready, timeout=600, interval=0.5)
        t_ready = time.monotonic() - start
        rss = peak_rss_mb(operator.pid)
    finally:
        operator.terminate()
        operator.wait(timeout=30)

    print(f"  operator: reconciled {t_reconciled:.1f}s, Ready {t_ready:.1f}s; baseline next", flush=True)
    client.delete_namespace(ns)  # free the GPUs for the baseline
    wait(lambda: not client.pods(ns), timeout=300, interval=0.5)
    bns = f"coldbase-{uuid.uuid4().hex[:6]}"
    client.namespace(bns)
    time.sleep(0.5)
    start = time.monotonic()
    for i in range(graphs):
        client.apply_objects(rendered_without_operator(f"g{i:03d}", bns))
    wait(lambda: running(client.pods(bns), 4 * graphs), timeout=600, interval=0.5)
    t_baseline = time.monotonic() - start
    client.delete_namespace(bns)
    return {
        "graphs": graphs,
        "pods": 4 * graphs,
        "operator_all_reconciled_s": t_reconciled,
        "operator_all_ready_s": t_ready,
        "operator_peak_rss_mb": rss,
        "baseline_direct_apply_all_running_s": t_baseline,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--graphs", type=int, default=100)
    parser.add_argument("--keep", action="store_true", help="leave the bench cluster running")
    args = parser.parse_args()

    # 40 nodes x 8 GPUs: room for 100 graphs x 3 GPU pods, so "Ready" is reachable for all.
    config = devcluster.ClusterConfig(name="bench", port_base=28400, nodes=40)
    cluster = devcluster.Cluster(config)
    cluster.up(fresh=True)
    log_dir = config.folder / "logs"
    kubectl = devcluster.k8s_bin("kubectl")
    env = {**os.environ, "KUBECONFIG": str(config.kubeconfig)}
    subprocess.run([str(kubectl), "apply", "--server-side", "-f", str(REPO / "crds")], env=env, check=True,
                   capture_output=True)
    subprocess.run([str(kubectl), "wait", "--for", "condition=Established", "crd", "--all"], env=env, check=True,
                   capture_output=True)
    client = Api(cluster)
    try:
        latency = bench_latency(client, config.kubeconfig, args.runs, log_dir)
        cold = bench_cold_start(client, config.kubeconfig, args.graphs, log_dir)
    finally:
        if not args.keep:
            cluster.down(quiet=True)

    print(f"\napply -> all pods Running, 3-component graph (4 pods), {latency['runs']} runs")
    print(f"  {'':28} {'median':>8} {'max':>8}")
    print(f"  {'operator (DynamoGraph)':28} {latency['operator_median_s']:>7.2f}s {latency['operator_max_s']:>7.2f}s")
    print(f"  {'baseline (Deployments)':28} {latency['baseline_median_s']:>7.2f}s {latency['baseline_max_s']:>7.2f}s")
    print(f"  operator overhead: {latency['operator_median_s'] - latency['baseline_median_s']:+.2f}s median")
    print(f"\ncold start, {cold['graphs']} graphs ({cold['pods']} pods)")
    print(f"  operator: all reconciled {cold['operator_all_reconciled_s']:.1f}s, all Ready "
          f"{cold['operator_all_ready_s']:.1f}s, peak RSS {cold['operator_peak_rss_mb']:.0f} MB")
    print(f"  baseline: same objects applied directly, all pods Running {cold['baseline_direct_apply_all_running_s']:.1f}s")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "operator.json").write_text(json.dumps({"latency": latency, "cold_start": cold}, indent=2) + "\n")
    print(f"\nwrote {RESULTS / 'operator.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
