#!/usr/bin/env bash
# Builds a kube-apiserver and an etcd for the real-control-plane test, once,
# into ~/.cache/ferrox/bin. k8s.io/kubernetes is not meant to be required as a
# module: its staging modules (k8s.io/api, ...) are pinned as v0.0.0 and must
# be replaced by the matching v0.x releases, which this script does.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.34.4}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
CACHE="${FERROX_CACHE:-$HOME/.cache/ferrox}"
BIN="$CACHE/bin"
mkdir -p "$BIN"
export GOFLAGS="${GOFLAGS:--mod=mod}"
export CGO_ENABLED=0

build_apiserver() {
  [[ -x "$BIN/kube-apiserver" ]] && return
  local dir="$CACHE/apiserver-mod"
  mkdir -p "$dir" && cd "$dir"
  [[ -f go.mod ]] || go mod init ferrox.dev/apiserver-build >/dev/null
  go mod edit -require="k8s.io/kubernetes@$K8S_VERSION"
  go mod download "k8s.io/kubernetes@$K8S_VERSION"
  local modfile
  modfile="$(go env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/$K8S_VERSION.mod"
  local minor="v0.${K8S_VERSION#v1.}"
  # Every staging module k8s.io/kubernetes pins at v0.0.0 -> its v0.x release.
  grep -E '^\s*k8s\.io/[a-z0-9-]+ v0\.0\.0$' "$modfile" | awk '{print $1}' | sort -u |
    while read -r m; do go mod edit -replace="$m=$m@$minor"; done
  go get "k8s.io/kubernetes/cmd/kube-apiserver@$K8S_VERSION"
  go build -trimpath -ldflags='-s -w' -o "$BIN/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
}

build_etcd() {
  [[ -x "$BIN/etcd" ]] && return
  # etcd's server module replaces its sibling modules with local paths, so it
  # cannot be `go install`ed: require it from a module of our own instead.
  local dir="$CACHE/etcd-mod"
  mkdir -p "$dir" && cd "$dir"
  [[ -f go.mod ]] || go mod init ferrox.dev/etcd-build >/dev/null
  go mod edit -require="go.etcd.io/etcd/server/v3@$ETCD_VERSION"
  for m in api/v3 client/pkg/v3 client/v3 pkg/v3; do
    go mod edit -replace="go.etcd.io/etcd/$m=go.etcd.io/etcd/$m@$ETCD_VERSION"
  done
  if go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" &&
    go build -trimpath -ldflags='-s -w' -o "$BIN/etcd" go.etcd.io/etcd/server/v3; then
    return
  fi
  # Fallback: Debian's etcd-server (older, but serves the v3 API).
  apt-get install -y -q etcd-server >/dev/null && ln -sf "$(command -v etcd)" "$BIN/etcd"
}

case "${1:-all}" in
  apiserver) build_apiserver ;;
  etcd) build_etcd ;;
  all) build_etcd; build_apiserver ;;
esac
ls -la "$BIN"
