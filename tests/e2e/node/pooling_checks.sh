# Sourced by tests/e2e/node/checks.sh: an embedding model (the tiny BERT
# fixture written by sentence-transformers) from a hostPath PV, with neither
# geometry nor task in its spec: the operator's inspection Job runs on the
# node and finds both, the plan has no KV pool, and the router wakes the
# model from zero for an /v1/embeddings request, whose vectors are
# sentence-transformers'; idle, it goes back to zero.

EMBED_FIXTURE="$ROOT/server/models/testdata/embeddings/bert"

# The cosine of each returned vector with the reference's, the worst one;
# prints "texts worst-cosine".
embed_through() { # url model fixture
  python3 - "$1" "$2" "$3/reference.json" <<'PY'
import json, math, sys, urllib.request
ref = json.load(open(sys.argv[3]))
body = json.dumps({"model": sys.argv[2], "input": ref["texts"], "encoding_format": "float"})
req = urllib.request.Request(sys.argv[1] + "/v1/embeddings", body.encode(), {"Content-Type": "application/json"})
got = [d["embedding"] for d in json.load(urllib.request.urlopen(req, timeout=240))["data"]]
def cos(a, b):
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))
print(len(got), min(cos(a, b) for a, b in zip(got, ref["embeddings"])))
PY
}

check_embed_from_zero() {
  local name=bert-embed dir="$NODE_DIR/pv/embed" url t0 answer wake_s found planned pools task
  mkdir -p "$dir" && cp -r "$EMBED_FIXTURE" "$dir/bert" && chmod -R a+rX "$dir" ||
    { bad "embed: copying the fixture"; return; }
  readonly_claim ferrox-embed embed-models "$dir" || { bad "embed: PV/PVC"; return; }
  kubectl apply -f - >/dev/null <<YAML || { bad "embed: apply $name"; return; }
apiVersion: ferrox.dev/v1alpha1
kind: ModelDeployment
metadata: {name: $name}
spec:
  model: {source: 'pvc://embed-models/bert'}
  replicas: 0
  autoscaling: {enabled: true, minReplicas: 0, maxReplicas: 1, scaleToZeroAfterSeconds: $ZERO_AFTER}
  resources:
    requests: {cpu: 250m, memory: 1Gi}
    limits: {memory: 1Gi}
YAML
  # Planned once the inspection Job has run on the node (ScaledToZero
  # holds from the start: replicas 0).
  if ! wait_for "[ \"\$(md_field $name '{.status.conditions[?(@.type==\"Planned\")].status}')\" = True ] && [ \"\$(md_field $name '{.status.conditions[?(@.type==\"ScaledToZero\")].status}')\" = True ] && router_knows $name" 240; then
    dump; bad "$name: not planned and ScaledToZero, or unknown to the router: $(md_field $name '{.status}')"; return
  fi
  # What inspection found, what was planned, and the plan's pool count.
  read -r found planned pools < <(kubectl get md "$name" -o json | python3 -c '
import json, sys
s = json.load(sys.stdin).get("status", {})
print(s.get("geometry", {}).get("task"), s.get("plan", {}).get("task"), len(s.get("plan", {}).get("pools", [0])))')
  task="$found $planned"
  url=$(router_url)
  t0=$(date +%s.%N)
  answer=$(embed_through "$url" "$name" "$EMBED_FIXTURE") || { dump; bad "embed from zero: $answer"; return; }
  wake_s=$(python3 -c "print(f'{$(date +%s.%N) - $t0:.1f}')")
  if [[ $task == "embed embed" && $pools == 0 && ${answer%% *} == 4 ]] &&
    python3 -c "import sys; sys.exit(not ${answer#* } >= 0.99999)" &&
    [[ $(kubectl get deploy "$name" -o jsonpath='{.spec.template.spec.containers[0].args}') == *'"--task","embed"'* ]]; then
    ok "an embedder with no task or geometry in its spec: inspection found task '${task% *}', planned no KV pool, the pod runs --task embed; from zero through the router in ${wake_s}s, 4 vectors at worst cosine ${answer#* } with sentence-transformers'"
  else
    bad "embed from zero: task '$task', pools '$pools', answer '$answer', status $(kubectl get md "$name" -o jsonpath='{.status}'), args $(kubectl get deploy "$name" -o jsonpath='{.spec.template.spec.containers[0].args}')"
  fi
  if wait_for "[ \"\$(md_field $name '{.spec.replicas}')\" = 0 ] && [ -z \"\$(pods_of $name)\" ]" $((ZERO_AFTER + 90)); then
    ok "$name idle ${ZERO_AFTER}s: back to 0 replicas, pod gone"
  else
    bad "$name not back to zero: replicas $(md_field "$name" '{.spec.replicas}'), autoscaler $(md_field "$name" '{.status.autoscaler.reason}')"
  fi
  kubectl delete md "$name" --wait=true --timeout 90s >>"$NODE_DIR/logs/kubectl.log" 2>&1
  kubectl delete pvc embed-models --wait=false >/dev/null; kubectl delete pv ferrox-embed --wait=false >/dev/null
}
