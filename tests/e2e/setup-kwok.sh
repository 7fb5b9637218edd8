#!/usr/bin/env bash
# Builds kwok (sigs.k8s.io/kwok, from the Go module proxy) once into
# ~/.cache/ferrox/bin: it plays the kubelets of simulated GPU nodes. kwok
# needs Stages to act on; the module's own "fast" ones (nodes Ready with a
# heartbeat; pods Ready with an address; deletion) are kept beside it as
# ~/.cache/ferrox/kwok-stages.yaml. Prints the binary's path.
set -euo pipefail
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
CACHE="${FERROX_CACHE:-$HOME/.cache/ferrox}"
BIN="$CACHE/bin"
STAGES="$CACHE/kwok-stages.yaml"
mkdir -p "$BIN"
if [[ ! -x "$BIN/kwok" ]]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  GOBIN="$tmp" CGO_ENABLED=0 go install -trimpath -ldflags='-s -w' "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" >&2
  mv "$tmp/kwok" "$BIN/kwok"
fi
if [[ ! -s "$STAGES" ]]; then
  GOFLAGS=-mod=mod go mod download "sigs.k8s.io/kwok@$KWOK_VERSION" >&2
  src="$(go env GOMODCACHE)/sigs.k8s.io/kwok@$KWOK_VERSION/kustomize/stage"
  for f in "$src"/node/fast/node-initialize.yaml "$src"/node/heartbeat/node-heartbeat.yaml \
    "$src"/pod/fast/pod-ready.yaml "$src"/pod/fast/pod-complete.yaml "$src"/pod/fast/pod-delete.yaml; do
    echo "---"; cat "$f"
  done >"$STAGES.tmp"
  mv "$STAGES.tmp" "$STAGES"
fi
echo "$BIN/kwok"
