#!/usr/bin/env bash
# Builds kube-scheduler once into ~/.cache/ferrox/bin, from the same
# k8s.io/kubernetes version as kube-apiserver: the simulated GPU cluster
# (tests/e2e/gpu-cluster.sh) needs real scheduling onto nvidia.com/gpu.
# Reuses the module tests/operator/setup-apiserver.sh prepared (staging
# modules already replaced), copied into a directory of its own.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
K8S_VERSION="${K8S_VERSION:-v1.34.4}"
CACHE="${FERROX_CACHE:-$HOME/.cache/ferrox}"
BIN="$CACHE/bin"
[[ -x "$BIN/kube-scheduler" ]] && { echo "$BIN/kube-scheduler"; exit 0; }
[[ -f "$CACHE/apiserver-mod/go.mod" ]] || bash "$ROOT/tests/operator/setup-apiserver.sh" apiserver >&2
export GOFLAGS="${GOFLAGS:--mod=mod}" CGO_ENABLED=0
dir="$CACHE/scheduler-mod"
mkdir -p "$dir"
cp "$CACHE/apiserver-mod/go.mod" "$CACHE/apiserver-mod/go.sum" "$dir/"
cd "$dir"
go mod edit -module ferrox.dev/scheduler-build
go get "k8s.io/kubernetes/cmd/kube-scheduler@$K8S_VERSION" >&2
go build -trimpath -ldflags='-s -w' -o "$BIN/.kube-scheduler.tmp" k8s.io/kubernetes/cmd/kube-scheduler >&2
mv "$BIN/.kube-scheduler.tmp" "$BIN/kube-scheduler"
echo "$BIN/kube-scheduler"
