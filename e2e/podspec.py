"""What a pod spec asks the e2e pod runner to exec: pod in, process spec out, no I/O.

Where it sits: the pure half of `podrunner.py`, the e2e harness's kubelet. The runner (the adapter)
watches pods, allocates the pod IP, mints the ServiceAccount token, finds the program on PATH and
spawns it; everything it needs to read out of the pod spec for that is here:

- which pods the runner owns (`is_owned`);
- the container's env: literal values with Kubernetes' `$(VAR)` expansion, the downward API's
  `fieldRef`s (`container_env`, `field_value`), and `secretKeyRef`s from the Secrets the runner read for it
  (`secret_names`; a kubelet reads them the same way); other `valueFrom` sources are refused;
- its command and args, expanded against that env, a wildcard `--host` bound to the pod IP as the
  pod's own network namespace would make it (`process_spec`), and the process environment around it
  (`process_env`);
- the ServiceAccount whose token it gets (`service_account`) and the kubeconfig that carries it
  (`kubeconfig`), since these local processes have no in-cluster token file;
- the port a probe or an httpGet hook targets, by number or by the container port's name (`probe_port`);
- cluster DNS for pods: a pod's own DNS name (`<hostname>.<subdomain>.<namespace>.svc`, what a
  StatefulSet's pods get through a headless Service) in its command line or env, which a multinode
  group's ranks use to reach their leader, is replaced by that pod's IP (`pod_dns_names`,
  `resolve_pod_names`), as the cluster's DNS would answer: these processes have no cluster DNS.

Errors a pod spec can cause are `ValueError`s; the runner reports them as the pod's
`CreateContainerConfigError`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from fleetpilot.api import contract
from fleetpilot.devcluster import pki

Manifest = dict[str, Any]

OWNED_LABEL = (contract.LABEL_FRAMEWORK, "simulator")
WILDCARD_HOSTS = ("0.0.0.0", "::", "")

_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
_LABEL_OR_ANNOTATION = re.compile(r"metadata\.(labels|annotations)\['([^']+)'\]")
_DNS_LABEL = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
#: `<hostname>.<subdomain>.<namespace>.svc[.cluster.local]`: one pod behind a headless Service.
_POD_DNS = re.compile(rf"\b({_DNS_LABEL})\.({_DNS_LABEL})\.({_DNS_LABEL})\.svc(?:\.cluster\.local)?\b")
PodName = tuple[str, str, str]  # (hostname, subdomain, namespace)


@dataclasses.dataclass(frozen=True)
class ProcessSpec:
    """One container as a process: the program to look up on PATH, its arguments, its declared env."""

    program: str  # the command's first word, as the container names it
    args: tuple[str, ...]  # the rest of the command, then args: expanded, a wildcard --host bound
    env: dict[str, str]  # the container's env, resolved in declaration order


def is_owned(pod: Manifest, nodes: set[str]) -> bool:
    """A simulator pod bound to one of the simulated nodes: the runner's, not kwok's."""
    label, value = OWNED_LABEL
    return (pod["metadata"].get("labels", {}).get(label) == value
            and pod.get("spec", {}).get("nodeName") in nodes)


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
    found = _LABEL_OR_ANNOTATION.fullmatch(path)
    if found:
        return str(meta.get(found.group(1), {}).get(found.group(2), ""))
    raise ValueError(f"fieldRef {path!r} is not supported by the e2e pod runner")


Secrets = Mapping[str, Mapping[str, str]]  # Secret name -> its data, decoded; a Secret not found is absent


def secret_names(pod: Manifest) -> set[str]:
    """The Secrets (in the pod's namespace) the first container's env takes values from."""
    container = pod["spec"]["containers"][0]
    return {item["valueFrom"]["secretKeyRef"]["name"] for item in container.get("env", [])
            if "secretKeyRef" in item.get("valueFrom", {})}


def secret_value(pod: Manifest, reference: Manifest, secrets: Secrets) -> str | None:
    """A `secretKeyRef`'s value; None for an optional one whose Secret or key is missing. A required one
    missing is the kubelet's CreateContainerConfigError, with its words."""
    name, key, optional = reference["name"], reference["key"], reference.get("optional", False)
    data = secrets.get(name)
    if data is None:
        if optional:
            return None
        raise ValueError(f'secret "{name}" not found')
    if key not in data:
        if optional:
            return None
        raise ValueError(f"couldn't find key {key} in Secret {pod['metadata']['namespace']}/{name}")
    return data[key]


def container_env(pod: Manifest, container: Manifest, *, pod_ip: str, host_ip: str,
                  secrets: Secrets | None = None) -> dict[str, str]:
    """The container's declared env, in order, with `$(VAR)` resolved against the ones before it."""
    env: dict[str, str] = {}
    for item in container.get("env", []):
        source = item.get("valueFrom", {})
        if "value" in item:
            env[item["name"]] = expand(str(item["value"]), env)
        elif "fieldRef" in source:
            env[item["name"]] = field_value(pod, source["fieldRef"]["fieldPath"], pod_ip=pod_ip, host_ip=host_ip)
        elif "secretKeyRef" in source:
            value = secret_value(pod, source["secretKeyRef"], secrets or {})
            if value is not None:
                env[item["name"]] = value
        elif source:
            raise ValueError(f"env {item['name']}: only value, fieldRef and secretKeyRef are supported by the "
                             "e2e pod runner")
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


def process_spec(pod: Manifest, *, pod_ip: str, host_ip: str, secrets: Secrets | None = None) -> ProcessSpec:
    """The pod's first container as a process (the simulator's pods have one; the runner warns otherwise);
    `secrets`: the Secrets of `secret_names(pod)` that exist."""
    container = pod["spec"]["containers"][0]
    env = container_env(pod, container, pod_ip=pod_ip, host_ip=host_ip, secrets=secrets)
    command = [expand(part, env) for part in container.get("command", [])]
    args = [expand(part, env) for part in container.get("args", [])]
    if not command:
        raise ValueError("the container has no command (images' entry points are unknown here)")
    return ProcessSpec(program=command[0], args=tuple(bind_to_pod_ip(command[1:] + args, pod_ip)), env=env)


def process_env(spec: ProcessSpec, *, hostname: str, base: Mapping[str, str], extra: Mapping[str, str],
                kubeconfig: str | None) -> dict[str, str]:
    """The whole environment: the runner's `base` (PATH, HOME, ...), HOSTNAME, `extra`, the container's
    own env over those, and KUBECONFIG (the pod's ServiceAccount) over everything."""
    env = {**base, "HOSTNAME": hostname, **extra, **spec.env}
    if kubeconfig is not None:
        env["KUBECONFIG"] = kubeconfig
    return env


def service_account(pod: Manifest) -> str | None:
    """The ServiceAccount whose token the pod gets, or None when it opts out of the automount."""
    spec = pod["spec"]
    if spec.get("automountServiceAccountToken") is False:
        return None
    return str(spec.get("serviceAccountName") or "default")


def kubeconfig(*, server: str, ca: str, account: str, namespace: str, token: str) -> Manifest:
    """A kubeconfig for one ServiceAccount token, its context defaulting to the pod's namespace."""
    return pki.kubeconfig(cluster_name="e2e", server=server, ca=ca, user=account, credentials={"token": token},
                          namespace=namespace)


def probe_port(probe: Manifest, container: Manifest) -> int:
    """The port of an httpGet probe or hook: a number, or the name of one of the container's ports."""
    port = probe["httpGet"]["port"]
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for declared in container.get("ports", []):
        if declared.get("name") == port:
            return int(declared["containerPort"])
    raise ValueError(f"probe port {port!r} is not a declared container port")


def pod_dns_key(pod: Manifest) -> PodName | None:
    """The DNS name a pod answers to, as (hostname, subdomain, namespace), or None without a subdomain."""
    spec, meta = pod.get("spec", {}), pod["metadata"]
    if not spec.get("subdomain"):
        return None
    return (str(spec.get("hostname") or meta["name"]), str(spec["subdomain"]), str(meta["namespace"]))


def pod_dns_names(spec: ProcessSpec) -> set[PodName]:
    """The pods' DNS names a process spec refers to (its arguments and env values)."""
    texts = [*spec.args, *spec.env.values()]
    return {(m.group(1), m.group(2), m.group(3)) for text in texts for m in _POD_DNS.finditer(text)}


def resolve_pod_names(spec: ProcessSpec, addresses: Mapping[PodName, str]) -> ProcessSpec:
    """The spec with every pod DNS name in `addresses` replaced by its IP; unknown names stay."""

    def one(match: re.Match[str]) -> str:
        return addresses.get((match.group(1), match.group(2), match.group(3)), match.group(0))

    return ProcessSpec(program=spec.program, args=tuple(_POD_DNS.sub(one, a) for a in spec.args),
                       env={k: _POD_DNS.sub(one, v) for k, v in spec.env.items()})
