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
source "$ROOT/tests/operator/etcd.sh"
start_etcd || fail "etcd not up"
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

# The geometry (ferrox-plan's ModelGeometry's schema) is stored as written:
# the schema defaults nothing (an absent kvDtype is the pods' device's to
# decide), and a null count is pruned, i.e. absent, as the operator reads it.
stored="$(kubectl create --dry-run=server -o jsonpath='{.spec.model.geometry}' -f - <<'YAML'
apiVersion: ferrox.dev/v1alpha1
kind: ModelDeployment
metadata: {name: as-written}
spec:
  model:
    source: hf://org/m
    geometry: {layers: 30, kvHeads: 3, headDim: 64, weightBytes: 98362432, contextLength: 8192, heads: null}
  accelerator: {memoryPerDevice: 80Gi}
YAML
)"
python3 -c 'import json,sys; g=json.loads(sys.argv[1]); sys.exit(g != {"layers": 30, "kvHeads": 3, "headDim": 64, "weightBytes": 98362432, "contextLength": 8192})' "$stored" \
  || fail "geometry not stored as written: $stored"
ok "a geometry without kvDtype is stored as written: $stored"

"$BIN" run --no-leader-election --listen 127.0.0.1:18080 --scrape-interval 5 >"$WORK/operator.log" 2>&1 &
OP_PID=$!
PIDS+=($OP_PID)
kubectl apply -f tests/operator/manifests/smollm2-cpu.yaml >/dev/null
wait_for() { for _ in $(seq 60); do eval "$1" >/dev/null 2>&1 && return 0; sleep 1; done; return 1; }
wait_for "kubectl get deployment smollm2" || { tail -30 "$WORK/operator.log"; fail "no Deployment"; }
wait_for "kubectl get service smollm2" || fail "no Service"
wait_for "[ \"\$(kubectl get md smollm2 -o jsonpath='{.status.conditions[?(@.type==\"Planned\")].status}')\" = True ]" \
  || { kubectl get md smollm2 -o yaml; fail "Planned is not True"; }
args="$(kubectl get deployment smollm2 -o jsonpath='{.spec.template.spec.containers[0].args}')"
blocks="$(kubectl get md smollm2 -o jsonpath='{.status.plan.kvBlocks}')"
# Every pool of status.plan.pools, by kind, is a --pool KIND=N of the pod.
pools="$(kubectl get md smollm2 -o jsonpath='{range .status.plan.pools[*]}{.pool}={.blocks}{"\n"}{end}')"
[ "$pools" = "full=$blocks" ] || fail "status.plan.pools '$pools', kvBlocks $blocks"
for p in $pools; do grep -q "\"--pool\",\"$p\"" <<<"$args" || fail "args $args lack --pool $p"; done
owner="$(kubectl get deployment smollm2 -o jsonpath='{.metadata.ownerReferences[0].kind}')"
[ "$owner" = ModelDeployment ] || fail "owner $owner"
header="$(kubectl get md smollm2 | sed -n 1p)"
for col in MODEL REPLICAS READY "MAX SEQS" "KV BLOCKS" AGE; do grep -q "$col" <<<"$header" || fail "no column $col: $header"; done
ok "Deployment, Service and status (kvBlocks=$blocks); kubectl get md: $(kubectl get md smollm2 --no-headers | tr -s ' ')"

sleep 3
reconciles() { curl -sf http://127.0.0.1:18080/metrics | sed -n 's/^ferrox_operator_reconciles_total //p'; }
n0="$(reconciles)"
rv() { kubectl get "$1" -o jsonpath='{.metadata.resourceVersion}'; }
before="$(rv deployment/smollm2) $(rv service/smollm2) $(kubectl get md smollm2 -o jsonpath='{.status}')"
kubectl annotate md smollm2 ferrox.dev/poke="$(date +%s)" --overwrite >/dev/null   # a watch event: reconcile again
sleep 5
after="$(rv deployment/smollm2) $(rv service/smollm2) $(kubectl get md smollm2 -o jsonpath='{.status}')"
[ "$before" = "$after" ] || fail "second reconcile changed something: $before -> $after"
[ "$(reconciles)" -gt "$n0" ] || fail "no second reconcile happened"
ok "second reconcile ($n0 -> $(reconciles) reconciles) changed nothing"

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

# Inspection: no geometry in the spec, so a Job runs `ferrox-server inspect`.
# No kubelet here: play its part by writing the Job's and its pod's status.
kubectl apply -f tests/operator/manifests/llama8b-gpu.yaml >/dev/null
wait_for "kubectl get jobs -o name | grep -q llama8b-inspect-" || fail "no inspection Job"
job="$(kubectl get jobs -o name | grep llama8b-inspect- | cut -d/ -f2)"
reason="$(kubectl get md llama8b -o jsonpath='{.status.conditions[?(@.type=="Planned")].reason}')"
[ "$reason" = Inspecting ] || fail "Planned reason $reason while inspecting"
# finish_inspection JOB FILE...: the Job's pod ends with the files' lines
# (one JSON line each) as its termination message, and the Job succeeds.
finish_inspection() {
  local job="$1"; shift
  kubectl create -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $job-pod, labels: {job-name: $job}}
spec: {restartPolicy: Never, containers: [{name: inspect, image: ferrox-server:0.1.0}]}
YAML
  local message
  message="$(cat "$@" | python3 -c 'import json,sys; print(json.dumps(sys.stdin.read()))')"
  kubectl patch pod "$job-pod" --subresource=status --type=merge -p "{\"status\":{\"containerStatuses\":[{\"name\":\"inspect\",\"image\":\"ferrox-server:0.1.0\",\"imageID\":\"\",\"ready\":false,\"restartCount\":0,\"state\":{\"terminated\":{\"exitCode\":0,\"reason\":\"Completed\",\"message\":$message}}}]}}" >/dev/null
  kubectl patch job "$job" --subresource=status --type=merge -p '{"status":{"succeeded":1}}' >/dev/null
}
finish_inspection "$job" tests/operator/manifests/llama8b-inspect.json
wait_for "[ \"\$(kubectl get md llama8b -o jsonpath='{.status.conditions[?(@.type==\"Planned\")].status}')\" = True ]" \
  || { kubectl get md llama8b -o yaml; fail "llama8b not planned from the inspection"; }
[ "$(kubectl get md llama8b -o jsonpath='{.status.geometry.geometry.layers}')" = 32 ] || fail "geometry not recorded"
[ "$(kubectl get md llama8b -o jsonpath='{.status.plan.maxSeqs}')" = 64 ] || fail "maxSeqs"
[ "$(kubectl get md llama8b -o jsonpath='{.status.geometry.geometry.weightBytes}')" = 16060522496 ] || fail "the GPU spec did not plan with the cuda footprint"
wait_for "kubectl get hpa llama8b" || fail "no HPA in hpa mode"
[ "$(kubectl get hpa llama8b -o jsonpath='{.spec.scaleTargetRef.kind}')" = ModelDeployment ] || fail "HPA target"
gpus="$(kubectl get deployment llama8b -o jsonpath='{.spec.template.spec.containers[0].resources.limits.nvidia\.com/gpu}')"
[ "$gpus" = 1 ] || fail "GPU limit $gpus"
ok "inspection Job -> termination message -> geometry -> plan with the cuda footprint (maxSeqs 64, the cap), HPA on the scale subresource"

# A draft model on a claim: a new Job inspects the model, then the draft; the
# plan counts the draft and the pods get it at its claim's mount.
blocks0="$(kubectl get md llama8b -o jsonpath='{.status.plan.kvBlocks}')"
kubectl patch md llama8b --type=merge -p '{"spec":{"speculative":{"method":"draft_model","numSpeculativeTokens":4,"model":"pvc://drafts/llama-1b"}}}' >/dev/null
wait_for "[ \"\$(kubectl get jobs -o name | grep -c llama8b-inspect-)\" = 2 ]" || fail "no second inspection Job for the draft"
job2="$(kubectl get jobs -o name | grep llama8b-inspect- | cut -d/ -f2 | grep -v "^$job\$")"
script="$(kubectl get job "$job2" -o jsonpath='{.spec.template.spec.containers[0].command[2]}')"
grep -qF "inspect --model '/draft/drafts/llama-1b' --json >>" <<<"$script" || fail "the Job does not inspect the draft: $script"
finish_inspection "$job2" tests/operator/manifests/llama8b-inspect.json tests/operator/manifests/llama1b-inspect.json
wait_for "[ \"\$(kubectl get md llama8b -o jsonpath='{.status.geometry.draft.geometry.layers}')\" = 16 ]" \
  || { kubectl get md llama8b -o yaml; fail "the draft's geometry is not recorded"; }
draft_bytes="$(kubectl get md llama8b -o jsonpath='{.status.plan.draftBytes}')"
blocks1="$(kubectl get md llama8b -o jsonpath='{.status.plan.kvBlocks}')"
# Its cuda weights (bf16) and one bf16 block of 16 x 32 KiB beside each KV block.
[ "$draft_bytes" = "$((2471628800 + blocks1 * 16 * 32768))" ] || fail "draftBytes $draft_bytes with $blocks1 blocks"
[ "$blocks1" -lt "$blocks0" ] || fail "kvBlocks $blocks0 -> $blocks1 with a draft"
wait_for "kubectl get deployment llama8b -o jsonpath='{.spec.template.spec.containers[0].args}' | grep -qF '/draft/drafts/llama-1b'" \
  || fail "the pods do not get the draft: $(kubectl get deployment llama8b -o jsonpath='{.spec.template.spec.containers[0].args}')"
claim="$(kubectl get deployment llama8b -o jsonpath='{.spec.template.spec.volumes[?(@.name=="draft-drafts")].persistentVolumeClaim.claimName}')"
[ "$claim" = drafts ] || fail "no draft claim volume: $claim"
ok "draft model: a second Job inspects it, status.plan.draftBytes $draft_bytes, kvBlocks $blocks0 -> $blocks1, its claim mounted at /draft/drafts"

# The disk tier's claim: created before the pods; a change its spec cannot
# take (another storage class) is Planned=False with the API's reason, and
# nothing else is applied.
kubectl apply -f - >/dev/null <<'YAML'
apiVersion: ferrox.dev/v1alpha1
kind: ModelDeployment
metadata: {name: tiered}
spec:
  model:
    source: hf://org/m
    geometry: {layers: 30, kvHeads: 3, headDim: 64, weightBytes: 98362432, contextLength: 8192}
  resources: {limits: {memory: 2Gi}}
  kvCache: {offload: {disk: {size: 8Gi, storageClassName: fast}}}
YAML
wait_for "kubectl get pvc tiered-kv-cache" || fail "no disk tier claim"
wait_for "kubectl get deployment tiered" || fail "no Deployment for the tiered deployment"
gen="$(kubectl get deployment tiered -o jsonpath='{.metadata.generation}')"
kubectl patch md tiered --type=merge -p '{"spec":{"kvCache":{"offload":{"disk":{"storageClassName":"slow"}}},"engine":{"maxSeqs":3}}}' >/dev/null
wait_for "[ \"\$(kubectl get md tiered -o jsonpath='{.status.conditions[?(@.type==\"Planned\")].reason}')\" = KvCacheClaimImmutable ]" \
  || { kubectl get md tiered -o yaml; tail -20 "$WORK/operator.log"; fail "an immutable claim change is not a condition"; }
msg="$(kubectl get md tiered -o jsonpath='{.status.conditions[?(@.type=="Planned")].message}')"
grep -q "tiered-kv-cache" <<<"$msg" && grep -qi "immutable\|forbidden" <<<"$msg" || fail "message: $msg"
[ "$(kubectl get pvc tiered-kv-cache -o jsonpath='{.spec.storageClassName}')" = fast ] || fail "the claim changed"
[ "$(kubectl get deployment tiered -o jsonpath='{.metadata.generation}')" = "$gen" ] || fail "the Deployment was changed"
kubectl patch md tiered --type=merge -p '{"spec":{"kvCache":{"offload":{"disk":{"storageClassName":"fast"}}}}}' >/dev/null
wait_for "[ \"\$(kubectl get md tiered -o jsonpath='{.status.conditions[?(@.type==\"Planned\")].status}')\" = True ]" \
  || fail "set back, the claim change is not planned again"
ok "disk tier claim: another storage class is Planned=False KvCacheClaimImmutable ($(cut -c1-90 <<<"$msg")...), nothing applied; set back, planned"
kubectl delete md tiered --wait=false >/dev/null

# Built-in autoscaler: a fake ready pod whose /metrics (on 127.0.0.1:8000) shows a queue.
METRICS="$WORK/metrics"; mkdir -p "$METRICS"
printf 'ferrox_requests_waiting 14\nferrox_requests_running 8\nferrox_kv_usage_ratio 0.5\n' > "$METRICS/metrics"
python3 -m http.server 8000 --bind 127.0.0.1 --directory "$METRICS" >/dev/null 2>&1 &
PIDS+=($!)
kubectl patch md smollm2 --type=merge -p '{"spec":{"autoscaling":{"enabled":true,"minReplicas":1,"maxReplicas":4,"targetQueuePerReplica":4,"scaleUpStabilizationSeconds":0,"scaleDownDelaySeconds":3600,"mode":"builtin"}}}' >/dev/null
kubectl scale md smollm2 --replicas 1 >/dev/null
wait_for "! kubectl get pdb smollm2" || fail "stale PDB not pruned at 1 replica"
ok "scale to 1 prunes the PDB it owned"
kubectl create -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: smollm2-fake, labels: {app.kubernetes.io/name: ferrox-server, app.kubernetes.io/instance: smollm2}}
spec: {containers: [{name: server, image: ferrox-server:0.1.0}]}
YAML
kubectl patch pod smollm2-fake --subresource=status --type=merge -p '{"status":{"podIP":"127.0.0.1","podIPs":[{"ip":"127.0.0.1"}],"conditions":[{"type":"Ready","status":"True"}]}}' >/dev/null
# 14 waiting / 4 per replica -> 4 replicas (the max).
wait_for "[ \"\$(kubectl get md smollm2 -o jsonpath='{.spec.replicas}')\" = 4 ]" \
  || { kubectl get md smollm2 -o yaml; tail -20 "$WORK/operator.log"; fail "builtin autoscaler did not scale up"; }
wait_for "[ \"\$(kubectl get deployment smollm2 -o jsonpath='{.spec.replicas}')\" = 4 ]" || fail "Deployment did not follow"
wait_for "[ \"\$(kubectl get md smollm2 -o jsonpath='{.status.autoscaler.desiredReplicas}')\" = 4 ]" || fail "no autoscaler status"
kubectl get events --field-selector reason=Scaled -o name | grep -q . || fail "no Scaled event"
ok "builtin autoscaler: queue 14 -> /scale 4 -> Deployment 4 ($(kubectl get md smollm2 -o jsonpath='{.status.autoscaler.reason}'))"

kill "$OP_PID"; wait "$OP_PID" 2>/dev/null || true
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
