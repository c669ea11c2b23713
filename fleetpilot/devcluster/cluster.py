"""A real Kubernetes control plane on loopback, with simulated GPU nodes, for demos and tests.

etcd (Debian's etcd-server), kube-apiserver, kube-controller-manager and kube-scheduler (built by
scripts/install-k8s.sh) and kwok (node heartbeats, pod status) run as local processes bound to
127.0.0.1. Each process's PID is saved under the cluster's state folder, and `down` stops exactly
those. Scheduling, GPU capacity, owner references and garbage collection are Kubernetes' own.

Nothing here runs pods' containers: pods on the simulated nodes are marked Running with a
loopback pod IP from the pod CIDR, which is all the operator's tests need. A cluster may leave some
pods to an external pod runner instead (`ClusterConfig.external_pod_labels`; the e2e harness runs
the simulator's pods as local processes): kwok's pod stages then skip those pods.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from fleetpilot.api import contract
from fleetpilot.devcluster import pki as pki_mod
from fleetpilot.devcluster import processes
from fleetpilot.devcluster.processes import terminate_group

K8S_VERSION = os.environ.get("FLEETPILOT_K8S_VERSION", "v1.30.14")
KWOK_VERSION = os.environ.get("FLEETPILOT_KWOK_VERSION", "v0.8.0")
PROMETHEUS_VERSION = os.environ.get("FLEETPILOT_PROMETHEUS_VERSION", "v3.16.0")
CACHE = Path(os.environ.get("FLEETPILOT_CACHE", Path.home() / ".cache" / "fleetpilot"))
SERVICE_CIDR = "127.96.0.0/16"  # inside loopback: a dialled ClusterIP never leaves the machine
SERVICE_IP = "127.96.0.1"
POD_CIDR = "127.1.0.0/16"
SIMULATED_NODE_ANNOTATION = "kwok.x-k8s.io/node"


class ClusterError(RuntimeError):
    """The control plane could not be started; the message names the log to read."""


@dataclass(frozen=True)
class ClusterConfig:
    """Where a named cluster lives and how it is laid out."""

    name: str = "dev"
    port_base: int = 26400
    nodes: int = 4
    gpus_per_node: int = 8
    gpu_product: str = "NVIDIA-H200"
    state_root: Path = field(default_factory=lambda: CACHE / "clusters")
    #: Pods carrying any of these (label, value) pairs are left to an external pod runner: kwok
    #: neither marks them Running nor deletes them. Empty (the default): kwok drives every pod.
    external_pod_labels: tuple[tuple[str, str], ...] = ()
    #: How long a node may go without a heartbeat before it is NotReady (the controller-manager's
    #: --node-monitor-grace-period; None: its default, 40 s). With hundreds of kwok nodes on a busy
    #: machine the leases can lag that much, and nothing then makes the pods Ready again (no kubelet).
    node_monitor_grace_s: float | None = None
    #: Write the apiserver's audit log (every request's user, agent, verb and resource, as JSON lines) to
    #: `logs/audit.log`: how benchmarks count the API requests one client makes.
    audit_log: bool = False
    #: The controller-manager's client rate limit to the apiserver (--kube-api-qps; burst twice that). None:
    #: Kubernetes' default, 20/s, which alone paces 3,000 new Deployments (each a ReplicaSet, status writes) to
    #: ~12 minutes; clusters that run thousands of workloads raise it. Benchmarks say which they used.
    controller_qps: int | None = None

    @property
    def folder(self) -> Path:
        return self.state_root / self.name

    @property
    def kubeconfig(self) -> Path:
        return self.folder / "admin.kubeconfig"

    @property
    def apiserver_port(self) -> int:
        return self.port_base + 43

    @property
    def kubelet_port(self) -> int:
        """Every simulated node's kubelet API port (its status' daemonEndpoints): where the apiserver sends
        `kubectl logs`. Nothing of the cluster's own listens there; a pod runner does (e2e/podrunner.py)."""
        return self.port_base + 85

    @property
    def etcd_port(self) -> int:
        return self.port_base + 79

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    def node_names(self) -> list[str]:
        return [f"gpu-node-{i}" for i in range(self.nodes)]


def k8s_bin(name: str) -> Path:
    return CACHE / "k8s" / K8S_VERSION / "bin" / name


def prometheus_bin(name: str = "prometheus") -> Path:
    """Upstream Prometheus or promtool, built by scripts/install-prometheus.sh (with Kubernetes discovery)."""
    return CACHE / "prometheus" / PROMETHEUS_VERSION / "bin" / name


def kwok_bin() -> Path:
    return CACHE / "bin" / "kwok"


def kwok_stages() -> list[Path]:
    return sorted((CACHE / "kwok" / KWOK_VERSION / "stages").glob("*.yaml"))


def etcd_bin() -> Path:
    found = shutil.which("etcd") or "/usr/bin/etcd"
    return Path(found)


class Cluster:
    """Start, inspect and stop one local control plane by its saved PIDs."""

    PROCESSES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")

    def __init__(self, config: ClusterConfig) -> None:
        self.config = config
        self.folder = config.folder
        self.pids = self.folder / "pids"
        self.logs = self.folder / "logs"
        self._children: dict[str, subprocess.Popen[bytes]] = {}  # what this object started: the surest liveness

    # -- lifecycle -------------------------------------------------------------------------------

    def up(self, *, fresh: bool = False, log: Any = print) -> float:
        """Start what is not running and wait until nodes are Ready; returns the seconds it took.

        The cluster's data (etcd's folder) is kept: a process that died is started again on it, so CRDs,
        graphs and everything else survive (`fresh` stops everything and wipes the data first). A cluster
        that is running and healthy is left alone.
        """
        started = time.monotonic()
        dead = [name for name in self.PROCESSES if self._pid(name) is None]
        if not fresh and not dead and self._healthy():
            log(f"cluster {self.config.name}: already running at {self.config.server}")
            return 0.0
        if fresh or not dead:  # fresh, or every process runs but the apiserver does not answer: start over
            self.down(quiet=True)
            dead = list(self.PROCESSES)
        if fresh:
            shutil.rmtree(self.folder / "etcd", ignore_errors=True)
        kept = (self.folder / "etcd").exists()
        self._check_binaries()
        self._check_ports(only=dead)
        for sub in (self.pids, self.logs):
            sub.mkdir(parents=True, exist_ok=True)
        pki = pki_mod.ensure(self.folder / "pki", service_ip=SERVICE_IP)
        starts = self._starts(pki, self._write_kubeconfigs(pki))
        restarting = len(dead) < len(self.PROCESSES)
        try:
            for name in dead:  # in PROCESSES' order: each needs the ones before it
                starts[name]()
            if "kube-apiserver" not in dead:
                self._wait(self._healthy, "kube-apiserver /readyz", "kube-apiserver", timeout=60)
            self._create_nodes()
            # kwok readies nodes one by one: hundreds take minutes on a busy machine.
            self._wait(self._nodes_ready, "simulated nodes to become Ready", "kwok",
                       timeout=60 + 1.0 * self.config.nodes)
            self._wait(self._default_service_account, "the default ServiceAccount", "kube-controller-manager", timeout=60)
        except BaseException:
            if not restarting:
                self.down(quiet=True)
            raise
        elapsed = time.monotonic() - started
        how = (f"restarted {', '.join(dead)} (the others kept running), data kept" if restarting
               else "up on its kept data" if kept and not fresh else "up")
        log(f"cluster {self.config.name}: {how} in {elapsed:.1f}s at {self.config.server}; "
            f"KUBECONFIG={self.config.kubeconfig}")
        return elapsed

    def _write_kubeconfigs(self, pki: pki_mod.Pki) -> dict[str, Path]:
        return {
            stem: pki_mod.write_kubeconfig(
                self.folder / f"{stem}.kubeconfig", pki=pki, stem=stem, server=self.config.server,
                cluster_name=f"fleetpilot-{self.config.name}",
            )
            for stem in pki_mod.CLIENTS
        }

    def _starts(self, pki: pki_mod.Pki, kubeconfigs: Mapping[str, Path]) -> dict[str, Callable[[], None]]:
        """How to start each process, with the certificates and kubeconfig it needs."""
        return {
            "etcd": self._start_etcd,
            "kube-apiserver": lambda: self._start_apiserver(pki),
            "kube-controller-manager": lambda: self._start_controller_manager(pki, kubeconfigs["controller-manager"]),
            "kube-scheduler": lambda: self._start_scheduler(kubeconfigs["scheduler"]),
            "kwok": lambda: self._start_kwok(kubeconfigs["kwok"]),
        }

    def down(self, *, quiet: bool = False) -> None:
        """Stop the processes named by the saved PIDs, newest first."""
        for name in reversed(self.PROCESSES):
            pid = self._pid(name)
            if pid is not None:
                terminate_group(pid, timeout=10)  # also reaps it when it is our child
                if not quiet:
                    print(f"stopped {name} (pid {pid})")
            self._children.pop(name, None)
            (self.pids / f"{name}.pid").unlink(missing_ok=True)

    def running(self) -> bool:
        return all(self._pid(name) is not None for name in self.PROCESSES)

    def restart(self, name: str, *, down_s: float = 0.0) -> float:
        """Stop etcd or kube-apiserver, leave it down `down_s` seconds, start it again and wait until it
        serves; returns the seconds it was away. For fault tests: the others keep running and must cope."""
        if name not in ("etcd", "kube-apiserver"):
            raise ValueError(f"restart: {name} is not one of ['etcd', 'kube-apiserver']")
        # etcd and the apiserver read no kubeconfig: the clients' files stay as they are.
        starts = self._starts(pki_mod.ensure(self.folder / "pki", service_ip=SERVICE_IP), {})
        stopped = time.monotonic()
        pid = self._pid(name)
        if pid is not None:
            terminate_group(pid, timeout=10)
        self._children.pop(name, None)
        time.sleep(down_s)
        starts[name]()
        if name == "etcd":
            self._wait(self._healthy, "kube-apiserver /readyz with etcd back", "kube-apiserver", timeout=60)
        return time.monotonic() - stopped

    def status(self) -> dict[str, Any]:
        return {
            "name": self.config.name,
            "server": self.config.server,
            "kubeconfig": str(self.config.kubeconfig),
            "processes": {name: self._pid(name) for name in self.PROCESSES},
            "healthy": self.running() and self._healthy(),
        }

    def env(self) -> dict[str, str]:
        return {"KUBECONFIG": str(self.config.kubeconfig)}

    # -- processes -------------------------------------------------------------------------------

    def _check_binaries(self) -> None:
        needed = [k8s_bin(b) for b in ("kube-apiserver", "kube-controller-manager", "kube-scheduler")]
        needed += [kwok_bin(), etcd_bin()]
        missing = [str(p) for p in needed if not os.access(p, os.X_OK)]
        if not kwok_stages():
            missing.append(str(CACHE / "kwok" / KWOK_VERSION / "stages"))
        if missing:
            raise ClusterError(
                f"missing binaries: {', '.join(missing)}; run scripts/install.sh (or scripts/install-k8s.sh) first"
            )

    def ports(self) -> dict[str, int]:
        base = self.config.port_base
        return {"etcd": self.config.etcd_port, "etcd peer": self.config.etcd_port + 1,
                "kube-apiserver": self.config.apiserver_port, "kube-controller-manager": base + 57,
                "kube-scheduler": base + 59, "kwok": base + 81}

    def held_ports(self) -> dict[str, int]:
        """The cluster's ports something already listens on (or holds bound), by what would use them."""
        held = {}
        for owner, port in self.ports().items():
            with socket.socket() as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    probe.bind(("127.0.0.1", port))
                except OSError:
                    held[owner] = port
        return held

    def _check_ports(self, *, only: list[str]) -> None:
        """Fail clearly when another cluster (say, one with the same name under another cache) holds a port
        one of the processes `only` is about to listen on."""
        for owner, port in self.held_ports().items():
            if owner.removesuffix(" peer") not in only:
                continue
            raise ClusterError(
                f"127.0.0.1:{port} ({owner}) is in use: is another cluster with port base"
                f" {self.config.port_base} running? Stop it, or set FLEETPILOT_CLUSTER_PORT_BASE"
            )

    def _spawn(self, name: str, argv: list[str]) -> None:
        log_path = self.logs / f"{name}.log"
        with log_path.open("wb") as log_file:
            process = subprocess.Popen(
                argv, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        processes.record(self.pids / f"{name}.pid", process.pid)
        self._children[name] = process

    def _pid(self, name: str) -> int | None:
        """The PID of `name` while that very process still runs: our own child's by its handle, else the
        saved one by PID and start time (see `processes`)."""
        child = self._children.get(name)
        if child is not None:
            return child.pid if child.poll() is None else None
        return processes.alive(self.pids / f"{name}.pid")

    def _exit_note(self, name: str) -> str:
        child = self._children.get(name)
        code = child.poll() if child is not None else None
        return f"{name} exited with code {code}" if code is not None else f"{name} is not running"

    def _start_etcd(self) -> None:
        port = self.config.etcd_port
        self._spawn("etcd", [
            str(etcd_bin()), "--name", "fleetpilot", "--data-dir", str(self.folder / "etcd"),
            "--listen-client-urls", f"http://127.0.0.1:{port}", "--advertise-client-urls", f"http://127.0.0.1:{port}",
            "--listen-peer-urls", f"http://127.0.0.1:{port + 1}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{port + 1}",
            "--initial-cluster", f"fleetpilot=http://127.0.0.1:{port + 1}",
            "--unsafe-no-fsync",  # a throw-away store: durability costs seconds per test run
            "--quota-backend-bytes", str(2 * 1024**3),
        ])
        self._wait(lambda: _http_ok(f"http://127.0.0.1:{port}/health"), "etcd", "etcd", timeout=20)

    def _start_apiserver(self, pki: pki_mod.Pki) -> None:
        self._spawn("kube-apiserver", [
            str(k8s_bin("kube-apiserver")),
            f"--etcd-servers=http://127.0.0.1:{self.config.etcd_port}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            f"--secure-port={self.config.apiserver_port}",
            f"--tls-cert-file={pki.crt('apiserver')}", f"--tls-private-key-file={pki.key('apiserver')}",
            f"--client-ca-file={pki.ca}",
            # `kubectl logs`: to the node's InternalIP (127.0.0.1; its name resolves nowhere), whose serving
            # certificate must be the CA's, with a client certificate of the CA's.
            "--kubelet-preferred-address-types=InternalIP",
            f"--kubelet-certificate-authority={pki.ca}",
            f"--kubelet-client-certificate={pki.crt(pki_mod.KUBELET_CLIENT)}",
            f"--kubelet-client-key={pki.key(pki_mod.KUBELET_CLIENT)}",
            f"--service-account-key-file={pki.service_account_pub}",
            f"--service-account-signing-key-file={pki.service_account_key}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC",
            # Endpoints of the `kubernetes` Service would be 127.0.0.1, which the API itself rejects.
            "--endpoint-reconciler-type=none",
            "--allow-privileged=true",
            "--profiling=false",
            "--event-ttl=30m",
            *self._audit_args(),
        ])
        self._wait(self._healthy, "kube-apiserver /readyz", "kube-apiserver", timeout=60)

    @property
    def audit_log(self) -> Path:
        return self.logs / "audit.log"

    def _audit_args(self) -> list[str]:
        """Metadata-level lines (a watch logs when it starts and ends: count requests by auditID), except
        kwok's node heartbeats (hundreds of nodes renew a Lease every few seconds: most of the volume, and
        nobody's question). The apiserver rotates the file at 100 MB whatever `--audit-log-maxsize` says
        (0 means its default): `audit_logs` lists every part."""
        if not self.config.audit_log:
            return []
        policy = self.folder / "audit-policy.yaml"
        policy.write_text(yaml.safe_dump({
            "apiVersion": "audit.k8s.io/v1", "kind": "Policy",
            "omitStages": ["RequestReceived"],
            "rules": [{"level": "None", "users": ["kwok-controller"], "resources": [
                          {"group": "coordination.k8s.io", "resources": ["leases"]}]},
                      {"level": "Metadata"}],
        }))
        for old in self.audit_logs():
            old.unlink(missing_ok=True)
        return [f"--audit-policy-file={policy}", f"--audit-log-path={self.audit_log}", "--audit-log-format=json",
                "--audit-log-mode=batch", "--audit-log-batch-max-wait=1s", "--audit-log-maxsize=0"]

    def audit_logs(self) -> list[Path]:
        """The audit log and its rotated parts (`audit-<time>.log`), oldest first."""
        return sorted(self.logs.glob("audit-*.log")) + ([self.audit_log] if self.audit_log.exists() else [])

    def _start_controller_manager(self, pki: pki_mod.Pki, kubeconfig: Path) -> None:
        self._spawn("kube-controller-manager", [
            str(k8s_bin("kube-controller-manager")),
            f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1", f"--secure-port={self.ports()['kube-controller-manager']}",
            f"--service-account-private-key-file={pki.service_account_key}", f"--root-ca-file={pki.ca}",
            f"--cluster-signing-cert-file={pki.ca}", f"--cluster-signing-key-file={pki.key('ca')}",
            "--use-service-account-credentials=true",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--leader-elect=false",
            *([f"--node-monitor-grace-period={self.config.node_monitor_grace_s:g}s"]
              if self.config.node_monitor_grace_s else []),
            *([f"--kube-api-qps={self.config.controller_qps}", f"--kube-api-burst={2 * self.config.controller_qps}"]
              if self.config.controller_qps else []),
        ])

    def _start_scheduler(self, kubeconfig: Path) -> None:
        self._spawn("kube-scheduler", [
            str(k8s_bin("kube-scheduler")),
            f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1", f"--secure-port={self.ports()['kube-scheduler']}",
            "--leader-elect=false",
        ])

    def _start_kwok(self, kubeconfig: Path) -> None:
        self._spawn("kwok", [
            str(kwok_bin()),
            f"--kubeconfig={kubeconfig}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={SIMULATED_NODE_ANNOTATION}=fake",
            f"--cidr={POD_CIDR}",
            "--node-ip=127.0.0.1",
            f"--node-port={self.config.kubelet_port}",
            "--node-lease-duration-seconds=40",
            f"--server-address=127.0.0.1:{self.ports()['kwok']}",
            *(f"--config={stage}" for stage in self._kwok_stage_files()),
        ])

    def _kwok_stage_files(self) -> list[Path]:
        """kwok's stages, or copies whose pod stages skip the pods an external runner owns."""
        if not self.config.external_pod_labels:
            return kwok_stages()
        folder = self.folder / "kwok-stages"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        written = []
        for source in kwok_stages():
            stage = yaml.safe_load(source.read_text())
            if stage.get("spec", {}).get("resourceRef", {}).get("kind") == "Pod":
                stage = narrow_pod_stage(stage, self.config.external_pod_labels)
            target = folder / source.name
            target.write_text(yaml.safe_dump(stage, sort_keys=False))
            written.append(target)
        return written

    # -- cluster objects ---------------------------------------------------------------------------

    def client(self) -> httpx.Client:
        """An HTTP client for the apiserver, authenticated as the cluster admin."""
        pki = pki_mod.Pki(self.folder / "pki")
        tls = ssl.create_default_context(cafile=str(pki.ca))
        tls.load_cert_chain(str(pki.crt("admin")), str(pki.key("admin")))
        return httpx.Client(base_url=self.config.server, verify=tls, timeout=5.0)

    def _healthy(self) -> bool:
        try:
            with self.client() as client:
                return client.get("/readyz").status_code == 200
        except (httpx.HTTPError, OSError):
            return False

    def node_manifest(self, name: str) -> dict[str, Any]:
        gpus = str(self.config.gpus_per_node)
        capacity = {"cpu": "64", "memory": "1Ti", "pods": "110", "ephemeral-storage": "1Ti", "nvidia.com/gpu": gpus}
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "annotations": {SIMULATED_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "type": "kwok",
                    contract.LABEL_SIMULATED_NODE: "true",
                    "nvidia.com/gpu.product": self.config.gpu_product,
                    "nvidia.com/gpu.count": gpus,
                },
            },
            "spec": {},
            "status": {"capacity": capacity, "allocatable": capacity},
        }

    def _create_nodes(self) -> None:
        with self.client() as client:
            for name in self.config.node_names():
                response = client.post("/api/v1/nodes", json=self.node_manifest(name))
                if response.status_code not in (201, 409):
                    raise ClusterError(f"creating node {name}: {response.status_code} {response.text}")

    def _nodes_ready(self) -> bool:
        with self.client() as client:
            nodes = client.get("/api/v1/nodes").json().get("items", [])
        ready = [
            n for n in nodes
            if any(c["type"] == "Ready" and c["status"] == "True" for c in n.get("status", {}).get("conditions", []))
            and not any(t["key"].startswith("node.kubernetes.io/") for t in n.get("spec", {}).get("taints", []))
        ]
        return len(ready) >= self.config.nodes

    def _default_service_account(self) -> bool:
        with self.client() as client:
            return client.get("/api/v1/namespaces/default/serviceaccounts/default").status_code == 200

    def _wait(self, check: Any, what: str, process: str, *, timeout: float) -> None:
        started = time.monotonic()
        last_error: Exception | None = None
        while time.monotonic() < started + timeout:
            try:
                if check():
                    return
            except (httpx.HTTPError, OSError, ValueError) as error:
                last_error = error
            if self._pid(process) is None:
                what = f"{what} ({self._exit_note(process)})"
                break
            time.sleep(0.2)
        tail = _tail(self.logs / f"{process}.log")
        raise ClusterError(
            f"gave up after {time.monotonic() - started:.1f}s waiting for {what}; last error: {last_error!r};"
            f" last lines of {self.logs / (process + '.log')}:\n{tail}"
        )


def narrow_pod_stage(stage: dict[str, Any], skip: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    """A copy of a kwok pod stage that no longer selects pods carrying any of the `skip` labels.

    kwok's selector keys are jq queries on the object; `NotIn` also matches a pod without the label.
    """
    narrowed: dict[str, Any] = yaml.safe_load(yaml.safe_dump(stage))
    selector = narrowed.setdefault("spec", {}).setdefault("selector", {})
    expressions = selector.setdefault("matchExpressions", [])
    for label, value in skip:
        expressions.append({"key": f'.metadata.labels["{label}"]', "operator": "NotIn", "values": [value]})
    return narrowed


def _http_ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# -- CLI ---------------------------------------------------------------------------------------------

DEFAULT_PORT_BASES = {"dev": 26400, "e2e": 29400}  # any other name (the tests' `test`): 27400


def config_from_env(name: str | None = None) -> ClusterConfig:
    """The dev cluster by default; FLEETPILOT_CLUSTER / _PORT_BASE pick another (tests use `test`).

    `dev`, `e2e` and every other name (`test`) have their own default port bases, so the three can
    run side by side.
    """
    name = name or os.environ.get("FLEETPILOT_CLUSTER", "dev")
    default_base = DEFAULT_PORT_BASES.get(name, 27400)
    return ClusterConfig(name=name, port_base=int(os.environ.get("FLEETPILOT_CLUSTER_PORT_BASE", default_base)))


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("cluster", help="the local control plane with simulated GPU nodes")
    parser.add_argument("action", choices=["up", "down", "status", "env"])
    parser.add_argument("--name", default=None, help="cluster name (default: dev, or $FLEETPILOT_CLUSTER)")
    parser.add_argument("--fresh", action="store_true",
                        help="stop everything and wipe the cluster's data first (default: keep it, start what died)")
    parser.set_defaults(func=cli)


def cli(args: argparse.Namespace) -> int:
    cluster = Cluster(config_from_env(args.name))
    try:
        if args.action == "up":
            cluster.up(fresh=args.fresh)
        elif args.action == "down":
            cluster.down()
        elif args.action == "status":
            print(yaml.safe_dump(cluster.status(), sort_keys=False), end="")
            return 0 if cluster.status()["healthy"] else 1
        else:
            for key, value in cluster.env().items():
                print(f"export {key}={value}")
    except ClusterError as error:
        print(f"fleetpilot cluster: {error}", file=sys.stderr)
        return 1
    return 0
