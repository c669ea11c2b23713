#!/usr/bin/env bash
# Build the Kubernetes control-plane binaries the integration tests run, once, into a cache.
#
# kube-apiserver, kube-controller-manager, kube-scheduler and kubectl are built with Go from the
# Go module proxy at a pinned release: a throw-away build module requires k8s.io/kubernetes and
# redirects each of its staging modules (which its own go.mod points at ./staging) to the matching
# published v0.X module.  kwok (simulated nodes) installs with a plain `go install`.
# Helm (the chart's lint and template tests) installs the same way as kwok.
# Everything lands under ~/.cache/fleetpilot/, so a second run is a no-op.
set -euo pipefail

K8S_VERSION="${FLEETPILOT_K8S_VERSION:-v1.30.14}"
KWOK_VERSION="${FLEETPILOT_KWOK_VERSION:-v0.8.0}"
HELM_VERSION="${FLEETPILOT_HELM_VERSION:-v3.21.4}"
CACHE="${FLEETPILOT_CACHE:-$HOME/.cache/fleetpilot}"
BIN="$CACHE/k8s/$K8S_VERSION/bin"
BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubectl)

# The module mirror this machine reaches serves modules but not every checksum-database lookup;
# go.sum is still written from what the proxy served.
export GOFLAGS=-mod=mod CGO_ENABLED=0 GOTOOLCHAIN=local GOSUMDB=off
command -v go >/dev/null || { echo "install-k8s: Go is required (https://go.dev/doc/install)" >&2; exit 1; }

have_all=1
for b in "${BINARIES[@]}"; do [[ -x "$BIN/$b" ]] || have_all=0; done
if (( have_all )); then
  echo "install-k8s: Kubernetes $K8S_VERSION binaries cached in $BIN"
else
  staging_version="v0.${K8S_VERSION#v1.}"
  work="$CACHE/k8s/$K8S_VERSION/build"
  mkdir -p "$work" "$BIN"
  gomod_file=$(cd "$work" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)",/\1/p')
  {
    echo "module fleetpilot.dev/k8s-control-plane-bins"
    echo
    echo "go 1.20"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    echo "replace ("
    # Every `k8s.io/X => ./staging/src/k8s.io/X` line of kubernetes' own go.mod becomes a published module.
    sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\t\1 => \1 '"$staging_version"'#p' "$gomod_file"
    echo ")"
  } > "$work/go.mod"
  echo "install-k8s: building Kubernetes $K8S_VERSION (about 7-10 minutes on 2 cores from an empty Go cache)"
  (cd "$work" && go build -trimpath -tags providerless -ldflags "-s -w \
      -X k8s.io/component-base/version.gitVersion=$K8S_VERSION \
      -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION" \
      -o "$BIN/" $(printf 'k8s.io/kubernetes/cmd/%s ' "${BINARIES[@]}"))
fi

if [[ -x "$CACHE/bin/kwok" ]]; then
  echo "install-k8s: kwok cached in $CACHE/bin"
else
  echo "install-k8s: installing kwok $KWOK_VERSION"
  GOBIN="$CACHE/bin" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
fi

# Helm learns its own version, and the Kubernetes version `helm template` and `helm lint` assume
# (v1.20 otherwise, older than the chart's kubeVersion), only from ldflags: set them as Helm's own
# Makefile does (Kubernetes 1.<minor of its client-go>). A binary that reports another version is rebuilt.
HELM_K8S_MINOR="${FLEETPILOT_HELM_K8S_MINOR:-36}"
if [[ -x "$CACHE/bin/helm" ]] && "$CACHE/bin/helm" version --template '{{.Version}}' 2>/dev/null | grep -qx "$HELM_VERSION"; then
  echo "install-k8s: helm $HELM_VERSION cached in $CACHE/bin"
else
  echo "install-k8s: installing helm $HELM_VERSION (a few minutes on 2 cores)"
  helm_ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
    helm_ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$HELM_K8S_MINOR"
  done
  GOBIN="$CACHE/bin" go install -trimpath -ldflags "$helm_ldflags" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
fi

# kwok's own stage definitions (shipped in its module) drive node heartbeats and pod lifecycles.
stages="$CACHE/kwok/$KWOK_VERSION/stages"
if [[ ! -f "$stages/pod-ready.yaml" ]]; then
  kwok_dir=$(cd "$CACHE" && go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | sed -n 's/.*"Dir": "\(.*\)",/\1/p')
  mkdir -p "$stages"
  for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
           pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
    cp "$kwok_dir/kustomize/stage/$f" "$stages/"
  done
  chmod 644 "$stages"/*.yaml
fi
echo "install-k8s: kwok stages in $stages"
