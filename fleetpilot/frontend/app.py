"""The frontend: an OpenAI-compatible router in front of prefill, decode or aggregated workers.

For a disaggregated graph each request takes two hops, following vLLM's protocol: the prefill
worker gets the request with `kv_transfer_params.do_remote_decode` and `max_tokens: 1`, and answers
with the parameters that let a decode worker pull the KV cache; the decode worker then gets the
original request carrying those parameters and streams the tokens. Aggregated graphs take one hop.

Upstream calls always stream, so the frontend measures TTFT and inter-token latency (the metric
contract) even for clients that asked for one JSON answer. A connection failure before any byte
came back is retried on another worker; a failure mid-stream ends that stream with an error event.
A client that goes away cancels the upstream request, and with it the work on the worker.

Errors are OpenAI's (`validation.ApiError`): a request is validated before any worker sees it (in a
disaggregated graph also its prompt + `max_tokens` against the context window, counted by a prefill
worker's `/tokenize` when a cheap bound cannot tell that it fits), a streaming request that fails
before its first token gets a JSON error with a 4xx/5xx status rather than a 200 and an error event,
a worker's own refusal is relayed with its status, message and `param`, and no worker address ever
reaches a client (it goes to the log, with the request id).

With API keys (`auth.py`) every route but /health, /ready and /metrics first passes `auth.ApiKeyAuth`: a
request without a valid `Authorization: Bearer` key gets OpenAI's 401 before validation, holding or any
metric of the contract sees it, and a key at its in-flight limit gets a 429 with Retry-After. Client
headers are never forwarded to a worker, so a key goes no further than the frontend.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import prometheus_client
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from fleetpilot.api import contract
from fleetpilot.frontend import auth, routing
from fleetpilot.frontend.discovery import Discovery
from fleetpilot.frontend.metrics import PHASES, FrontendMetrics
from fleetpilot.frontend.validation import (
    ApiError,
    check_context,
    completion_budget,
    message_text,
    prompt_token_bound,
    validate,
)

logger = logging.getLogger("fleetpilot.frontend")

QUARANTINE_SECONDS = 5.0
TOKENIZE_TIMEOUT_S = 5.0
# Failures before any byte of the answer came back, worth another worker: refused, or a kept-alive
# connection the worker closed or reset as the request went out (it drains and closes what is idle, or
# its keep-alive timeout struck): the request never reached an engine, or reached one that is gone.
REFUSED = (httpx.ConnectError, httpx.ConnectTimeout)
CONNECT_ERRORS = (*REFUSED, httpx.RemoteProtocolError, httpx.ReadError)
#: Idle upstream connections are closed before the workers' own keep-alive timeout (uvicorn's 5 s),
#: so the frontend never sends on a connection the worker is closing at that moment.
KEEPALIVE_EXPIRY_S = 4.0
#: What a 503 tells a client to wait before it tries again: about what a held request would have
#: waited for a replica to start, short enough that a client retrying sees the workers come up.
RETRY_AFTER_S = 10
#: The ASGI scope key holding the request's arrival (time.monotonic()): stamped by the server's protocol
#: (`cli.ArrivalStampingProtocol`) or else by `StampArrival`.
ARRIVED = "fleetpilot.arrived"


def unavailable(message: str, *, code: str = "no_worker") -> ApiError:
    """No worker could take the request: 503, worth retrying after Retry-After."""
    return ApiError(message, status=503, type="service_unavailable", code=code, retry_after_s=RETRY_AFTER_S)


def worker_failed(role: str, request_id: str) -> ApiError:
    """A worker failed in a way the client cannot fix: 502, details in the frontend's log."""
    return ApiError(f"the {role} worker failed to serve the request (request id {request_id}); "
                    "the frontend's log has the details", status=502, type="upstream_error", code="worker_failed")


def relayed(role: str, status: int, text: str, request_id: str) -> ApiError:
    """A worker's answer of `status`: its own refusal (4xx, OpenAI-shaped) as it gave it, else a 502."""
    if 400 <= status < 500:
        try:
            error = json.loads(text).get("error") or {}
        except (json.JSONDecodeError, AttributeError):
            error = {}
        if isinstance(error, dict) and error.get("message"):
            code = error.get("code")
            return ApiError(str(error["message"]), status=status, type=str(error.get("type") or "invalid_request_error"),
                            param=error.get("param"), code=str(code) if code is not None else None)
        return ApiError(f"the {role} worker refused the request: {text[:300]}", status=status)
    return worker_failed(role, request_id)


def prompt_text(body: dict[str, Any]) -> str:
    """The text prefix-aware routing hashes: the prompt, or the chat messages in order."""
    if "messages" in body:
        parts = []
        for message in body.get("messages") or []:
            parts.append(f"{message.get('role', '')}: {message_text(message.get('content'))}")
        return "\n".join(parts)
    prompt = body.get("prompt", "")
    if isinstance(prompt, list):
        return " ".join(str(p) for p in prompt)
    return str(prompt)


def chunk_text(chunk: dict[str, Any]) -> str:
    """Text carried by one OpenAI streaming chunk, completion or chat."""
    text = ""
    for choice in chunk.get("choices") or []:
        text += choice.get("text") or (choice.get("delta") or {}).get("content") or ""
    return text


class StampArrival:
    """ASGI middleware, outermost but for Starlette's error handler: stamps each HTTP request's scope with
    its arrival unless the server already has (`fleetpilot frontend` serves through
    `cli.ArrivalStampingProtocol`, which stamps when the request's first bytes are parsed).

    TTFT, request duration and prefill time count from this stamp, so that receiving and parsing the
    body, validation, holding and whatever runs before the handler builds its tracker all fall inside
    them, as they do for the client. Stamped here, at the first moment the app runs for the request,
    the clock misses uvicorn's parsing of the head and the new task's wait for its first turn on the
    event loop, which grows with the requests in flight (benchmarks/frontend_ttft.py measures both).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope.setdefault(ARRIVED, time.monotonic())
        await self.app(scope, receive, send)


@dataclass
class Tracker:
    """Timing of one request as the frontend sees it."""

    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    started: float = field(default_factory=time.monotonic)
    prefilled: float | None = None  # disaggregated: when the prefill worker handed the KV cache over
    first_token: float | None = None
    last_token: float | None = None
    tokens: int = 0
    usage: dict[str, Any] | None = None
    phase: str | None = None  # where the request is now (metrics.PHASES); None once finished
    on_phase: Callable[[str | None, str | None], None] | None = None  # (old, new): keeps the phase gauge

    def enter(self, phase: str | None) -> None:
        if phase != self.phase:
            if self.on_phase is not None:
                self.on_phase(self.phase, phase)
            self.phase = phase

    def token(self) -> None:
        now = time.monotonic()
        if self.first_token is None:
            self.first_token = now
            self.enter("decoding")
        self.last_token = now
        self.tokens += 1

    def mean_itl(self) -> float | None:
        if self.first_token is None or self.last_token is None or self.tokens < 2:
            return None
        return (self.last_token - self.first_token) / (self.tokens - 1)


class Frontend:
    """Routes requests to workers and keeps the metric contract."""

    def __init__(
        self,
        *,
        model: str,
        mode: str,
        discovery: Discovery,
        policy: routing.Policy,
        metrics: FrontendMetrics | None = None,
        retries: int = 3,
        request_timeout: float = 600.0,
        max_model_len: int | None = None,
        hold_seconds: float = 0.0,
        hold_queue: int = 256,
        api_keys: auth.Keys | None = None,
        max_in_flight_per_key: int | None = None,
    ) -> None:
        if mode not in ("disaggregated", "aggregated"):
            raise ValueError(f"mode must be disaggregated or aggregated, not {mode!r}")
        self.model = model
        self.mode = mode
        self.discovery = discovery
        self.policy = policy
        self.decode_policy: routing.Policy = routing.LeastLoaded()
        self.metrics = metrics or FrontendMetrics()
        for phase in PHASES:  # every phase exported from the start, at 0: "none waiting" is a reading too
            self.metrics.in_phase.labels(model, phase)
        for status in ("ok", "error", "cancelled"):  # so is every outcome: an error ratio of 0 is a reading
            self.metrics.requests.labels(model, status)
        # Without keys every request is served, as before; with them, `auth.ApiKeyAuth` guards the API.
        self.api_keys = api_keys
        self.max_in_flight_per_key = max_in_flight_per_key
        if api_keys is not None:
            for reason in auth.REASONS:  # every refusal reason exported at 0 from the start
                self.metrics.auth_refusals.labels(model, reason)
        self.retries = retries
        self.request_timeout = request_timeout
        self.max_model_len = max_model_len  # the flag's, else learned from the first worker that counts a prompt
        self.tokenize_supported = True  # until a worker answers /tokenize with 404: then the engine checks alone
        self.load: dict[str, int] = defaultdict(int)  # in flight per worker URL
        self.names: dict[str, str] = {}  # worker URL -> pod name, for the per-worker load metric
        # Requests that arrive while no worker can take them wait here (scale from zero, a gap in a
        # rollout): at most `hold_queue` at once, each for up to `hold_seconds`; 0 answers 503 at once.
        self.hold_seconds = hold_seconds
        self.hold_queue = hold_queue
        self.held = 0
        self._workers_changed = asyncio.Event()
        discovery.on_change(self._wake_held)
        self.last_arrival = time.monotonic()  # the idle clock starts with the process
        self.metrics.idle.labels(model).set_function(lambda: time.monotonic() - self.last_arrival)
        self.metrics.held.labels(model)
        self.metrics.track_worker_load(model, self._worker_loads)
        self.quarantined: dict[str, float] = {}
        self.prefix_cache = routing.PrefixCache()  # a model of the workers' KV caches, for any policy
        self.arrivals: deque[float] = deque()  # arrival times within the trailing burst window
        self.draining = False
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(request_timeout, connect=3.0),
            limits=httpx.Limits(max_connections=4096, max_keepalive_connections=512,
                                keepalive_expiry=KEEPALIVE_EXPIRY_S),
        )

    def _worker_loads(self) -> dict[str, int]:
        """Requests in flight per worker pod, for the metric a scale-down reads (idle workers left out)."""
        return {self.names.get(url, url): n for url, n in self.load.items() if n > 0}

    def _wake_held(self) -> None:
        """The workers changed: every held request looks again (a fresh event for the next change)."""
        self._workers_changed.set()
        self._workers_changed = asyncio.Event()

    def _servable(self) -> bool:
        """Whether a request sent now has a worker (a prefill with a decode of its generation)."""
        if self.mode == "disaggregated":
            return bool(routing.paired(self.discovery.workers("prefill"), self.discovery.workers("decode")))
        return bool(self.discovery.workers("aggregated"))

    async def _hold(self, tracker: Tracker) -> None:
        """Wait until a worker can take the request: at once when one can, else in the bounded queue for
        up to `hold_seconds`; a full queue or the timeout is a 503 with Retry-After. The held-requests
        gauge is the demand the planner wakes a pool scaled to zero for."""
        if self._servable():
            return
        if self.hold_seconds <= 0:
            return  # no holding: routing answers 503 with Retry-After at once
        if self.held >= self.hold_queue:
            self.metrics.held_outcomes.labels(self.model, "queue_full").inc()
            raise unavailable(f"no worker is ready for model {self.model} and {self.held} requests already wait "
                              f"for one; retry after {RETRY_AFTER_S} s", code="hold_queue_full")
        self.held += 1
        self.metrics.held.labels(self.model).inc()
        started = time.monotonic()
        logger.info("request %s: no worker ready; holding it (%d held)", tracker.request_id, self.held)
        try:
            async with asyncio.timeout(self.hold_seconds):
                while not self._servable():
                    await self._workers_changed.wait()
        except TimeoutError:
            self.metrics.held_outcomes.labels(self.model, "timeout").inc()
            raise unavailable(f"no worker for model {self.model} became ready within {self.hold_seconds:g} s; "
                              f"retry after {RETRY_AFTER_S} s", code="hold_timeout") from None
        finally:
            self.held -= 1
            self.metrics.held.labels(self.model).dec()
        self.metrics.held_outcomes.labels(self.model, "served").inc()
        logger.info("request %s: a worker is ready after %.2f s held", tracker.request_id, time.monotonic() - started)

    def _count_arrival(self, now: float) -> None:
        """Observe the arrival rate this request arrived into over the trailing burst window: the
        histogram of it, one sample per request, is what the planner sizes prefill's bursts from."""
        self.arrivals.append(now)
        while self.arrivals and self.arrivals[0] <= now - contract.BURST_WINDOW_S:
            self.arrivals.popleft()
        self.metrics.arrival_burst.labels(self.model).observe(len(self.arrivals) / contract.BURST_WINDOW_S)

    # -- choosing workers ----------------------------------------------------------------------------

    def _candidates(self, role: str, tried: set[str], generation: str | None = None) -> list[routing.Worker]:
        """Workers of `role` not yet tried. In a disaggregated graph a request's prefill goes only to a
        generation that has decode workers too, and its decode (`generation` given) to the prefill's
        generation: a KV cache never crosses generations (engine or model versions)."""
        now = time.monotonic()
        workers = self.discovery.workers(role)
        if role == "prefill" and self.mode == "disaggregated":
            workers = routing.paired(workers, self.discovery.workers("decode"))
        if generation is not None:
            workers = routing.same_generation(workers, generation)
        workers = [w for w in workers if w.url not in tried]
        healthy = [w for w in workers if self.quarantined.get(w.url, 0) <= now]
        return healthy or workers  # when all are quarantined, trying one beats failing outright

    def _pick(self, role: str, policy: routing.Policy, blocks: list[int], tried: set[str],
              generation: str | None = None) -> routing.Worker:
        candidates = self._candidates(role, tried, generation)
        if not candidates:
            raise unavailable(f"no ready {role} worker for model {self.model}; retry later")
        worker = policy.choose(candidates, load=self.load, prompt_blocks=blocks)
        policy.routed(worker, blocks)
        self.names[worker.url] = worker.name or worker.url
        if role != "decode":  # where the prompt's KV is computed: count what was probably cached
            self.metrics.prefix_query_blocks.labels(self.model).inc(len(blocks))
            self.metrics.prefix_hit_blocks.labels(self.model).inc(self.prefix_cache.match(worker.url, blocks))
            self.prefix_cache.add(worker.url, blocks)
        return worker

    async def _with_retries(
        self, role: str, policy: routing.Policy, blocks: list[int],
        attempt: Callable[[routing.Worker], Awaitable[Any]], request_id: str, generation: str | None = None,
    ) -> Any:
        """Run `attempt` on a worker; on a refused connection, quarantine it and try another."""
        tried: set[str] = set()
        last: Exception | None = None
        for _ in range(self.retries):
            worker = self._pick(role, policy, blocks, tried, generation)
            tried.add(worker.url)
            self.load[worker.url] += 1
            try:
                return await attempt(worker)
            except CONNECT_ERRORS as error:
                logger.warning("request %s: %s worker %s unreachable (%r); trying another", request_id, role,
                               worker.url, error)
                if isinstance(error, REFUSED):  # nothing listens: keep away a while; a reset is one connection's
                    self.quarantined[worker.url] = time.monotonic() + QUARANTINE_SECONDS
                last = error
            finally:
                self.load[worker.url] -= 1
            if not self._candidates(role, tried, generation):
                break
        logger.warning("request %s: no %s worker reachable, last error: %s", request_id, role, last)
        raise unavailable(f"no {role} worker reachable for model {self.model}; retry later")

    # -- before the first hop ------------------------------------------------------------------------

    async def _check_context(self, body: dict[str, Any], *, chat: bool, request_id: str) -> None:
        """Refuse a request whose prompt + output cannot fit the context window before a prefill worker
        computes its KV cache (the decode worker would refuse it only after). Requests that surely fit
        by `prompt_token_bound` cost nothing; the rest are counted by a prefill worker's `/tokenize`
        (vLLM's). Without an answer the request goes on, and the engine's own check stands."""
        budget = completion_budget(body, chat=chat)
        if budget is None or not self.tokenize_supported:
            return
        budget_param, max_tokens = budget
        if self.max_model_len is not None and prompt_token_bound(body, chat=chat) + max_tokens <= self.max_model_len:
            return
        counted = await self._tokenize(body, chat=chat, request_id=request_id)
        if counted is None:
            return
        tokens, window = counted
        if self.max_model_len is None and window is not None:
            self.max_model_len = window
            logger.info("context window of %s learned from a worker: %d tokens", self.model, window)
        if self.max_model_len is not None:
            check_context(tokens, max_tokens, self.max_model_len, chat=chat, budget_param=budget_param)

    async def _tokenize(self, body: dict[str, Any], *, chat: bool, request_id: str) -> tuple[int, int | None] | None:
        """(prompt tokens, the worker's context window) from the least loaded prefill worker, or None."""
        candidates = self._candidates("prefill", set())
        if not candidates:
            return None
        worker = min(candidates, key=lambda w: self.load[w.url])
        question = {"model": self.model, "messages": body["messages"]} if chat else {"model": self.model,
                                                                                     "prompt": body["prompt"]}
        try:
            response = await self.client.post(worker.url + "/tokenize", json=question, timeout=TOKENIZE_TIMEOUT_S)
        except httpx.HTTPError as error:
            logger.warning("request %s: could not count its prompt on %s (%r); the engine will check it",
                           request_id, worker.name or worker.url, error)
            return None
        if response.status_code in (404, 405):
            logger.info("the prefill workers have no /tokenize; prompt length against the context window stays the "
                        "engine's check")
            self.tokenize_supported = False
            return None
        if response.status_code >= 400:
            raise relayed("prefill", response.status_code, response.text, request_id)
        try:
            answer = response.json()
            count, window = int(answer["count"]), answer.get("max_model_len")
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            logger.warning("request %s: %s answered /tokenize without a count (%r); the engine will check it",
                           request_id, worker.name or worker.url, error)
            return None
        return count, int(window) if isinstance(window, int) else None

    # -- the two hops --------------------------------------------------------------------------------

    async def _prefill(self, path: str, body: dict[str, Any], blocks: list[int],
                       request_id: str) -> tuple[dict[str, Any], str]:
        """First hop: prefill remotely; the KV transfer parameters for decode, and the prefill worker's
        generation (its decode must be of the same one)."""
        hop = {k: v for k, v in body.items() if k not in ("stream_options", "min_tokens")}
        hop.update(stream=False, max_tokens=1, kv_transfer_params={
            "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
            "remote_block_ids": None, "remote_host": None, "remote_port": None,
        })
        if "max_completion_tokens" in hop:
            hop["max_completion_tokens"] = 1

        async def attempt(worker: routing.Worker) -> tuple[dict[str, Any], str]:
            response = await self.client.post(worker.url + path, json=hop)
            if response.status_code >= 400:
                logger.warning("request %s: prefill worker %s answered %d: %s", request_id,
                               worker.name or worker.url, response.status_code, response.text[:500])
                raise relayed("prefill", response.status_code, response.text, request_id)
            params = response.json().get("kv_transfer_params")
            if not params:
                logger.error("request %s: prefill worker %s returned no kv_transfer_params; is it running with a "
                             "KV connector?", request_id, worker.name or worker.url)
                raise worker_failed("prefill", request_id)
            return dict(params), worker.generation

        result: tuple[dict[str, Any], str] = await self._with_retries("prefill", self.policy, blocks, attempt,
                                                                      request_id)
        return result

    async def _stream(
        self, path: str, body: dict[str, Any], blocks: list[int], tracker: Tracker, generation: str | None = None,
    ) -> AsyncIterator[dict[str, Any]]:
        """Last hop: stream chunks from a decode (or aggregated) worker; a decode worker of the prefill
        worker's `generation`."""
        role = "decode" if self.mode == "disaggregated" else "aggregated"
        policy = self.decode_policy if self.mode == "disaggregated" else self.policy
        upstream = dict(body, stream=True, stream_options={"include_usage": True})

        async def attempt(worker: routing.Worker) -> tuple[routing.Worker, httpx.Response]:
            request = self.client.build_request("POST", worker.url + path, json=upstream)
            response = await self.client.send(request, stream=True)
            if response.status_code >= 400:
                text = (await response.aread()).decode(errors="replace")
                await response.aclose()
                logger.warning("request %s: %s worker %s answered %d: %s", tracker.request_id, role,
                               worker.name or worker.url, response.status_code, text[:500])
                raise relayed(role, response.status_code, text, tracker.request_id)
            return worker, response

        worker, response = await self._with_retries(role, policy, blocks, attempt, tracker.request_id, generation)
        if generation is not None:
            # The pairing as it happened, for anyone to check: a prefill and a decode of one generation.
            self.metrics.generation_pairs.labels(self.model, generation, worker.generation).inc()
            logger.debug("request %s: prefill and decode on generation %s", tracker.request_id, worker.generation)
        self.load[worker.url] += 1
        try:
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    return
                chunk = json.loads(payload)
                if chunk.get("error"):
                    logger.warning("request %s: %s worker %s sent an error mid-stream: %s", tracker.request_id, role,
                                   worker.name or worker.url, chunk["error"])
                    raise worker_failed(role, tracker.request_id)
                if chunk.get("usage"):
                    tracker.usage = chunk["usage"]
                yield chunk
        except (httpx.TransportError, json.JSONDecodeError) as error:
            logger.warning("request %s: %s worker %s broke off the stream: %r", tracker.request_id, role,
                           worker.name or worker.url, error)
            raise worker_failed(role, tracker.request_id) from error
        finally:
            self.load[worker.url] -= 1
            await response.aclose()

    # -- request handling ----------------------------------------------------------------------------

    def _phase_changed(self, old: str | None, new: str | None) -> None:
        if old is not None:
            self.metrics.in_phase.labels(self.model, old).dec()
        if new is not None:
            self.metrics.in_phase.labels(self.model, new).inc()

    def _finish(self, tracker: Tracker, status: str) -> None:
        tracker.enter(None)
        model = self.model
        self.metrics.requests.labels(model, status).inc()
        self.metrics.inflight.labels(model).dec()
        if status == "cancelled":
            logger.info("request %s: cancelled by the client after %.3f s and %d tokens", tracker.request_id,
                        time.monotonic() - tracker.started, tracker.tokens)
        if status != "ok":
            return
        self.metrics.duration.labels(model).observe(time.monotonic() - tracker.started)
        if tracker.first_token is not None:
            self.metrics.ttft.labels(model).observe(tracker.first_token - tracker.started)
        if tracker.prefilled is not None:
            self.metrics.prefill.labels(model).observe(tracker.prefilled - tracker.started)
            if tracker.first_token is not None:
                self.metrics.first_token_wait.labels(model).observe(tracker.first_token - tracker.prefilled)
        if tracker.first_token is not None and tracker.last_token is not None:
            self.metrics.decode.labels(model).observe(tracker.last_token - tracker.first_token)
        itl = tracker.mean_itl()
        if itl is not None:
            self.metrics.itl.labels(model).observe(itl)
        if tracker.usage:
            self.metrics.input_tokens.labels(model).observe(int(tracker.usage.get("prompt_tokens", 0)))
            self.metrics.output_tokens.labels(model).observe(int(tracker.usage.get("completion_tokens", 0)))

    async def _chunks(self, path: str, body: dict[str, Any], tracker: Tracker) -> AsyncIterator[dict[str, Any]]:
        blocks = routing.block_hashes(prompt_text(body))
        generation = None
        if self.mode == "disaggregated":
            tracker.enter("prefill")
            params, generation = await self._prefill(path, body, blocks, tracker.request_id)
            for _ in range(self.retries - 1):
                if self._candidates("decode", set(), generation):
                    break
                # The prefill's generation lost its last decode worker while the prefill ran (a rollout
                # retiring it): no other generation can read that KV, so prefill again on one that still
                # pairs (the first prefill's KV is freed at its hold timeout). Nothing awaits between
                # this check and the decode's pick, so a generation that passes it is the one decoded on.
                logger.info("request %s: generation %s has no decode worker left; prefilling again",
                            tracker.request_id, generation)
                params, generation = await self._prefill(path, body, blocks, tracker.request_id)
            body = dict(body, kv_transfer_params=params)
            tracker.prefilled = time.monotonic()
        tracker.enter("first_token")
        async for chunk in self._stream(path, body, blocks, tracker, generation):
            yield chunk

    async def handle(self, request: Request) -> Response:
        # The clock starts at the request's arrival in the app (StampArrival), not here; here only when the
        # handler is served without the middleware.
        arrived = request.scope.get(ARRIVED)
        tracker = Tracker(request_id=request.headers.get("x-request-id") or uuid.uuid4().hex,
                          started=arrived if isinstance(arrived, float) else time.monotonic(),
                          on_phase=self._phase_changed)
        headers = {"x-request-id": tracker.request_id}
        path = request.url.path
        try:
            body = await request.json()
        except json.JSONDecodeError as error:
            return _error(ApiError(f"the request body is not JSON: {error}", code="invalid_json"), headers)
        chat = path.endswith("/chat/completions")
        try:
            validate(body, chat=chat, model=self.model, max_model_len=self.max_model_len)
            if self.mode == "disaggregated":
                await self._check_context(body, chat=chat, request_id=tracker.request_id)
        except ApiError as error:
            self.metrics.rejected.labels(self.model, error.param or "").inc()
            return _error(error, headers)
        body["model"] = self.model
        self._count_arrival(tracker.started)
        self.last_arrival = tracker.started
        self.metrics.started.labels(self.model).inc()
        self.metrics.inflight.labels(self.model).inc()
        try:
            await self._hold(tracker)
        except ApiError as error:
            self._finish(tracker, "error")
            return _error(error, headers)
        except BaseException:
            self._finish(tracker, "cancelled")  # the client went away while held
            raise
        if body.get("stream"):
            return await self._stream_response(path, body, tracker, headers)
        return await self._collect(path, body, tracker, request, headers)

    async def _stream_response(self, path: str, body: dict[str, Any], tracker: Tracker,
                               headers: dict[str, str]) -> Response:
        """A streaming answer whose status says whether it started: the first chunk is awaited before the
        200 goes out, so a refusal or a missing worker is a JSON 4xx/5xx, not a 200 with an error event."""
        chunks = self._chunks(path, body, tracker)
        try:
            first = await anext(chunks)
        except StopAsyncIteration:
            first = None
        except ApiError as error:
            self._finish(tracker, "error")
            return _error(error, headers)
        except BaseException:
            self._finish(tracker, "cancelled")
            raise
        return StreamingResponse(self._sse(first, chunks, body, tracker), media_type="text/event-stream",
                                 headers=headers)

    async def _sse(self, first: dict[str, Any] | None, chunks: AsyncIterator[dict[str, Any]], body: dict[str, Any],
                   tracker: Tracker) -> AsyncIterator[str]:
        wants_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        status = "cancelled"

        async def all_chunks() -> AsyncIterator[dict[str, Any]]:
            if first is not None:
                yield first
            async for chunk in chunks:
                yield chunk

        try:
            async for chunk in all_chunks():
                if chunk.get("usage") and not chunk.get("choices") and not wants_usage:
                    continue
                yield f"data: {json.dumps(chunk)}\n\n"
                if chunk_text(chunk):
                    # The yield returns once StreamingResponse's `await send(...)` of this chunk has: the
                    # server has written it to the connection (having waited first if the client was behind).
                    tracker.token()
            status = "ok"
        except ApiError as error:
            # The stream has started (its 200 is sent): the error ends it as an event, and is counted.
            status = "error"
            yield f"data: {json.dumps(error.body())}\n\n"
        finally:
            if status != "cancelled":
                yield "data: [DONE]\n\n"
            self._finish(tracker, status)

    async def _collect(self, path: str, body: dict[str, Any], tracker: Tracker, request: Request,
                       headers: dict[str, str]) -> Response:
        """A non-streaming answer, assembled from the upstream stream; a client disconnect cancels it."""
        chat = "messages" in body
        text, finish_reason = [], None

        async def consume() -> None:
            nonlocal finish_reason
            async for chunk in self._chunks(path, body, tracker):
                text.append(chunk_text(chunk))
                if text[-1]:
                    tracker.token()
                for choice in chunk.get("choices") or []:
                    finish_reason = choice.get("finish_reason") or finish_reason

        work = asyncio.create_task(consume())
        watch = asyncio.create_task(_disconnected(request))
        try:
            done, _ = await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
            if work not in done:
                work.cancel()
                await asyncio.gather(work, return_exceptions=True)
                self._finish(tracker, "cancelled")
                return Response(status_code=499, headers=headers)
            work.result()
        except ApiError as error:
            self._finish(tracker, "error")
            return _error(error, headers)
        finally:
            watch.cancel()
        self._finish(tracker, "ok")
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish_reason or "length"}
        if chat:
            choice["message"] = {"role": "assistant", "content": "".join(text)}
        else:
            choice["text"] = "".join(text)
        return JSONResponse({
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [choice],
            "usage": tracker.usage or {},
        }, headers=headers)

    def _model_card(self) -> dict[str, Any]:
        card: dict[str, Any] = {"id": self.model, "object": "model", "created": 0, "owned_by": "fleetpilot"}
        if self.max_model_len is not None:
            card["max_model_len"] = self.max_model_len
        return card

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [self._model_card()]})

    async def one_model(self, request: Request) -> Response:
        if request.path_params["model"] != self.model:
            return _error(ApiError(f"the model {request.path_params['model']!r} is not served here; use "
                                   f"{self.model!r}", status=404, param="model", code="model_not_found"), {})
        return JSONResponse(self._model_card())

    def _missing_roles(self) -> list[str]:
        roles = ("prefill", "decode") if self.mode == "disaggregated" else ("aggregated",)
        now = time.monotonic()
        return [role for role in roles
                if not any(self.quarantined.get(w.url, 0) <= now for w in self.discovery.workers(role))]

    async def health(self, request: Request) -> Response:
        """Liveness: the process serves HTTP (503 while it drains, so a load balancer stops sending)."""
        if self.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        return JSONResponse({"status": "ok", "missing_workers": self._missing_roles()})

    async def ready(self, request: Request) -> Response:
        """Readiness: a request sent now has somewhere to go (a prefill and a decode worker, or an
        aggregated one, known and not quarantined for refusing connections), or will be held until it
        has (a graph that may scale to zero must keep its frontend reachable to be woken)."""
        if self.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        missing = self._missing_roles()
        if missing and self.hold_seconds > 0:
            return JSONResponse({"status": "ready", "missing_workers": missing, "holding": True})
        if missing:
            return JSONResponse({"status": "not ready", "missing_workers": missing}, status_code=503)
        return JSONResponse({"status": "ready", "missing_workers": []})

    def _auth_refused(self, reason: str) -> None:
        self.metrics.auth_refusals.labels(self.model, reason).inc()

    async def metrics_endpoint(self, request: Request) -> Response:
        return Response(prometheus_client.generate_latest(self.metrics.registry),
                        media_type=prometheus_client.CONTENT_TYPE_LATEST)

    def app(self) -> Starlette:
        @contextlib.asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[None]:
            if self.api_keys is not None:
                await self.api_keys.start()
            await self.discovery.start()
            try:
                yield
            finally:
                await self.discovery.stop()
                if self.api_keys is not None:
                    await self.api_keys.stop()
                await self.client.aclose()

        middleware = [Middleware(StampArrival)]
        if self.api_keys is not None:
            # Inside the arrival stamp, outside the routes: a refused request costs a hash and a comparison.
            middleware.append(Middleware(auth.ApiKeyAuth, keys=self.api_keys,
                                         max_in_flight=self.max_in_flight_per_key,
                                         on_refused=self._auth_refused))

        return Starlette(
            routes=[
                Route("/v1/completions", self.handle, methods=["POST"]),
                Route("/v1/chat/completions", self.handle, methods=["POST"]),
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/v1/models/{model:path}", self.one_model, methods=["GET"]),
                Route("/health", self.health, methods=["GET"]),
                Route("/ready", self.ready, methods=["GET"]),
                Route("/metrics", self.metrics_endpoint, methods=["GET"]),
            ],
            middleware=middleware,
            lifespan=lifespan,
            exception_handlers={404: _not_found, 405: _not_allowed},
        )


def _error(error: ApiError, headers: dict[str, str]) -> JSONResponse:
    if error.retry_after_s is not None:
        headers = {**headers, "Retry-After": str(error.retry_after_s)}
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


async def _not_found(request: Request, exc: Exception) -> Response:
    return _error(ApiError(f"no route {request.url.path}; this frontend serves /v1/completions, "
                           "/v1/chat/completions and /v1/models", status=404, code="not_found"), {})


async def _not_allowed(request: Request, exc: Exception) -> Response:
    return _error(ApiError(f"{request.method} is not allowed on {request.url.path}", status=405,
                           code="method_not_allowed"), {})


async def _disconnected(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
