"""The kubelet of the e2e harness: runs the simulator's pods as local processes on loopback IPs.

Where it sits: between the real scheduler and the processes. kwok keeps the simulated GPU nodes
alive and drives every other pod, but its pod stages skip the pods this runner owns (those labelled
`fleetpilot.dev/framework=simulator`, see `ClusterConfig.external_pod_labels`). For each such pod
bound to a simulated node the runner does what a kubelet would:

- gives it a pod IP from 127.2.0.0/16 (kwok's are 127.1.0.0/16) and starts the container's command
  and args, with its env (values, `$(VAR)` references and the downward API's `fieldRef`s) and a
  kubeconfig holding a pod-bound token of its ServiceAccount (there is no in-cluster token file);
  a wildcard `--host` becomes the pod IP, as a pod's own network namespace would make it;
- writes the pod's status (phase, pod IP, container state, conditions) through `pods/status`, with
  Ready=True only once the readiness probe (httpGet on the pod IP) passes, and False when it fails
  `failureThreshold` times in a row; the startup probe gates readiness, the liveness probe restarts;
- restarts a container that exits (restartPolicy Always), with a growing back-off;
- on deletion runs the preStop hook (exec or httpGet), sends SIGTERM, waits up to the grace period,
  sends SIGKILL, then removes the pod (`gracePeriodSeconds=0`).

Each container's output goes to `<state>/logs/<namespace>_<pod>.log`; each process's PID to
`<state>/pids/`, so `reap()` can kill what a crashed runner left. On exit every process is killed.

Run by hand: `~/.cache/fleetpilot/venv/bin/python e2e/podrunner.py --kubeconfig FILE --state DIR`.
Deviation from a kubelet, on purpose: before a container's first successful probe the runner probes
every `FIRST_PROBE_S` instead of every `periodSeconds`, so a test does not wait 5 s per pod start.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import ipaddress
import json
import logging
import os
import re
import shutil
import signal
import ssl
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fleetpilot.devcluster import processes

logger = logging.getLogger("podrunner")

OWNED_LABEL = ("fleetpilot.dev/framework", "simulator")
SIMULATED_NODE_LABEL = "fleetpilot.dev/simulated-node=true"
POD_NETWORK = ipaddress.ip_network("127.2.0.0/16")
WILDCARD_HOSTS = ("0.0.0.0", "::", "")
FIRST_PROBE_S = 0.5
RESTART_BACKOFF_S = (1.0, 2.0, 5.0, 10.0)
Manifest = dict[str, Any]


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- pure pieces: what a pod spec asks for --------------------------------------------------------------

_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: known names are replaced, `$$` is a literal `$`, the rest stays."""

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env.get(name, match.group(0))

    return _REFERENCE.sub(one, text)


def field_value(pod: Manifest, path: str, *, pod_ip: str, host_ip: str) -> str:
    """The downward API's `fieldRef.fieldPath` values a container may ask for."""
    meta, spec = pod["metadata"], pod["spec"]
    simple = {
        "metadata.name": meta["name"],
        "metadata.namespace": meta["namespace"],
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
        "status.podIP": pod_ip,
        "status.podIPs": pod_ip,
        "status.hostIP": host_ip,
        "status.hostIPs": host_ip,
    }
    if path in simple:
        return str(simple[path])
    found = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if found:
        return str(meta.get(found.group(1), {}).get(found.group(2), ""))
    raise ValueError(f"fieldRef {path!r} is not supported by the e2e pod runner")


def container_env(pod: Manifest, container: Manifest, *, pod_ip: str, host_ip: str) -> dict[str, str]:
    """The container's declared env, in order, with `$(VAR)` resolved against the ones before it."""
    env: dict[str, str] = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = expand(str(item["value"]), env)
        elif "fieldRef" in item.get("valueFrom", {}):
            env[item["name"]] = field_value(pod, item["valueFrom"]["fieldRef"]["fieldPath"], pod_ip=pod_ip,
                                            host_ip=host_ip)
        elif "valueFrom" in item:
            raise ValueError(f"env {item['name']}: only value and fieldRef are supported by the e2e pod runner")
        else:
            env[item["name"]] = ""
    return env


def bind_to_pod_ip(args: list[str], pod_ip: str) -> list[str]:
    """A wildcard `--host` means "every address of the pod", which on loopback is the pod IP alone."""
    out = list(args)
    for index, arg in enumerate(out):
        if arg == "--host" and index + 1 < len(out) and out[index + 1] in WILDCARD_HOSTS:
            out[index + 1] = pod_ip
        elif arg.startswith("--host=") and arg.split("=", 1)[1] in WILDCARD_HOSTS:
            out[index] = f"--host={pod_ip}"
    return out


def probe_port(probe: Manifest, container: Manifest) -> int:
    port = probe["httpGet"]["port"]
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for declared in container.get("ports", []):
        if declared.get("name") == port:
            return int(declared["containerPort"])
    raise ValueError(f"probe port {port!r} is not a declared container port")


def is_owned(pod: Manifest, nodes: set[str]) -> bool:
    label, value = OWNED_LABEL
    return (pod["metadata"].get("labels", {}).get(label) == value
            and pod.get("spec", {}).get("nodeName") in nodes)


def service_account_certificate(ca_folder: Path, out: Path, *, namespace: str, account: str) -> tuple[Path, Path]:
    """A client certificate the apiserver maps to the ServiceAccount's user name and groups.

    The stand-in for a token where fleetpilot's API client sends none (see `token_auth_works` in
    harness.py): RBAC sees `system:serviceaccount:<namespace>:<account>`, as with the token.
    """
    ca_cert = x509.load_pem_x509_certificate((ca_folder / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((ca_folder / "ca.key").read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
    subject = x509.Name([
        x509.NameAttribute(NameOID.COMMON_NAME, f"system:serviceaccount:{namespace}:{account}"),
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:serviceaccounts"),
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, f"system:serviceaccounts:{namespace}"),
    ])
    certificate = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(ca_cert.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    out.mkdir(parents=True, exist_ok=True)
    crt, pem = out / f"{account}.crt", out / f"{account}.key"
    pem.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
    pem.chmod(0o600)
    crt.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return crt, pem


# -- the API, as the runner's admin identity -----------------------------------------------------------

def http_client(kubeconfig: Path) -> httpx.AsyncClient:
    """An async client for the kubeconfig's current context (client certificate or token)."""
    config = yaml.safe_load(kubeconfig.read_text())
    context = next(c["context"] for c in config["contexts"] if c["name"] == config["current-context"])
    cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
    user = next(u["user"] for u in config["users"] if u["name"] == context["user"])
    tls = ssl.create_default_context(cafile=cluster["certificate-authority"])
    headers = {"Accept": "application/json"}
    if "client-certificate" in user:
        tls.load_cert_chain(user["client-certificate"], user["client-key"])
    if "token" in user:
        headers["Authorization"] = f"Bearer {user['token']}"
    return httpx.AsyncClient(base_url=cluster["server"], verify=tls, headers=headers,
                             timeout=httpx.Timeout(30.0, connect=5.0))


class ApiFailed(RuntimeError):
    def __init__(self, response: httpx.Response) -> None:
        super().__init__(f"{response.request.method} {response.request.url.path}: {response.status_code}"
                         f" {response.text[:300]}")
        self.status = response.status_code


def _checked(response: httpx.Response) -> Manifest:
    if response.status_code >= 400:
        raise ApiFailed(response)
    body: Manifest = response.json() if response.content else {}
    return body


# -- one pod ---------------------------------------------------------------------------------------------

@dataclass
class RunningPod:
    """What the runner knows about one pod it runs (one container: the simulator's pods have one)."""

    uid: str
    namespace: str
    name: str
    ip: str
    pod: Manifest
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    started_at: str = ""
    process: asyncio.subprocess.Process | None = None
    ready: bool = False
    started: bool = False  # the startup probe (or, without one, the first readiness probe) passed
    restarts: int = 0
    last_exit: Manifest | None = None
    terminating: bool = False
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def container(self) -> Manifest:
        containers: list[Manifest] = self.pod["spec"]["containers"]
        return containers[0]

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class PodRunner:
    """Watches the owned pods and keeps one local process per pod."""

    def __init__(self, kubeconfig: Path, state: Path, *, bin_dirs: list[Path] | None = None,
                 extra_env: Mapping[str, str] | None = None, certificates_from: Path | None = None) -> None:
        self.kubeconfig = kubeconfig
        self.certificates_from = certificates_from  # a CA folder: certificates instead of tokens
        self.state = state
        self.logs = state / "logs"
        self.pids = state / "pids"
        self.secrets = state / "secrets"
        for folder in (self.logs, self.pids, self.secrets):
            folder.mkdir(parents=True, exist_ok=True)
        self.bin_dirs = bin_dirs or [Path(sys.executable).parent]
        self.extra_env = dict(extra_env or {})
        self.api = http_client(kubeconfig)
        self.server = str(self.api.base_url).rstrip("/")
        self.ca = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["certificate-authority"]
        self.nodes: dict[str, str] = {}  # simulated node name -> its InternalIP
        self.pods: dict[str, RunningPod] = {}
        self._used_ips: set[str] = set()
        self._next_ip = 1
        self._probe_client = httpx.AsyncClient(timeout=httpx.Timeout(3.0))

    # -- the watch -------------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        watching = asyncio.create_task(self._watch_forever(), name="pod watch")
        try:
            await stop.wait()
        finally:
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)
            await self.shutdown()

    async def _watch_forever(self) -> None:
        pause = 0.5
        while True:
            try:
                await self._load_nodes()
                listed = _checked(await self.api.get("/api/v1/pods", params={"labelSelector": "=".join(OWNED_LABEL)}))
                seen = set()
                for pod in listed["items"]:
                    seen.add(pod["metadata"]["uid"])
                    await self._on_event("MODIFIED", pod)
                for uid in set(self.pods) - seen:
                    await self._forget(self.pods[uid], why="gone while the watch was down")
                version = listed["metadata"]["resourceVersion"]
                params = {"labelSelector": "=".join(OWNED_LABEL), "watch": "true", "resourceVersion": version,
                          "allowWatchBookmarks": "true", "timeoutSeconds": "300"}
                async with self.api.stream("GET", "/api/v1/pods", params=params,
                                           timeout=httpx.Timeout(330.0, connect=5.0)) as response:
                    if response.status_code >= 400:
                        await response.aread()
                        raise ApiFailed(response)
                    async for line in response.aiter_lines():
                        if not line.strip():
                            continue
                        event = json.loads(line)
                        if event["type"] == "ERROR":
                            break
                        if event["type"] != "BOOKMARK":
                            await self._on_event(event["type"], event["object"])
                pause = 0.5
            except asyncio.CancelledError:
                raise
            except Exception as error:  # noqa: BLE001 - the runner must outlive API hiccups
                logger.warning("pod watch failed: %s; re-listing in %.1fs", error, pause)
                await asyncio.sleep(pause)
                pause = min(pause * 2, 10.0)

    async def _load_nodes(self) -> None:
        listed = _checked(await self.api.get("/api/v1/nodes", params={"labelSelector": SIMULATED_NODE_LABEL}))
        self.nodes = {}
        for node in listed["items"]:
            addresses = node.get("status", {}).get("addresses", [])
            internal = [a["address"] for a in addresses if a.get("type") == "InternalIP"]
            self.nodes[node["metadata"]["name"]] = internal[0] if internal else "127.0.0.1"

    async def _on_event(self, kind: str, pod: Manifest) -> None:
        uid = pod["metadata"]["uid"]
        running = self.pods.get(uid)
        if kind == "DELETED":
            if running is not None and not running.terminating:
                await self._forget(running, why="deleted")  # forced: no graceful termination was asked
            return
        if pod["spec"].get("nodeName") and pod["spec"]["nodeName"] not in self.nodes:
            await self._load_nodes()  # a node added after the last list
        if not is_owned(pod, set(self.nodes)):
            return
        if pod["metadata"].get("deletionTimestamp"):
            if running is None:
                await self._remove(pod)  # never started: nothing to stop
            elif not running.terminating:
                running.pod = pod  # its deletionGracePeriodSeconds
                running.terminating = True
                running.tasks.append(asyncio.create_task(self._terminate(running), name=f"stop {running.key}"))
            return
        if running is None:
            if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                return
            await self._start(pod)
        else:
            running.pod = pod

    # -- start -----------------------------------------------------------------------------------------

    def _allocate_ip(self, pod: Manifest) -> str:
        previous = pod.get("status", {}).get("podIP")
        if previous and ipaddress.ip_address(previous) in POD_NETWORK and previous not in self._used_ips:
            self._used_ips.add(previous)
            return str(previous)
        hosts = POD_NETWORK.num_addresses - 2
        for _ in range(hosts):
            candidate = str(POD_NETWORK.network_address + self._next_ip)
            self._next_ip = self._next_ip % hosts + 1
            if candidate not in self._used_ips:
                self._used_ips.add(candidate)
                return candidate
        raise RuntimeError("no free pod IP left in " + str(POD_NETWORK))

    async def _service_account_kubeconfig(self, pod: Manifest, folder: Path) -> Path | None:
        """A kubeconfig with a token bound to this pod, as the kubelet's projected token would be."""
        spec = pod["spec"]
        if spec.get("automountServiceAccountToken") is False:
            return None
        account = spec.get("serviceAccountName") or "default"
        meta = pod["metadata"]
        path = folder / "kubeconfig"
        user: Manifest
        if self.certificates_from is not None:
            crt, key = service_account_certificate(self.certificates_from, folder, namespace=meta["namespace"],
                                                   account=account)
            user = {"client-certificate": str(crt), "client-key": str(key)}
        else:
            user = {"token": await self._bound_token(pod, account)}
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "pod",
            "clusters": [{"name": "e2e", "cluster": {"server": self.server, "certificate-authority": self.ca}}],
            "users": [{"name": account, "user": user}],
            "contexts": [{"name": "pod", "context": {"cluster": "e2e", "user": account,
                                                    "namespace": meta["namespace"]}}],
        }))
        path.chmod(0o600)
        return path

    async def _bound_token(self, pod: Manifest, account: str) -> str:
        meta = pod["metadata"]
        request = {
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"expirationSeconds": 6 * 3600,
                     "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}},
        }
        answer = _checked(await self.api.post(
            f"/api/v1/namespaces/{meta['namespace']}/serviceaccounts/{account}/token", json=request))
        token: str = answer["status"]["token"]
        return token

    async def _start(self, pod: Manifest) -> None:
        meta = pod["metadata"]
        node_ip = self.nodes.get(pod["spec"]["nodeName"], "127.0.0.1")
        ip = self._allocate_ip(pod)
        key = f"{meta['namespace']}_{meta['name']}"
        container = pod["spec"]["containers"][0]
        if len(pod["spec"]["containers"]) > 1 or pod["spec"].get("initContainers"):
            logger.warning("%s/%s: only the first container runs", meta["namespace"], meta["name"])
        try:
            declared = container_env(pod, container, pod_ip=ip, host_ip=node_ip)
            folder = self.secrets / key
            folder.mkdir(parents=True, exist_ok=True)
            kubeconfig = await self._service_account_kubeconfig(pod, folder)
            command = [expand(part, declared) for part in container.get("command", [])]
            args = [expand(part, declared) for part in container.get("args", [])]
            if not command:
                raise ValueError("the container has no command (images' entry points are unknown here)")
            path = os.pathsep.join([*(str(d) for d in self.bin_dirs), os.environ.get("PATH", "/usr/bin:/bin")])
            binary = shutil.which(command[0], path=path)
            if binary is None:
                raise ValueError(f"{command[0]!r} is not on {path}")
        except (ValueError, ApiFailed) as error:
            logger.error("%s/%s cannot start: %s", meta["namespace"], meta["name"], error)
            self._used_ips.discard(ip)
            await self._patch_status(pod, {"phase": "Pending", "conditions": self._conditions(pod, False, False),
                                           "containerStatuses": [{
                                               "name": container["name"], "image": container.get("image", ""),
                                               "imageID": "", "ready": False, "restartCount": 0, "started": False,
                                               "state": {"waiting": {"reason": "CreateContainerConfigError",
                                                                     "message": str(error)[:500]}}}]})
            return
        env = {
            "PATH": path, "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8", "PYTHONUNBUFFERED": "1",
            "HOSTNAME": meta["name"], **self.extra_env, **declared,
        }
        if kubeconfig is not None:
            env["KUBECONFIG"] = str(kubeconfig)
        running = RunningPod(uid=meta["uid"], namespace=meta["namespace"], name=meta["name"], ip=ip, pod=pod,
                             argv=[binary, *bind_to_pod_ip(command[1:] + args, ip)], env=env,
                             log_path=self.logs / f"{key}.log")
        self.pods[running.uid] = running
        await self._spawn(running)
        running.tasks.append(asyncio.create_task(self._supervise(running), name=f"run {running.key}"))

    async def _spawn(self, running: RunningPod) -> None:
        with running.log_path.open("ab") as log:
            log.write(f"--- {now_rfc3339()} start {' '.join(running.argv)}\n".encode())
            log.flush()
            running.process = await asyncio.create_subprocess_exec(
                *running.argv, stdout=log, stderr=asyncio.subprocess.STDOUT, stdin=asyncio.subprocess.DEVNULL,
                env=running.env, start_new_session=True,
            )
        processes.record(self.pids / f"{running.uid}.pid", running.process.pid)
        running.started_at = now_rfc3339()
        running.started = running.ready = False
        logger.info("%s: started pid %d on %s", running.key, running.process.pid, running.ip)
        await self._report(running)

    # -- run: probes and restarts ----------------------------------------------------------------------

    async def _supervise(self, running: RunningPod) -> None:
        """Probe while the process runs; restart it when it exits, until the pod terminates."""
        backoff = 0
        while not running.terminating:
            assert running.process is not None
            probing = asyncio.create_task(self._probe_loop(running), name=f"probe {running.key}")
            code = await running.process.wait()
            probing.cancel()
            await asyncio.gather(probing, return_exceptions=True)
            (self.pids / f"{running.uid}.pid").unlink(missing_ok=True)
            if running.terminating:
                return
            logger.warning("%s: exited with %d; restarting", running.key, code)
            running.last_exit = {"terminated": {"exitCode": code, "reason": "Error" if code else "Completed",
                                                "startedAt": running.started_at, "finishedAt": now_rfc3339()}}
            running.ready = running.started = False
            running.restarts += 1
            await self._report(running, waiting="CrashLoopBackOff")
            await asyncio.sleep(RESTART_BACKOFF_S[min(backoff, len(RESTART_BACKOFF_S) - 1)])
            backoff += 1
            if not running.terminating:
                await self._spawn(running)

    async def _probe(self, running: RunningPod, probe: Manifest) -> bool:
        if "httpGet" not in probe:
            return True  # exec and tcpSocket probes are not needed by the simulator's pods
        get = probe["httpGet"]
        url = f"http://{running.ip}:{probe_port(probe, running.container)}{get.get('path', '/')}"
        try:
            response = await self._probe_client.get(url, timeout=float(probe.get("timeoutSeconds", 1)))
        except httpx.HTTPError:
            return False
        return 200 <= response.status_code < 400

    async def _probe_loop(self, running: RunningPod) -> None:
        container = running.container
        startup = container.get("startupProbe")
        readiness = container.get("readinessProbe")
        liveness = container.get("livenessProbe")
        failures = {"readiness": 0, "liveness": 0}
        next_liveness = time.monotonic()
        while True:
            if not running.started:
                gate = startup or readiness
                if gate is None or await self._probe(running, gate):
                    running.started = True
                    next_liveness = time.monotonic() + float((liveness or {}).get("periodSeconds", 10))
                    if readiness is None:
                        running.ready = True
                        await self._report(running)
                    continue  # readiness runs at once after startup
                await asyncio.sleep(FIRST_PROBE_S)
                continue
            if readiness is not None:
                if await self._probe(running, readiness):
                    failures["readiness"] = 0
                    if not running.ready:
                        running.ready = True
                        logger.info("%s: ready", running.key)
                        await self._report(running)
                else:
                    failures["readiness"] += 1
                    if running.ready and failures["readiness"] >= int(readiness.get("failureThreshold", 3)):
                        running.ready = False
                        logger.info("%s: not ready (%d failed probes)", running.key, failures["readiness"])
                        await self._report(running)
            if liveness is not None and time.monotonic() >= next_liveness:
                next_liveness = time.monotonic() + float(liveness.get("periodSeconds", 10))
                if await self._probe(running, liveness):
                    failures["liveness"] = 0
                else:
                    failures["liveness"] += 1
                    if failures["liveness"] >= int(liveness.get("failureThreshold", 3)):
                        logger.warning("%s: liveness failed %d times; killing it", running.key,
                                       failures["liveness"])
                        await self._signal(running, signal.SIGKILL)  # _supervise restarts it
                        return
            period = float((readiness or liveness or {}).get("periodSeconds", 10))
            if not running.ready:
                period = min(period, FIRST_PROBE_S * 2)
            await asyncio.sleep(period)

    # -- stop ------------------------------------------------------------------------------------------

    async def _signal(self, running: RunningPod, sig: signal.Signals) -> None:
        if running.process is not None and running.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(running.process.pid, sig)

    async def _pre_stop(self, running: RunningPod, budget_s: float) -> None:
        hook = running.container.get("lifecycle", {}).get("preStop")
        if not hook or budget_s <= 0:
            return
        try:
            if "exec" in hook:
                process = await asyncio.create_subprocess_exec(
                    *hook["exec"]["command"], env=running.env, stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.DEVNULL, start_new_session=True)
                try:
                    await asyncio.wait_for(process.wait(), budget_s)
                except TimeoutError:
                    os.killpg(process.pid, signal.SIGKILL)
                    await process.wait()
            elif "httpGet" in hook:
                get = hook["httpGet"]
                port = probe_port({"httpGet": get}, running.container)
                await self._probe_client.get(f"http://{running.ip}:{port}{get.get('path', '/')}", timeout=budget_s)
            elif "sleep" in hook:
                await asyncio.sleep(min(float(hook["sleep"]["seconds"]), budget_s))
        except (OSError, httpx.HTTPError) as error:
            logger.warning("%s: preStop hook failed: %s", running.key, error)

    async def _terminate(self, running: RunningPod) -> None:
        """Graceful termination as the kubelet does it, then the pod object goes."""
        pod = running.pod
        grace = pod["metadata"].get("deletionGracePeriodSeconds")
        if grace is None:
            grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
        deadline = time.monotonic() + float(grace)
        logger.info("%s: terminating (grace %ss)", running.key, grace)
        running.ready = False
        with contextlib.suppress(ApiFailed, httpx.HTTPError):
            await self._report(running)
        await self._pre_stop(running, deadline - time.monotonic())
        await self._signal(running, signal.SIGTERM)
        if running.process is not None:
            try:
                await asyncio.wait_for(running.process.wait(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                logger.warning("%s: still running after %ss; SIGKILL", running.key, grace)
                await self._signal(running, signal.SIGKILL)
                await running.process.wait()
            logger.info("%s: exited with %s", running.key, running.process.returncode)
        await self._remove(pod)
        self._release(running)

    async def _remove(self, pod: Manifest) -> None:
        meta = pod["metadata"]
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
                "preconditions": {"uid": meta["uid"]}}
        response = await self.api.request("DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                                          content=json.dumps(body), headers={"Content-Type": "application/json"})
        if response.status_code not in (200, 202, 404, 409):
            logger.warning("removing %s/%s: %s %s", meta["namespace"], meta["name"], response.status_code,
                           response.text[:200])

    async def _forget(self, running: RunningPod, *, why: str) -> None:
        """The pod object is gone (forced, or while we were not watching): stop its process now."""
        logger.info("%s: %s; killing its process", running.key, why)
        running.terminating = True
        await self._signal(running, signal.SIGKILL)
        if running.process is not None:
            await running.process.wait()
        self._release(running)

    def _release(self, running: RunningPod) -> None:
        self.pods.pop(running.uid, None)
        self._used_ips.discard(running.ip)
        (self.pids / f"{running.uid}.pid").unlink(missing_ok=True)
        shutil.rmtree(self.secrets / f"{running.namespace}_{running.name}", ignore_errors=True)

    async def shutdown(self) -> None:
        """Stop every process: SIGTERM, a short wait, then SIGKILL. Pods are left as they are."""
        everything = list(self.pods.values())
        for running in everything:
            running.terminating = True
            await self._signal(running, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for running in everything:
            if running.process is None:
                continue
            try:
                await asyncio.wait_for(running.process.wait(), max(0.1, deadline - time.monotonic()))
            except TimeoutError:
                await self._signal(running, signal.SIGKILL)
                await running.process.wait()
            for task in running.tasks:
                task.cancel()
            (self.pids / f"{running.uid}.pid").unlink(missing_ok=True)
        self.pods.clear()
        await self._probe_client.aclose()
        await self.api.aclose()

    # -- status ----------------------------------------------------------------------------------------

    @staticmethod
    def _conditions(pod: Manifest, initialized: bool, ready: bool) -> list[Manifest]:
        """Our conditions, each keeping its transition time while its status does not change."""
        old = {c["type"]: c for c in pod.get("status", {}).get("conditions", [])}
        wanted = {"PodScheduled": True, "Initialized": initialized, "ContainersReady": ready, "Ready": ready}
        out = []
        for type_, value in wanted.items():
            status = "True" if value else "False"
            previous = old.get(type_, {})
            stamp = previous.get("lastTransitionTime") if previous.get("status") == status else now_rfc3339()
            out.append({"type": type_, "status": status, "lastProbeTime": None, "lastTransitionTime": stamp})
        return out

    async def _report(self, running: RunningPod, *, waiting: str | None = None) -> None:
        container = running.container
        state: Manifest
        if waiting:
            state = {"waiting": {"reason": waiting}}
        else:
            state = {"running": {"startedAt": running.started_at}}
        status: Manifest = {
            "name": container["name"], "image": container.get("image", ""), "imageID": "",
            "containerID": f"e2e://{running.process.pid if running.process else 0}",
            "ready": running.ready, "started": running.started, "restartCount": running.restarts, "state": state,
        }
        if running.last_exit:
            status["lastState"] = running.last_exit
        node_ip = self.nodes.get(running.pod["spec"].get("nodeName", ""), "127.0.0.1")
        await self._patch_status(running.pod, {
            "phase": "Running",
            "podIP": running.ip, "podIPs": [{"ip": running.ip}],
            "hostIP": node_ip, "hostIPs": [{"ip": node_ip}],
            "startTime": running.pod.get("status", {}).get("startTime") or running.started_at,
            "conditions": self._conditions(running.pod, True, running.ready),
            "containerStatuses": [status],
        })

    async def _patch_status(self, pod: Manifest, status: Manifest) -> None:
        meta = pod["metadata"]
        response = await self.api.patch(
            f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status",
            content=json.dumps({"status": status}), headers={"Content-Type": "application/merge-patch+json"})
        if response.status_code == 404:
            return
        updated = _checked(response)
        running = self.pods.get(meta["uid"])
        if running is not None:
            running.pod = updated


def reap(state: Path) -> list[int]:
    """Kill what a runner that died without cleaning up left behind (by its saved PIDs)."""
    killed = []
    for pid_file in (state / "pids").glob("*.pid"):
        pid = processes.alive(pid_file)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            killed.append(pid)
        pid_file.unlink(missing_ok=True)
    return killed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", type=Path, required=True, help="an identity that may run pods (admin)")
    parser.add_argument("--state", type=Path, required=True, help="folder for logs, PIDs and pod credentials")
    parser.add_argument("--bin-dir", type=Path, action="append", default=[],
                        help="where container commands are found first (default: this Python's bin)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="extra environment for every container (repeatable)")
    parser.add_argument("--certificates-from", type=Path, default=None, metavar="CA_FOLDER",
                        help="give pods client certificates for their ServiceAccount instead of tokens")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    extra = dict(item.split("=", 1) for item in args.env)
    reap(args.state)

    async def go() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        runner = PodRunner(args.kubeconfig, args.state, bin_dirs=args.bin_dir or None, extra_env=extra,
                           certificates_from=args.certificates_from)
        await runner.run(stop)

    asyncio.run(go())
    return 0


if __name__ == "__main__":
    sys.exit(main())
