#!/usr/bin/env bash
# `fleetpilot profile` against a real engine on a GPU: Hugging Face's `transformers serve` (continuous
# batching, paged attention) serving a Llama-shaped model of random weights (make_model.py). vLLM cannot
# be installed on the lent GPU machine (no registry there; its wheels are far over what can be carried).
#
#   benchmarks/gpu_profile/run.sh SIZE DEVICE OUTDIR PYTHON [fleetpilot profile flags...]
# e.g. run.sh 8b cuda:0 /tmp/p8b python3 --isl 256,1024,4096,8192 --batch 1,4 --repeats 3 \
#        --context 1024,4096 --concurrency 1,8,32 --osl 64
# Needs torch and transformers[serving] 5.x; fleetpilot is put on PYTHONPATH from this checkout.
set -uo pipefail
SIZE=${1:-1b}; DEV=${2:-cuda:0}; OUT=${3:-/tmp/gpuprof}; PY=${4:-python3}
mkdir -p "$OUT" /tmp/hfcache; export HF_HUB_CACHE=/tmp/hfcache HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cd /tmp  # the checkout's operator/ would shadow Python's own operator module for `python -c`
# The package as installed (operator/ and planner/ are fleetpilot.operator and .planner), without installing it.
tree=$(mktemp -d); mkdir "$tree/fleetpilot"
for f in "$repo"/fleetpilot/*; do ln -s "$f" "$tree/fleetpilot/"; done
ln -s "$repo/operator" "$tree/fleetpilot/operator"; ln -s "$repo/planner" "$tree/fleetpilot/planner"
export PYTHONPATH=$tree:${PYTHONPATH:-}
(nvidia-smi -L || echo "no GPU") > "$OUT/hardware.txt" 2>&1
$PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" >> "$OUT/hardware.txt" 2>&1
MODEL=/tmp/model-$SIZE
[[ -d $MODEL ]] || $PY "$here/make_model.py" "$MODEL" "$SIZE" > "$OUT/make_model.log" 2>&1
BLOCKS=${BLOCKS:-1024}; BLOCK=${BLOCK:-256}
$PY -c "from transformers.cli.transformers import main; main()" serve "$MODEL" --continuous-batching --device "$DEV" \
  --dtype bfloat16 --host 127.0.0.1 --port 8300 --cb-num-blocks "$BLOCKS" --cb-block-size "$BLOCK" \
  > "$OUT/serve-$SIZE.log" 2>&1 &
server=$!
for _ in $(seq 1 240); do curl -sf 127.0.0.1:8300/health >/dev/null && break; sleep 0.5; done
shift 4
$PY "$here/run_profiler.py" --endpoint http://127.0.0.1:8300 --model "$MODEL" --engine "transformers-serve (continuous batching)" \
  --gpu "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || echo cpu)" \
  --kv-capacity-tokens $((BLOCKS * BLOCK)) --out "$OUT/profile-$SIZE.json" "$@" 2>&1 | tee "$OUT/profile-$SIZE.log"
kill $server; wait $server 2>/dev/null
