#!/usr/bin/env bash
# Install everything fleetpilot needs on this machine, once; later runs only check the caches.
#
#   Debian packages   etcd-server (the control plane's store)
#   Python            a virtualenv in ~/.cache/fleetpilot/venv with fleetpilot installed editable
#   Kubernetes        kube-apiserver, -controller-manager, -scheduler, kubectl and kwok, built by
#                     scripts/install-k8s.sh into ~/.cache/fleetpilot/
#   Prometheus        upstream prometheus and promtool with Kubernetes discovery, built by
#                     scripts/install-prometheus.sh (Debian's has no kubernetes_sd)
#   Go test programs  tests/*/*/ (Argo CD's and kstatus' health checks, Grafana's dashboard model,
#                     cyclonus' NetworkPolicy engine),
#                     built into ~/.cache/fleetpilot/gotools/ when their sources change
#   aiperf            NVIDIA's benchmark client, in its own virtualenv ~/.cache/fleetpilot/aiperf-venv
#                     (e2e drives the frontend with it as users do)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE="${FLEETPILOT_CACHE:-$HOME/.cache/fleetpilot}"
VENV="$CACHE/venv"
mkdir -p "$CACHE"

# -- Debian packages ---------------------------------------------------------------------------------
missing=()
for pkg in etcd-server; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if (( ${#missing[@]} )); then
  echo "install: apt-get install ${missing[*]}"
  sudo_cmd=""; [[ $(id -u) -eq 0 ]] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # The packages start system services where an init system runs; the tests start their own.
  $sudo_cmd service etcd stop >/dev/null 2>&1 || true
fi

# -- Python ------------------------------------------------------------------------------------------
stamp="$(sha256sum "$repo/pyproject.toml" | cut -c1-16) $repo"
if [[ ! -x "$VENV/bin/python" ]]; then
  echo "install: creating $VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
fi
if [[ "$(cat "$VENV/.fleetpilot-stamp" 2>/dev/null)" != "$stamp" ]]; then
  echo "install: pip install -e .[dev] (first time: about 2-3 minutes)"
  "$VENV/bin/pip" install -q -e "$repo[dev]"
  echo "$stamp" > "$VENV/.fleetpilot-stamp"
fi

# -- aiperf ------------------------------------------------------------------------------------------
# Its own virtualenv: aiperf pins transformers, pandas and friends that the planner's stack must not follow.
AIPERF_VERSION="0.13.0"
AIPERF_VENV="$CACHE/aiperf-venv"
if [[ "$(cat "$AIPERF_VENV/.fleetpilot-stamp" 2>/dev/null)" != "$AIPERF_VERSION" ]]; then
  echo "install: aiperf $AIPERF_VERSION into $AIPERF_VENV (first time: about 5 minutes)"
  rm -rf "$AIPERF_VENV"
  python3 -m venv "$AIPERF_VENV"
  "$AIPERF_VENV/bin/pip" install -q "aiperf==$AIPERF_VERSION"
  echo "$AIPERF_VERSION" > "$AIPERF_VENV/.fleetpilot-stamp"
fi

# -- Kubernetes binaries -----------------------------------------------------------------------------
bash "$repo/scripts/install-k8s.sh"

# -- Prometheus --------------------------------------------------------------------------------------
bash "$repo/scripts/install-prometheus.sh"

# -- Go test programs --------------------------------------------------------------------------------
# Each is rebuilt when its sources change: the stamp holds their digest (tests/unit/gotools.py checks it).
for go_mod in "$repo"/tests/*/*/go.mod; do
  src=$(dirname "$go_mod")
  name=$(basename "$src")
  digest=$(cd "$src" && cat go.mod go.sum $(LC_ALL=C ls *.go) | sha256sum | cut -c1-16)
  if [[ "$(cat "$CACHE/gotools/$name.stamp" 2>/dev/null)" != "$digest" ]]; then
    echo "install: building $name (${src#"$repo"/}; the health check's first build takes several minutes)"
    started=$SECONDS
    mkdir -p "$CACHE/gotools"
    (cd "$src" && GOFLAGS=-mod=readonly CGO_ENABLED=0 GOTOOLCHAIN=local GOSUMDB=off \
       nice -n 10 go build -trimpath -ldflags "-s -w" -o "$CACHE/gotools/$name" .)
    echo "$digest" > "$CACHE/gotools/$name.stamp"
    echo "install: built $name in $((SECONDS - started)) s"
  fi
done
echo "install: done; activate with: source $VENV/bin/activate"
