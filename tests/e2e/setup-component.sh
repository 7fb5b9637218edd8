#!/usr/bin/env bash
# Builds one Kubernetes component (kube-controller-manager, kube-scheduler,
# kubelet, kube-proxy) once into ~/.cache/ferrox/bin and prints its path.
# Reuses the module tests/operator/setup-apiserver.sh prepared (same
# k8s.io/kubernetes version, staging modules already replaced), copied into a
# directory of the component's own so the apiserver's build stays untouched.
#
#   tests/e2e/setup-component.sh kubelet
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
name=${1:?usage: setup-component.sh <kube-controller-manager|kube-scheduler|kubelet|kube-proxy>}
K8S_VERSION="${K8S_VERSION:-v1.34.4}"
CACHE="${FERROX_CACHE:-$HOME/.cache/ferrox}"
BIN="$CACHE/bin"
[[ -x "$BIN/$name" ]] && { echo "$BIN/$name"; exit 0; }
[[ -f "$CACHE/apiserver-mod/go.mod" ]] || bash "$ROOT/tests/operator/setup-apiserver.sh" apiserver >&2
# CGO off: the kubelet and kube-proxy build and run without it (the kubelet
# then reads cgroups and mounts through Go code only, which is all a node here needs).
export GOFLAGS="${GOFLAGS:--mod=mod}" CGO_ENABLED=0
dir="$CACHE/${name#kube-}-mod"
mkdir -p "$dir"
cp "$CACHE/apiserver-mod/go.mod" "$CACHE/apiserver-mod/go.sum" "$dir/"
cd "$dir"
go mod edit -module "ferrox.dev/${name#kube-}-build"
go get "k8s.io/kubernetes/cmd/$name@$K8S_VERSION" >&2
go build -trimpath -ldflags='-s -w' -o "$BIN/.$name.tmp" "k8s.io/kubernetes/cmd/$name" >&2
mv "$BIN/.$name.tmp" "$BIN/$name"
echo "$BIN/$name"
