"""Kubernetes pod discovery for Prometheus over its HTTP SD protocol (Debian's build lacks kubernetes_sd).

Where it sits: between the apiserver and Prometheus in the e2e harness. Debian bookworm's
prometheus 2.42 is built without the Kubernetes service-discovery plugin (`kubernetes_sd_configs`
is refused as an unknown field), but it has `http_sd_configs`. This bridge watches Pods with
Prometheus' own ServiceAccount token (list and watch on pods, nothing else) and serves, at
`/targets`, one target group per declared container port of every pod with an IP, labelled with the
very `__meta_kubernetes_pod_*` names the `role: pod` plugin gives. The scrape config's relabelling
is therefore the one a real cluster's Prometheus would use.

Run: `python e2e/podsd.py --kubeconfig FILE --listen 127.0.0.1:PORT`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import re
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from fleetpilot import informer, kube

logger = logging.getLogger("podsd")
_INVALID = re.compile(r"[^a-zA-Z0-9_]")


def sanitize(name: str) -> str:
    """Prometheus' label-name sanitising: every character outside [a-zA-Z0-9_] becomes `_`."""
    return _INVALID.sub("_", name)


def target_groups(pod: dict[str, Any]) -> list[dict[str, Any]]:
    """What the kubernetes_sd `role: pod` plugin would give for one pod (pure)."""
    meta, spec, status = pod["metadata"], pod.get("spec", {}), pod.get("status", {})
    ip = status.get("podIP")
    if not ip:
        return []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", []))
    common = {
        "__meta_kubernetes_namespace": meta["namespace"],
        "__meta_kubernetes_pod_name": meta["name"],
        "__meta_kubernetes_pod_ip": ip,
        "__meta_kubernetes_pod_uid": meta.get("uid", ""),
        "__meta_kubernetes_pod_node_name": spec.get("nodeName", ""),
        "__meta_kubernetes_pod_host_ip": status.get("hostIP", ""),
        "__meta_kubernetes_pod_phase": status.get("phase", ""),
        "__meta_kubernetes_pod_ready": "true" if ready else "false",
    }
    for kind in ("label", "annotation"):
        for key, value in meta.get(f"{kind}s", {}).items():
            common[f"__meta_kubernetes_pod_{kind}_{sanitize(key)}"] = value
            common[f"__meta_kubernetes_pod_{kind}present_{sanitize(key)}"] = "true"
    groups = []
    for container in spec.get("containers", []):
        for port in container.get("ports", []):
            groups.append({"targets": [f"{ip}:{port['containerPort']}"], "labels": {
                **common,
                "__meta_kubernetes_pod_container_name": container["name"],
                "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
                "__meta_kubernetes_pod_container_port_number": str(port["containerPort"]),
                "__meta_kubernetes_pod_container_port_protocol": port.get("protocol", "TCP"),
            }})
    return groups


class PodWatch:
    """Every pod (all namespaces), kept current by fleetpilot's informer (list once, then watch)."""

    def __init__(self, api: kube.KubeApi) -> None:
        self.informer = informer.Informer(api, "Pod", on_event=self._changed, max_pause_s=10.0)
        self._pods: tuple[dict[str, Any], ...] = ()

    def _changed(self, event_type: str, pod: dict[str, Any]) -> None:
        # The HTTP server's threads read the pods while the informer's event loop changes its store:
        # they get a tuple published after each change, never the live store.
        self._pods = tuple(self.informer.store.objects())

    def groups(self) -> list[dict[str, Any]]:
        return [group for pod in self._pods for group in target_groups(pod)]


def serve(watch: PodWatch, host: str, port: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] != "/targets":
                self.send_error(404)
                return
            body = json.dumps(watch.groups()).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", type=Path, required=True, help="a token kubeconfig that may list/watch pods")
    parser.add_argument("--listen", default="127.0.0.1:9095", help="HOST:PORT to serve /targets on")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    host, _, port = args.listen.rpartition(":")

    async def go() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        api = kube.KubeApi(kube.load_configuration(str(args.kubeconfig)), field_manager="e2e-podsd")
        watch = PodWatch(api)
        await watch.informer.start()
        server = serve(watch, host, int(port))
        logger.info("serving pod targets at http://%s/targets", args.listen)
        try:
            await stop.wait()
        finally:
            server.shutdown()
            await watch.informer.stop()
            await api.aclose()

    asyncio.run(go())
    return 0


if __name__ == "__main__":
    sys.exit(main())
