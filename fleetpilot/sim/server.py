"""The simulator's HTTP face: vLLM's OpenAI-compatible API and its disaggregation protocol.

Where it sits: `cli` (flags, uvicorn) → this module (HTTP requests ↔ engine requests, OpenAI JSON and
SSE shapes, `kv_transfer_params`) → `engine` (scheduling and timing) and `metrics` (Prometheus).

Routes: `POST /v1/completions`, `POST /v1/chat/completions` (streaming and not), `GET /v1/models`,
`POST /tokenize` (vLLM's: the prompt's token count and the context window, no generation), `GET
/health` (200 while the engine loop runs), `GET /metrics`, and `POST /sim/kv_pull`, the simulator's
stand-in for NIXL's "I have read your blocks" notice from a decode worker.

Tokens, since the simulator has no real tokenizer: a text prompt is its whitespace-separated words ×
`tokens_per_word` tokens (default 1.0, rounded up, at least 1), each token's id a stable hash of its
word (`text_token_ids`), so prompts that share leading words share leading token ids and hit the
prefix cache (see `scheduler`); a completions `prompt` given as a list of token ids is those ids;
chat is the words of all message contents (text parts only, no chat template). `/tokenize` answers
the same ids. Only one prompt and `n = 1` per request are supported.

Output text: every token is " " + one of `FILLER_WORDS`, so the output's word count equals its token
count. The words come from a fixed toy model (`LOGITS`: one distribution per output position) sampled
as vLLM samples: greedy at temperature 0, else at `temperature` (default 1, as in OpenAI's API) within
the `top_p` nucleus, from a generator seeded by `seed` (same seed, same text) or by the OS without one.
`logprobs` (chat: `logprobs` + `top_logprobs`; completions: the integer `logprobs`, at most
`MAX_LOGPROBS`) report that model's log-probabilities in OpenAI's shapes, streamed chunks included.
`stop` strings end the output before the first of them (`StopFilter`): text that could still begin one
is held back, the stop string is never sent, `finish_reason` is "stop" and `stop_reason` names it (as
vLLM does), and `usage.completion_tokens` counts every token generated, the one that completed the stop
string included. Other sampling fields are accepted and have no effect.

Disaggregation (vLLM's NixlConnector protocol): a prefill-role worker given
`kv_transfer_params.do_remote_decode` prefills only (max_tokens forced to 1) and answers with the
parameters a decode worker needs (`do_remote_prefill`, `remote_engine_id`, `remote_block_ids`,
`remote_host`, `remote_port`, `remote_request_id`, `tp_size`); `remote_host`/`remote_port` are this
server's advertised HTTP address. A decode-role worker given `do_remote_prefill` skips the prefill,
waits the modelled KV transfer, decodes, and tells the prefill worker (best effort) that it pulled the
blocks, so they are freed after the transfer time instead of at the hold timeout. A worker of any
role without matching parameters serves the request aggregated-style, as vLLM does. The pull is
real in one respect: a decode worker that cannot reach the prefill worker, or finds no KV held there
(it exited, or the hold timed out), fails the request with 502, as a NIXL read from a gone engine
fails. So a prefill worker must not exit while a decode worker still has to pull from it:

Draining (`DrainingServer`): on SIGTERM the worker keeps serving — a frontend that has not yet seen
its pod go may still send — until it has nothing left (no request running or waiting, no KV held for
a decode worker) and `QUIET_S` has passed, for at most the drain time; then uvicorn's graceful
shutdown closes the connections and the streams still open finish within what is left of it.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import dataclasses
import functools
import json
import logging
import math
import random
import signal
import socket
import time
import uuid
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from types import FrameType
from typing import Any, Literal

import httpx
import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from fleetpilot.sim import engine, scheduler
from fleetpilot.sim import group as group_mod
from fleetpilot.sim import metrics as metrics_mod

logger = logging.getLogger("fleetpilot.sim")

Role = Literal["prefill", "decode", "aggregated"]
_Handler = Callable[[Request], Awaitable[Response]]
ROLES: tuple[Role, ...] = ("prefill", "decode", "aggregated")


class BadRequest(ValueError):
    """The request is malformed; the client gets a 400 with this message, naming `param` when one field is."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


FILLER_WORDS = (
    "the", "fleet", "sails", "on", "a", "quiet", "sea", "while", "pilots", "watch", "every", "signal",
    "and", "steady", "hands", "keep", "course", "through", "wind", "rain", "light", "until", "harbor",
    "lamps", "show", "home", "again", "under", "clear", "northern", "stars", "tonight",
)
VOCABULARY = len(FILLER_WORDS)
#: The most alternatives a request may ask logprobs for (vLLM's default --max-logprobs; OpenAI's chat cap).
MAX_LOGPROBS = 20
#: Below this temperature sampling is greedy, as in vLLM (dividing the logits by it would overflow).
GREEDY_TEMPERATURE = 1e-5


# -- the simulated language model: logits, sampling, stop strings (pure) ---------------------------


def _log_softmax(logits: Sequence[float]) -> tuple[float, ...]:
    top = max(logits)
    log_total = top + math.log(math.fsum(math.exp(x - top) for x in logits))
    return tuple(x - log_total for x in logits)


def _model_logits() -> tuple[tuple[float, ...], ...]:
    """The simulator's next-token logits over FILLER_WORDS, one row per output position modulo the
    vocabulary size (the simulator has no context to condition on, only the position). At position p
    word p leads by a clear margin, so the greedy text is FILLER_WORDS in order; the other words' logits
    are fixed draws from [-2, 2]. At temperature 1 the leader has about a quarter of the mass, so sampled
    texts differ from request to request while staying mostly on the greedy words."""
    draw = random.Random(0x5EED)  # fixed: every simulator process has the same model
    return tuple(tuple(3.0 if word == position else draw.uniform(-2.0, 2.0) for word in range(VOCABULARY))
                 for position in range(VOCABULARY))


LOGITS = _model_logits()
#: log P(word | position) of the model, before temperature and top-p: what `logprobs` reports, as
#: vLLM does by default (its `logprobs_mode` "raw_logprobs").
LOGPROBS = tuple(_log_softmax(row) for row in LOGITS)


def _ranked(scores: Sequence[float]) -> tuple[int, ...]:
    """Word ids from the highest score to the lowest (ties by vocabulary order)."""
    return tuple(sorted(range(len(scores)), key=lambda word: (-scores[word], word)))


#: Per position, the words from likeliest to least likely.
RANKED = tuple(_ranked(row) for row in LOGPROBS)


def filler_token(index: int) -> str:
    """Token `index` of the greedy output: the likeliest word at that position, with its leading space."""
    return " " + FILLER_WORDS[index % VOCABULARY]


@functools.lru_cache(maxsize=4096)
def nucleus(position: int, temperature: float, top_p: float) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """What sampling at `position` draws from: the logits divided by `temperature`, softmaxed, then cut to
    the smallest set of likeliest words whose probability reaches `top_p` (at least one word), and
    renormalised. Returns those words, likeliest first, and their cumulative probabilities (the last 1)."""
    scaled = _log_softmax([x / temperature for x in LOGITS[position % VOCABULARY]])
    words: list[int] = []
    cumulative: list[float] = []
    total = 0.0
    for word in _ranked(scaled):
        words.append(word)
        total += math.exp(scaled[word])
        cumulative.append(total)
        if total >= top_p:
            break
    return tuple(words), tuple(c / total for c in cumulative)


@dataclasses.dataclass(frozen=True)
class Token:
    """One generated token: its output position and the vocabulary word chosen there."""

    index: int
    word: int

    @property
    def text(self) -> str:
        return " " + FILLER_WORDS[self.word]

    @property
    def logprob(self) -> float:
        return LOGPROBS[self.index % VOCABULARY][self.word]

    def top(self, n: int) -> list[tuple[str, float]]:
        """The `n` likeliest tokens at this position with their logprobs, likeliest first."""
        position = self.index % VOCABULARY
        return [(" " + FILLER_WORDS[w], LOGPROBS[position][w]) for w in RANKED[position][:n]]


def _number(body: dict[str, Any], param: str, default: float, low: float, high: float) -> float:
    value = body.get(param)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise BadRequest(f"{param} must be a number from {low:g} to {high:g}, got {value!r}", param=param)
    return float(value)


def _count(value: Any, param: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_LOGPROBS:
        raise BadRequest(f"{param} must be an integer from 0 to {MAX_LOGPROBS}, got {value!r}", param=param)
    return value


@dataclasses.dataclass(frozen=True)
class Sampling:
    """A request's sampling fields. `temperature` defaults to 1 as in OpenAI's API and vLLM's, so a
    request that does not ask for greedy decoding (temperature 0) samples; `seed` makes the draws
    reproducible. `logprobs`: how many alternatives to report per token, None for no logprobs (chat:
    `logprobs: true` with `top_logprobs`; completions: the integer `logprobs`)."""

    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    logprobs: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE

    @classmethod
    def from_body(cls, body: dict[str, Any], *, chat: bool) -> Sampling:
        """The fields of a request body; raises BadRequest naming the field that is out of range."""
        temperature = _number(body, "temperature", 1.0, 0.0, math.inf)
        top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
        seed = body.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise BadRequest(f"seed must be an integer, got {seed!r}", param="seed")
        wanted, top = body.get("logprobs"), body.get("top_logprobs")
        logprobs: int | None = None
        if chat:
            if wanted is not None and not isinstance(wanted, bool):
                raise BadRequest(f"logprobs must be true or false for chat completions, got {wanted!r}",
                                 param="logprobs")
            alternatives = 0 if top is None else _count(top, "top_logprobs")
            if alternatives and not wanted:
                raise BadRequest("top_logprobs requires logprobs: true", param="top_logprobs")
            logprobs = alternatives if wanted else None
        elif wanted is not None:
            logprobs = _count(wanted, "logprobs")
        return cls(temperature=temperature, top_p=top_p, seed=seed, logprobs=logprobs)


class TokenSampler:
    """Draws a request's tokens from the model: the likeliest word when greedy, else a draw from
    `nucleus`. The generator is seeded with the request's `seed` (same seed, same text), or from the
    operating system's entropy without one (two requests, two texts)."""

    def __init__(self, sampling: Sampling) -> None:
        self.sampling = sampling
        self._random = random.Random(sampling.seed)  # None: seeded from os.urandom

    def next(self, index: int) -> Token:
        position = index % VOCABULARY
        if self.sampling.greedy:
            return Token(index, RANKED[position][0])
        words, cumulative = nucleus(position, self.sampling.temperature, self.sampling.top_p)
        pick = bisect.bisect_right(cumulative, self._random.random())
        return Token(index, words[min(pick, len(words) - 1)])  # min: rounding may leave the last below 1


@dataclasses.dataclass
class StopFilter:
    """Cuts the output at the first stop string, which is never sent (as OpenAI and vLLM do). `push`
    takes the next token's text and returns (text that can be sent now, the stop string that ended the
    output or None). Text is held back while it could still be the start of a stop string, so a stop
    string spread over several tokens leaks no part of itself, and released once it cannot be;
    `flush` releases what is held when the output ends without a stop."""

    stops: tuple[str, ...] = ()
    held: str = ""  # generated, not sent: the end of the text that some stop string starts with

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> StopFilter:
        stop = body.get("stop")
        if isinstance(stop, str):
            return cls((stop,) if stop else ())
        return cls(tuple(s for s in stop or () if isinstance(s, str) and s))

    def push(self, text: str) -> tuple[str, str | None]:
        pending = self.held + text
        hits = [(at, stop) for stop in self.stops if (at := pending.find(stop)) >= 0]
        if hits:
            at, stop = min(hits, key=lambda hit: hit[0])  # the earliest; at a tie, the first listed
            self.held = ""
            return pending[:at], stop
        keep = self._open_tail(pending)
        self.held = pending[len(pending) - keep:]
        return pending[:len(pending) - keep], None

    def flush(self) -> str:
        out, self.held = self.held, ""
        return out

    def _open_tail(self, text: str) -> int:
        """Length of the longest end of `text` that a stop string starts with (a match still possible).
        Everything before it was already searched: no stop string can begin there any more."""
        longest = min(len(text), max((len(s) for s in self.stops), default=1) - 1)
        for n in range(longest, 0, -1):
            tail = text[-n:]
            if any(stop.startswith(tail) for stop in self.stops):
                return n
        return 0


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    served_model: str
    role: Role = "aggregated"
    engine_id: str = dataclasses.field(default_factory=lambda: str(uuid.uuid4()))
    advertise_host: str = "127.0.0.1"  # how peers reach this server: remote_host in kv_transfer_params
    advertise_port: int = 8000
    tensor_parallel_size: int = 1
    tokens_per_word: float = 1.0
    default_max_tokens: int = 16  # completions without max_tokens (OpenAI's and vLLM's default)
    default_chat_max_tokens: int = 256  # chat without a limit: vLLM would stop at EOS, and we have none
    pull_notice_timeout_s: float = 2.0


# -- request parsing (pure) ------------------------------------------------------------------------


#: Token ids lie below this bound, as large as Llama 3's vocabulary.
TOKEN_ID_SPACE = 128_256


@functools.lru_cache(maxsize=65_536)
def _text_id(text: str, part: int = 0) -> int:
    """The token id of a word (or of `part` of one, or of words that make one token): a stable hash, the
    same in every process, so equal words give equal ids and equal prompt prefixes equal id prefixes."""
    return zlib.crc32(text.encode(), part) % TOKEN_ID_SPACE


def count_text_tokens(text: str, tokens_per_word: float) -> int:
    words = len(text.split())
    return max(1, math.ceil(words * tokens_per_word)) if words else 0


def text_token_ids(text: str, tokens_per_word: float) -> list[int]:
    """The simulator's tokenizer: `count_text_tokens` ids, token i standing for the words from
    i / tokens_per_word up to (i + 1) / tokens_per_word (at least one; a word of several tokens gives
    each its part number). Token i depends only on the words up to it, so prompts that share their
    leading words share their leading token ids, and a prefix cache sees the sharing."""
    words = text.split()
    if tokens_per_word == 1.0:
        return [_text_id(word) for word in words]
    ids = []
    for i in range(count_text_tokens(text, tokens_per_word)):
        low = min(int(i / tokens_per_word), len(words) - 1)
        high = max(low + 1, min(len(words), int((i + 1) / tokens_per_word)))
        part = i - math.ceil(low * tokens_per_word)  # which of its word's tokens this one is
        ids.append(_text_id(words[low] if high == low + 1 else " ".join(words[low:high]), part))
    return ids


def _is_token_ids(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def completion_prompt_ids(prompt: Any, tokens_per_word: float) -> list[int]:
    """Token ids of a completions prompt: a string, token ids, or a one-element list of either."""
    single = isinstance(prompt, list) and len(prompt) == 1
    if single and (isinstance(prompt[0], str) or _is_token_ids(prompt[0])):
        prompt = prompt[0]
    if isinstance(prompt, str):
        ids = text_token_ids(prompt, tokens_per_word)
    elif _is_token_ids(prompt):
        ids = list(prompt)
    elif isinstance(prompt, list):
        raise BadRequest("the simulator serves one prompt per request")
    else:
        raise BadRequest("prompt must be a string or a list of token ids")
    if not ids:
        raise BadRequest("prompt cannot be empty")
    return ids


def chat_prompt_ids(messages: Any, tokens_per_word: float) -> list[int]:
    """Token ids of a chat: the words of every message's text content (no chat template), at least one."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list")
    texts: list[str] = []
    for message in messages:
        if not isinstance(message, dict):
            raise BadRequest("each message must be an object")
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts += [str(part.get("text", "")) for part in content if isinstance(part, dict)]
    return text_token_ids(" ".join(texts), tokens_per_word) or [_text_id("")]


def prompt_token_ids(body: dict[str, Any], *, chat: bool, tokens_per_word: float) -> list[int]:
    """The prompt of a chat (`messages`) or completions (`prompt`) request, as token ids."""
    if chat:
        return chat_prompt_ids(body.get("messages"), tokens_per_word)
    return completion_prompt_ids(body.get("prompt"), tokens_per_word)


def requested_max_tokens(body: dict[str, Any], *, chat: bool, config: ServerConfig) -> int:
    value = body.get("max_completion_tokens") if chat else None
    if value is None:
        value = body.get("max_tokens")
    if value is None:
        return config.default_chat_max_tokens if chat else config.default_max_tokens
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise BadRequest("max_tokens must be a positive integer")
    return value


def request_mode(role: Role, kv_transfer_params: Any) -> scheduler.Mode:
    """Which part of the work this worker does, from its role and the request's kv_transfer_params."""
    if not isinstance(kv_transfer_params, dict):
        return scheduler.Mode.FULL
    if role == "prefill" and kv_transfer_params.get("do_remote_decode"):
        return scheduler.Mode.PREFILL_ONLY
    if role == "decode" and kv_transfer_params.get("do_remote_prefill"):
        return scheduler.Mode.REMOTE_PREFILL
    return scheduler.Mode.FULL


def error_body(message: str, *, kind: str = "BadRequestError", code: int = 400,
               param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _error(message: str, *, kind: str = "BadRequestError", code: int = 400, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, kind=kind, code=code, param=param), status_code=code)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


# -- responses --------------------------------------------------------------------------------------


class _EngineStreamResponse(StreamingResponse):
    """An SSE response that cancels its engine request however the response ends (disconnect included)."""

    def __init__(self, content: AsyncIterator[str], stream: engine.RequestStream) -> None:
        super().__init__(content, media_type="text/event-stream")
        self._stream = stream

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._stream.cancel()


async def _json_object(request: Request) -> dict[str, Any]:
    """The request's body as a JSON object, or BadRequest saying what it is instead."""
    try:
        body = await request.json()
    except json.JSONDecodeError as error:
        raise BadRequest(f"request body is not JSON: {error}") from error
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


async def _disconnected(request: Request) -> None:
    """Returns when the client goes away (the body is already read, so only a disconnect can come)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def chat_logprob(token: Token, top: int) -> dict[str, Any]:
    """One entry of a chat choice's `logprobs.content`, in OpenAI's shape."""

    def entry(text: str, logprob: float) -> dict[str, Any]:
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    return {**entry(token.text, token.logprob), "top_logprobs": [entry(t, lp) for t, lp in token.top(top)]}


def completion_logprobs(pieces: Sequence[Piece], top: int) -> dict[str, Any]:
    """A completions choice's `logprobs`, OpenAI's legacy shape: per token its text, logprob, the `top`
    likeliest alternatives and its character offset in the generated text."""
    return {"tokens": [p.token.text for p in pieces], "token_logprobs": [p.token.logprob for p in pieces],
            "top_logprobs": [dict(p.token.top(top)) for p in pieces], "text_offset": [p.offset for p in pieces]}


@dataclasses.dataclass(frozen=True)
class Piece:
    """What one generated token adds to the answer: the text released with it (held-back text of
    earlier tokens included, a stop string and what follows it excluded), and how the output ends."""

    token: Token
    offset: int  # where the token's text starts in the generated text (stop strings included)
    text: str
    finish_reason: str | None
    stop: str | None  # the stop string that ended the output


@dataclasses.dataclass
class _Generation:
    """One accepted request: what the response builders need besides the token stream."""

    request_id: str
    chat: bool
    model: str
    created: int
    mode: scheduler.Mode
    stream: engine.RequestStream
    sampling: Sampling = dataclasses.field(default_factory=Sampling)
    stops: StopFilter = dataclasses.field(default_factory=StopFilter)
    pull: asyncio.Task[str | None] | None = None  # the KV pull from the prefill worker, under way
    generated: int = 0  # characters of text generated so far
    sampler: TokenSampler = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.sampler = TokenSampler(self.sampling)

    def take(self, event: scheduler.TokenEvent) -> Piece:
        """The engine produced token `event.index`: choose it, and say what of the text can go out."""
        token = self.sampler.next(event.index)
        offset, self.generated = self.generated, self.generated + len(token.text)
        text, stop = self.stops.push(token.text)
        if stop is None and event.finished:
            text += self.stops.flush()  # no token left to complete a stop string
        return Piece(token, offset, text, "stop" if stop else event.finish_reason, stop)

    def logprobs(self, pieces: Sequence[Piece]) -> dict[str, Any] | None:
        """The choice's `logprobs` for these tokens, None when the request asked for none."""
        top = self.sampling.logprobs
        if top is None:
            return None
        if self.chat:
            return {"content": [chat_logprob(p.token, top) for p in pieces]}
        return completion_logprobs(pieces, top)

    async def pulled(self) -> str | None:
        """None once the KV cache is being pulled (or there is nothing to pull), else why it cannot be;
        a failed pull cancels the engine's request."""
        failed = None if self.pull is None else await self.pull
        if failed is not None:
            self.stream.cancel()
            logger.warning("request %s: %s", self.request_id, failed)
        return failed

    def kv_transfer_params(self, event: scheduler.TokenEvent, config: ServerConfig) -> dict[str, Any] | None:
        if self.mode is not scheduler.Mode.PREFILL_ONLY or not event.finished:
            return None
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": config.engine_id,
            "remote_block_ids": list(event.kv_block_ids),
            "remote_host": config.advertise_host,
            "remote_port": config.advertise_port,
            "remote_request_id": self.request_id,
            "tp_size": config.tensor_parallel_size,
        }

    def chunk(self, choice: dict[str, Any]) -> dict[str, Any]:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return {"id": self.request_id, "object": kind, "created": self.created, "model": self.model,
                "choices": [choice]}

    def usage(self, completion_tokens: int) -> dict[str, int]:
        prompt = self.stream.prompt_tokens
        return {"prompt_tokens": prompt, "completion_tokens": completion_tokens,
                "total_tokens": prompt + completion_tokens}


class _Service:
    """The routes, bound to one engine, its metrics and its configuration."""

    def __init__(self, config: ServerConfig, sim: engine.Engine, metrics: metrics_mod.SimMetrics,
                 group: group_mod.GroupLeader | None = None) -> None:
        self.config = config
        self.engine = sim
        self.metrics = metrics
        self.group = group
        self.client: httpx.AsyncClient | None = None

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        if self.group is None:
            await self.engine.start()
        else:
            await self.group.start()  # the engine starts once every rank has joined (see create_app)
        async with httpx.AsyncClient(timeout=self.config.pull_notice_timeout_s) as client:
            self.client = client
            try:
                yield
            finally:
                self.client = None
                if self.group is not None:
                    await self.group.stop()
                await self.engine.stop()

    # -- plain routes --

    async def health(self, request: Request) -> Response:
        return Response(status_code=200 if self.engine.running else 503)

    async def prometheus(self, request: Request) -> Response:
        return Response(self.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{
            "id": self.config.served_model, "object": "model", "created": int(time.time()),
            "owned_by": "fleetpilot", "root": self.config.served_model, "parent": None,
            "max_model_len": self.engine.scheduler.config.max_model_len,
        }]})

    async def tokenize(self, request: Request) -> Response:
        """vLLM's `/tokenize`: how many tokens a prompt or a chat takes, and the context window; the
        frontend asks it before a prefill whether prompt + max_tokens fits."""
        try:
            body = await _json_object(request)
            ids = prompt_token_ids(body, chat="messages" in body, tokens_per_word=self.config.tokens_per_word)
        except BadRequest as error:
            return _error(str(error))
        return JSONResponse({"count": len(ids), "max_model_len": self.engine.scheduler.config.max_model_len,
                             "tokens": ids, "token_strs": None})

    async def kv_pull(self, request: Request) -> Response:
        """A decode worker has started pulling a held request's KV: free it after the transfer time."""
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return _error("request body is not JSON")
        if not isinstance(body, dict) or body.get("remote_engine_id") != self.config.engine_id:
            return _error("unknown remote_engine_id", kind="NotFoundError", code=404)
        released = self.engine.release_after_transfer(str(body.get("remote_request_id")))
        if not released:
            return _error("no KV held for that request", kind="NotFoundError", code=404)
        return JSONResponse({"released": True})

    # -- generation --

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: Request) -> Response:
        return await self._generate(request, chat=True)

    async def _generate(self, request: Request, *, chat: bool) -> Response:
        try:
            body = await _json_object(request)
        except BadRequest as error:
            return _error(str(error))
        model = body.get("model")
        if model not in (None, self.config.served_model):
            return _error(f"The model `{model}` does not exist.", kind="NotFoundError", code=404)
        try:
            if body.get("n") not in (None, 1):
                raise BadRequest("the simulator supports only n = 1")
            prompt = prompt_token_ids(body, chat=chat, tokens_per_word=self.config.tokens_per_word)
            max_tokens = requested_max_tokens(body, chat=chat, config=self.config)
            sampling = Sampling.from_body(body, chat=chat)
        except BadRequest as error:
            return _error(str(error), param=error.param)
        params = body.get("kv_transfer_params")
        mode = request_mode(self.config.role, params)
        request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        if mode is scheduler.Mode.PREFILL_ONLY:
            max_tokens = 1  # the decode worker generates; vLLM's proxies ask prefill for one token
        spec = scheduler.RequestSpec(len(prompt), max_tokens, mode, request_id, tuple(prompt))
        try:
            stream = self.engine.submit(spec)
        except scheduler.RequestRejected as error:
            return _error(str(error))
        except engine.EngineStopped as error:
            message = self.group.status if self.group is not None else str(error)
            return _error(message, kind="ServiceUnavailableError", code=503)
        generation = _Generation(request_id, chat, self.config.served_model, int(time.time()), mode, stream,
                                 sampling, StopFilter.from_body(body))
        if mode is scheduler.Mode.REMOTE_PREFILL and isinstance(params, dict):
            # The pull runs beside the engine's modelled transfer, as NIXL's read does: only the first
            # token waits for it (`_pulled`).
            generation.pull = asyncio.create_task(self._pull(params))
        if body.get("stream"):
            options = body.get("stream_options")
            include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
            return _EngineStreamResponse(self._sse(generation, include_usage=include_usage), stream)
        return await self._collect(generation, request)

    async def _sse(self, gen: _Generation, *, include_usage: bool) -> AsyncIterator[str]:
        """One chunk per token that releases text or carries logprobs, and one for the last token (with
        the finish reason); a token whose text is held back for a possible stop string sends nothing."""
        produced = 0
        failed = await gen.pulled()
        if failed is not None:
            yield _sse_line(error_body(failed, kind="KVTransferError", code=502))
            yield "data: [DONE]\n\n"
            return
        try:
            async with gen.stream:
                async for event in gen.stream:
                    if gen.chat and produced == 0:
                        # vLLM sends the role with the first output, so it also marks the first token's time.
                        yield _sse_line(gen.chunk({"index": 0, "delta": {"role": "assistant", "content": ""},
                                                   "logprobs": None, "finish_reason": None}))
                    produced += 1
                    piece = gen.take(event)
                    logprobs = gen.logprobs([piece])
                    if not piece.text and logprobs is None and piece.finish_reason is None:
                        continue
                    choice: dict[str, Any] = {"index": 0, "logprobs": logprobs, "finish_reason": piece.finish_reason}
                    if gen.chat:
                        choice["delta"] = {"content": piece.text}
                    else:
                        choice.update(text=piece.text, stop_reason=piece.stop)
                    chunk = gen.chunk(choice)
                    params = gen.kv_transfer_params(event, self.config)
                    if params is not None:
                        chunk["kv_transfer_params"] = params
                    yield _sse_line(chunk)
                    if piece.stop is not None:
                        break  # leaving `async with` cancels the rest of the generation
        except engine.EngineStopped as error:
            yield _sse_line(error_body(str(error), kind="ServiceUnavailableError", code=503))
        if include_usage:
            yield _sse_line({**gen.chunk({}), "choices": [], "usage": gen.usage(produced)})
        yield "data: [DONE]\n\n"

    async def _collect(self, gen: _Generation, request: Request) -> Response:
        """A non-streaming answer; a client that goes away before it is ready cancels the request."""

        failed = await gen.pulled()
        if failed is not None:
            return _error(failed, kind="KVTransferError", code=502)

        async def consume() -> tuple[list[scheduler.TokenEvent], list[Piece]]:
            events: list[scheduler.TokenEvent] = []
            pieces: list[Piece] = []
            async with gen.stream:  # leaving it at a stop sequence cancels the rest of the generation
                async for event in gen.stream:
                    events.append(event)
                    pieces.append(gen.take(event))
                    if pieces[-1].stop is not None:
                        break
            return events, pieces

        work = asyncio.create_task(consume())
        watch = asyncio.create_task(_disconnected(request))
        try:
            done, _ = await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            if not work.done():
                work.cancel()
            await asyncio.gather(work, watch, return_exceptions=True)
        if work.cancelled() or work not in done:
            return Response(status_code=499)  # nobody is listening; nginx's "client closed request"
        try:
            events, pieces = work.result()
        except engine.EngineStopped as error:
            return _error(str(error), kind="ServiceUnavailableError", code=503)
        text = "".join(p.text for p in pieces)
        last = pieces[-1] if pieces else None
        choice: dict[str, Any] = {"index": 0, "logprobs": gen.logprobs(pieces),
                                  "finish_reason": last.finish_reason if last else None,
                                  "stop_reason": last.stop if last else None}
        if gen.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return JSONResponse({
            "id": gen.request_id,
            "object": "chat.completion" if gen.chat else "text_completion",
            "created": gen.created,
            "model": gen.model,
            "choices": [choice],
            "usage": gen.usage(len(events)),
            "kv_transfer_params": gen.kv_transfer_params(events[-1], self.config) if events else None,
        })

    async def _pull(self, params: dict[str, Any]) -> str | None:
        """Start pulling the prefill worker's KV blocks (the simulator's stand-in for NIXL's read, which
        also frees them there after the transfer time): None when under way, else why it cannot be. A
        prefill worker that is gone or holds nothing for the request fails it; a slow answer does not
        (the transfer is modelled here either way)."""
        host, port = params.get("remote_host"), params.get("remote_port")
        request_id = params.get("remote_request_id")
        if not host or not port or not request_id or self.client is None:
            return None
        url = f"http://{_url_host(str(host))}:{port}/sim/kv_pull"
        notice = {"remote_engine_id": params.get("remote_engine_id"), "remote_request_id": request_id}
        try:
            answer = await self.client.post(url, json=notice)
        except (httpx.ConnectError, httpx.RemoteProtocolError) as error:
            return f"cannot pull the KV cache of {request_id}: the prefill worker at {host}:{port} is gone ({error!r})"
        except httpx.HTTPError as error:
            logger.debug("KV pull notice to %s unanswered: %r", url, error)
            return None
        if answer.status_code == 404:
            return (f"cannot pull the KV cache of {request_id}: the prefill worker at {host}:{port} holds none "
                    "(freed after its hold timeout, or another engine)")
        return None


def _sse_line(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload)}\n\n"


def create_app(
    config: ServerConfig, sim: engine.Engine, *, registry: CollectorRegistry | None = None,
    group: group_mod.GroupLeader | None = None,
) -> Starlette:
    """The ASGI app for one simulated worker; its lifespan starts and stops the engine loop. With a
    `group` (a multinode replica's leader, built with `leader_group`), the engine runs only while
    every rank is joined, so /health is 503 until the group forms and once it breaks."""
    metrics = metrics_mod.SimMetrics(model_name=config.served_model, snapshot=sim.snapshot, registry=registry,
                                     block_size=sim.scheduler.config.block_size)
    sim.add_finish_listener(metrics.observe)
    service = _Service(config, sim, metrics, group)
    get, post = ["GET"], ["POST"]
    routes: list[tuple[str, _Handler, list[str]]] = [
        ("/v1/completions", service.completions, post),
        ("/v1/chat/completions", service.chat_completions, post),
        ("/v1/models", service.models, get),
        ("/tokenize", service.tokenize, post),
        ("/health", service.health, get),
        ("/metrics", service.prometheus, get),
        ("/sim/kv_pull", service.kv_pull, post),
    ]
    app = Starlette(routes=[Route(path, fn, methods=methods) for path, fn, methods in routes],
                    lifespan=service.lifespan)
    app.state.service = service
    return app


def leader_group(identity: group_mod.Identity, sim: engine.Engine, *, host: str, port: int,
                 heartbeat_s: float = group_mod.HEARTBEAT_S, timeout_s: float = group_mod.TIMEOUT_S
                 ) -> group_mod.GroupLeader:
    """A multinode replica's leader, wired to its engine: it serves once all ranks have joined, and
    stops (failing what it runs) when one is lost."""

    async def broken(reason: str) -> None:
        await sim.stop()

    return group_mod.GroupLeader(identity, host=host, port=port, on_complete=sim.start, on_broken=broken,
                                 heartbeat_s=heartbeat_s, timeout_s=timeout_s)


def create_rank_app(member: group_mod.GroupMember, *, on_over: Callable[[str], None],
                    registry: CollectorRegistry | None = None) -> Starlette:
    """A multinode replica's rank > 0: no API (the leader serves), only /health (200 while joined to
    the leader) and /metrics; `on_over` is called with the reason once the group is over for it."""
    registry = registry or CollectorRegistry()
    joined = Gauge("fleetpilot_sim_group_joined", "1 while this rank is joined to its group's leader.",
                   ["rank"], registry=registry)
    joined.labels(str(member.rank)).set_function(lambda: 1.0 if member.joined else 0.0)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async def hold() -> None:
            on_over(await member.run())

        task = asyncio.create_task(hold(), name="fleetpilot-sim-rank")
        try:
            yield
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def health(request: Request) -> Response:
        return Response(status_code=200 if member.joined else 503)

    async def prometheus(request: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return Starlette(routes=[Route("/health", health, methods=["GET"]), Route("/metrics", prometheus, methods=["GET"])],
                     lifespan=lifespan)


def bind_socket(host: str, port: int) -> socket.socket:
    """A bound TCP socket for uvicorn; binding first tells us the real port when `port` is 0."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


#: After SIGTERM a worker serves at least this long: the frontends stop sending to a terminating pod
#: the moment its deletion reaches their watch, and a request sent just before must still find it.
QUIET_S = 2.0


class DrainingServer(uvicorn.Server):
    """uvicorn, draining on SIGTERM as a worker pod must (see the module docstring): serve until the
    engine has nothing running, waiting or held, and `QUIET_S` has passed, for at most `drain_s`; then
    uvicorn's own shutdown, whose graceful timeout is what is left of the drain time. A second signal
    (or SIGINT) stops at once, as uvicorn does."""

    def __init__(self, config: uvicorn.Config, sim: engine.Engine, *, drain_s: float) -> None:
        super().__init__(config)
        self.engine = sim
        self.drain_s = drain_s
        self.drain_started: float | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGTERM and self.drain_started is None:
            captured = getattr(self, "_captured_signals", None)
            if isinstance(captured, list):
                captured.append(sig)  # re-raised once shut down, as uvicorn does: the exit status says SIGTERM
            self.begin_drain()
            return
        super().handle_exit(sig, frame)

    def begin_drain(self) -> None:
        self.drain_started = time.monotonic()
        snapshot = self.engine.snapshot()
        logger.info("draining for up to %g s: %d running, %d waiting, %d holding KV for a decode worker",
                    self.drain_s, snapshot.running, snapshot.waiting, snapshot.held)

    async def on_tick(self, counter: int) -> bool:
        if self.drain_started is not None and not self.should_exit:
            waited = time.monotonic() - self.drain_started
            snapshot = self.engine.snapshot()
            idle = snapshot.running + snapshot.waiting + snapshot.held + snapshot.arriving == 0
            if (idle and waited >= min(QUIET_S, self.drain_s)) or waited >= self.drain_s:
                logger.info("drained after %.1f s%s", waited, "" if idle else " (drain time up: stopping anyway)")
                self.config.timeout_graceful_shutdown = max(1, round(self.drain_s - waited))
                self.should_exit = True
        return await super().on_tick(counter)
