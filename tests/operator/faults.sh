#!/usr/bin/env bash
# The operator under faults, in a real local control plane: etcd +
# kube-apiserver + kube-controller-manager (garbage collector, Deployment and
# ReplicaSet controllers, so that rollouts are real; no scheduler, so pods stay
# Pending), all built from Go modules by the setup scripts and cached in
# ~/.cache/ferrox.
#
#   1. leader failover: two replicas; the leader is SIGKILLed right after five
#      ModelDeployments are applied; the other takes the Lease within the lease
#      duration (+ one retry period) and finishes the work: every
#      ModelDeployment planned, one Deployment each, none rolled twice.
#   2. API server restarted mid-reconcile: the leader survives, its watches
#      resume, work applied during and after the outage is done.
#   3. a 409 on apply (injected by tests/operator/fault_proxy.py) is retried;
#      a conflicting writer's changes to the Deployment are taken back, and
#      its own non-forced apply of our fields is refused.
#   4. deletion mid-rollout, background and foreground: no children are left
#      (Deployment, ReplicaSets, Pods, Service), and none come back.
#
# Ports apart from tests/operator/e2e.sh's and tests/e2e/run.sh's.
# Last line: "N passed, 0 failed"; exits non-zero at the first failure.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT"
CACHE="${FERROX_CACHE:-$HOME/.cache/ferrox}"
bash tests/operator/setup-apiserver.sh all >/dev/null
bash tests/e2e/setup-controller-manager.sh >/dev/null
KUBECTL="$(tests/chart/setup-tools)/kubectl"
kubectl() { "$KUBECTL" "$@"; }
if [[ -z "${FERROX_OPERATOR:-}" ]]; then
  cargo build -q --locked -p ferrox-operator
  FERROX_OPERATOR="${CARGO_TARGET_DIR:-$ROOT/target}/debug/ferrox-operator"
fi
LEASE_SECONDS=15   # operator/src/main.rs; renewals and retries every 5 s

WORK="$(mktemp -d)"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for _ in $(seq 10); do
    alive=0; for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [[ $alive == 0 ]] && break; sleep 0.5
  done
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [[ -n "${KEEP_WORK:-}" ]] || rm -rf "$WORK"
}
trap cleanup EXIT
pass=0
fail() {
  echo "FAIL: $*"
  for log in operator-a operator-b operator-c proxy apiserver controller-manager; do
    [[ -f "$WORK/$log.log" ]] && { echo "--- $log.log (tail)"; tail -15 "$WORK/$log.log"; }
  done
  echo "$pass passed, 1 failed"
  exit 1
}
ok() { echo "ok - $*"; pass=$((pass + 1)); }
wait_for() { for _ in $(seq "${2:-60}"); do eval "$1" >/dev/null 2>&1 && return 0; sleep 1; done; return 1; }

# Below the ephemeral range (32768+), where a busy machine's outgoing
# connections would take them.
ETCD_PORT=13379; API_PORT=13443; KCM_PORT=13257; PROXY_PORT=13480

source "$ROOT/tests/operator/etcd.sh"
start_etcd || fail "etcd not up"
openssl genrsa -out "$WORK/sa.key" 2048 2>/dev/null
TOKEN="ferrox-faults-$(date +%s)-$RANDOM"
echo "$TOKEN,admin,admin,system:masters" >"$WORK/tokens.csv"
API_PID=
start_apiserver() {
  "$CACHE/bin/kube-apiserver" --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address 127.0.0.1 --secure-port "$API_PORT" --cert-dir "$WORK/certs" \
    --token-auth-file "$WORK/tokens.csv" --authorization-mode AlwaysAllow \
    --service-account-issuer https://kubernetes.default.svc --service-account-key-file "$WORK/sa.key" \
    --service-account-signing-key-file "$WORK/sa.key" --service-cluster-ip-range 10.96.0.0/16 \
    --disable-admission-plugins ServiceAccount >>"$WORK/apiserver.log" 2>&1 &
  API_PID=$!
  PIDS+=($API_PID)
}
start_apiserver
kubeconfig() {  # file server
  KUBECONFIG="$1" kubectl config set-cluster faults --server "$2" --insecure-skip-tls-verify=true >/dev/null
  KUBECONFIG="$1" kubectl config set-credentials admin --token "$TOKEN" >/dev/null
  KUBECONFIG="$1" kubectl config set-context faults --cluster faults --user admin --namespace default >/dev/null
  KUBECONFIG="$1" kubectl config use-context faults >/dev/null
}
kubeconfig "$WORK/kubeconfig" "https://127.0.0.1:$API_PORT"
export KUBECONFIG="$WORK/kubeconfig"
wait_for "kubectl get --raw /readyz" 120 || fail "apiserver not ready"
kubectl apply --server-side -f crds/modeldeployment.yaml >/dev/null
kubectl wait --for condition=established --timeout=60s crd/modeldeployments.ferrox.dev >/dev/null
"$CACHE/bin/kube-controller-manager" --kubeconfig "$KUBECONFIG" \
  --controllers garbage-collector-controller,deployment-controller,replicaset-controller \
  --bind-address 127.0.0.1 --secure-port "$KCM_PORT" --cert-dir "$WORK/kcm-certs" \
  --authentication-skip-lookup --leader-elect=false >"$WORK/controller-manager.log" 2>&1 &
PIDS+=($!)
ok "etcd + kube-apiserver + kube-controller-manager (GC, Deployment, ReplicaSet controllers) ready"

# A ModelDeployment named $1 (planned from its geometry: no inspection Job).
md() {
  sed "s/^  name: smollm2$/  name: $1/; s/servedName: smollm2/servedName: $1/" tests/operator/manifests/smollm2-cpu.yaml
}
operator() {  # name port [flags...]
  local name=$1 port=$2; shift 2
  POD_NAME="$name" RUST_LOG=info "$FERROX_OPERATOR" run --lease-namespace default \
    --listen "127.0.0.1:$port" --scrape-interval 60 "$@" >"$WORK/operator-${name#op-}.log" 2>&1 &
  PIDS+=($!)
  LAST_PID=$!
}
holder() { kubectl get lease ferrox-operator -o jsonpath='{.spec.holderIdentity}'; }
planned() { [ "$(kubectl get md "$1" -o jsonpath='{.status.conditions[?(@.type=="Planned")].status}')" = True ]; }
rs_count() { kubectl get rs -l "app.kubernetes.io/instance=$1" -o name | wc -l; }

# --- 1. leader failover mid-reconcile ---------------------------------------
operator op-a 13081; A_PID=$LAST_PID
wait_for '[ "$(holder)" = op-a ]' 60 || fail "op-a did not take the Lease"
operator op-b 13082; B_PID=$LAST_PID
sleep 6
[ "$(holder)" = op-a ] || fail "op-b took a held Lease"
for i in 1 2 3 4 5; do md "md-$i"; echo "---"; done | kubectl apply -f - >/dev/null
kill -9 "$A_PID"
killed=$(date +%s)
wait_for '[ "$(holder)" = op-b ]' $((LEASE_SECONDS + 15)) || fail "op-b did not take over"
took=$(( $(date +%s) - killed ))
(( took <= LEASE_SECONDS + 7 )) || fail "takeover took ${took}s, lease is ${LEASE_SECONDS}s"
grep -q "leading" "$WORK/operator-b.log" || fail "op-b never said it leads"
for i in 1 2 3 4 5; do
  wait_for "planned md-$i" 60 || fail "md-$i not planned after the failover (lost action)"
  wait_for "kubectl get deployment md-$i" 30 || fail "md-$i has no Deployment"
done
sleep 5
for i in 1 2 3 4 5; do
  gen="$(kubectl get deployment "md-$i" -o jsonpath='{.metadata.generation}')"
  owners="$(kubectl get deployment "md-$i" -o jsonpath='{.metadata.ownerReferences[*].name}')"
  [ "$gen" = 1 ] || fail "md-$i's Deployment was changed after the takeover (generation $gen)"
  [ "$owners" = "md-$i" ] || fail "md-$i's Deployment owners: $owners"
  [ "$(rs_count "md-$i")" = 1 ] || fail "md-$i rolled out twice: $(rs_count "md-$i") ReplicaSets"
done
curl -sf http://127.0.0.1:13082/metrics | grep -q '^ferrox_operator_leader 1' || fail "op-b metrics: not leader"
ok "leader SIGKILLed mid-reconcile: op-b took the Lease in ${took}s (lease ${LEASE_SECONDS}s), 5/5 planned, one Deployment and one ReplicaSet each, none changed twice"

# --- 2. API server restarted mid-reconcile ----------------------------------
md md-6 | kubectl apply -f - >/dev/null
kill -9 "$API_PID"
sleep 3
md md-7 >"$WORK/md-7.yaml"
start_apiserver
wait_for "kubectl get --raw /readyz" 120 || fail "apiserver did not come back"
kubectl apply -f "$WORK/md-7.yaml" >/dev/null
applied=$(date +%s)
kubectl scale md md-1 --replicas 2 >/dev/null
# Before the controller's trigger backoff was capped (trigger_backoff.rs) this
# took 180 s: every watch's error after the outage added its own pause.
for i in 6 7; do wait_for "planned md-$i" 45 || fail "md-$i not planned within 45 s of the restart"; done
recovered=$(( $(date +%s) - applied ))
wait_for '[ "$(kubectl get deployment md-1 -o jsonpath={.spec.replicas})" = 2 ]' 60 \
  || fail "a scale after the restart did not reach the Deployment (watch not resumed)"
kill -0 "$B_PID" || fail "op-b died with the API server"
[ "$(holder)" = op-b ] || fail "op-b lost the Lease over the restart"
ok "API server SIGKILLed and restarted mid-reconcile: op-b lived on, md-6 planned, md-7 (applied after) planned in ${recovered}s, a scale after it followed"

# --- 3. a 409 on apply, and a conflicting writer ----------------------------
kill "$B_PID"; wait "$B_PID" 2>/dev/null || true
python3 tests/operator/fault_proxy.py "$PROXY_PORT" "https://127.0.0.1:$API_PORT" PATCH \
  /apis/apps/v1/namespaces/default/deployments/md-409 1 >"$WORK/proxy.log" 2>&1 &
PIDS+=($!)
kubeconfig "$WORK/proxied.kubeconfig" "http://127.0.0.1:$PROXY_PORT"
wait_for "curl -s -o /dev/null http://127.0.0.1:$PROXY_PORT/readyz" 20 || fail "proxy not up"
KUBECONFIG="$WORK/proxied.kubeconfig" operator op-c 13083 --no-leader-election; C_PID=$LAST_PID
md md-409 | kubectl apply -f - >/dev/null
wait_for "kubectl get deployment md-409" 60 || fail "md-409 never got its Deployment after the 409"
wait_for "planned md-409" 30 || fail "md-409 not planned"
grep -q "deployments/md-409?.* -> 409 injected" "$WORK/proxy.log" || fail "no 409 was injected"
patches="$(grep -c "PATCH /apis/apps/v1/namespaces/default/deployments/md-409?" "$WORK/proxy.log")"
(( patches >= 2 )) || fail "the apply was not retried ($patches PATCHes)"
errors="$(curl -sf http://127.0.0.1:13083/metrics | sed -n 's/^ferrox_operator_reconcile_errors_total //p')"
(( errors >= 1 )) || fail "the 409 was not counted as a failed reconcile"
ok "409 on apply: counted ($errors failed reconcile), retried with backoff ($patches PATCHes), Deployment applied"
# Another writer changes our fields with an update: the owned-object watch
# brings a reconcile, and the forced apply takes them back.
kubectl patch deployment md-409 --type json \
  -p '[{"op": "replace", "path": "/spec/template/spec/containers/0/image", "value": "intruder:1"}]' >/dev/null
wait_for '[ "$(kubectl get deployment md-409 -o jsonpath={.spec.template.spec.containers[0].image})" = ferrox-server:0.1.0 ]' 30 \
  || fail "a conflicting writer's image stayed"
# Its server-side apply of a field we own, without --force-conflicts, is refused.
if out="$(kubectl get deployment md-409 -o json | python3 -c '
import json, sys
d = json.load(sys.stdin)
c = d["spec"]["template"]["spec"]["containers"][0]
print(json.dumps({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "md-409"},
  "spec": {"selector": d["spec"]["selector"], "template": {"metadata": d["spec"]["template"]["metadata"],
  "spec": {"containers": [{"name": c["name"], "image": "intruder:2"}]}}}}))' \
  | kubectl apply --server-side --field-manager intruder -f - 2>&1)"; then
  fail "a conflicting server-side apply was accepted: $out"
fi
grep -q "conflict" <<<"$out" || fail "refused without a conflict: $out"
ok "conflicting writer: its update taken back by the forced apply, its non-forced apply refused (409 conflict)"

# --- 4. deletion mid-rollout ------------------------------------------------
children() {  # name -> count of what is left
  local n=0
  kubectl get deployment "$1" >/dev/null 2>&1 && n=$((n + 1))
  kubectl get service "$1" >/dev/null 2>&1 && n=$((n + 1))
  n=$((n + $(rs_count "$1")))
  n=$((n + $(kubectl get pods -l "app.kubernetes.io/instance=$1" -o name | wc -l)))
  echo "$n"
}
for cascade in background foreground; do
  name="md-del-$cascade"
  md "$name" | kubectl apply -f - >/dev/null
  wait_for "[ \"\$(rs_count $name)\" = 1 ]" 60 || fail "$name: no first rollout"
  wait_for "kubectl get pods -l app.kubernetes.io/instance=$name -o name | grep -q ." 60 || fail "$name: no pods"
  # A new image starts a second rollout; delete while it is under way.
  kubectl patch md "$name" --type merge -p '{"spec":{"image":"ferrox-server:next"}}' >/dev/null
  wait_for "[ \"\$(rs_count $name)\" = 2 ]" 30 || fail "$name: the second rollout did not start"
  kubectl delete md "$name" --cascade="$cascade" --wait=false >/dev/null
  wait_for "! kubectl get md $name" 90 || fail "$name: still there ($cascade)"
  wait_for "[ \"\$(children $name)\" = 0 ]" 90 || fail "$name: $(children $name) children left ($cascade)"
  sleep 8
  [ "$(children "$name")" = 0 ] || fail "$name: children came back after the deletion ($cascade)"
done
kill -0 "$C_PID" || fail "the operator died"
ok "deletion mid-rollout (background and foreground): no Deployment, ReplicaSet, Pod or Service left, none re-created"

echo "$pass passed, 0 failed"
