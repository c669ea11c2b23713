"""A Llama-architecture model with random weights and a word-level tokenizer over the profiler's prompt
words: real transformer compute on whatever device serves it, and no weights to download (the GPU
machine reaches no model hub). Timing does not depend on what the weights are.

    python make_model.py OUT_DIR tiny|1b|3b|8b      (fleetpilot importable: its prompt words are the vocabulary)
"""
import json
import sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from fleetpilot.replay import prompts

out = Path(sys.argv[1])
size = sys.argv[2] if len(sys.argv) > 2 else "tiny"
words = list(prompts.VOCABULARY)
vocab = {"[UNK]": 0, "<s>": 1, "</s>": 2}
for w in words:
    vocab.setdefault(w, len(vocab))
FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads")
SHAPES = {  # Llama 3.2 1B and 3B, Llama 3.1 8B; "tiny" for a smoke test on a CPU
    "tiny": (128, 256, 2, 4, 2),
    "1b": (2048, 8192, 16, 32, 8),
    "3b": (3072, 8192, 28, 24, 8),
    "8b": (4096, 14336, 32, 32, 8),
}
shapes = dict(zip(FIELDS, SHAPES[size], strict=True))
if size != "tiny":  # Llama 3's vocabulary size, so the LM head costs what it costs in the real model
    for i in range(len(vocab), 128256):
        vocab[f"t{i}"] = i
config = LlamaConfig(vocab_size=len(vocab), max_position_embeddings=32768, bos_token_id=1, eos_token_id=2,
                     torch_dtype="bfloat16", rope_theta=500000.0, **shapes)
torch.manual_seed(0)
torch.set_default_dtype(torch.bfloat16)
with torch.device("cuda" if torch.cuda.is_available() else "cpu"):  # random init of 8B on a CPU takes minutes
    model = LlamaForCausalLM(config)
model.generation_config.eos_token_id = None  # random weights: never stop early; outputs run to max_tokens
model.save_pretrained(out)
(out / "tokenizer.json").write_text(json.dumps({
    "version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
    "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None,
    "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": False},
    "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}}))
(out / "tokenizer_config.json").write_text(json.dumps({
    "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]", "bos_token": "<s>", "eos_token": "</s>",
    "model_max_length": 32768}))
print("params", sum(p.numel() for p in model.parameters()), "vocab", len(vocab))
