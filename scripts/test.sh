#!/usr/bin/env bash
# The whole test suite, as CI runs it: install (cached), static checks, unit and integration tests.
# Integration tests start their own control planes (clusters "test" and "test-gw1", one per pytest-xdist
# worker) and stop them by their saved PIDs.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
bash scripts/install.sh
CACHE="${FLEETPILOT_CACHE:-$HOME/.cache/fleetpilot}"
export PATH="$CACHE/venv/bin:$PATH"
export OPENBLAS_NUM_THREADS=1  # small model fits; a BLAS thread pool only fights the servers for 2 cores

echo "== static checks"
bash scripts/check.sh

echo "== unit tests (both cores: pure, no shared state)"
set +e
pytest tests/unit -p no:cacheprovider -n 2 --durations=15 "$@"
unit_status=$?
echo "== integration tests (two processes, each with its own control plane; a file's tests stay together)"
pytest tests/integration -p no:cacheprovider -n 2 --dist loadfile --durations=15 "$@"
status=$?
echo "== backtest benchmark, quick (every policy on two traces; the full run is benchmarks/backtest.py)"
quick_out=$(mktemp -d)
python benchmarks/backtest.py --quick --out "$quick_out"
bench_status=$?
rm -rf "$quick_out"
echo "== scale benchmark, quick (10 graphs through every phase; the full run is benchmarks/scale_bench.py)"
python benchmarks/scale_bench.py --quick --out "$(mktemp -d)/scale-quick.json"
scale_status=$?
echo "== e2e: the closed loop (cluster e2e, Prometheus, operator, planner, simulated fleet)"
pytest e2e -p no:cacheprovider --durations=15
e2e_status=$?
set -e
for code in $unit_status $status $e2e_status; do
  if [[ $code -eq 5 ]]; then
    echo "test.sh: pytest collected no tests; that is a failure" >&2
    exit 1
  fi
done
(( unit_status == 0 )) || exit $unit_status
(( status == 0 )) || exit $status
(( bench_status == 0 )) || exit $bench_status
(( scale_status == 0 )) || exit $scale_status
exit $e2e_status
