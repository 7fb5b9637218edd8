#!/usr/bin/env bash
# Builds kube-controller-manager once into ~/.cache/ferrox/bin. The e2e needs
# its garbage collector: deleting a ModelDeployment must delete the children
# that carry its owner reference, and only the GC does that.
# Reuses the module tests/operator/setup-apiserver.sh prepared (same
# k8s.io/kubernetes version, staging modules already replaced), copied into a
# directory of its own so that the apiserver's build stays untouched.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
K8S_VERSION="${K8S_VERSION:-v1.34.4}"
CACHE="${FERROX_CACHE:-$HOME/.cache/ferrox}"
BIN="$CACHE/bin"
[[ -x "$BIN/kube-controller-manager" ]] && { echo "$BIN/kube-controller-manager"; exit 0; }
[[ -f "$CACHE/apiserver-mod/go.mod" ]] || bash "$ROOT/tests/operator/setup-apiserver.sh" apiserver >&2
export GOFLAGS="${GOFLAGS:--mod=mod}" CGO_ENABLED=0
dir="$CACHE/controller-manager-mod"
mkdir -p "$dir"
cp "$CACHE/apiserver-mod/go.mod" "$CACHE/apiserver-mod/go.sum" "$dir/"
cd "$dir"
go mod edit -module ferrox.dev/controller-manager-build
go get "k8s.io/kubernetes/cmd/kube-controller-manager@$K8S_VERSION" >&2
go build -trimpath -ldflags='-s -w' -o "$BIN/.kube-controller-manager.tmp" k8s.io/kubernetes/cmd/kube-controller-manager >&2
mv "$BIN/.kube-controller-manager.tmp" "$BIN/kube-controller-manager"
echo "$BIN/kube-controller-manager"
