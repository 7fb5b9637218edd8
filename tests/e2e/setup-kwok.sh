#!/usr/bin/env bash
# Builds kwok (sigs.k8s.io/kwok, from the Go module proxy) once into
# ~/.cache/ferrox/bin: it plays the kubelets of simulated GPU nodes.
set -euo pipefail
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
CACHE="${FERROX_CACHE:-$HOME/.cache/ferrox}"
BIN="$CACHE/bin"
[[ -x "$BIN/kwok" ]] && { echo "$BIN/kwok"; exit 0; }
mkdir -p "$BIN"
export CGO_ENABLED=0
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
GOBIN="$tmp" go install -trimpath -ldflags='-s -w' "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" >&2
mv "$tmp/kwok" "$BIN/kwok"
echo "$BIN/kwok"
