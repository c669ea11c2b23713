"""`fleetpilot frontend` serves through a uvicorn protocol that stamps each request's arrival when its first
bytes are parsed: the TTFT clock then counts uvicorn's reading of the head and the app task's wait for the
event loop, as the client's clock does."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import uvicorn

from fleetpilot.frontend import app as app_mod
from fleetpilot.frontend import cli


async def arrival_app(scope: dict, receive: object, send: object) -> None:  # type: ignore[type-arg]
    """Answers each request with the arrival the server stamped (or null)."""
    if scope["type"] != "http":
        return
    body = json.dumps({"arrived": scope.get(app_mod.ARRIVED)}).encode()
    await send({"type": "http.response.start", "status": 200,  # type: ignore[operator]
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})  # type: ignore[operator]


async def served_arrival(http: str, *, pause_s: float) -> tuple[float | None, float, float]:
    """Send one request's first bytes, pause, send the rest of its head; return the stamp the app saw,
    and the monotonic clock just before the first bytes and just after the pause."""
    protocol = cli.http_protocol(http)
    config = uvicorn.Config(arrival_app, host="127.0.0.1", port=0, log_level="warning", http=protocol,
                            lifespan="off")
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        before = time.monotonic()
        writer.write(b"GET /x HTTP/1.1\r\n")
        await writer.drain()
        await asyncio.sleep(pause_s)
        after = time.monotonic()
        writer.write(b"Host: t\r\nConnection: close\r\n\r\n")
        await writer.drain()
        response = await reader.read()
    finally:
        writer.close()
        server.should_exit = True
        await serving
    stamped = json.loads(response.split(b"\r\n\r\n", 1)[1])["arrived"]
    return stamped, before, after


def test_the_frontend_stamps_a_request_when_its_first_bytes_arrive() -> None:
    pytest.importorskip("httptools")
    stamped, before, after = asyncio.run(served_arrival("auto", pause_s=0.3))
    assert stamped is not None and before <= stamped < after  # before the head was complete
    # With h11 chosen, uvicorn's own protocol stamps nothing: the app's middleware does, when it runs.
    stamped, _, _ = asyncio.run(served_arrival("h11", pause_s=0.0))
    assert stamped is None
