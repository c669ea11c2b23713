"""The performance model: how long a prefill or decode step takes, and how many KV tokens fit.

One model, two clocks. The simulator engine (a GPU-free vLLM look-alike) asks it, in real time, how long
to sleep for each continuous-batching step; the fleet simulator asks it, in simulated time, when each
step of every simulated worker ends. Both ask the same questions per step, thousands of times per
simulated second, so the step methods are plain float arithmetic over constants computed once in the
constructor: no numpy, no pandas, no I/O. (Measured Dynamo profiles are read by
`fleetpilot.api.profile.from_dynamo_csv`, for the planner.)

`PerformanceModel` is a roofline: a step costs a fixed overhead plus the larger of its compute time
(≈ 2·params FLOPs per token for the GEMMs, plus attention FLOPs over the cached context) and its memory
time (weights streamed once per step, plus the KV cache read), with measured efficiency factors and
per-step, per-layer and per-sequence overheads. Those constants depend on the serving stack, so they
live in `Calibration` presets (`CALIBRATIONS`: vLLM, the default, SGLang and TensorRT-LLM), fitted once
to `../shared/traces/calibration/`; `docs/perfmodel.md` says how, and `tests/unit/test_perfmodel.py`
checks the fit every run. `aggregated_steady_state` lifts the step times to what a closed-loop
benchmark sees: TTFT and TPOT at a given concurrency (the calibration against the silicon sweeps).
"""

from __future__ import annotations

import dataclasses
import math

# -- hardware and architecture facts ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """A dense decoder-only transformer, as far as timing and memory care.

    `params` counts every parameter, embeddings included; the presets have untied input embeddings and
    LM heads. FP8 checkpoints keep both in 16 bits; `vocab_size` lets the model count them at 2 bytes
    and leave the embedding table (looked up, never streamed) out of the per-step weight reads.
    """

    name: str
    params: int
    layers: int
    hidden_size: int
    kv_heads: int
    head_dim: int
    weight_bytes_per_param: float
    kv_bytes_per_element: float
    attention_heads: int = 0  # query heads; 0 means hidden_size // head_dim
    vocab_size: int = 0  # 0: embeddings are not modelled separately
    # Mixture of experts: `expert_params` of `params` sit in `experts` experts per layer, of which each
    # token uses `experts_per_token`. 0: a dense model.
    experts: int = 0
    experts_per_token: int = 0
    expert_params: int = 0
    repository: str = ""  # the checkpoint on the Hugging Face hub, for the manifests a recommendation writes

    @property
    def query_dim(self) -> int:
        """Width of the attention queries: Qwen3 projects 5120 hidden to 64×128 = 8192."""
        heads = self.attention_heads or self.hidden_size // self.head_dim
        return heads * self.head_dim

    @property
    def embedding_params(self) -> int:
        """Parameters of one vocabulary matrix (the input embedding or the untied LM head)."""
        return self.vocab_size * self.hidden_size

    @property
    def gemm_params(self) -> int:
        """Parameters that cost 2 FLOPs per token: everything but the input embedding table."""
        return self.params - self.embedding_params

    @property
    def active_gemm_params(self) -> float:
        """GEMM parameters one token passes through: a MoE token uses only its experts' share."""
        if not self.experts:
            return float(self.gemm_params)
        return self.gemm_params - self.expert_params * (1.0 - self.experts_per_token / self.experts)

    @property
    def expert_weight_bytes(self) -> float:
        """Bytes of all experts' weights (0 for a dense model): streamed only where a token routes."""
        return self.expert_params * self.weight_bytes_per_param

    @property
    def weight_bytes(self) -> float:
        """Resident weight bytes; the two vocabulary matrices stay 16-bit in quantized checkpoints."""
        vocab = 2 * self.embedding_params
        return (self.params - vocab) * self.weight_bytes_per_param + vocab * max(
            self.weight_bytes_per_param, 2.0
        )

    @property
    def streamed_weight_bytes(self) -> float:
        """Weight bytes every forward pass reads: all but the embedding table."""
        return self.weight_bytes - self.embedding_params * max(self.weight_bytes_per_param, 2.0)

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V for one token across all layers (whole model, before any sharding)."""
        return 2.0 * self.layers * self.kv_heads * self.head_dim * self.kv_bytes_per_element


@dataclasses.dataclass(frozen=True)
class GpuSpec:
    """One GPU, from its datasheet.

    `flops` is the dense tensor-core rate for 8-bit (FP8) GEMMs, the precision of the preset models;
    `flops_16bit` is the dense BF16 rate, used for attention (which runs in 16 bits even in FP8
    models) and for the GEMMs of 16-bit models (0: the same as `flops`, for GPUs without FP8).
    `interconnect_bandwidth` is NVLink bytes/s per direction per GPU, for tensor-parallel all-reduces.
    """

    name: str
    flops: float
    memory_bandwidth: float
    memory_bytes: float
    flops_16bit: float = 0.0
    interconnect_bandwidth: float = 450e9


# Architecture facts from the models' published configs (config.json); parameter counts from the model
# cards. FP8 presets have FP8 weights and a BF16 KV cache: vLLM's kv_cache_dtype "auto" keeps the KV
# cache in the activation dtype, as in the calibration profiles. The "-bf16" presets are the original
# checkpoints.
_FP8_MODELS = (
    ModelSpec(
        name="llama-3.1-8b",
        params=8_030_261_248,
        layers=32,
        hidden_size=4096,
        kv_heads=8,
        head_dim=128,
        weight_bytes_per_param=1,
        kv_bytes_per_element=2,
        attention_heads=32,
        vocab_size=128_256,
        repository="nvidia/Llama-3.1-8B-Instruct-FP8",
    ),
    ModelSpec(
        name="llama-3.1-70b",
        params=70_553_706_496,
        layers=80,
        hidden_size=8192,
        kv_heads=8,
        head_dim=128,
        weight_bytes_per_param=1,
        kv_bytes_per_element=2,
        attention_heads=64,
        vocab_size=128_256,
        repository="nvidia/Llama-3.1-70B-Instruct-FP8",
    ),
    ModelSpec(
        name="qwen3-32b",
        params=32_762_123_264,
        layers=64,
        hidden_size=5120,
        kv_heads=8,
        head_dim=128,
        weight_bytes_per_param=1,
        kv_bytes_per_element=2,
        attention_heads=64,
        vocab_size=151_936,
        repository="Qwen/Qwen3-32B-FP8",
    ),
    # Mixture-of-experts presets (128 experts, 8 per token). Not calibrated: no MoE row is in the
    # calibration data, so their times are the dense stacks' constants applied to the active parameters
    # and the experts the batch touches (docs/perfmodel.md, "Mixture of experts").
    ModelSpec(
        name="qwen3-30b-a3b",
        params=30_532_122_624,
        layers=48,
        hidden_size=2048,
        kv_heads=4,
        head_dim=128,
        weight_bytes_per_param=1,
        kv_bytes_per_element=2,
        attention_heads=32,
        vocab_size=151_936,
        experts=128,
        experts_per_token=8,
        expert_params=28_991_029_248,
        repository="Qwen/Qwen3-30B-A3B-FP8",
    ),
    ModelSpec(
        name="qwen3-235b-a22b",
        params=235_093_634_560,
        layers=94,
        hidden_size=4096,
        kv_heads=4,
        head_dim=128,
        weight_bytes_per_param=1,
        kv_bytes_per_element=2,
        attention_heads=64,
        vocab_size=151_936,
        experts=128,
        experts_per_token=8,
        expert_params=227_096_395_776,
        repository="Qwen/Qwen3-235B-A22B-FP8",
    ),
)
# The original 16-bit checkpoints of the FP8 presets.
_BF16_REPOSITORIES = {
    "llama-3.1-8b": "meta-llama/Llama-3.1-8B-Instruct",
    "llama-3.1-70b": "meta-llama/Llama-3.1-70B-Instruct",
    "qwen3-32b": "Qwen/Qwen3-32B",
    "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B",
    "qwen3-235b-a22b": "Qwen/Qwen3-235B-A22B",
}
MODELS: dict[str, ModelSpec] = {spec.name: spec for spec in _FP8_MODELS} | {
    f"{spec.name}-bf16": dataclasses.replace(
        spec, name=f"{spec.name}-bf16", weight_bytes_per_param=2, repository=_BF16_REPOSITORIES[spec.name])
    for spec in _FP8_MODELS
}

# NVIDIA datasheets (SXM, dense = half the "with sparsity" figure). Memory is what the driver reports
# (81,559 MiB and 143,771 MiB), which is what vLLM's gpu_memory_utilization multiplies.
GPUS: dict[str, GpuSpec] = {
    "h100-sxm": GpuSpec(
        name="h100-sxm",
        flops=1979e12,
        flops_16bit=989e12,
        memory_bandwidth=3.35e12,
        memory_bytes=81_559 * 2**20,
        interconnect_bandwidth=450e9,
    ),
    "h200-sxm": GpuSpec(
        name="h200-sxm",
        flops=1979e12,
        flops_16bit=989e12,
        memory_bandwidth=4.8e12,
        memory_bytes=143_771 * 2**20,
        interconnect_bandwidth=450e9,
    ),
}


#: Between nodes: one 400 Gb/s NIC per GPU (ConnectX-7, NDR InfiniBand, as in DGX H100/H200), bytes/s
#: per direction; what a tensor-parallel all-reduce gets per GPU once its ranks span nodes.
NETWORK_BANDWIDTH = 50e9
#: What crossing nodes adds to one all-reduce or pipeline hand-off beyond NVLink's latency (NIC, switch,
#: NCCL's inter-node protocol). Judgement from NCCL's published small-message latencies, not fitted:
#: the calibration data has no multinode run.
NETWORK_LATENCY_S = 15e-6


# -- calibration ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Calibration:
    """What the datasheets do not say: achieved efficiencies, software overheads, scheduler habits.

    These belong to a serving stack (engine and version), not to a model or a GPU: one set serves every
    model and GPU. `CALIBRATIONS` holds the fitted sets; `docs/perfmodel.md` says how they were fitted.
    """

    gemm_efficiency: float  # achieved / peak tensor FLOP/s in the linear layers
    attention_efficiency: float  # achieved / peak BF16 FLOP/s in attention
    memory_efficiency: float  # achieved / peak HBM bandwidth when streaming weights and KV
    step_overhead_s: float  # per engine step: scheduling, input preparation, launch
    layer_overhead_s: float  # per layer per step: small kernels (norms, rotary, activations)
    sequence_overhead_s: float  # per running sequence per step: sampling, detokenizing, streaming out
    allreduce_latency_s: float  # per tensor-parallel all-reduce (two per layer), besides bytes / bandwidth
    interconnect_efficiency: float  # achieved / datasheet NVLink bandwidth in all-reduces
    ttft_overhead_s: float  # per request, outside the engine steps: HTTP, tokenizing, first-token return
    memory_utilization: float = 0.9  # share of GPU memory the engine takes (vLLM gpu_memory_utilization)
    activation_reserve_bytes: float = 2.733e9  # per GPU, kept from the KV cache: activations, CUDA graphs
    kv_bytes_per_element: float = 0.0  # KV cache dtype width; 0: the model's own (`ModelSpec`)
    max_num_seqs: int = 1024  # running-batch cap: beyond it requests wait, and steps stop growing
    kv_transfer_latency_s: float = 1e-3  # per P→D transfer: connector handshake and completion notice
    # How a closed loop of clients meets the scheduler; used only by `aggregated_steady_state`.
    prefill_sync: float = 0.0  # 0: prompts arrive spread out; 1: in lock-step waves, prefilled back to back
    first_token_prefills: float = 0.0  # extra prefill-lengths before a first token comes back
    kv_output_share: float = 0.5  # share of its output a running request holds KV for: ½ when blocks are
    # allocated as tokens appear (vLLM), 1 when the scheduler reserves the whole output up front


# Fitted by scipy least squares (soft-L1 on log errors) to ../shared/traces/calibration/; see
# docs/perfmodel.md. vLLM is fitted to the Dynamo H200 profile of Llama-3.1-8B-FP8 together with every
# vLLM row of the Llama-3.1-70B and Qwen3-32B sweeps; the other stacks to their own sweep rows.
VLLM_HOPPER = Calibration(
    gemm_efficiency=0.61,
    attention_efficiency=0.42,
    memory_efficiency=0.88,
    step_overhead_s=1.84e-3,
    layer_overhead_s=33.3e-6,
    sequence_overhead_s=34.8e-6,
    allreduce_latency_s=7.4e-6,
    interconnect_efficiency=0.77,
    ttft_overhead_s=18.8e-3,
    # The Dynamo decode profile never ran more than ~900 sequences at once (decode tokens/s × ITL), even
    # at 1,573 concurrent requests; vLLM's configured cap is 1,024.
    max_num_seqs=900,
    prefill_sync=0.18,
    first_token_prefills=0.14,
)
# TensorRT-LLM runs FP8 checkpoints with an FP8 KV cache and reserves a request's whole output up front.
TRTLLM_HOPPER = Calibration(
    gemm_efficiency=0.69,
    attention_efficiency=0.80,
    memory_efficiency=0.95,
    step_overhead_s=1.31e-3,
    layer_overhead_s=24.4e-6,
    sequence_overhead_s=38.5e-6,
    allreduce_latency_s=6.0e-6,
    interconnect_efficiency=0.71,
    ttft_overhead_s=37.5e-3,
    kv_bytes_per_element=1.0,
    max_num_seqs=2048,
    prefill_sync=0.13,
    first_token_prefills=0.08,
    kv_output_share=1.0,
)
# TensorRT-LLM 1.0.0rc3 (the Qwen3-32B sweeps): first tokens come back ~1.6 prefill-lengths later than
# in the other TensorRT-LLM sweeps, at every concurrency, ISL and TP.
TRTLLM_1_0_HOPPER = Calibration(
    gemm_efficiency=0.46,
    attention_efficiency=0.80,
    memory_efficiency=0.86,
    step_overhead_s=1.37e-3,
    layer_overhead_s=25.3e-6,
    sequence_overhead_s=50.8e-6,
    allreduce_latency_s=5.7e-6,
    interconnect_efficiency=0.42,
    ttft_overhead_s=56.0e-3,
    kv_bytes_per_element=1.0,
    max_num_seqs=2048,
    prefill_sync=0.13,
    first_token_prefills=1.57,
    kv_output_share=1.0,
)
# SGLang prefills arriving prompts in waves: its clients fall into lock-step (prefill_sync = 1).
SGLANG_HOPPER = Calibration(
    gemm_efficiency=0.52,
    attention_efficiency=0.80,
    memory_efficiency=0.95,
    step_overhead_s=1.25e-3,
    layer_overhead_s=22.5e-6,
    sequence_overhead_s=31.1e-6,
    allreduce_latency_s=8.7e-6,
    interconnect_efficiency=0.90,
    ttft_overhead_s=60.0e-3,
    prefill_sync=1.0,
    first_token_prefills=1.88,
)
CALIBRATIONS: dict[str, Calibration] = {
    "vllm": VLLM_HOPPER,
    "trtllm": TRTLLM_HOPPER,
    "trtllm-1.0": TRTLLM_1_0_HOPPER,
    "sglang": SGLANG_HOPPER,
}


# -- the analytic model ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SteadyState:
    """A closed-loop aggregated worker at fixed concurrency, as a benchmark sweep measures it."""

    ttft: float  # seconds, mean over requests
    tpot: float  # seconds per output token after the first
    request_rate: float  # completed requests per second
    running: int  # sequences the KV cache and the batch cap let run at once


class PerformanceModel:
    """Roofline step times for one worker: `tensor_parallel` × `pipeline_parallel` GPUs of one kind.

    Tensor parallelism shards weights, KV heads and FLOPs and adds two all-reduces per layer, so it
    speeds a step up by less than its degree. Pipeline parallelism shards weights and KV across stages,
    but one step still passes every layer in turn: it buys memory, not step latency.

    A multinode replica (`nodes` > 1: its GPUs on that many nodes, as many on each) pays the network
    where its ranks cross nodes: tensor-parallel all-reduces over more GPUs than a node holds run at
    the NIC's bandwidth (`NETWORK_BANDWIDTH`, a ninth of NVLink's) with `NETWORK_LATENCY_S` more each,
    and each pipeline hand-off between nodes costs that latency and the activations' bytes. Its KV
    capacity and FLOPs follow tensor × pipeline as on one node.

    `calibration` picks the serving stack (`CALIBRATIONS`); the default, `VLLM_HOPPER`, is the one the
    simulator engine imitates.
    """

    def __init__(
        self,
        model: ModelSpec,
        gpu: GpuSpec,
        tensor_parallel: int = 1,
        pipeline_parallel: int = 1,
        *,
        calibration: Calibration = VLLM_HOPPER,
        nodes: int = 1,
    ) -> None:
        if tensor_parallel < 1 or pipeline_parallel < 1:
            raise ValueError("tensor_parallel and pipeline_parallel must be ≥ 1")
        if nodes < 1 or (tensor_parallel * pipeline_parallel) % nodes:
            raise ValueError(f"nodes must divide tensor_parallel × pipeline_parallel "
                             f"({tensor_parallel * pipeline_parallel}), got {nodes}")
        self.model = model
        self.gpu = gpu
        self.tensor_parallel = tensor_parallel
        self.pipeline_parallel = pipeline_parallel
        self.nodes = nodes
        self.calibration = cal = calibration
        # Where the replica's ranks cross nodes: its all-reduces, when a TP group is wider than a node;
        # else the boundaries between nodes' pipeline stages.
        tp_spans_nodes = tensor_parallel > tensor_parallel * pipeline_parallel // nodes
        stage_crossings = (pipeline_parallel - 1) if tp_spans_nodes else (nodes - 1)
        link = gpu.interconnect_bandwidth * cal.interconnect_efficiency
        if tp_spans_nodes:
            link = min(link, NETWORK_BANDWIDTH * cal.interconnect_efficiency)

        tp = float(tensor_parallel)
        eight_bit = model.weight_bytes_per_param <= 1 or not gpu.flops_16bit
        gemm_peak = gpu.flops if eight_bit else gpu.flops_16bit
        attention_peak = gpu.flops_16bit or gpu.flops
        bandwidth = gpu.memory_bandwidth * cal.memory_efficiency
        kv_width = cal.kv_bytes_per_element or model.kv_bytes_per_element
        # KV heads shard across TP ranks until there are more ranks than heads; then they replicate.
        shard = math.ceil(model.kv_heads / tensor_parallel) / model.kv_heads
        #: KV bytes one token occupies on one GPU of this worker (before pipeline sharding).
        self.kv_bytes_per_token_per_gpu = (
            model.kv_bytes_per_token * kv_width / model.kv_bytes_per_element * shard
        )

        # Everything below is seconds per unit, so the step methods are a handful of multiply-adds.
        self._gemm_s_per_token = 2.0 * model.active_gemm_params / (tp * gemm_peak * cal.gemm_efficiency)
        # One query attending to one key costs 4·query_dim FLOPs per layer (QKᵀ and PV, 2 FLOPs a MAC).
        self._attention_s_per_pair = (
            4.0 * model.layers * model.query_dim / (tp * attention_peak * cal.attention_efficiency)
        )
        # A MoE step streams the dense weights and the experts its tokens route to: with uniform routing,
        # an expert is untouched by n tokens with probability (1 − k/E)ⁿ (`_weights_for`).
        self._weights_s = (model.streamed_weight_bytes - model.expert_weight_bytes) / tp / bandwidth
        self._expert_weights_s = model.expert_weight_bytes / tp / bandwidth
        self._expert_miss = 1.0 - model.experts_per_token / model.experts if model.experts else 0.0
        self._kv_s_per_token = self.kv_bytes_per_token_per_gpu / bandwidth
        allreduces = 2.0 * model.layers if tensor_parallel > 1 else 0.0
        # Pipeline stages run one after another within a step; each hand-off costs one more latency.
        self._fixed_s = (
            cal.step_overhead_s
            + model.layers * cal.layer_overhead_s
            + allreduces * (cal.allreduce_latency_s + (NETWORK_LATENCY_S if tp_spans_nodes else 0.0))
            + (pipeline_parallel - 1) * cal.allreduce_latency_s
            + stage_crossings * NETWORK_LATENCY_S
        )
        # A ring all-reduce moves 2·(tp−1)/tp of the BF16 activations through each GPU's link; a
        # hand-off between nodes sends a token's BF16 activations over the network.
        self._allreduce_s_per_token = (
            allreduces * 2.0 * (tp - 1.0) / tp * model.hidden_size * 2.0 / link
            + stage_crossings * model.hidden_size * 2.0 / NETWORK_BANDWIDTH
        )
        self._seq_s = cal.sequence_overhead_s

    # -- step times (hot: called per engine step) --

    def _weights_for(self, tokens: float) -> float:
        """Seconds to stream the weights a step of `tokens` tokens reads (dense: all of them)."""
        if not self._expert_weights_s:
            return self._weights_s
        untouched: float = self._expert_miss**tokens
        return self._weights_s + self._expert_weights_s * (1.0 - untouched)

    def prefill_time(self, batch_tokens: int, context_tokens: int = 0) -> float:
        """One prefill (chunk) step: `batch_tokens` new tokens of one sequence after `context_tokens`.

        Compute-bound beyond a few hundred tokens; attention also covers the cached context, which is
        what makes the later chunks of a long prompt slower than the first.
        """
        n = float(batch_tokens)
        pairs = n * (context_tokens + (n + 1.0) * 0.5)
        compute = n * self._gemm_s_per_token + pairs * self._attention_s_per_pair
        memory = self._weights_for(n) + (context_tokens + n) * self._kv_s_per_token
        return self._fixed_s + self._seq_s + n * self._allreduce_s_per_token + max(compute, memory)

    def decode_step_time(self, batch_size: int, total_context: int) -> float:
        """One decode step: a new token for each of `batch_size` sequences holding `total_context`.

        Memory-bound: the weights are streamed once for the whole batch but the KV cache once per
        sequence, so batching amortises the first and not the second.
        """
        if batch_size <= 0:
            return 0.0
        b = float(batch_size)
        compute = b * self._gemm_s_per_token + total_context * self._attention_s_per_pair
        memory = self._weights_for(b) + total_context * self._kv_s_per_token
        return self._fixed_s + b * (self._seq_s + self._allreduce_s_per_token) + max(compute, memory)

    def mixed_step_time(
        self, *, prefill_tokens: int, prefill_context: int, decode_batch: int, decode_context: int
    ) -> float:
        """One step that runs a prefill chunk and advances a decode batch together (chunked prefill).

        The weights are read once for both, so a prompt riding on a decode step costs little more
        than its own compute.
        """
        n = float(prefill_tokens)
        b = float(decode_batch)
        pairs = n * (prefill_context + (n + 1.0) * 0.5) + decode_context
        compute = (n + b) * self._gemm_s_per_token + pairs * self._attention_s_per_pair
        memory = self._weights_for(n + b) + (prefill_context + n + decode_context) * self._kv_s_per_token
        sequences = b + (1.0 if prefill_tokens > 0 else 0.0)
        return (
            self._fixed_s
            + sequences * self._seq_s
            + (n + b) * self._allreduce_s_per_token
            + max(compute, memory)
        )

    # -- capacity and transfer --

    def kv_capacity_tokens(self) -> int:
        """KV tokens that fit once the weights are loaded, at `calibration.memory_utilization`."""
        cal = self.calibration
        free = (
            self.gpu.memory_bytes * cal.memory_utilization
            - self.model.weight_bytes / (self.tensor_parallel * self.pipeline_parallel)
            - cal.activation_reserve_bytes
        )
        per_token = self.kv_bytes_per_token_per_gpu / self.pipeline_parallel
        return max(0, int(free // per_token))

    def kv_transfer_time(self, tokens: int, bandwidth_bytes_per_s: float) -> float:
        """Prefill → decode KV transfer: every TP rank ships its own KV shard over its own link.

        `bandwidth_bytes_per_s` is one rank's link (50e9 for a 400 Gb/s NIC per GPU, say), so the
        bytes that matter are one rank's shard.
        """
        shard_bytes = tokens * self.kv_bytes_per_token_per_gpu
        return self.calibration.kv_transfer_latency_s + shard_bytes / bandwidth_bytes_per_s

    # -- request-level conveniences --

    def ttft(self, isl: int) -> float:
        """Time to first token of a request alone on the worker: its prefill plus request overhead."""
        return self.calibration.ttft_overhead_s + self.prefill_time(isl)

    def itl(self, batch_size: int, context_length: int) -> float:
        """Inter-token latency with `batch_size` sequences of `context_length` tokens each.

        Beyond `calibration.max_num_seqs` the engine runs only that many at once and the rest wait,
        so the step the running requests see stops growing.
        """
        cap = self.calibration.max_num_seqs
        running = min(batch_size, cap)
        return self.decode_step_time(running, running * context_length)

    def aggregated_steady_state(self, isl: int, osl: int, concurrency: int) -> SteadyState:
        """TTFT and TPOT of an aggregated worker kept at `concurrency` requests (a closed-loop sweep).

        Every client's prompt is prefilled once per cycle, mixed into the decode steps (chunked
        prefill), so per cycle a request shares the GPU with the other clients' `running − 1`
        prefills. Where they land depends on how synchronised the clients are
        (`calibration.prefill_sync` = s): spread out, they all fall between a request's output
        tokens and lengthen its TPOT; in lock-step waves, on average (running − 1)/2 of them are
        prefilled before its first token and the rest before its second. So, with p the marginal
        cost of one prompt in a step:

            TTFT = overhead + prefill + one step + (first_token_prefills + s·(running−1)/2)·p
            TPOT = decode step + (1 − s/2)·(running−1)·p/osl

        When the KV cache (holding `isl + kv_output_share·osl` tokens per request) or `max_num_seqs`
        cannot run every client, the rest queue for a slot (Little's law). Not a hot path: the
        calibration tests use it.
        """
        if isl < 1 or osl < 1 or concurrency < 1:
            raise ValueError("isl, osl and concurrency must be ≥ 1")
        cal = self.calibration
        held = isl + cal.kv_output_share * osl
        fit = int(self.kv_capacity_tokens() // held)
        running = max(1, min(concurrency, fit, cal.max_num_seqs))
        context = int(running * (isl + osl / 2.0))
        decode = self.decode_step_time(running, context)
        # A prompt riding on a decode step costs its compute beyond the step's shared overheads.
        marginal = (
            self.mixed_step_time(
                prefill_tokens=isl, prefill_context=0, decode_batch=running, decode_context=context
            )
            - decode
        )
        others = running - 1
        tpot = decode + (1.0 - cal.prefill_sync / 2.0) * others * marginal / osl
        ttft = (
            cal.ttft_overhead_s
            + self.prefill_time(isl)
            + decode
            + (cal.first_token_prefills + cal.prefill_sync * others / 2.0) * marginal
        )
        cycle = ttft + (osl - 1) * tpot
        rate = running / cycle
        if concurrency > running:
            # Little's law over all clients: the ones without a slot wait for one.
            ttft += concurrency / rate - cycle
        return SteadyState(ttft=ttft, tpot=tpot, request_rate=rate, running=running)
