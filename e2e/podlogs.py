"""The kubelet's log endpoint, for the pods the e2e pod runner runs: `kubectl logs` on the local cluster.

`kubectl logs` asks the apiserver (`pods/log`), which asks the kubelet of the pod's node:
`GET https://<node InternalIP>:<daemonEndpoints.kubeletEndpoint.Port>/containerLogs/<namespace>/<pod>/<container>`.
The local cluster's simulated nodes all have InternalIP 127.0.0.1 and that port
(`ClusterConfig.kubelet_port`, kwok's `--node-port`); the pod runner serves it over TLS with the cluster
CA's `kubelet` certificate, and accepts only clients with a certificate of that CA (the apiserver's
`apiserver-kubelet-client`). This answers the query parameters kubectl sends: `tailLines`, `limitBytes`,
`previous` and `follow`; `timestamps` is accepted and not honoured (the runner does not stamp lines).

A pod's log file holds every run of its container, each after a header line the runner writes at its
start; the current run is what follows the last header, the previous one (`--previous`) the run before it.
The slicing is pure (`select`); `serve` is the aiohttp adapter.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp.web

#: The line the runner writes before each start of a container (podrunner.PodRunner._spawn).
_RUN_HEADER = re.compile(rb"^--- \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ start .*\n", re.MULTILINE)
FOLLOW_POLL_S = 0.2


def run_header(started_at: str, argv: list[str]) -> bytes:
    return f"--- {started_at} start {' '.join(argv)}\n".encode()


def runs(data: bytes) -> list[bytes]:
    """The output of each run of the container, oldest first, without the runner's header lines."""
    starts = [match.end() for match in _RUN_HEADER.finditer(data)]
    if not starts:
        return [data] if data else []
    ends = [match.start() for match in _RUN_HEADER.finditer(data)][1:] + [len(data)]
    return [data[start:end] for start, end in zip(starts, ends, strict=True)]


def select(data: bytes, *, previous: bool = False, tail_lines: int | None = None,
           limit_bytes: int | None = None) -> bytes | None:
    """What `kubectl logs` shows of a log file: the current run (or the previous one; None if there was
    none), its last `tail_lines` lines, at most `limit_bytes` of it from the start of what is left."""
    each = runs(data)
    if previous:
        if len(each) < 2:
            return None
        chosen = each[-2]
    else:
        chosen = each[-1] if each else b""
    if tail_lines is not None:
        lines = chosen.splitlines(keepends=True)
        chosen = b"".join(lines[-tail_lines:]) if tail_lines > 0 else b""
    if limit_bytes is not None:
        chosen = chosen[:limit_bytes]
    return chosen


@dataclass(frozen=True)
class LogSource:
    """Where one running pod's container writes, as the runner knows it."""

    container: str
    path: Path
    alive: Callable[[], bool]  # the pod is still this runner's and not terminating


Lookup = Callable[[str, str], LogSource | None]  # (namespace, pod) -> its log, if the runner runs it


def _int(value: str | None, name: str) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise aiohttp.web.HTTPBadRequest(text=f"{name} must be an integer, not {value!r}") from None


def app(lookup: Lookup) -> aiohttp.web.Application:
    async def container_logs(request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        namespace, pod, container = (request.match_info[k] for k in ("namespace", "pod", "container"))
        source = lookup(namespace, pod)
        if source is None:
            raise aiohttp.web.HTTPNotFound(text=f"pod {namespace}/{pod} is not run by the e2e pod runner")
        if container != source.container:
            raise aiohttp.web.HTTPBadRequest(text=f"container {container} is not valid for pod {pod}")
        query = request.query
        previous = query.get("previous") == "true"
        data = source.path.read_bytes() if source.path.exists() else b""
        shown = select(data, previous=previous, tail_lines=_int(query.get("tailLines"), "tailLines"),
                       limit_bytes=_int(query.get("limitBytes"), "limitBytes"))
        if shown is None:
            raise aiohttp.web.HTTPBadRequest(text=f"previous terminated container {container} in pod {pod} not found")
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        await response.write(shown)
        if query.get("follow") == "true" and not previous:
            await _follow(response, source, offset=len(data))
        await response.write_eof()
        return response

    application = aiohttp.web.Application()
    application.router.add_get("/containerLogs/{namespace}/{pod}/{container}", container_logs)
    return application


async def _follow(response: aiohttp.web.StreamResponse, source: LogSource, *, offset: int) -> None:
    """Stream what the current run appends, until it ends (the pod goes, or the container restarts)."""
    while source.alive():
        await asyncio.sleep(FOLLOW_POLL_S)
        data = source.path.read_bytes() if source.path.exists() else b""
        fresh = data[offset:]
        header = _RUN_HEADER.search(fresh)
        if header is not None:  # the container restarted: its run, and so this follow, ended
            await response.write(fresh[: header.start()])
            return
        if fresh:
            await response.write(fresh)
            offset = len(data)


async def serve(lookup: Lookup, *, port: int, pki_folder: Path) -> aiohttp.web.AppRunner:
    """Serve the log endpoint on 127.0.0.1:`port`, TLS with the cluster CA's `kubelet` certificate."""
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(str(pki_folder / "kubelet.crt"), str(pki_folder / "kubelet.key"))
    tls.verify_mode = ssl.CERT_REQUIRED
    tls.load_verify_locations(str(pki_folder / "ca.crt"))
    runner = aiohttp.web.AppRunner(app(lookup), handle_signals=False, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    await aiohttp.web.TCPSite(runner, "127.0.0.1", port, ssl_context=tls).start()
    return runner
