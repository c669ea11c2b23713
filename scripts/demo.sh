#!/usr/bin/env bash
# The demo: fleetpilot doing its main job on a shared trace (e2e/demo.py says what runs).
#   scripts/demo.sh [up]   bring it all up, replay 15 minutes of the Azure code trace ×4 faster (the first
#                          5 are the planner's history), print a table and write a timeline PNG; it stays
#                          up to explore
#   scripts/demo.sh down   stop every process it started, by PID
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE="${FLEETPILOT_CACHE:-$HOME/.cache/fleetpilot}"
python="${FLEETPILOT_PYTHON:-$CACHE/venv/bin/python}"
export OPENBLAS_NUM_THREADS=1
# e2e/demo.py imports e2e's modules, never the repository root's operator/ folder.
exec "$python" "$repo/e2e/demo.py" "${1:-up}"
