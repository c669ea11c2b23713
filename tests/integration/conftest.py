"""Fixtures for tests against the real control plane.

One control plane per test session (etcd, kube-apiserver, kube-controller-manager, kube-scheduler
and kwok's simulated GPU nodes, started by fleetpilot.devcluster and stopped by their saved PIDs),
the generated CRDs applied to it, and the operator running as a separate process, exactly as a user
would run it: with the Helm chart's ServiceAccount and RBAC (a token minted for it), so every operator
test also proves the chart grants enough and the operator needs no more. Each test gets its own namespace.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetpilot.devcluster import cluster as devcluster
from fleetpilot.devcluster import pki

REPO = Path(__file__).resolve().parents[2]
TOTAL_GPUS = 32  # 4 simulated nodes x 8
CHART = REPO / "charts" / "fleetpilot"
CHART_NAMESPACE = "fleetpilot-system"  # where the chart's ServiceAccounts live in the test cluster
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")


def wait_for(
    check: Callable[[], Any], *, timeout: float = 60, interval: float = 0.25, what: str | Callable[[], str] = "condition"
) -> Any:
    """Poll until `check()` returns something truthy; fail with the last value seen (and `what()`, if callable)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except (subprocess.CalledProcessError, KeyError, IndexError, TypeError) as error:
            last = error
        else:
            if last:
                return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what() if callable(what) else what};"
                         f" last seen: {last!r}")


@dataclass
class Kubectl:
    """The kubectl built with the control plane, pointed at the test cluster."""

    binary: Path
    kubeconfig: Path

    def run(self, *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.binary), *args], input=stdin, capture_output=True, text=True, check=check,
            env={**os.environ, "KUBECONFIG": str(self.kubeconfig)},
        )

    def json(self, *args: str) -> Any:
        return json.loads(self.run(*args, "-o", "json").stdout)

    def apply(self, manifest: dict[str, Any] | str, namespace: str | None = None) -> subprocess.CompletedProcess[str]:
        text = manifest if isinstance(manifest, str) else yaml.safe_dump(manifest)
        args = ["apply", "-f", "-"] + (["-n", namespace] if namespace else [])
        return self.run(*args, stdin=text)

    def items(self, kind: str, namespace: str, selector: str | None = None) -> list[dict[str, Any]]:
        args = ["get", kind, "-n", namespace] + (["-l", selector] if selector else [])
        items: list[dict[str, Any]] = self.json(*args)["items"]
        return items


def worker_cluster_config() -> devcluster.ClusterConfig:
    """The test cluster, or under pytest-xdist one per worker: worker N > 0 (`gwN`) gets `<name>-gwN`, its
    own state folder and the port block 100·N above the first (a cluster's ports span under 100)."""
    config = devcluster.config_from_env(os.environ.get("FLEETPILOT_TEST_CLUSTER", "test"))
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    if worker == 0:
        return config
    return dataclasses.replace(config, name=f"{config.name}-gw{worker}", port_base=config.port_base + 100 * worker)


@pytest.fixture(scope="session")
def control_plane() -> Iterator[devcluster.Cluster]:
    config = worker_cluster_config()
    cluster = devcluster.Cluster(config)
    already_running = cluster.running()
    cluster.up(fresh=not already_running)
    yield cluster
    if not already_running and not os.environ.get("FLEETPILOT_KEEP_CLUSTER"):
        cluster.down(quiet=True)


@pytest.fixture(scope="session")
def kubectl(control_plane: devcluster.Cluster) -> Kubectl:
    return Kubectl(devcluster.k8s_bin("kubectl"), control_plane.config.kubeconfig)


@pytest.fixture(scope="session")
def crds(kubectl: Kubectl) -> None:
    kubectl.run("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    kubectl.run("wait", "--for", "condition=Established", "crd", "--all", "--timeout=60s")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class OperatorProcess:
    """`fleetpilot operator run` as a child process that tests may kill and restart."""

    def __init__(self, kubeconfig: Path, log_dir: Path) -> None:
        self.kubeconfig = kubeconfig
        self.log_dir = log_dir
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.metrics_port = _free_port()

    def start(self) -> None:
        self.starts += 1
        log = (self.log_dir / f"operator-{self.starts}.log").open("wb")
        self.process = subprocess.Popen(
            # The console script, not `python -m`: from the repository root, `-m` would put the
            # top-level operator/ folder on sys.path ahead of the standard library's `operator`.
            [str(Path(sys.executable).parent / "fleetpilot"), "operator", "run",
             "--metrics-port", str(self.metrics_port)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "KUBECONFIG": str(self.kubeconfig), "FLEETPILOT_RESYNC_SECONDS": "20"},
        )

    def kill(self) -> None:
        """SIGKILL: no cleanup, as when a node dies under the operator."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.log_dir.glob("operator-*.log")))


def helm_binary() -> str:
    cache = Path(os.environ.get("FLEETPILOT_CACHE", Path.home() / ".cache" / "fleetpilot"))
    found = shutil.which("helm") or str(cache / "bin" / "helm")
    assert Path(found).is_file(), f"helm is missing: scripts/setup.sh installs it ({found})"
    return found


def render_chart(*args: str, namespace: str, release: str = "fleetpilot") -> list[dict[str, Any]]:
    """`helm template` of charts/fleetpilot into `namespace`; args are more helm flags."""
    out = subprocess.run([helm_binary(), "template", release, str(CHART), "--namespace", namespace, *args],
                         capture_output=True, text=True, check=True).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def token_kubeconfig(kubectl: Kubectl, *, namespace: str, service_account: str, path: Path) -> Path:
    """A kubeconfig for the test cluster that authenticates as a ServiceAccount (a TokenRequest token)."""
    token = kubectl.run("create", "token", service_account, "-n", namespace, "--duration=24h").stdout.strip()
    admin = yaml.safe_load(kubectl.kubeconfig.read_text())
    cluster = admin["clusters"][0]["cluster"]
    # A relative path is relative to the admin kubeconfig.
    ca = str((kubectl.kubeconfig.parent / cluster["certificate-authority"]).resolve())
    user = f"system:serviceaccount:{namespace}:{service_account}"
    path.write_text(yaml.safe_dump(pki.kubeconfig(cluster_name="test", server=cluster["server"],
                                                  ca=ca, user=user,
                                                  credentials={"token": token})))
    path.chmod(0o600)
    return path


@dataclass
class ChartIdentities:
    """The chart's operator and planner ServiceAccounts, installed with their RBAC, and a kubeconfig for each."""

    namespace: str
    kubeconfigs: dict[str, Path]

    def user(self, component: str) -> str:
        return f"system:serviceaccount:{self.namespace}:fleetpilot-{component}"


@pytest.fixture(scope="session")
def chart_identities(kubectl: Kubectl, crds: None, tmp_path_factory: pytest.TempPathFactory) -> ChartIdentities:
    """The chart's RBAC with default values (cluster-wide), applied for real in fleetpilot-system."""
    kubectl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": CHART_NAMESPACE}})
    rbac = [doc for doc in render_chart(namespace=CHART_NAMESPACE) if doc["kind"] in RBAC_KINDS]
    kubectl.run("apply", "--server-side", "--force-conflicts", "-f", "-", stdin=yaml.safe_dump_all(rbac))
    folder = tmp_path_factory.mktemp("identities")
    return ChartIdentities(CHART_NAMESPACE, {
        component: token_kubeconfig(kubectl, namespace=CHART_NAMESPACE, service_account=f"fleetpilot-{component}",
                                    path=folder / f"{component}.kubeconfig")
        for component in ("operator", "planner")
    })


@pytest.fixture(scope="session")
def operator(chart_identities: ChartIdentities, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    # Least privilege: the operator runs as the chart's ServiceAccount, not as the cluster admin.
    process = OperatorProcess(chart_identities.kubeconfigs["operator"], tmp_path_factory.mktemp("operator"))
    process.start()
    yield process
    process.stop()
    # Unexpected exceptions in our code are logged at ERROR with a traceback; API refusals are warnings.
    errors = [line for line in process.log().splitlines() if "ERROR fleetpilot" in line]
    assert not errors, f"the operator logged errors:\n{process.log()[-5000:]}"


@pytest.fixture
def namespace(kubectl: Kubectl) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    kubectl.run("create", "namespace", name)
    yield name
    kubectl.run("delete", "namespace", name, "--wait=false")
    # GPUs are shared by all tests: wait until this test's pods have released theirs.
    wait_for(lambda: not kubectl.items("pods", name), timeout=60, what=f"pods in {name} to go")


def load_sample(name: str) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((REPO / "manifests" / "samples" / name).read_text())
    return document


def condition(graph: dict[str, Any], type_: str) -> dict[str, Any]:
    for item in graph.get("status", {}).get("conditions", []):
        if item["type"] == type_:
            return dict(item)
    return {}
