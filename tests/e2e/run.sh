#!/usr/bin/env bash
# The user's path against a real control plane: etcd + kube-apiserver (RBAC
# on, audit log on) + kube-controller-manager (its garbage collector only),
# all on 127.0.0.1, built from Go modules and cached in ~/.cache/ferrox.
#
#   helm install (real helm, the CRD from the chart's crds/)
#   -> ferrox-operator run, locally, as the chart's ServiceAccount (a token
#      from the TokenRequest API): RBAC is exactly the chart's rules
#   -> kubectl apply -f examples/smollm2-cpu.yaml -> Deployment + Service with
#      the planned args, `kubectl get md` plan columns, an adapter added to
#      spec.adapters reaching the pods' args and volumes, `kubectl scale md`
#   -> CEL refuses a bad spec -> delete the ModelDeployment, the GC deletes
#      its children -> every call the operator made is one the chart grants.
#
# No scheduler or kubelet: pods are never started, which nothing here needs.
# Last line: "N passed, 0 failed"; exits non-zero at the first failure.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT"
CACHE="${FERROX_CACHE:-$HOME/.cache/ferrox}"
T0=$(date +%s)
bash tests/operator/setup-apiserver.sh all >/dev/null
bash tests/e2e/setup-controller-manager.sh >/dev/null
TOOLS="$(tests/chart/setup-tools)"
HELM="$TOOLS/helm"; KUBECTL="$TOOLS/kubectl"
kubectl() { "$KUBECTL" "$@"; }
if [[ -z "${FERROX_OPERATOR:-}" ]]; then
  cargo build -q --locked -p ferrox-operator
  FERROX_OPERATOR="${CARGO_TARGET_DIR:-$ROOT/target}/debug/ferrox-operator"
fi
echo "# setup (builds, cached after the first run): $(( $(date +%s) - T0 ))s"

WORK="$(mktemp -d)"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  # kube-apiserver drains its watches for up to a minute on SIGTERM; nothing
  # here needs a graceful stop, so what is still up after 5 s is killed.
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
  for log in operator apiserver controller-manager; do
    echo "--- $log.log (tail)"; tail -15 "$WORK/$log.log" 2>/dev/null || true
  done
  echo "$pass passed, 1 failed"
  exit 1
}
ok() { echo "ok - $*"; pass=$((pass + 1)); }
wait_for() { for _ in $(seq "${2:-60}"); do eval "$1" >/dev/null 2>&1 && return 0; sleep 1; done; return 1; }

# Ports apart from tests/operator/e2e.sh's, so both can run on one machine.
# Below the ephemeral range (32768+), where a busy machine's outgoing
# connections would take them.
ETCD_PORT=12379; API_PORT=12443; KCM_PORT=12257; OP_PORT=12080
NS=ferrox-system; SA=ferrox

source "$ROOT/tests/operator/etcd.sh"
start_etcd || fail "etcd not up"
openssl genrsa -out "$WORK/sa.key" 2048 2>/dev/null
TOKEN="ferrox-e2e-$(date +%s)-$RANDOM"
echo "$TOKEN,admin,admin,system:masters" >"$WORK/tokens.csv"
# Only the operator's ServiceAccount is audited: its calls are what the RBAC check reads.
cat >"$WORK/audit.yaml" <<YAML
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    users: ["system:serviceaccount:$NS:$SA"]
  - level: None
YAML
"$CACHE/bin/kube-apiserver" --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
  --bind-address 127.0.0.1 --secure-port "$API_PORT" --cert-dir "$WORK/certs" \
  --token-auth-file "$WORK/tokens.csv" --authorization-mode RBAC \
  --service-account-issuer https://kubernetes.default.svc --service-account-key-file "$WORK/sa.key" \
  --service-account-signing-key-file "$WORK/sa.key" --service-cluster-ip-range 10.96.0.0/16 \
  --audit-policy-file "$WORK/audit.yaml" --audit-log-path "$WORK/audit.log" \
  --disable-admission-plugins ServiceAccount >"$WORK/apiserver.log" 2>&1 &
PIDS+=($!)
export KUBECONFIG="$WORK/admin.kubeconfig"
kubectl config set-cluster e2e --server "https://127.0.0.1:$API_PORT" --insecure-skip-tls-verify=true >/dev/null
kubectl config set-credentials admin --token "$TOKEN" >/dev/null
kubectl config set-context e2e --cluster e2e --user admin --namespace default >/dev/null
kubectl config use-context e2e >/dev/null
wait_for "kubectl get --raw /readyz" 120 || fail "apiserver not ready"
ok "etcd + kube-apiserver (RBAC, audit) ready"

T1=$(date +%s)
"$HELM" install ferrox charts/ferrox --namespace "$NS" --create-namespace \
  --set image.repository=ferrox-operator --set image.tag=e2e >"$WORK/helm.log" 2>&1 || { cat "$WORK/helm.log"; fail "helm install"; }
grep -q "kubectl apply -f examples/smollm2-cpu.yaml" "$WORK/helm.log" || fail "NOTES do not say what to apply"
kubectl wait --for condition=established --timeout=60s crd/modeldeployments.ferrox.dev >/dev/null || fail "CRD from the chart not established"
for obj in deployment/ferrox serviceaccount/ferrox service/ferrox-metrics role/ferrox-leader-election rolebinding/ferrox-leader-election; do
  kubectl -n "$NS" get "$obj" >/dev/null || fail "helm did not create $obj"
done
kubectl get clusterrole/ferrox clusterrolebinding/ferrox >/dev/null || fail "no ClusterRole/binding"
# (captured first: grep -q closing the pipe early would fail the pipeline under pipefail)
status="$("$HELM" status ferrox -n "$NS")"
grep -q "STATUS: deployed" <<<"$status" || fail "release not deployed: $status"
ok "helm install: CRD (from charts/ferrox/crds), RBAC, ServiceAccount, Deployment, metrics Service ($(( $(date +%s) - T1 ))s)"

# The garbage collector is what deletes a ModelDeployment's children. Started
# after the CRD exists, so that its first discovery already maps ModelDeployment
# (otherwise it waits for its 30 s rediscovery).
"$CACHE/bin/kube-controller-manager" --kubeconfig "$KUBECONFIG" --controllers garbage-collector-controller \
  --bind-address 127.0.0.1 --secure-port "$KCM_PORT" --cert-dir "$WORK/kcm-certs" \
  --authentication-skip-lookup --leader-elect=false >"$WORK/controller-manager.log" 2>&1 &
PIDS+=($!)

# The operator runs here, not in a pod (no kubelet), but with the identity the
# chart gives it in a cluster: a token of its ServiceAccount, so RBAC is real.
SA_TOKEN="$(kubectl -n "$NS" create token "$SA" --duration 1h)"
OPCFG="$WORK/operator.kubeconfig"
KUBECONFIG="$OPCFG" kubectl config set-cluster e2e --server "https://127.0.0.1:$API_PORT" --insecure-skip-tls-verify=true >/dev/null
KUBECONFIG="$OPCFG" kubectl config set-credentials sa --token "$SA_TOKEN" >/dev/null
KUBECONFIG="$OPCFG" kubectl config set-context e2e --cluster e2e --user sa --namespace "$NS" >/dev/null
KUBECONFIG="$OPCFG" kubectl config use-context e2e >/dev/null
[[ "$(KUBECONFIG="$OPCFG" kubectl auth whoami -o jsonpath='{.status.userInfo.username}')" == "system:serviceaccount:$NS:$SA" ]] \
  || fail "token is not the chart's ServiceAccount"
KUBECONFIG="$OPCFG" kubectl auth can-i create pods -n default >/dev/null 2>&1 && fail "the ServiceAccount may create pods"
KUBECONFIG="$OPCFG" POD_NAMESPACE="$NS" POD_NAME=ferrox-e2e RUST_LOG=info \
  "$FERROX_OPERATOR" run --listen "127.0.0.1:$OP_PORT" --scrape-interval 2 >"$WORK/operator.log" 2>&1 &
PIDS+=($!)
wait_for "[ \"\$(kubectl -n $NS get lease ferrox-operator -o jsonpath='{.spec.holderIdentity}')\" = ferrox-e2e ]" \
  || fail "operator did not take the Lease in $NS"
wait_for "curl -sf http://127.0.0.1:$OP_PORT/healthz" || fail "no /healthz"
metrics="$(curl -sf "http://127.0.0.1:$OP_PORT/metrics")"
grep -q '^ferrox_operator_leader 1' <<<"$metrics" || fail "operator metrics: not leader"
ok "operator as system:serviceaccount:$NS:$SA holds the Lease (Role in $NS), serves /healthz and /metrics"

kubectl apply -f examples/smollm2-cpu.yaml >/dev/null
wait_for "kubectl get deployment smollm2" || fail "no Deployment"
wait_for "kubectl get service smollm2" || fail "no Service"
wait_for "[ \"\$(kubectl get md smollm2 -o jsonpath='{.status.conditions[?(@.type==\"Planned\")].status}')\" = True ]" \
  || { kubectl get md smollm2 -o yaml; fail "Planned is not True"; }
blocks="$(kubectl get md smollm2 -o jsonpath='{.status.plan.kvBlocks}')"
seqs="$(kubectl get md smollm2 -o jsonpath='{.status.plan.maxSeqs}')"
# The same numbers `ferrox-operator render` plans offline.
want="$("$FERROX_OPERATOR" render -f examples/smollm2-cpu.yaml | sed -n 's/^# plan.kvBlocks: //p')"
[[ -n "$blocks" && "$blocks" == "$want" ]] || fail "status kvBlocks '$blocks', render says '$want'"
args="$(kubectl get deployment smollm2 -o jsonpath='{.spec.template.spec.containers[0].args}')"
grep -q "\"--pool\",\"full=$blocks\"" <<<"$args" || fail "args $args lack --pool full=$blocks"
grep -q "\"--max-seqs\",\"$seqs\"" <<<"$args" || fail "args $args lack --max-seqs $seqs"
grep -q '"--model","/models/SmolLM2-135M-Instruct.Q4_1.gguf"' <<<"$args" || fail "args $args lack the model"
[[ "$(kubectl get service smollm2 -o jsonpath='{.spec.ports[0].port}')" == 8000 ]] || fail "service port"
ok "examples/smollm2-cpu.yaml -> Deployment (--pool full=$blocks --max-seqs $seqs) and Service"

header="$(kubectl get md smollm2 | sed -n 1p)"
row="$(kubectl get md smollm2 --no-headers | tr -s ' ')"
for col in MODEL REPLICAS "MAX SEQS" "KV BLOCKS"; do grep -q "$col" <<<"$header" || fail "no column $col: $header"; done
[[ "$row" == "smollm2 smollm2 1 "*" $seqs $blocks "* ]] || fail "kubectl get md row: $row"
ok "kubectl get md: $row"

# An adapter added to a running ModelDeployment: the operator plans it and
# renders it into the pods' args and volumes (the template changes: the pods
# roll, so each serves exactly the spec's adapters from its start).
kubectl patch md smollm2 --type merge -p \
  '{"spec":{"adapters":[{"name":"sql","source":"pvc://lora-adapters/sql-v3"}],"lora":{"maxLoras":1,"maxLoraRank":16}}}' >/dev/null \
  || fail "patching spec.adapters"
template() { kubectl get deployment smollm2 -o jsonpath="{.spec.template.spec.$1}"; }
wait_for "template 'containers[0].args' | grep -q 'sql=/adapters/lora-adapters/sql-v3'" \
  || fail "the adapter did not reach the pods' args: $(template 'containers[0].args')"
args="$(template 'containers[0].args')"
for want in '"--enable-lora"' '"--max-loras","1"' '"--max-lora-rank","16"' '"--lora-modules","sql=/adapters/lora-adapters/sql-v3"'; do
  grep -qF "$want" <<<"$args" || fail "args $args lack $want"
done
[[ "$(template 'volumes[?(@.persistentVolumeClaim.claimName=="lora-adapters")].persistentVolumeClaim.readOnly')" == true ]] \
  || fail "no read-only volume of the claim lora-adapters: $(template volumes)"
wait_for "[ \"\$(kubectl get md smollm2 -o jsonpath='{.status.plan.adapterBytes}')\" -gt 0 ]" \
  || fail "status.plan.adapterBytes not counted"
ok "spec.adapters added at run time -> --enable-lora --lora-modules sql=... and the claim mounted read-only ($(kubectl get md smollm2 -o jsonpath='{.status.plan.adapterBytes}') adapter bytes planned)"

kubectl scale md smollm2 --replicas 2 >/dev/null
wait_for "[ \"\$(kubectl get deployment smollm2 -o jsonpath='{.spec.replicas}')\" = 2 ]" || fail "scale did not reach the Deployment"
[[ "$(kubectl get md smollm2 -o jsonpath='{.status.selector}')" == *"app.kubernetes.io/instance=smollm2"* ]] || fail "no scale selector"
ok "kubectl scale md --replicas 2 -> scale subresource -> Deployment replicas 2"

bad() {
  sed "s/^  name: smollm2$/  name: bad/" examples/smollm2-cpu.yaml | python3 -c "
import sys, yaml; d = yaml.safe_load(sys.stdin); exec(sys.argv[1]); print(yaml.safe_dump(d))" "$1"
}
for case in \
  "d['spec']['engine'] = {'memoryUtilization': 1.5}|engine.memoryUtilization must be in (0, 1]" \
  "del d['spec']['resources']|without spec.accelerator, spec.resources.limits.memory" \
  "d['spec']['autoscaling'] = {'enabled': True, 'minReplicas': 5, 'maxReplicas': 2}|autoscaling.minReplicas must not exceed autoscaling.maxReplicas" \
  "d['spec']['model']['geometry']['kvDtype'] = 'fp8'|geometry.kvDtype fp8 is not served by ferrox-server yet"; do
  edit="${case%%|*}"; msg="${case#*|}"
  if out="$(bad "$edit" | kubectl apply -f - 2>&1)"; then fail "accepted: $edit"; fi
  grep -qF "$msg" <<<"$out" || fail "refused without '$msg': $out"
done
kubectl get md bad >/dev/null 2>&1 && fail "a refused spec exists"
ok "CEL refuses bad specs with their messages (4 cases)"

# A GPU example plans without GPUs present: the plan is arithmetic on the spec.
kubectl apply -f examples/llama-3.1-8b-gpu.yaml >/dev/null
wait_for "kubectl get deployment llama-3-1-8b" || fail "no Deployment for the 8B example"
want="$("$FERROX_OPERATOR" render -f examples/llama-3.1-8b-gpu.yaml | sed -n 's/^# plan.kvBlocks: //p')"
wait_for "[ \"\$(kubectl get md llama-3-1-8b -o jsonpath='{.status.plan.kvBlocks}')\" = $want ]" || fail "8B plan is not $want blocks"
gpus="$(kubectl get deployment llama-3-1-8b -o jsonpath='{.spec.template.spec.containers[0].resources.limits.nvidia\.com/gpu}')"
[[ "$gpus" == 1 ]] || fail "8B GPU limit '$gpus'"
ok "examples/llama-3.1-8b-gpu.yaml -> $want KV blocks on one GPU (built-in autoscaler lists its pods)"

kubectl delete md smollm2 --wait=false >/dev/null
wait_for "! kubectl get deployment smollm2 && ! kubectl get service smollm2 && ! kubectl get pdb smollm2" 120 \
  || fail "children not garbage-collected after deleting the ModelDeployment"
ok "delete ModelDeployment -> kube-controller-manager's GC deletes its Deployment, Service and PDB"

# Every call the operator made, from the audit log, against the chart's rules.
"$HELM" get manifest ferrox -n "$NS" >"$WORK/manifest.yaml"
python3 - "$WORK/audit.log" "$WORK/manifest.yaml" "system:serviceaccount:$NS:$SA" "$NS" <<'PY' || fail "audit check"
import json, sys, yaml
audit, manifest, user, ns = sys.argv[1:]
rules = []  # (apiGroup, resource, verb, namespace or None for cluster-wide)
for d in yaml.safe_load_all(open(manifest)):
    if d and d["kind"] in ("ClusterRole", "Role"):
        for r in d["rules"]:
            for g in r["apiGroups"]:
                for res in r["resources"]:
                    for v in r["verbs"]:
                        rules.append((g, res, v, None if d["kind"] == "ClusterRole" else d["metadata"]["namespace"]))
seen, denied = set(), []
for line in open(audit):
    e = json.loads(line)
    # A watch is logged at ResponseStarted (it completes only when it ends).
    if e["user"]["username"] != user or e["stage"] not in ("ResponseStarted", "ResponseComplete"):
        continue
    if e.get("userAgent", "").startswith("kubectl"):
        continue  # this script's own `kubectl auth whoami/can-i` with the token
    o = e.get("objectRef") or {}
    if "resource" not in o:
        continue  # discovery, /version
    res = o["resource"] + ("/" + o["subresource"] if o.get("subresource") else "")
    call = (o.get("apiGroup", ""), res, e["verb"], o.get("namespace"))
    seen.add(call)
    if e["responseStatus"]["code"] == 403:
        denied.append(call)
ok = lambda c: any(c[:3] == r[:3] and (r[3] is None or r[3] == c[3]) for r in rules)
outside = sorted({c for c in seen if not ok(c)}, key=str)
assert not denied, f"the chart's RBAC denied: {denied}"
assert not outside, f"calls outside the chart's rules: {outside}"
used = {c[:3] for c in seen}
unused = sorted({r[:3] for r in rules} - used)
# `create` for server-side apply is an authorization check inside a PATCH, so
# the audit log shows the patch only; the 403 without it is what proves it.
print(f"# {len(used)} distinct calls, all granted; granted but not seen here (keda, inspection, prune, autoscaler paths; SSA create): {unused}")
PY
ok "audit log: every call the operator made is granted by the chart, none denied"

"$HELM" uninstall ferrox -n "$NS" >/dev/null || fail "helm uninstall"
kubectl -n "$NS" get deployment ferrox >/dev/null 2>&1 && fail "uninstall left the operator Deployment"
kubectl get crd modeldeployments.ferrox.dev >/dev/null || fail "helm must keep the CRD (crds/ are never deleted)"
ok "helm uninstall removes the release and keeps the CRD"
echo "# total $(( $(date +%s) - T0 ))s"
echo "$pass passed, 0 failed"
