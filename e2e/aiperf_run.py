"""NVIDIA's aiperf as e2e runs it: offline, with a tokenizer that counts tokens as the simulator does.

aiperf needs a Hugging Face tokenizer to make prompts of a given length and to count the output; it
cannot download one here. `write_word_tokenizer` writes a word-level tokenizer (split on
whitespace, one token per word: the simulator's own count at `--tokens-per-word 1`) whose
vocabulary is the simulator's output words, so aiperf's input and output lengths match the
engine's token for token. aiperf lives in its own virtualenv (scripts/install.sh), started here as
a child process in its own session and stopped by its PID.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from fleetpilot.sim.server import FILLER_WORDS

CACHE = Path(os.environ.get("FLEETPILOT_CACHE", Path.home() / ".cache" / "fleetpilot"))
AIPERF = CACHE / "aiperf-venv" / "bin" / "aiperf"
UNKNOWN = "[UNK]"  # aiperf's prompt corpus is Shakespeare: to this vocabulary nearly every word is unknown


def write_word_tokenizer(folder: Path) -> Path:
    """A `PreTrainedTokenizerFast` directory: WordLevel model, whitespace split, no special tokens."""
    folder.mkdir(parents=True, exist_ok=True)
    vocabulary = {word: index for index, word in enumerate([UNKNOWN, *FILLER_WORDS])}
    (folder / "tokenizer.json").write_text(json.dumps({
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None, "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocabulary, "unk_token": UNKNOWN},
    }))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": UNKNOWN, "model_max_length": 131_072}))
    return folder


def profile(url: str, *, model: str, out: Path, requests: int, concurrency: int, isl: int, osl: int,
            timeout_s: float = 600) -> dict[str, Any]:
    """Run `aiperf profile` (streaming chat, fixed ISL/OSL) against `url`; returns its JSON summary
    with the per-request records under "records"."""
    if not AIPERF.exists():
        raise AssertionError(f"aiperf is not installed at {AIPERF}: run scripts/install.sh")
    tokenizer = write_word_tokenizer(out / "tokenizer")
    artifacts = out / "artifacts"
    argv = [str(AIPERF), "profile", "--model", model, "--url", url, "--endpoint-type", "chat", "--streaming",
            "--tokenizer", str(tokenizer), "--concurrency", str(concurrency), "--request-count", str(requests),
            "--prompt-input-tokens-mean", str(isl), "--prompt-input-tokens-stddev", "0",
            "--prompt-output-tokens-mean", str(osl), "--prompt-output-tokens-stddev", "0",
            "--extra-inputs", "ignore_eos:true", "--random-seed", "7", "--workers-max", str(concurrency),
            "--output-artifact-dir", str(artifacts), "--ui", "none"]
    log = out / "aiperf.log"
    with log.open("wb") as sink:
        # Not HF_HUB_OFFLINE: aiperf 0.13's offline branch takes a local directory for a hub id and fails;
        # a directory path is loaded without any network call as it is.
        process = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            raise AssertionError(f"aiperf ran past {timeout_s:.0f} s; its log: {log}") from None
    if code != 0:
        raise AssertionError(f"aiperf exited {code}; the end of its log:\n{log.read_text()[-3000:]}")
    summary: dict[str, Any] = json.loads((artifacts / "profile_export_aiperf.json").read_text())
    lines = (artifacts / "profile_export.jsonl").read_text().splitlines()
    summary["records"] = [json.loads(line) for line in lines if line.strip()]
    return summary
