"""The operator at scale on the real control plane: cold start, API requests at rest, one scale under load.

For each operator variant — this checkout, and with `--compare-rev REV` the operator of an earlier
commit, run in the same benchmark on the same cluster — and for each graph count:

1. **cold start**: N simulator graphs (4 pods each) are created while the operator is down; then it
   starts. Time until every graph's status is reconciled (`observedGeneration`) and until every graph
   is Ready; the operator's peak RSS and CPU seconds; its API requests meanwhile.
2. **at rest**: `--rest-seconds` with nothing changing. The operator's API requests, by verb and
   resource, from the apiserver's audit log (the operator runs as its own ServiceAccount, so its
   requests are told apart from kwok's, the controllers' and this script's).
3. **one scale under that load**: `kubectl scale dgc/... --replicas` on random graphs, time until the
   Deployment's `spec.replicas` says so (p50 and p99 of `--scale-samples`).

Run: `~/.cache/fleetpilot/venv/bin/python benchmarks/scale_bench.py --graphs 100 --compare-rev a7a88fd`
(about 10 minutes per variant and graph count at 100 graphs with the default 5-minute rest window).
Writes benchmarks/results/scale.json and prints a table.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from fleetpilot.api import v1alpha1 as api
from fleetpilot.devcluster import cluster as devcluster

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
IDENTITY_NAMESPACE = "fleetpilot-system"
IDENTITY = "fleetpilot-operator"
USER = f"system:serviceaccount:{IDENTITY_NAMESPACE}:{IDENTITY}"
PODS_PER_GRAPH = 4  # frontend, 1 prefill, 2 decode
GPUS_PER_GRAPH = 3


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
    return Variant(label=rev, pythonpath=str(tree))


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

    def per_second(self, seconds: float) -> float:
        return self.total / seconds if seconds > 0 else math.nan


def count_requests(audit_log: Path, *, user: str, start: datetime.datetime, end: datetime.datetime) -> AuditCount:
    """Requests (one per auditID) whose user is `user` and that the apiserver received in [start, end)."""
    seen: set[str] = set()
    count = AuditCount()
    with audit_log.open() as lines:
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
    return count


def utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def measure(variant: Variant, *, cluster: devcluster.Cluster, client: Api, kubeconfig: Path, graphs: int,
            rest_seconds: float, scale_samples: int, log_dir: Path) -> dict[str, Any]:
    namespace = f"scale-{uuid.uuid4().hex[:6]}"
    client.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                  "metadata": {"name": namespace}})
    for i in range(graphs):
        client.request("POST", f"/apis/{api.API_VERSION}/namespaces/{namespace}/{api.GRAPH_PLURAL}",
                       simulator_graph(f"g{i:04d}", namespace))

    def reconciled() -> bool:
        items = client.graphs(namespace)
        return len(items) == graphs and all(
            g.get("status", {}).get("observedGeneration") == g["metadata"]["generation"] for g in items)

    def all_ready() -> bool:
        return all(any(c["type"] == "Ready" and c["status"] == "True" for c in g.get("status", {}).get("conditions", []))
                   for g in client.graphs(namespace))

    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    if variant.pythonpath:
        env["PYTHONPATH"] = variant.pythonpath
    log = (log_dir / f"operator-{variant.label}-{graphs}.log").open("wb")
    operator = subprocess.Popen(variant.command(), stdout=log, stderr=subprocess.STDOUT, env=env,
                                cwd=tempfile.gettempdir(), start_new_session=True)
    cold_start = utcnow()
    started = time.monotonic()
    try:
        wait(reconciled, timeout=3600, what="all graphs reconciled")
        t_reconciled = time.monotonic() - started
        wait(all_ready, timeout=3600, what="all graphs Ready")
        t_ready = time.monotonic() - started
        cold_end = utcnow()
        _, cpu_cold = process_stats(operator.pid)
        print(f"  [{variant.label}] {graphs} graphs: reconciled {t_reconciled:.1f}s, Ready {t_ready:.1f}s;"
              f" at rest for {rest_seconds:.0f}s", flush=True)

        rest_start = utcnow()
        time.sleep(rest_seconds)
        rest_end = utcnow()
        rss, cpu_rest_end = process_stats(operator.pid)

        scale_times = []
        rng = random.Random(graphs)
        for sample in range(scale_samples):
            graph = f"g{rng.randrange(graphs):04d}"
            replicas = 2 + sample % 2
            start = time.monotonic()
            client.http.patch(f"/apis/{api.API_VERSION}/namespaces/{namespace}/{api.COMPONENT_PLURAL}/"
                              f"{graph}-prefill/scale", json={"spec": {"replicas": replicas}},
                              headers={"Content-Type": "application/merge-patch+json"}).raise_for_status()

            def updated(graph: str = graph, replicas: int = replicas) -> bool:
                # The prefill Deployment of the graph's (one) generation: <graph>-prefill-<generation>.
                found = client.request("GET", f"/apis/apps/v1/namespaces/{namespace}/deployments?labelSelector="
                                       f"fleetpilot.dev/graph={graph},fleetpilot.dev/component=prefill")["items"]
                return len(found) == 1 and int(found[0]["spec"]["replicas"]) == replicas

            wait(updated, timeout=120, interval=0.02, what=f"{graph}-prefill scaled to {replicas}")
            scale_times.append(time.monotonic() - start)
    finally:
        operator.terminate()
        try:
            operator.wait(timeout=30)
        except subprocess.TimeoutExpired:
            operator.kill()
    time.sleep(2)  # the audit log is written in batches, at most a second late
    cold = count_requests(cluster.audit_log, user=USER, start=cold_start, end=cold_end)
    rest = count_requests(cluster.audit_log, user=USER, start=rest_start, end=rest_end)
    client.request("DELETE", f"/api/v1/namespaces/{namespace}")
    wait(lambda: not client.pods(namespace), timeout=1800, what=f"pods of {namespace} gone")
    scale_times.sort()
    return {
        "variant": variant.label,
        "graphs": graphs,
        "pods": graphs * PODS_PER_GRAPH,
        "all_reconciled_s": round(t_reconciled, 1),
        "all_ready_s": round(t_ready, 1),
        "peak_rss_mb": round(rss, 1),
        "cpu_seconds_cold": round(cpu_cold, 1),
        "cpu_seconds_at_rest": round(cpu_rest_end - cpu_cold, 1),
        "api_requests_cold": cold.total,
        "api_requests_cold_per_s": round(cold.per_second((cold_end - cold_start).total_seconds()), 2),
        "rest_seconds": rest_seconds,
        "api_requests_at_rest": rest.total,
        "api_requests_at_rest_per_s": round(rest.per_second(rest_seconds), 3),
        "at_rest_by_call": dict(rest.by_call.most_common()),
        "scale_reflected_p50_s": round(statistics.median(scale_times), 3) if scale_times else None,
        "scale_reflected_p99_s": round(scale_times[min(len(scale_times) - 1, math.ceil(0.99 * len(scale_times)) - 1)], 3)
        if scale_times else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--graphs", default="100", help="comma-separated graph counts (default 100)")
    parser.add_argument("--rest-seconds", type=float, default=300.0)
    parser.add_argument("--scale-samples", type=int, default=20)
    parser.add_argument("--compare-rev", default=None, help="also measure the operator of this git revision")
    parser.add_argument("--only-rev", action="store_true", help="measure only --compare-rev, not this checkout")
    parser.add_argument("--out", type=Path, default=RESULTS / "scale.json")
    parser.add_argument("--keep", action="store_true", help="leave the bench cluster running")
    args = parser.parse_args()
    counts = [int(n) for n in args.graphs.split(",")]

    nodes = math.ceil(max(counts) * GPUS_PER_GRAPH / 8) + 2
    config = devcluster.ClusterConfig(name="scale", port_base=28600, nodes=nodes, audit_log=True)
    cluster = devcluster.Cluster(config)
    cluster.up(reuse=False)
    kubectl = devcluster.k8s_bin("kubectl")
    env = {**os.environ, "KUBECONFIG": str(config.kubeconfig)}
    subprocess.run([str(kubectl), "apply", "--server-side", "-f", str(REPO / "crds")], env=env, check=True,
                   capture_output=True)
    subprocess.run([str(kubectl), "wait", "--for", "condition=Established", "crd", "--all"], env=env, check=True,
                   capture_output=True)
    client = Api(cluster)
    rows = []
    with tempfile.TemporaryDirectory(prefix="scale-bench-") as scratch:
        kubeconfig = operator_identity(cluster, client, Path(scratch))
        variants = [] if args.only_rev else [Variant(label="this checkout")]
        if args.compare_rev:
            variants.append(unpack_rev(args.compare_rev, Path(scratch)))
        try:
            for graphs in counts:
                for variant in variants:
                    rows.append(measure(variant, cluster=cluster, client=client, kubeconfig=kubeconfig, graphs=graphs,
                                        rest_seconds=args.rest_seconds, scale_samples=args.scale_samples,
                                        log_dir=config.folder / "logs"))
        finally:
            if not args.keep:
                cluster.down(quiet=True)

    header = (f"{'operator':16} {'graphs':>6} {'reconciled':>10} {'Ready':>7} {'RSS MB':>7} {'CPU cold':>8}"
              f" {'req cold':>8} {'req/s rest':>10} {'scale p50':>9} {'scale p99':>9}")
    print("\n" + header)
    for row in rows:
        print(f"{row['variant']:16} {row['graphs']:>6} {row['all_reconciled_s']:>9.1f}s {row['all_ready_s']:>6.1f}s"
              f" {row['peak_rss_mb']:>7.0f} {row['cpu_seconds_cold']:>7.1f}s {row['api_requests_cold']:>8}"
              f" {row['api_requests_at_rest_per_s']:>10.3f} {row['scale_reflected_p50_s']:>8.2f}s"
              f" {row['scale_reflected_p99_s']:>8.2f}s")
    for row in rows:
        calls = ", ".join(f"{call} {n}" for call, n in row["at_rest_by_call"].items()) or "none"
        print(f"  at rest, {row['variant']} with {row['graphs']} graphs over {row['rest_seconds']:.0f}s: {calls}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rows": rows}, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
