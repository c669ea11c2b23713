#!/usr/bin/env bash
# Build upstream Prometheus and promtool from the Go module proxy, once, into a cache.
#
# Debian's prometheus (2.42) is built without Kubernetes service discovery; users run Prometheus
# with `kubernetes_sd_configs` (or the Prometheus Operator, which writes the same), so the dev
# cluster, e2e and the demo run upstream's own build. github.com/prometheus/prometheus has no
# `replace` lines, so `go install module@version` works. Build tags, as Prometheus' own Makefile
# uses them: `remove_all_sd` + `enable_kubernetes_sd` keeps only Kubernetes among the service
# discoveries (no cloud SDKs to compile), and leaving out `builtinassets` leaves the web UI's
# assets out (the HTTP API, which everything here uses, is complete without them).
set -euo pipefail

PROMETHEUS_VERSION="${FLEETPILOT_PROMETHEUS_VERSION:-v3.16.0}"
CACHE="${FLEETPILOT_CACHE:-$HOME/.cache/fleetpilot}"
BIN="$CACHE/prometheus/$PROMETHEUS_VERSION/bin"
# Prometheus 3.x is published as Go module versions v0.3XX.Y (v3.16.0 is v0.316.0).
minor="${PROMETHEUS_VERSION#v3.}"
module_version="v0.3$(printf '%02d' "${minor%%.*}").${minor#*.}"

export GOFLAGS=-mod=mod CGO_ENABLED=0 GOTOOLCHAIN=local GOSUMDB=off
command -v go >/dev/null || { echo "install-prometheus: Go is required (https://go.dev/doc/install)" >&2; exit 1; }

if [[ -x "$BIN/prometheus" && -x "$BIN/promtool" ]]; then
  echo "install-prometheus: Prometheus $PROMETHEUS_VERSION cached in $BIN"
  exit 0
fi
echo "install-prometheus: building Prometheus $PROMETHEUS_VERSION and promtool (about 5 minutes on 2 cores)"
mkdir -p "$BIN"
started=$SECONDS
ldflags="-s -w"
for pair in "Version=${PROMETHEUS_VERSION#v}" "Branch=HEAD" "Revision=$module_version" "BuildUser=fleetpilot"; do
  ldflags+=" -X github.com/prometheus/common/version.$pair"
done
GOBIN="$BIN" nice -n 10 go install -trimpath -tags remove_all_sd,enable_kubernetes_sd -ldflags "$ldflags" \
  "github.com/prometheus/prometheus/cmd/prometheus@$module_version" \
  "github.com/prometheus/prometheus/cmd/promtool@$module_version"
echo "install-prometheus: built in $((SECONDS - started)) s: $("$BIN/prometheus" --version | head -1)"
