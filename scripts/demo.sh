#!/usr/bin/env bash
# The demo: a local control plane with 4 simulated 8-GPU nodes, the CRDs, the operator, and a
# disaggregated simulator DynamoGraph; prints `kubectl get dg`. `scripts/demo.sh down` stops it all.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE="${FLEETPILOT_CACHE:-$HOME/.cache/fleetpilot}"
export PATH="$CACHE/venv/bin:$PATH"
state="$CACHE/clusters/dev"
kubectl="$CACHE/k8s/${FLEETPILOT_K8S_VERSION:-v1.30.14}/bin/kubectl"
export KUBECONFIG="$state/admin.kubeconfig"

stop_operator() {
  if [[ -f "$state/operator.pid" ]]; then
    pid=$(cat "$state/operator.pid")
    if kill -0 "$pid" 2>/dev/null; then kill "$pid"; echo "stopped operator (pid $pid)"; fi
    rm -f "$state/operator.pid"
  fi
}

if [[ "${1:-up}" == "down" ]]; then
  stop_operator
  fleetpilot cluster down --name dev
  exit 0
fi

fleetpilot cluster up --name dev
"$kubectl" apply --server-side --force-conflicts -f "$repo/crds" >/dev/null
"$kubectl" wait --for condition=Established crd --all --timeout=60s >/dev/null
stop_operator
nohup fleetpilot operator run > "$state/logs/operator.log" 2>&1 &
echo $! > "$state/operator.pid"
echo "operator running (pid $!, log $state/logs/operator.log)"

"$kubectl" apply -n default -f "$repo/manifests/samples/simulator.yaml"
"$kubectl" wait -n default --for=condition=Ready dg/llama-8b-sim --timeout=120s >/dev/null
"$kubectl" get -n default dg
echo
"$kubectl" get -n default dgc,deployments,pods -o wide
cat <<MSG

Try:  export KUBECONFIG=$KUBECONFIG
      $kubectl scale -n default dgc/llama-8b-sim-decode --replicas=4
      $kubectl get -n default dg -w
Stop: scripts/demo.sh down
MSG
