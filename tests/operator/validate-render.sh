#!/usr/bin/env bash
# Renders the sample ModelDeployments and checks every object with
# kubernetes-validate --strict. ScaledObject (keda mode) is a KEDA CRD with no
# schema there: kubernetes-validate warns and skips it; the rest is checked.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN="${FERROX_OPERATOR:-${CARGO_TARGET_DIR:-target}/debug/ferrox-operator}"
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
command -v kubernetes-validate >/dev/null || pip install -q kubernetes-validate
K8S="${K8S_SCHEMA_VERSION:-1.34.0}"
render() { "$BIN" render -f "tests/operator/manifests/$1" ${2:+--geometry-from "tests/operator/manifests/$2"} > "$OUT/$3"; }
render smollm2-cpu.yaml "" smollm2.yaml
render llama8b-gpu.yaml llama8b-inspect.json llama8b.yaml
render llama8b-keda.yaml llama8b-inspect.json llama8b-keda.yaml
grep -q "kind: ScaledObject" "$OUT/llama8b-keda.yaml"
render smollm2-cpu.yaml smollm2-inspect.json smollm2-inspected.yaml
# A model file (not JSON) is handed to `ferrox-server inspect`; a stand-in
# server that prints the SmolLM2 inspection checks that plumbing.
printf '#!/bin/sh\n[ "$1 $2 $3" = "inspect --json --model" ] || exit 2\ncat %s\n' \
  "$PWD/tests/operator/manifests/smollm2-inspect.json" > "$OUT/fake-server"
chmod +x "$OUT/fake-server"
printf 'GGUF' > "$OUT/model.gguf"
"$BIN" render -f tests/operator/manifests/smollm2-cpu.yaml --geometry-from "$OUT/model.gguf" \
  --server-bin "$OUT/fake-server" > "$OUT/smollm2-from-model.yaml"
status=0
for f in "$OUT"/*.yaml; do
  echo "== $(basename "$f")"
  kubernetes-validate --strict -k "$K8S" "$f" || status=1
done
# A plan that cannot fit must be refused, with the numbers.
if "$BIN" render -f tests/operator/manifests/llama70b-24gi.yaml > "$OUT/refused.txt" 2>&1; then
  echo "llama70b on 24Gi rendered, but it cannot fit"; status=1
else
  grep -q "insufficient memory: .*weights take 141107412992," "$OUT/refused.txt" || { cat "$OUT/refused.txt"; status=1; }
  echo "== llama70b-24gi.yaml refused as expected"
fi
exit $status
