"""A deterministic timing model for the simulator's tests, shared by the engine and server tests."""

from __future__ import annotations

PREFILL_S_PER_TOKEN = 1e-5  # 1 ms per 100 tokens
DECODE_STEP_S = 0.010
TRANSFER_S_PER_TOKEN = 1e-6


class FakeTiming:
    """Calibration-free timing: the engine's behaviour is pinned by these numbers alone."""

    def __init__(self, capacity: int = 1_000_000) -> None:
        self.capacity = capacity

    def prefill_time(self, batch_tokens: int, context_tokens: int = 0) -> float:
        return batch_tokens * PREFILL_S_PER_TOKEN

    def decode_step_time(self, batch_size: int, total_context: int) -> float:
        return DECODE_STEP_S

    def kv_capacity_tokens(self) -> int:
        return self.capacity

    def kv_transfer_time(self, tokens: int, bandwidth_bytes_per_s: float) -> float:
        return tokens * TRANSFER_S_PER_TOKEN
