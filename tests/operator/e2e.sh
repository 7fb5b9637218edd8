#!/usr/bin/env bash
# The operator against a real control plane: etcd + kube-apiserver (no
# scheduler, no controller-manager: Deployments get no pods, which this test
# does not need). Checks: the CRD installs, CEL refuses bad specs with their
# messages, a ModelDeployment gets its Deployment/Service/status, a second
# reconcile changes nothing, scale-subresource writes reach the Deployment,
# InsufficientMemory makes no Deployment, and the leader Lease is held.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT"
BIN="${FERROX_OPERATOR:-${CARGO_TARGET_DIR:-target}/debug/ferrox-operator}"
CACHE="${FERROX_CACHE:-$HOME/.cache/ferrox}"
bash tests/operator/setup-apiserver.sh all >/dev/null
WORK="$(mktemp -d)"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
pass=0
ok() { echo "ok - $*"; pass=$((pass + 1)); }

ETCD_PORT=23791; API_PORT=26443
"$CACHE/bin/etcd" --data-dir "$WORK/etcd" --listen-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" --listen-peer-urls http://127.0.0.1:23792 \
  >"$WORK/etcd.log" 2>&1 &
PIDS+=($!)
openssl genrsa -out "$WORK/sa.key" 2048 2>/dev/null
TOKEN="ferrox-e2e-$(date +%s)"
echo "$TOKEN,admin,admin,system:masters" > "$WORK/tokens.csv"
"$CACHE/bin/kube-apiserver" --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
  --bind-address 127.0.0.1 --secure-port "$API_PORT" --cert-dir "$WORK/certs" \
  --token-auth-file "$WORK/tokens.csv" --authorization-mode AlwaysAllow \
  --service-account-issuer https://kubernetes.default.svc --service-account-key-file "$WORK/sa.key" \
  --service-account-signing-key-file "$WORK/sa.key" --service-cluster-ip-range 10.96.0.0/16 \
  --disable-admission-plugins ServiceAccount >"$WORK/apiserver.log" 2>&1 &
PIDS+=($!)
export KUBECONFIG="$WORK/kubeconfig"
kubectl config set-cluster e2e --server "https://127.0.0.1:$API_PORT" --insecure-skip-tls-verify=true >/dev/null
kubectl config set-credentials admin --token "$TOKEN" >/dev/null
kubectl config set-context e2e --cluster e2e --user admin --namespace default >/dev/null
kubectl config use-context e2e >/dev/null
for _ in $(seq 120); do kubectl get --raw /readyz >/dev/null 2>&1 && break; sleep 1; done
kubectl get --raw /readyz >/dev/null || { tail -20 "$WORK/apiserver.log"; fail "apiserver not ready"; }
ok "apiserver ready"

kubectl apply --server-side -f crds/modeldeployment.yaml >/dev/null
kubectl wait --for condition=established --timeout=60s crd/modeldeployments.ferrox.dev >/dev/null
ok "CRD installed"

for f in tests/operator/manifests/bad/*.yaml; do
  want="$(sed -n 's/^# expect: //p' "$f")"
  if out="$(kubectl apply -f "$f" 2>&1)"; then fail "$f was accepted"; fi
  grep -qF "$want" <<<"$out" || fail "$f refused without '$want': $out"
  ok "refused $(basename "$f"): $want"
done

"$BIN" run --no-leader-election --listen 127.0.0.1:18080 --scrape-interval 5 >"$WORK/operator.log" 2>&1 &
PIDS+=($!)
kubectl apply -f tests/operator/manifests/smollm2-cpu.yaml >/dev/null
wait_for() { for _ in $(seq 60); do eval "$1" >/dev/null 2>&1 && return 0; sleep 1; done; return 1; }
wait_for "kubectl get deployment smollm2" || { tail -30 "$WORK/operator.log"; fail "no Deployment"; }
wait_for "kubectl get service smollm2" || fail "no Service"
wait_for "[ \"\$(kubectl get md smollm2 -o jsonpath='{.status.conditions[?(@.type==\"Planned\")].status}')\" = True ]" \
  || { kubectl get md smollm2 -o yaml; fail "Planned is not True"; }
args="$(kubectl get deployment smollm2 -o jsonpath='{.spec.template.spec.containers[0].args}')"
blocks="$(kubectl get md smollm2 -o jsonpath='{.status.plan.kvBlocks}')"
grep -q "\"--kv-blocks\",\"$blocks\"" <<<"$args" || fail "args $args lack --kv-blocks $blocks"
owner="$(kubectl get deployment smollm2 -o jsonpath='{.metadata.ownerReferences[0].kind}')"
[ "$owner" = ModelDeployment ] || fail "owner $owner"
ok "Deployment, Service and status (kvBlocks=$blocks)"

sleep 3
rv() { kubectl get "$1" -o jsonpath='{.metadata.resourceVersion}'; }
before="$(rv deployment/smollm2) $(rv service/smollm2) $(kubectl get md smollm2 -o jsonpath='{.status}')"
kubectl annotate md smollm2 ferrox.dev/poke="$(date +%s)" --overwrite >/dev/null   # a watch event: reconcile again
sleep 5
after="$(rv deployment/smollm2) $(rv service/smollm2) $(kubectl get md smollm2 -o jsonpath='{.status}')"
[ "$before" = "$after" ] || fail "second reconcile changed something: $before -> $after"
ok "second reconcile changed nothing"

kubectl scale md smollm2 --replicas 3 >/dev/null
wait_for "[ \"\$(kubectl get deployment smollm2 -o jsonpath='{.spec.replicas}')\" = 3 ]" || fail "scale did not reach the Deployment"
wait_for "kubectl get pdb smollm2" || fail "no PDB at 3 replicas"
sel="$(kubectl get md smollm2 -o jsonpath='{.status.selector}')"
[ -n "$sel" ] || fail "no status.selector"
ok "scale subresource -> Deployment replicas 3, PDB created (selector $sel)"

kubectl apply -f tests/operator/manifests/llama70b-24gi.yaml >/dev/null
wait_for "[ \"\$(kubectl get md llama70b -o jsonpath='{.status.conditions[?(@.type==\"Planned\")].reason}')\" = InsufficientMemory ]" \
  || fail "llama70b not refused"
kubectl get deployment llama70b >/dev/null 2>&1 && fail "llama70b got a Deployment"
wait_for "kubectl get events --field-selector reason=InsufficientMemory -o name | grep -q ." || fail "no event"
ok "InsufficientMemory: Planned=False, no Deployment, a Warning event"

kill "${PIDS[-1]}"; wait "${PIDS[-1]}" 2>/dev/null || true; unset 'PIDS[-1]'
POD_NAME=op-a "$BIN" run --lease-namespace default --listen 127.0.0.1:18081 >"$WORK/operator-a.log" 2>&1 &
PIDS+=($!)
wait_for "[ \"\$(kubectl get lease ferrox-operator -o jsonpath='{.spec.holderIdentity}')\" = op-a ]" || fail "lease not held"
POD_NAME=op-b "$BIN" run --lease-namespace default --listen 127.0.0.1:18082 >"$WORK/operator-b.log" 2>&1 &
PIDS+=($!)
sleep 6
[ "$(kubectl get lease ferrox-operator -o jsonpath='{.spec.holderIdentity}')" = op-a ] || fail "second replica took the lease"
grep -q leading "$WORK/operator-b.log" && fail "op-b leads too"
curl -sf http://127.0.0.1:18081/metrics | grep -q "ferrox_operator_leader 1" || fail "op-a metrics"
curl -sf http://127.0.0.1:18082/healthz >/dev/null || fail "op-b healthz"
ok "leader election: op-a holds the Lease, op-b waits"

echo "$pass passed, 0 failed"
