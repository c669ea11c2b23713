"""The network step of a replay: fire each request at its arrival time and time its stream.

Open loop, as real users are: request i goes out at `start + arrival_i` whether or not earlier ones
have finished, so a slow server sees its queue grow instead of a politely waiting client (a closed
loop would hide exactly the overload a planner must react to). One scheduler coroutine sleeps until
each arrival on the monotonic clock and starts a task; how late each task actually sent its request
is recorded, so a report can tell a late client from a slow server.

Each task POSTs `/v1/completions` with `stream: true` and `stream_options.include_usage`, reads the
server-sent events and keeps the arrival time of every chunk that carries text: TTFT is the first,
ITL the mean gap between tokens after it. `ignore_eos` and `min_tokens` (vLLM's extensions, which
SGLang and our simulator also accept) make the generation as long as the trace says. Failures —
an HTTP error, a refused or dropped connection, a malformed stream, the per-request timeout — are
recorded on the request and never stop the run. The only I/O is the shared `httpx.AsyncClient`.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from fleetpilot import traces
from fleetpilot.replay import prompts

Status = Literal["ok", "error", "cancelled"]
ERROR_BODY_BYTES = 2048  # enough of an error response to say what went wrong
WARM_UP_TIMEOUT_S = 5.0


@dataclass(slots=True)
class Result:
    """What happened to one request, filled in by the task that sends it.

    Times are seconds: `scheduled_s`, `start_s` and `end_s` from the replay's start, `token_times_s`
    from the request's own start. A request never sent (a cancelled run) keeps NaN times.
    """

    index: int
    scheduled_s: float  # the arrival time it was due at
    input_tokens: int
    expected_output_tokens: int
    start_s: float = math.nan  # when it was sent
    end_s: float = math.nan  # when the last byte (or the error) came
    status: Status = "error"
    error: str | None = None
    token_times_s: list[float] = field(default_factory=list)  # each chunk that carried text
    output_tokens: int = 0  # from the usage block when the server sends one, else chunks counted
    finish_reason: str | None = None  # why the output ended, as the server said: a complete answer has one

    @property
    def lateness_s(self) -> float:
        """How far behind its arrival time the scheduler sent it (the client's error, not the server's)."""
        return self.start_s - self.scheduled_s

    @property
    def latency_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def ttft_s(self) -> float | None:
        return self.token_times_s[0] if self.token_times_s else None

    @property
    def itl_s(self) -> float | None:
        """Mean gap between tokens after the first: (last chunk − first chunk) / (tokens − 1).

        Counting tokens rather than chunks keeps it right when a server packs several tokens into a
        chunk. The frontend's ITL histogram takes one observation per request, of this same mean.
        """
        if len(self.token_times_s) < 2 or self.output_tokens < 2:
            return None
        return (self.token_times_s[-1] - self.token_times_s[0]) / (self.output_tokens - 1)


class _Failed(Exception):
    """The request failed in a way the server told us about (status code, error event, bad stream)."""


def base_url(url: str) -> str:
    """`http://host:8000`, from that or from `http://host:8000/v1/` (the form a DynamoGraph's status shows)."""
    url = url.rstrip("/")
    return url.removesuffix("/v1")


def request_body(request: traces.Request, *, model: str, prompt: str, stream: bool,
                 length_extensions: bool = True) -> dict[str, Any]:
    """The completion request for one trace request: exactly `output_tokens` tokens back, through vLLM's
    `min_tokens` and `ignore_eos` (`length_extensions`; a server that refuses unknown fields gets neither,
    and its outputs may then end early at an end-of-sequence token)."""
    tokens = max(request.output_tokens, 1)
    body: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": tokens}
    if length_extensions:
        body |= {"min_tokens": tokens, "ignore_eos": True}
    body["stream"] = stream
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def _chunk_text(chunk: dict[str, Any]) -> str:
    """The text a stream chunk carries: `choices[0].text` (completions) or `.delta.content` (chat)."""
    choices = chunk.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        return ""
    choice = choices[0]
    text = choice.get("text")
    if text is None:
        text = (choice.get("delta") or {}).get("content")
    return text if isinstance(text, str) else ""


def _finish_reason(payload: dict[str, Any]) -> str | None:
    choices = payload.get("choices") or []
    if choices and isinstance(choices[0], dict) and isinstance(choices[0].get("finish_reason"), str):
        return str(choices[0]["finish_reason"])
    return None


def _completion_tokens(payload: dict[str, Any]) -> int | None:
    usage = payload.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        return int(usage["completion_tokens"])
    return None


async def _error_text(response: httpx.Response) -> str:
    body = b""
    async for piece in response.aiter_bytes():
        body += piece
        if len(body) >= ERROR_BODY_BYTES:
            break
    text = body[:ERROR_BODY_BYTES].decode("utf-8", errors="replace").strip()
    return f"HTTP {response.status_code}: {text}" if text else f"HTTP {response.status_code}"


async def _stream(
    client: httpx.AsyncClient, endpoint: str, body: dict[str, Any], result: Result, *, sent: float
) -> None:
    usage_tokens = None
    async with client.stream("POST", endpoint, json=body) as response:
        if response.status_code >= 400:
            raise _Failed(await _error_text(response))
        async for line in response.aiter_lines():
            now = time.perf_counter()
            if not line.startswith("data:"):
                continue  # blank separators, `: keep-alive` comments, `event:` lines
            data = line[len("data:") :].strip()
            if data == "[DONE]":
                result.output_tokens = usage_tokens if usage_tokens is not None else len(result.token_times_s)
                if result.finish_reason is None:
                    # A stream cut short and closed politely is still cut short: a complete answer
                    # says why it ended (length, stop).
                    raise _Failed(f"truncated: the stream ended after {len(result.token_times_s)} chunks without a "
                                  "finish_reason")
                return
            try:
                chunk = json.loads(data)
            except ValueError as error:
                raise _Failed(f"bad stream: not JSON: {data[:200]!r}") from error
            if not isinstance(chunk, dict):
                raise _Failed(f"bad stream: not an object: {data[:200]!r}")
            if "error" in chunk:
                raise _Failed(f"error event: {json.dumps(chunk['error'])[:500]}")
            if _chunk_text(chunk):
                result.token_times_s.append(now - sent)
            result.finish_reason = _finish_reason(chunk) or result.finish_reason
            usage_tokens = _completion_tokens(chunk) or usage_tokens
    result.output_tokens = usage_tokens if usage_tokens is not None else len(result.token_times_s)
    if result.finish_reason is None:
        raise _Failed("bad stream: it ended without `data: [DONE]` or a finish_reason")
    # Closed cleanly after the chunk that says why the answer ended, without OpenAI's `data: [DONE]`:
    # complete (Hugging Face's `transformers serve` ends its completion streams so).


async def _complete(client: httpx.AsyncClient, endpoint: str, body: dict[str, Any], result: Result) -> None:
    response = await client.post(endpoint, json=body)
    if response.status_code >= 400:
        text = response.text[:ERROR_BODY_BYTES].strip()
        raise _Failed(f"HTTP {response.status_code}: {text}" if text else f"HTTP {response.status_code}")
    try:
        payload = response.json()
    except ValueError as error:
        raise _Failed(f"bad response: not JSON: {response.text[:200]!r}") from error
    if not isinstance(payload, dict):
        raise _Failed("bad response: not a JSON object")
    result.output_tokens = _completion_tokens(payload) or 0
    result.finish_reason = _finish_reason(payload)
    if result.finish_reason is None:
        raise _Failed("truncated: the answer has no finish_reason")


async def _send(
    client: httpx.AsyncClient,
    endpoint: str,
    body: dict[str, Any],
    result: Result,
    *,
    origin: float,
    stream: bool,
    timeout_s: float,
    on_result: Callable[[Result], None] | None,
) -> None:
    sent = time.perf_counter()
    result.start_s = sent - origin
    try:
        async with asyncio.timeout(timeout_s):
            if stream:
                await _stream(client, endpoint, body, result, sent=sent)
            else:
                await _complete(client, endpoint, body, result)
        result.status = "ok"
    except asyncio.CancelledError:
        result.status, result.error = "cancelled", "cancelled by the client"
        raise
    except TimeoutError:
        result.error = f"timeout: no complete response within {timeout_s:g} s"
    except _Failed as error:
        result.error = str(error)
    except httpx.HTTPError as error:  # refused, reset, dropped mid-stream, protocol errors
        result.error = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    except (ValueError, TypeError, KeyError, AttributeError, OSError) as error:
        # a reply shaped in a way nobody foresaw fails its own request, never the run
        result.error = f"{type(error).__name__}: {error}"
    finally:
        result.end_s = time.perf_counter() - origin
        result.output_tokens = result.output_tokens or len(result.token_times_s)  # what came before a failure
        if on_result is not None:
            on_result(result)


async def _warm_up(http: httpx.AsyncClient, url: str, *, timeout_s: float) -> None:
    """One `GET /v1/models` before the clock starts, its answer ignored.

    The first request through an httpx client pays for lazy imports and the first connection
    (about 20 ms here); paid inside the schedule, it would make the first burst late.
    """
    try:
        await http.get(base_url(url) + "/v1/models", timeout=timeout_s)
    except httpx.HTTPError:
        pass  # an unreachable frontend shows up as every request's error, with its own message


async def replay(
    requests: Sequence[traces.Request],
    *,
    url: str,
    model: str,
    stream: bool = True,
    timeout_s: float = 300.0,
    max_connections: int = 4096,
    prompt_seed: int = 0,
    on_result: Callable[[Result], None] | None = None,
    client: httpx.AsyncClient | None = None,
    length_extensions: bool = True,
) -> list[Result]:
    """Send `requests` open loop to the frontend at `url`; one `Result` per request, in trace order.

    Returns when every request has finished or timed out (`timeout_s` bounds each one, so the run is
    bounded by the last arrival + `timeout_s`). `on_result` is called as each one finishes (for a
    progress bar, or to keep partial results). Cancelling the call cancels every request in flight:
    they are reported to `on_result` as `cancelled`, and the cancellation propagates.
    `max_connections` is the client's pool; a request waiting for a connection counts as late.
    `length_extensions`: send vLLM's `min_tokens` and `ignore_eos` (`request_body`).
    """
    endpoint = base_url(url) + "/v1/completions"
    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
    own_client = client is None
    http = client or httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(timeout_s))
    results = [
        Result(
            index=index,
            scheduled_s=request.arrival_s,
            input_tokens=request.input_tokens,
            expected_output_tokens=request.output_tokens,
        )
        for index, request in enumerate(requests)
    ]
    tasks: list[asyncio.Task[None]] = []
    try:
        await _warm_up(http, url, timeout_s=min(timeout_s, WARM_UP_TIMEOUT_S))
        origin = time.perf_counter()
        for request, result in zip(requests, results, strict=True):
            # the prompt (up to a few ms for a long one) is built before the wait, not at the arrival
            prompt = prompts.build_prompt(request, salt=result.index, seed=prompt_seed)
            body = request_body(request, model=model, prompt=prompt, stream=stream,
                                length_extensions=length_extensions)
            delay = origin + request.arrival_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            sending = _send(
                http,
                endpoint,
                body,
                result,
                origin=origin,
                stream=stream,
                timeout_s=timeout_s,
                on_result=on_result,
            )
            tasks.append(asyncio.create_task(sending))
            # let it go out now: in a burst of simultaneous arrivals, request i must not wait while
            # the prompts of i+1, i+2, ... are built
            await asyncio.sleep(0)
        await asyncio.gather(*tasks)
    except BaseException:
        # Ctrl-C or a cancelled caller: stop the requests in flight, and wait until they have
        # recorded themselves, so that no task outlives the client it uses
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    finally:
        if own_client:
            await http.aclose()
    return results


async def served_models(url: str, *, timeout_s: float = 10.0) -> list[str]:
    """The model names the frontend serves (`GET /v1/models`), for when none is given."""
    async with httpx.AsyncClient(timeout=timeout_s) as http:
        response = await http.get(base_url(url) + "/v1/models")
        response.raise_for_status()
        payload = response.json()
    return [
        str(entry["id"]) for entry in payload.get("data", []) if isinstance(entry, dict) and "id" in entry
    ]
