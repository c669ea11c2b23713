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
  sends SIGKILL, then removes the pod (`gracePeriodSeconds=0`);
- with `--image` given, plays a node that can pull only those images: a pod asking for another stays
  Pending with `ImagePullBackOff`, as a kubelet reports an image that does not exist;
- plays cluster DNS for pods behind headless Services (a multinode group's ranks find their leader
  by `<leader>.<service>.<namespace>.svc`): such a name in a command line or env becomes that pod's
  IP, and a pod naming a peer that has none yet starts once it has.

What the pod spec asks for (env, command line, ServiceAccount, probe ports) is read by the pure
functions of `podspec.py`; this module is the adapter around them: the pod watch (fleetpilot's
informer), the API calls (`fleetpilot.kube`), processes, probes and status.

Each container's output goes to `<state>/logs/<namespace>_<pod>.log`; each process's PID to
`<state>/pids/`, so `reap()` can kill what a crashed runner left. On exit every process is killed.
With `--kubelet-port` and `--pki`, the runner also serves the kubelet's log endpoint for its pods
(`podlogs.py`), so `kubectl logs` works on the local cluster.

Run by hand: `~/.cache/fleetpilot/venv/bin/python e2e/podrunner.py --kubeconfig FILE --state DIR`.
Deviation from a kubelet, on purpose: before a container's first successful probe the runner probes
every `FIRST_PROBE_S` instead of every `periodSeconds`, so a test does not wait 5 s per pod start.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import datetime
import ipaddress
import logging
import os
import shutil
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import podlogs
import podspec
import yaml

from fleetpilot import informer, kube
from fleetpilot.api import contract
from fleetpilot.devcluster import processes

logger = logging.getLogger("podrunner")

FIELD_MANAGER = "e2e-podrunner"
SIMULATED_NODE_LABELS = {contract.LABEL_SIMULATED_NODE: "true"}
# Pod IPs on loopback; two e2e runs on one machine (different port bases) need different networks.
POD_NETWORK = ipaddress.ip_network(os.environ.get("FLEETPILOT_E2E_POD_NETWORK", "127.2.0.0/16"))
FIRST_PROBE_S = 0.5
RESTART_BACKOFF_S = (1.0, 2.0, 5.0, 10.0)
Manifest = dict[str, Any]


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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
                 extra_env: Mapping[str, str] | None = None, images: set[str] | None = None,
                 kubelet_port: int | None = None, pki_folder: Path | None = None) -> None:
        self.kubeconfig = kubeconfig
        self.kubelet_port = kubelet_port
        self.pki_folder = pki_folder
        self.state = state
        self.logs = state / "logs"
        self.pids = state / "pids"
        self.secrets = state / "secrets"
        for folder in (self.logs, self.pids, self.secrets):
            folder.mkdir(parents=True, exist_ok=True)
        self.bin_dirs = bin_dirs or [Path(sys.executable).parent]
        self.extra_env = dict(extra_env or {})
        self.images = images or set()  # the images this node can pull (empty: any)
        configuration = kube.load_configuration(str(kubeconfig))
        self.api = kube.KubeApi(configuration, field_manager=FIELD_MANAGER)
        self.server = str(configuration.host).rstrip("/")  # what the pods' kubeconfigs point at
        self.ca = str(configuration.ssl_ca_cert)
        self.nodes: dict[str, str] = {}  # simulated node name -> its InternalIP
        self.pods: dict[str, RunningPod] = {}
        self._used_ips: set[str] = set()
        self._next_ip = 1
        # Pods whose command line names another pod (a group's leader) that has no IP yet, by uid.
        self._awaiting_peer: dict[str, Manifest] = {}
        self._probe_client = httpx.AsyncClient(timeout=httpx.Timeout(3.0))

    # -- the watch -------------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        label, value = podspec.OWNED_LABEL
        # List once, then watch (resuming from the last version; a re-list hands on deletions missed).
        watch = informer.Informer(self.api, "Pod", labels={label: value}, on_event=self._on_event,
                                  max_pause_s=10.0)
        await watch.start()
        retry = asyncio.create_task(self._start_awaiting(), name="start pods awaiting a peer")
        logs = None
        if self.kubelet_port and self.pki_folder:
            logs = await podlogs.serve(self.log_source, port=self.kubelet_port, pki_folder=self.pki_folder)
        try:
            await stop.wait()
        finally:
            if logs is not None:
                await logs.cleanup()
            retry.cancel()
            await asyncio.gather(retry, return_exceptions=True)
            await watch.stop()
            await self.shutdown()

    def log_source(self, namespace: str, name: str) -> podlogs.LogSource | None:
        """Where a pod this runner runs writes (`kubectl logs`), or None for any other pod."""
        found = next((r for r in self.pods.values() if (r.namespace, r.name) == (namespace, name)), None)
        if found is None:
            return None
        return podlogs.LogSource(container=found.container["name"], path=found.log_path,
                                 alive=lambda: self.pods.get(found.uid) is found and not found.terminating)

    async def _start_awaiting(self) -> None:
        """Start the pods that waited for a peer's address, once it has one (no event may come)."""
        while True:
            await asyncio.sleep(FIRST_PROBE_S)
            for uid, pod in list(self._awaiting_peer.items()):
                del self._awaiting_peer[uid]
                if uid not in self.pods:
                    await self._start(pod)

    async def _load_nodes(self) -> None:
        self.nodes = {}
        for node in await self.api.list("Node", labels=SIMULATED_NODE_LABELS):
            addresses = node.get("status", {}).get("addresses", [])
            internal = [a["address"] for a in addresses if a.get("type") == "InternalIP"]
            self.nodes[node["metadata"]["name"]] = internal[0] if internal else "127.0.0.1"

    async def _on_event(self, kind: str, pod: Manifest) -> None:
        uid = pod["metadata"]["uid"]
        running = self.pods.get(uid)
        if kind == "DELETED" or pod["metadata"].get("deletionTimestamp"):
            self._awaiting_peer.pop(uid, None)
        if kind == "DELETED":
            if running is not None and not running.terminating:
                await self._forget(running, why="deleted")  # forced: no graceful termination was asked
            return
        for other in [r for r in self.pods.values() if r.uid != uid and (r.namespace, r.name) == (
                pod["metadata"]["namespace"], pod["metadata"]["name"])]:
            # Deleted and made again under the same name while the watch was down: the re-list sees one
            # object changing, not a deletion, so the old pod's process is told apart by its uid.
            await self._forget(other, why="replaced while the watch was down")
        if pod["spec"].get("nodeName") and pod["spec"]["nodeName"] not in self.nodes:
            await self._load_nodes()  # the first pod, or a node added since
        if not podspec.is_owned(pod, set(self.nodes)):
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

    async def _secrets_of(self, pod: Manifest) -> dict[str, dict[str, str]]:
        """The Secrets the pod's env takes values from, decoded, as a kubelet reads them before it starts a
        container; one that does not exist is left out (`podspec.secret_value` says what that means)."""
        found = {}
        for name in sorted(podspec.secret_names(pod)):
            try:
                secret = await self.api.get("Secret", pod["metadata"]["namespace"], name)
            except kube.ApiError as error:
                if error.not_found:
                    continue
                raise
            found[name] = {key: base64.b64decode(value).decode() for key, value in (secret.get("data") or {}).items()}
        return found

    async def _service_account_kubeconfig(self, pod: Manifest, folder: Path) -> Path | None:
        """A kubeconfig with a token bound to this pod, as the kubelet's projected token would be."""
        account = podspec.service_account(pod)
        if account is None:
            return None
        path = folder / "kubeconfig"
        path.write_text(yaml.safe_dump(podspec.kubeconfig(
            server=self.server, ca=self.ca, account=account, namespace=pod["metadata"]["namespace"],
            token=await self._bound_token(pod, account))))
        path.chmod(0o600)
        return path

    async def _bound_token(self, pod: Manifest, account: str) -> str:
        meta = pod["metadata"]
        request = {
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"expirationSeconds": 6 * 3600,
                     "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}},
        }
        answer = await self.api.create_subresource("ServiceAccount", meta["namespace"], account, "token", request)
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
        image = container.get("image", "")
        if self.images and image not in self.images:
            self._used_ips.discard(ip)
            await self._waiting(pod, "ImagePullBackOff", f'Back-off pulling image "{image}": not found')
            return
        try:
            spec = podspec.process_spec(pod, pod_ip=ip, host_ip=node_ip, secrets=await self._secrets_of(pod))
            peers = podspec.pod_dns_names(spec)
            if peers:
                addresses = self._pod_addresses(pod, ip)
                if peers - set(addresses):
                    # A peer (its group's leader) has no IP yet: start once it has, as the process would
                    # retry the name until the cluster's DNS answered it.
                    self._used_ips.discard(ip)
                    self._awaiting_peer[meta["uid"]] = pod
                    return
                spec = podspec.resolve_pod_names(spec, addresses)
            folder = self.secrets / key
            folder.mkdir(parents=True, exist_ok=True)
            kubeconfig = await self._service_account_kubeconfig(pod, folder)
            path = os.pathsep.join([*(str(d) for d in self.bin_dirs), os.environ.get("PATH", "/usr/bin:/bin")])
            binary = shutil.which(spec.program, path=path)
            if binary is None:
                raise ValueError(f"{spec.program!r} is not on {path}")
        except (ValueError, kube.ApiError) as error:
            logger.error("%s/%s cannot start: %s", meta["namespace"], meta["name"], error)
            self._used_ips.discard(ip)
            await self._waiting(pod, "CreateContainerConfigError", str(error))
            return
        base = {"PATH": path, "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8", "PYTHONUNBUFFERED": "1"}
        env = podspec.process_env(spec, hostname=meta["name"], base=base, extra=self.extra_env,
                                  kubeconfig=None if kubeconfig is None else str(kubeconfig))
        running = RunningPod(uid=meta["uid"], namespace=meta["namespace"], name=meta["name"], ip=ip, pod=pod,
                             argv=[binary, *spec.args], env=env, log_path=self.logs / f"{key}.log")
        self.pods[running.uid] = running
        await self._spawn(running)
        running.tasks.append(asyncio.create_task(self._supervise(running), name=f"run {running.key}"))

    def _pod_addresses(self, pod: Manifest, ip: str) -> dict[podspec.PodName, str]:
        """The DNS names of the pods this runner runs (and of `pod` itself, about to get `ip`)."""
        addresses = {key: r.ip for r in self.pods.values()
                     if not r.terminating and (key := podspec.pod_dns_key(r.pod)) is not None}
        own = podspec.pod_dns_key(pod)
        if own is not None:
            addresses[own] = ip
        return addresses

    async def _waiting(self, pod: Manifest, reason: str, message: str) -> None:
        """A pod whose container cannot start: Pending, the container waiting for `reason`."""
        container = pod["spec"]["containers"][0]
        await self._patch_status(pod, {"phase": "Pending", "conditions": self._conditions(pod, False, False),
                                       "containerStatuses": [{
                                           "name": container["name"], "image": container.get("image", ""),
                                           "imageID": "", "ready": False, "restartCount": 0, "started": False,
                                           "state": {"waiting": {"reason": reason, "message": message[:500]}}}]})

    async def _spawn(self, running: RunningPod) -> None:
        with running.log_path.open("ab") as log:
            log.write(podlogs.run_header(now_rfc3339(), running.argv))
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
        url = f"http://{running.ip}:{podspec.probe_port(probe, running.container)}{get.get('path', '/')}"
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
                port = podspec.probe_port({"httpGet": get}, running.container)
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
        with contextlib.suppress(kube.ApiError, httpx.HTTPError):
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
        try:
            # Not found: already gone. A conflict: the uid precondition failed, a newcomer took the name.
            await self.api.delete("Pod", meta["namespace"], meta["name"], uid=meta["uid"], grace_period_seconds=0)
        except kube.ApiError as error:
            if not error.conflict:
                logger.warning("removing %s/%s: %s", meta["namespace"], meta["name"], str(error)[:200])

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
        try:
            updated = await self.api.patch("Pod", meta["namespace"], meta["name"], {"status": status},
                                           subresource="status")
        except kube.ApiError as error:
            if error.not_found:
                return
            raise
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
    parser.add_argument("--kubelet-port", type=int, default=None,
                        help="serve the kubelet's log endpoint here (the cluster's kubelet_port), with --pki")
    parser.add_argument("--pki", type=Path, default=None, help="the cluster's pki folder (its CA, kubelet certificate)")
    parser.add_argument("--image", action="append", default=[],
                        help="an image this node can pull (repeatable; none given: any image)")
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
                           images=set(args.image), kubelet_port=args.kubelet_port, pki_folder=args.pki)
        await runner.run(stop)

    asyncio.run(go())
    return 0


if __name__ == "__main__":
    sys.exit(main())
