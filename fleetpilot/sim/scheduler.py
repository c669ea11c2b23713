"""The simulator's scheduler: continuous batching over a paged KV cache, timed by the performance model.

Where it sits: `server` (HTTP) → `engine.Engine` (the real-time loop) → `Scheduler` (this module, the
pure core: which requests run in the next step, what the step costs, which tokens it emits). The
scheduler never sleeps and never reads a clock: every method that depends on time takes `now` in
simulated seconds, so the same core can be unit-tested step by step or driven in simulated time by a
fleet simulator.

The scheduling policy follows vLLM's V1 scheduler with chunked prefill:

- each step has a token budget (`max_num_batched_tokens`); running decodes take one token each, in
  admission order, and what is left goes to prefill chunks, first of admitted requests whose prompt
  is not complete yet, then of waiting requests in arrival order;
- a waiting request is admitted only when it fits `max_num_seqs` and the KV blocks for everything it
  must prefill (its prompt, plus the tokens already generated when it resumes after a preemption) are
  free, less the cached prefix blocks it reuses (those no one references are free blocks too, and
  taking them counts against what is free); the head of the queue blocks the requests behind it
  (FCFS, as in vLLM); no request is admitted in a step that preempted one;
- a decode that needs a new block when none is free preempts the most recently admitted running
  request (recompute: its KV is freed, it goes back to the front of the queue and later prefills its
  prompt and the tokens it has produced, then goes on generating).

Automatic prefix caching (vLLM's, on by default; `SchedulerConfig.enable_prefix_caching`): a request
that comes with its prompt's token ids (`RequestSpec.token_ids`) has the chained hashes of its full
prompt blocks (`kvcache.block_hashes`). At admission the longest run of its leading blocks that is
cached is reused: those blocks are referenced instead of allocated, count as computed, and the prefill
computes only the rest, at least the prompt's last token (a prompt cached in full recomputes its last
block) — so the step is priced by the performance model for the uncached tokens after a context of the
cached ones. Its full prompt blocks are cached as each chunk is scheduled, and stay cached after the
request ends, until the block pool needs them (`kvcache.BlockPool`: least recently freed first; a
block a running request references is never evicted). Only prompt blocks are cached, not generated
ones. The lookups are counted as vLLM counts them, in tokens and at admission: every admitted request
queries its prompt (plus, after a preemption, its generated tokens) and hits its reused tokens; the
re-admission of a preempted request is counted apart and not exported, so it cannot inflate the rate.

Request overhead: the performance model prices, besides the steps, a fixed time per request outside
them (`Calibration.ttft_overhead_s`: HTTP, tokenizing, returning the first token), and its TTFT is that
overhead plus the prefill. The scheduler spends it before the queue: a request that will prefill here
is `ARRIVING` for that long after `add`, and only then joins the queue, its arrival stamped there: the
engine's own TTFT and queue-time histograms start where vLLM's engine-side ones do, once the API
server has handed the request over, and leave the overhead out, while a client sees it. It is not part of any step: a step's
duration is what the modelled GPU spends, and the other requests in the batch do not wait for one
request's HTTP handling. A `REMOTE_PREFILL` request does not pay it again: the prefill worker already
did, and the model counts it once per request.

Output length: the simulator has no end-of-sequence token, so every request produces exactly
`max_tokens` tokens and finishes with reason "length"; `ignore_eos` and `min_tokens` change nothing.

Disaggregation modes (vLLM's NixlConnector semantics, chosen by the server from `kv_transfer_params`):
`PREFILL_ONLY` prefills, emits one token and keeps its KV blocks until the decode side has pulled
them (`release_after`) or a hold timeout passes; `REMOTE_PREFILL` allocates KV for the prompt, waits
the transfer time, then decodes — its first token costs one decode step, not a prefill.
The prefill side is where prefix caching pays: a prefill-only request hits and fills the prefill
worker's cache like any other, and its blocks stay cached once pulled. The decode side receives the
KV of the whole prompt (the transfer is sized by the full prompt) and takes no part in prefix
caching: it neither looks its cache up nor registers the received blocks. (vLLM's decode side looks
its own cache up too and pulls only the blocks it lacks, which shortens the transfer, not the
prefill; the simulator does not model that.)
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import enum
import math
from collections.abc import Callable, Mapping
from typing import Protocol

from fleetpilot.sim import kvcache

FINISH_LENGTH = "length"
FINISH_ABORT = "abort"


class TimingModel(Protocol):
    """The performance model as the simulator uses it (`fleetpilot.perfmodel.PerformanceModel` fits)."""

    def prefill_time(self, batch_tokens: int, context_tokens: int = 0) -> float: ...

    def decode_step_time(self, batch_size: int, total_context: int) -> float: ...

    def kv_capacity_tokens(self) -> int: ...

    def kv_transfer_time(self, tokens: int, bandwidth_bytes_per_s: float) -> float: ...


class Mode(enum.Enum):
    """What this engine does for one request."""

    FULL = "full"  # prefill and decode here (aggregated, or a disaggregated worker without a peer)
    PREFILL_ONLY = "prefill_only"  # prefill role: one token, then hold the KV for the decode worker
    REMOTE_PREFILL = "remote_prefill"  # decode role: the prompt's KV arrives from a prefill worker


class Phase(enum.Enum):
    ARRIVING = "arriving"  # spending the per-request overhead before it joins the queue
    WAITING = "waiting"
    TRANSFERRING = "transferring"  # blocks allocated, KV arriving from the prefill worker
    PREFILL = "prefill"
    DECODE = "decode"
    HELD = "held"  # finished prefill-only request whose blocks wait for the decode side's pull


class RequestRejected(ValueError):
    """The request can never run here (too long for the model or for the whole KV cache)."""


@dataclasses.dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    block_size: int = 16
    kv_capacity_tokens: int | None = None  # None: the timing model's capacity
    max_model_len: int = 131_072  # prompt + output limit, as vLLM's --max-model-len
    kv_bandwidth_bytes_per_s: float = 50e9  # one rank's link for P→D transfers
    kv_hold_timeout_s: float = 30.0  # prefill side frees unpulled KV after this (vLLM has an abort timeout)
    # Per request, before the queue (see the module docstring); None: the timing model's
    # `calibration.ttft_overhead_s` when it has one, else 0.
    request_overhead_s: float | None = None
    enable_prefix_caching: bool = True  # vLLM's --enable-prefix-caching, on by default as there

    def __post_init__(self) -> None:
        if min(self.max_num_seqs, self.max_num_batched_tokens, self.block_size, self.max_model_len) < 1:
            raise ValueError("max_num_seqs, max_num_batched_tokens, block_size, max_model_len must be ≥ 1")
        if self.kv_capacity_tokens is not None and self.kv_capacity_tokens < self.block_size:
            raise ValueError("kv_capacity_tokens must hold at least one block")
        if self.kv_bandwidth_bytes_per_s <= 0 or self.kv_hold_timeout_s < 0:
            raise ValueError("kv_bandwidth_bytes_per_s must be > 0 and kv_hold_timeout_s ≥ 0")
        if self.request_overhead_s is not None and not self.request_overhead_s >= 0:
            raise ValueError("request_overhead_s must be ≥ 0")


@dataclasses.dataclass(frozen=True)
class RequestSpec:
    prompt_tokens: int
    max_tokens: int
    mode: Mode = Mode.FULL
    request_id: str | None = None  # None: the scheduler numbers it
    # The prompt's token ids, `prompt_tokens` of them: what prefix caching hashes. None: the prompt's
    # content is unknown, and the request takes no part in prefix caching.
    token_ids: tuple[int, ...] | None = None


@dataclasses.dataclass(frozen=True)
class TokenEvent:
    """One generated token; the last one of a request carries its finish reason."""

    request_id: str
    index: int  # 0-based position in the output
    time: float  # simulated seconds, end of the step that produced it
    finish_reason: str | None = None
    kv_block_ids: tuple[int, ...] = ()  # set on a PREFILL_ONLY request's token: the blocks it holds

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclasses.dataclass(frozen=True)
class RequestRecord:
    """A request's life, for the latency histograms; all times in simulated seconds."""

    request_id: str
    mode: Mode
    prompt_tokens: int
    output_tokens: int
    arrival: float
    scheduled: float | None  # first admission (end of the queue time)
    first_token: float | None
    finished: float
    finish_reason: str
    preemptions: int
    inter_token_latencies: tuple[float, ...]
    cached_tokens: int = 0  # prompt tokens found in the prefix cache at the first admission


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """The scheduler's decision for one step; `Scheduler.complete` applies its outcome."""

    start: float
    tokens: Mapping[str, int]  # request id → tokens computed this step (1 for a decode)
    preempted: tuple[str, ...] = ()
    admitted: tuple[str, ...] = ()
    prefill_tokens: int = 0
    prefill_context: int = 0  # one context that gives the chunks their attention work (see `schedule`)
    decode_batch: int = 0
    decode_context: int = 0  # summed over the decoding sequences, including the token being computed

    @property
    def empty(self) -> bool:
        return not self.tokens


@dataclasses.dataclass(frozen=True)
class StepResult:
    events: tuple[TokenEvent, ...]
    finished: tuple[RequestRecord, ...]


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """Engine state and running totals, as the metrics exporter reads them."""

    running: int
    waiting: int  # queued, preempted, and receiving KV from a prefill worker (as vLLM counts them)
    held: int
    kv_blocks_used: int
    kv_blocks_total: int
    preemptions: int
    prompt_tokens: int
    generation_tokens: int
    finished: Mapping[str, int]  # finish reason → requests
    submitted: int
    arriving: int = 0  # added but still spending the request overhead: not yet in the engine's queue
    # Prefix caching, in tokens, as vLLM's vllm:prefix_cache_queries / _hits count them (see the module
    # docstring); re-admissions after a preemption apart, as vLLM keeps them (not exported).
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    preempted_prefix_cache_queries: int = 0
    preempted_prefix_cache_hits: int = 0
    prefix_caching: bool = False

    @property
    def kv_usage(self) -> float:
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0


@dataclasses.dataclass(eq=False)
class _Seq:
    request_id: str
    prompt_tokens: int
    max_tokens: int
    mode: Mode
    arrival: float  # when it joins the queue (ARRIVING: when it will)
    phase: Phase = Phase.WAITING
    blocks: list[int] = dataclasses.field(default_factory=list)
    computed: int = 0  # tokens whose KV exists
    target: int = 0  # PREFILL: tokens this admission computes before the next token comes out
    output: int = 0
    scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    itl: list[float] = dataclasses.field(default_factory=list)
    preemptions: int = 0
    deadline: float = math.inf  # TRANSFERRING: KV complete; HELD: blocks freed
    # Prefix caching: whether this request looks the cache up, the hashes of its full prompt blocks,
    # how many of its leading blocks are registered in the cache, and its first admission's hit.
    lookup: bool = False
    block_hashes: tuple[kvcache.BlockHash, ...] = ()
    hashed: int = 0
    cached_tokens: int = 0

    def remaining(self) -> int:
        return self.target - self.computed


class Scheduler:
    """The pure core: requests in, step plans and token events out, time passed in by the caller."""

    def __init__(self, timing: TimingModel, config: SchedulerConfig = SchedulerConfig()) -> None:
        self.timing = timing
        self.config = config
        capacity = config.kv_capacity_tokens
        if capacity is None:
            capacity = timing.kv_capacity_tokens()
        self.kv = kvcache.BlockPool(capacity // config.block_size, caching=config.enable_prefix_caching)
        # vLLM V1 runs a mixed prefill + decode batch as one forward pass; a model that can price that
        # (fleetpilot.perfmodel.PerformanceModel.mixed_step_time) is used for it, else the parts add up.
        self._mixed: Callable[..., float] | None = getattr(timing, "mixed_step_time", None)
        overhead = config.request_overhead_s
        if overhead is None:
            overhead = float(getattr(getattr(timing, "calibration", None), "ttft_overhead_s", 0.0))
        self.request_overhead_s = overhead
        self._arriving: list[_Seq] = []  # ordered by when their overhead ends
        self._requests: dict[str, _Seq] = {}
        self._waiting: collections.deque[_Seq] = collections.deque()
        self._transferring: list[_Seq] = []
        self._running: list[_Seq] = []  # admission order: the last one is preempted first
        self._held: dict[str, _Seq] = {}
        self._next_id = 0
        self._submitted = 0
        self._preemptions = 0
        self._prompt_tokens = 0
        self._generation_tokens = 0
        self._finished: collections.Counter[str] = collections.Counter()
        self._queries = self._hits = self._preempted_queries = self._preempted_hits = 0

    # -- requests in and out --

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.config.block_size)

    def add(self, spec: RequestSpec, now: float) -> str:
        """Queue a request; raise RequestRejected when it could never complete here."""
        max_tokens = 1 if spec.mode is Mode.PREFILL_ONLY else spec.max_tokens
        if spec.prompt_tokens < 1 or max_tokens < 1:
            raise RequestRejected("the prompt and max_tokens must be at least 1 token")
        if spec.prompt_tokens + max_tokens > self.config.max_model_len:
            raise RequestRejected(
                f"this model's maximum context length is {self.config.max_model_len} tokens; the request "
                f"has {spec.prompt_tokens} prompt tokens and asks for {max_tokens} more"
            )
        # The last output token's KV is never computed, so the longest resident sequence is one shorter.
        if self._blocks_for(spec.prompt_tokens + max_tokens - 1) > self.kv.total:
            raise RequestRejected(
                f"{spec.prompt_tokens} prompt tokens + {max_tokens} output tokens do not fit the KV cache "
                f"({self.kv.total * self.config.block_size} tokens)"
            )
        request_id = spec.request_id
        if request_id is None:
            request_id = f"req-{self._next_id}"
            self._next_id += 1
        if request_id in self._requests or request_id in self._held:
            raise RequestRejected(f"request id {request_id!r} is already in use")
        if spec.token_ids is not None and len(spec.token_ids) != spec.prompt_tokens:
            raise ValueError(f"{len(spec.token_ids)} token ids for a prompt of {spec.prompt_tokens} tokens")
        overhead = 0.0 if spec.mode is Mode.REMOTE_PREFILL else self.request_overhead_s
        seq = _Seq(request_id, spec.prompt_tokens, max_tokens, spec.mode, arrival=now + overhead)
        # A decode worker receives the whole prompt's KV: its cache takes no part (module docstring).
        if self.config.enable_prefix_caching and spec.token_ids is not None and spec.mode is not Mode.REMOTE_PREFILL:
            seq.lookup = True
            seq.block_hashes = kvcache.block_hashes(spec.token_ids, self.config.block_size)
        self._requests[request_id] = seq
        if overhead > 0:
            seq.phase, seq.deadline = Phase.ARRIVING, seq.arrival
            bisect.insort(self._arriving, seq, key=lambda other: other.deadline)
        else:
            self._waiting.append(seq)
        self._submitted += 1
        return request_id

    def cancel(self, request_id: str, now: float) -> RequestRecord | None:
        """Drop an unfinished request and free its KV at once (a client went away)."""
        seq = self._requests.pop(request_id, None)
        if seq is None:
            return None
        if seq.phase is Phase.ARRIVING:
            self._arriving.remove(seq)
        elif seq.phase is Phase.WAITING:
            self._waiting.remove(seq)
        elif seq.phase is Phase.TRANSFERRING:
            self._transferring.remove(seq)
        else:
            self._running.remove(seq)
        self.kv.release(seq.blocks)
        self._finished[FINISH_ABORT] += 1
        return self._record(seq, now, FINISH_ABORT)

    def release_after(self, request_id: str, delay: float, now: float) -> bool:
        """A decode worker is pulling a held request's KV: free its blocks `delay` from `now`."""
        seq = self._held.get(request_id)
        if seq is None:
            return False
        seq.deadline = min(seq.deadline, now + delay)
        return True

    def held_tokens(self, request_id: str) -> int | None:
        seq = self._held.get(request_id)
        return None if seq is None else seq.prompt_tokens

    # -- time passing outside steps --

    def advance(self, now: float) -> None:
        """Queue requests whose overhead is spent, finish KV transfers, free held KV whose time has come."""
        while self._arriving and self._arriving[0].deadline <= now:
            seq = self._arriving.pop(0)
            seq.phase, seq.deadline = Phase.WAITING, math.inf
            self._waiting.append(seq)
        arrived = [seq for seq in self._transferring if seq.deadline <= now]
        for seq in arrived:
            self._transferring.remove(seq)
            # The prompt's KV is here; recomputing its last token, a decode step, yields the first token.
            seq.phase, seq.computed, seq.deadline = Phase.DECODE, seq.prompt_tokens - 1, math.inf
            self._running.append(seq)
        for request_id in [rid for rid, seq in self._held.items() if seq.deadline <= now]:
            self.kv.release(self._held.pop(request_id).blocks)

    def next_deadline(self) -> float | None:
        """When `advance` will next change something without a new request arriving."""
        deadlines = [seq.deadline for seq in (*self._arriving[:1], *self._transferring, *self._held.values())]
        return min(deadlines, default=None)

    # -- one step --

    def schedule(self, now: float) -> StepPlan:
        """Decide the next step: decodes first, then prefill chunks FCFS, preempting when KV runs out."""
        cfg = self.config
        budget = cfg.max_num_batched_tokens
        tokens: dict[str, int] = {}
        preempted: list[str] = []
        admitted: list[str] = []
        decode_batch = decode_context = 0

        i = 0
        while i < len(self._running) and budget > 0:
            seq = self._running[i]
            if seq.phase is not Phase.DECODE:
                i += 1
                continue
            needed = self._blocks_for(seq.computed + 1) - len(seq.blocks)
            while needed > self.kv.free and seq in self._running:
                victim = self._running[-1]  # never scheduled yet: the pass goes oldest first
                self._preempt(victim)
                preempted.append(victim.request_id)
            if seq not in self._running:
                break  # it was the newest running request and preempted itself
            if needed:
                blocks = self.kv.allocate(needed)
                assert blocks is not None
                seq.blocks.extend(blocks)
            tokens[seq.request_id] = 1
            decode_batch += 1
            decode_context += seq.computed + 1
            budget -= 1
            i += 1

        prefill_tokens = 0
        pairs2 = 0  # twice the (query, key) pairs the chunks attend over

        def chunk(seq: _Seq) -> None:
            nonlocal budget, prefill_tokens, pairs2
            n = min(seq.remaining(), budget)
            tokens[seq.request_id] = n
            prefill_tokens += n
            pairs2 += n * (2 * seq.computed + n + 1)
            budget -= n
            self._cache_full_blocks(seq, seq.computed + n)

        for seq in self._running:
            if budget <= 0:
                break
            if seq.phase is Phase.PREFILL:
                chunk(seq)

        # vLLM admits nothing in a step that had to preempt: the freed blocks go to the preempted first.
        while self._waiting and budget > 0 and not preempted:
            seq = self._waiting[0]
            if len(self._running) + len(self._transferring) >= cfg.max_num_seqs:
                break
            remote = seq.mode is Mode.REMOTE_PREFILL and seq.output == 0 and seq.preemptions == 0
            need = seq.prompt_tokens if remote else seq.prompt_tokens + seq.output
            # The longest cached prefix, in whole blocks, short of the last token (it is always computed).
            hit = self.kv.longest_hit(seq.block_hashes[:(need - 1) // cfg.block_size]) if seq.lookup else []
            new = self._blocks_for(need) - len(hit)
            if new + self.kv.evictable(hit) > self.kv.free:
                break  # FCFS: the head waits for KV, and so does everyone behind it
            self.kv.touch(hit)
            blocks = self.kv.allocate(new)
            assert blocks is not None
            self._waiting.popleft()
            seq.blocks = hit + blocks
            seq.hashed = len(hit)
            cached = len(hit) * cfg.block_size
            if seq.lookup:
                self._count_lookup(seq, need, cached)
            if seq.scheduled is None:
                seq.scheduled = now
            admitted.append(seq.request_id)
            if remote:
                seq.phase = Phase.TRANSFERRING
                transfer = self.timing.kv_transfer_time(seq.prompt_tokens, cfg.kv_bandwidth_bytes_per_s)
                seq.deadline = now + transfer
                self._transferring.append(seq)
                continue
            seq.phase, seq.computed, seq.target = Phase.PREFILL, cached, need
            self._running.append(seq)
            chunk(seq)

        # The timing model prices one chunk after one context. For several chunks, pick the context that
        # gives one chunk of all their tokens the same attention work (exact for a single chunk); at
        # least 0, so a step of many short prompts is priced as one prompt of their length.
        n = prefill_tokens
        context = max(0, (pairs2 - n * (n + 1)) // (2 * n)) if n else 0
        return StepPlan(
            start=now,
            tokens=tokens,
            preempted=tuple(preempted),
            admitted=tuple(admitted),
            prefill_tokens=prefill_tokens,
            prefill_context=context,
            decode_batch=decode_batch,
            decode_context=decode_context,
        )

    def _cache_full_blocks(self, seq: _Seq, tokens: int) -> None:
        """Register the prompt blocks that the first `tokens` tokens fill. As in vLLM, at scheduling:
        a request admitted later in the same step may already hit them (their KV is written in the
        same forward pass, layer by layer, before attention reads it)."""
        full = min(len(seq.block_hashes), tokens // self.config.block_size)
        for index in range(seq.hashed, full):
            self.kv.cache(seq.blocks[index], seq.block_hashes[index])
        seq.hashed = max(seq.hashed, full)

    def _count_lookup(self, seq: _Seq, queried: int, hit: int) -> None:
        if seq.preemptions:
            self._preempted_queries += queried
            self._preempted_hits += hit
            return
        self._queries += queried
        self._hits += hit
        seq.cached_tokens = hit

    def _preempt(self, seq: _Seq) -> None:
        self._running.remove(seq)
        self.kv.release(seq.blocks)
        seq.phase, seq.computed, seq.target, seq.hashed = Phase.WAITING, 0, 0, 0
        seq.preemptions += 1
        self._preemptions += 1
        self._waiting.appendleft(seq)

    def step_duration(self, plan: StepPlan) -> float:
        """Seconds the modelled GPU spends on the step."""
        if plan.prefill_tokens and plan.decode_batch and self._mixed is not None:
            return float(self._mixed(
                prefill_tokens=plan.prefill_tokens, prefill_context=plan.prefill_context,
                decode_batch=plan.decode_batch, decode_context=plan.decode_context,
            ))
        duration = 0.0
        if plan.prefill_tokens:
            duration += self.timing.prefill_time(plan.prefill_tokens, plan.prefill_context)
        if plan.decode_batch:
            duration += self.timing.decode_step_time(plan.decode_batch, plan.decode_context)
        return duration

    def complete(self, plan: StepPlan, now: float) -> StepResult:
        """Apply the step's outcome at its end time `now`: KV computed, tokens emitted, requests done."""
        events: list[TokenEvent] = []
        finished: list[RequestRecord] = []
        for request_id, n in plan.tokens.items():
            seq = self._requests.get(request_id)
            if seq is None or seq.phase not in (Phase.PREFILL, Phase.DECODE):
                continue  # cancelled while the step ran
            seq.computed += n
            if seq.phase is Phase.PREFILL:
                if seq.computed < seq.target:
                    continue  # a chunk of a longer prefill: no token yet
                seq.phase = Phase.DECODE
            seq.output += 1
            self._generation_tokens += 1
            if seq.first_token is None:
                seq.first_token = now
                self._prompt_tokens += seq.prompt_tokens
            elif seq.last_token is not None:
                seq.itl.append(now - seq.last_token)
            seq.last_token = now
            if seq.output < seq.max_tokens:
                events.append(TokenEvent(request_id, seq.output - 1, now))
                continue
            del self._requests[request_id]
            self._running.remove(seq)
            self._finished[FINISH_LENGTH] += 1
            block_ids: tuple[int, ...] = ()
            if seq.mode is Mode.PREFILL_ONLY:
                seq.phase, seq.deadline = Phase.HELD, now + self.config.kv_hold_timeout_s
                self._held[request_id] = seq
                block_ids = tuple(seq.blocks)
            else:
                self.kv.release(seq.blocks)
            events.append(TokenEvent(request_id, seq.output - 1, now, FINISH_LENGTH, block_ids))
            finished.append(self._record(seq, now, FINISH_LENGTH))
        return StepResult(tuple(events), tuple(finished))

    def _record(self, seq: _Seq, now: float, reason: str) -> RequestRecord:
        return RequestRecord(
            request_id=seq.request_id, mode=seq.mode, prompt_tokens=seq.prompt_tokens,
            output_tokens=seq.output, arrival=seq.arrival, scheduled=seq.scheduled,
            first_token=seq.first_token, finished=now,
            finish_reason=reason, preemptions=seq.preemptions, inter_token_latencies=tuple(seq.itl),
            cached_tokens=seq.cached_tokens,
        )

    def step(self, now: float) -> tuple[StepPlan, StepResult]:
        """advance → schedule → complete at now + duration: one step in simulated time, no sleeping."""
        self.advance(now)
        plan = self.schedule(now)
        if plan.empty:
            return plan, StepResult((), ())
        return plan, self.complete(plan, now + self.step_duration(plan))

    # -- state --

    def has_work(self) -> bool:
        """Requests still to run (held KV is not work: it only waits for a pull or a timeout)."""
        return bool(self._requests)

    def phase(self, request_id: str) -> Phase | None:
        seq = self._requests.get(request_id) or self._held.get(request_id)
        return None if seq is None else seq.phase

    def snapshot(self) -> Snapshot:
        return Snapshot(
            running=len(self._running),
            waiting=len(self._waiting) + len(self._transferring),
            held=len(self._held),
            kv_blocks_used=self.kv.total - self.kv.free,
            kv_blocks_total=self.kv.total,
            preemptions=self._preemptions,
            prompt_tokens=self._prompt_tokens,
            generation_tokens=self._generation_tokens,
            finished=dict(self._finished),
            submitted=self._submitted,
            arriving=len(self._arriving),
            prefix_cache_queries=self._queries,
            prefix_cache_hits=self._hits,
            preempted_prefix_cache_queries=self._preempted_queries,
            preempted_prefix_cache_hits=self._preempted_hits,
            prefix_caching=self.config.enable_prefix_caching,
        )
