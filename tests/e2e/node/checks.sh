# Sourced by tests/e2e/real-node.sh once the node is up and the chart is
# installed: the user's path on it, check by check (ok/bad count; a check
# that fails leaves the next ones to run where they can).

MD=smollm2
# The operator's pre-stop sleep (operator/src/desired/deployment.rs), and a
# stream long enough to outlive it at this node's decode speed; the drain the
# (30 s, the default) is what it must end in.
PRE_STOP=5
STREAM_TOKENS=${FERROX_NODE_STREAM_TOKENS:-400}
# The delete check's stream lasts this long: the pre-stop sleep, then a drain.
STREAM_SECONDS=$((PRE_STOP + 8))
CHAT='{"model":"smollm2","messages":[{"role":"user","content":"Say hello."}],"max_tokens":8}'
CLIENT="$ROOT/tests/e2e/node/client.py"
BENCH="$ROOT/docs/benchmarks.md"
# shellcheck source=router_checks.sh
source "$ROOT/tests/e2e/node/router_checks.sh"
# shellcheck source=pooling_checks.sh
source "$ROOT/tests/e2e/node/pooling_checks.sh"

# One chat completion; prints the answer's text.
chat() { # base-url [model]
  curl -sf --max-time 60 "$1/v1/chat/completions" -H 'Content-Type: application/json' \
    -d "${CHAT/smollm2/${2:-smollm2}}" | python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"])'
}
svc_url() { echo "http://$(kubectl get svc "$1" -o jsonpath='{.spec.clusterIP}:{.spec.ports[0].port}')"; }
pods_of() { kubectl get pods -l "app.kubernetes.io/instance=$1" -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}'; }
ready_pods() {
  kubectl get pods -l "app.kubernetes.io/instance=$1" \
    -o jsonpath='{range .items[?(@.status.containerStatuses[0].ready==true)]}{.metadata.name}{"\n"}{end}'
}
md_ready() { kubectl wait --for condition=Available "deployment/$1" --timeout 2s; }
# A read-only hostPath PersistentVolume bound to the claim of that name in
# `default` (a model or adapters read through pvc://).
readonly_claim() { # pv claim dir
  kubectl apply -f - >/dev/null <<YAML
apiVersion: v1
kind: PersistentVolume
metadata: {name: $1}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadOnlyMany]
  storageClassName: ""
  claimRef: {namespace: default, name: $2}
  hostPath: {path: $3, type: Directory}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: $2, namespace: default}
spec:
  accessModes: [ReadOnlyMany]
  storageClassName: ""
  volumeName: $1
  resources: {requests: {storage: 1Gi}}
YAML
}

# The host path of a file of the pod's server container's cgroup (v1 or v2).
cgroup_file() { # pod file
  local uid cid d
  uid=$(kubectl get pod "$1" -o jsonpath='{.metadata.uid}')
  cid=$(kubectl get pod "$1" -o jsonpath='{.status.containerStatuses[0].containerID}')
  cid=${cid#containerd://}
  for d in /sys/fs/cgroup/memory/kubepods /sys/fs/cgroup/kubepods; do
    find "$d" -maxdepth 3 -type d -name "$cid" -path "*pod$uid*" 2>/dev/null | head -n1 | sed "s|$|/$2|"
  done | head -n1
}
server_pid() { head -n1 "$(cgroup_file "$1" cgroup.procs)"; }
bytes() { python3 -c 'import sys; v=sys.argv[1]; u={"Ki":1<<10,"Mi":1<<20,"Gi":1<<30}; print(int(v[:-2])*u[v[-2:]] if v[-2:] in u else int(v))' "$1"; }

check_apply() {
  local t0 url t_first pod
  t0=$(date +%s.%N)
  kubectl apply -f examples/smollm2-cpu.yaml >/dev/null || { bad "kubectl apply -f examples/smollm2-cpu.yaml"; return; }
  if ! wait_for "md_ready $MD" 240; then dump; bad "the smollm2 pod is not Ready (readiness probe)"; return; fi
  url=$(svc_url "$MD")
  wait_for "chat $url" 60 || { bad "no answer through the Service $url"; return; }
  t_first=$(python3 -c "import time; print(f'{time.time() - $t0:.1f}')")
  APPLY_TO_ANSWER=$t_first
  ok "kubectl apply -> pod Ready -> a chat answer through the ClusterIP $url (kube-proxy): ${t_first}s, '$(chat "$url" | head -c 40)'"
  "$KUBECTL" --kubeconfig "$ADMIN_KUBECONFIG" port-forward "svc/$MD" 18080:8000 >"$NODE_DIR/logs/port-forward.log" 2>&1 &
  local pf=$!
  if wait_for "chat http://127.0.0.1:18080" 20; then ok "a chat answer through kubectl port-forward svc/$MD"; else bad "kubectl port-forward"; fi
  kill "$pf" 2>/dev/null; wait "$pf" 2>/dev/null

  pod=$(ready_pods "$MD" | head -n1)
  wait_for "[ \"\$(kubectl get md $MD -o jsonpath='{.status.conditions[?(@.type==\"PlanVerified\")].status}')\" = True ]" 60 ||
    bad "PlanVerified is not True: $(kubectl get md $MD -o jsonpath='{.status.conditions}')"
  local src mem limit cg
  src=$(kubectl get md "$MD" -o jsonpath='{.status.observedPlan.memorySource}')
  mem=$(kubectl get md "$MD" -o jsonpath='{.status.observedPlan.memoryBytes}')
  limit=$(bytes "$(kubectl get deploy "$MD" -o jsonpath='{.spec.template.spec.containers[0].resources.limits.memory}')")
  cg=$(cat "$(cgroup_file "$pod" memory.limit_in_bytes)" 2>/dev/null || cat "$(cgroup_file "$pod" memory.max)")
  if [[ $src == cgroup* && $mem == "$limit" && $cg == "$limit" ]]; then
    ok "in the pod: the cgroup's memory limit $cg = the plan's limit $limit; the server planned from it (memorySource $src, $mem bytes); PlanVerified True"
  else
    bad "memory: cgroup '$cg', plan limit '$limit', server memoryBytes '$mem' from '$src'"
  fi
}

# The model on a hostPath PersistentVolume, read through pvc://, by the image
# that has no model in it.
check_pvc() {
  local dir="$NODE_DIR/pv/models" name=smollm2-pvc
  mkdir -p "$dir" && cp -L models/SmolLM2-135M-Instruct.Q4_1.gguf "$dir/" && chmod -R a+rX "$NODE_DIR/pv"
  readonly_claim ferrox-models models "$dir" || { bad "PV/PVC"; return; }
  sed -e "s/^  name: smollm2$/  name: $name/" -e 's|file:///models/|pvc://models/|' -e "s/servedName: smollm2/servedName: $name/" \
    -e 's|^  replicas: 1|  image: localhost/ferrox-server:latest\n  replicas: 1|' examples/smollm2-cpu.yaml | kubectl apply -f - >/dev/null
  if wait_for "md_ready $name" 240 && wait_for "chat $(svc_url $name) $name" 60; then
    ok "pvc://models/...: the model from a hostPath PV, the image without a baked model, serves through its Service"
  else
    dump; bad "the pvc:// ModelDeployment does not serve"
  fi
  kubectl delete md "$name" --wait=true --timeout 90s >>"$NODE_DIR/logs/kubectl.log" 2>&1
  kubectl delete pvc models --wait=false >/dev/null; kubectl delete pv ferrox-models --wait=false >/dev/null
}

check_scale() {
  kubectl scale md "$MD" --replicas 2 >/dev/null || { bad "kubectl scale md"; return; }
  if ! wait_for "[ \$(ready_pods $MD | wc -l) = 2 ]" 240; then dump; bad "2 replicas not Ready"; return; fi
  local p ip answered=0
  for p in $(ready_pods "$MD"); do
    ip=$(kubectl get pod "$p" -o jsonpath='{.status.podIP}')
    chat "http://$ip:8000" >/dev/null && answered=$((answered + 1))
  done
  if ((answered == 2)); then ok "kubectl scale md $MD --replicas 2: both pods Ready, both answer on their pod addresses"; else bad "$answered of 2 pods answered"; fi
}

# A spec change rolls the pods while a client keeps asking: nothing may fail
# but what a server refused with its documented retryable status.
check_rollout() {
  local url out="$NODE_DIR/rollout.json" gen
  url=$(svc_url "$MD")
  python3 "$CLIENT" load --url "$url" --model "$MD" --stop-file "$NODE_DIR/stop-load" --out "$out" &
  local client=$!
  sleep 3
  gen=$(kubectl get deploy "$MD" -o jsonpath='{.metadata.generation}')
  # With the stall switch check_restarts uses.
  local env='[{"name":"FERROX_FAULT_STALL_REQUEST_ID","value":"ferrox-stall"},{"name":"FERROX_STALL_TIMEOUT","value":"5"}]'
  kubectl patch md "$MD" --type merge \
    -p "{\"spec\":{\"engine\":{\"maxSeqs\":8},\"env\":$env}}" >/dev/null
  wait_for "[ \$(kubectl get deploy $MD -o jsonpath='{.metadata.generation}') -gt $gen ]" 30
  local rolled=0
  wait_for "kubectl rollout status deploy/$MD --timeout 2s" 300 && rolled=1
  wait_for "[ \$(pods_of $MD | wc -l) = 2 ]" 120
  sleep 3
  touch "$NODE_DIR/stop-load"; wait "$client"
  local summary failed
  summary=$(python3 -c "import json; r=json.load(open('$out')); print(r['total'], r['ok'], r['retryable'], r['failed'], r['errors'][:3])")
  read -r total okc retry failed _ <<<"$summary"
  ROLLOUT_SUMMARY="$total requests, $okc answered, $retry refused retryably, $failed failed"
  if ((rolled)) && [[ $failed == 0 && $okc -gt 0 ]] &&
    kubectl get deploy "$MD" -o jsonpath='{.spec.template.spec.containers[0].args}' | grep -q '"--max-seqs","8"'; then
    ok "engine.maxSeqs 16 -> 8 rolled both pods under load: $ROLLOUT_SUMMARY"
  else
    bad "rollout (rolled=$rolled): $summary"
  fi
}

check_restarts() {
  local pod pid before
  pod=$(ready_pods "$MD" | head -n1)
  before=$(kubectl get pod "$pod" -o jsonpath='{.status.containerStatuses[0].restartCount}')
  pid=$(server_pid "$pod")
  [[ -n $pid ]] && kill -9 "$pid"
  if wait_for "[ \$(kubectl get pod $pod -o jsonpath='{.status.containerStatuses[0].restartCount}') -gt $before ]" 60 &&
    wait_for "[ \"\$(kubectl get pod $pod -o jsonpath='{.status.containerStatuses[0].ready}')\" = true ]" 120 &&
    chat "http://$(kubectl get pod "$pod" -o jsonpath='{.status.podIP}'):8000" >/dev/null; then
    ok "the server process (pid $pid on the host) killed: the kubelet restarted its container and it serves again"
  else
    bad "no restart after the server was killed"
  fi
  # A stalled worker: the test-only fault switch (FERROX_FAULT_STALL_REQUEST_ID,
  # docs/operator.md) makes the request with that id hang the worker's step.
  pod=$(ready_pods "$MD" | head -n1)
  before=$(kubectl get pod "$pod" -o jsonpath='{.status.containerStatuses[0].restartCount}')
  local ip
  ip=$(kubectl get pod "$pod" -o jsonpath='{.status.podIP}')
  curl -s --max-time 5 "http://$ip:8000/v1/chat/completions" -H 'X-Request-Id: ferrox-stall' \
    -H 'Content-Type: application/json' -d "$CHAT" >/dev/null
  local health=000
  wait_for "[ \$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 http://$ip:8000/health) = 503 ]" 30 && health=503
  if [[ $health == 503 ]] &&
    wait_for "[ \$(kubectl get pod $pod -o jsonpath='{.status.containerStatuses[0].restartCount}') -gt $before ]" 120 &&
    wait_for "[ \"\$(kubectl get pod $pod -o jsonpath='{.status.containerStatuses[0].ready}')\" = true ]" 120; then
    ok "a stalled worker: /health 503, the liveness probe restarted the container, Ready again"
  else
    bad "stalled worker: /health $health, restarts $(kubectl get pod "$pod" -o jsonpath='{.status.containerStatuses[0].restartCount}')"
  fi
}

check_delete() {
  local url out="$NODE_DIR/stream.json"
  url=$(svc_url "$MD")
  python3 "$CLIENT" stream --url "$url" --model "$MD" --started-file "$NODE_DIR/stream-started" --max-tokens "$STREAM_TOKENS" --seconds "$STREAM_SECONDS" --out "$out" &
  local client=$!
  wait_for "[ -f $NODE_DIR/stream-started ]" 30
  local t_delete
  t_delete=$(date +%s.%N)
  kubectl delete md "$MD" --wait=false >>"$NODE_DIR/logs/kubectl.log" 2>&1
  wait "$client"
  local reason after
  reason=$(python3 -c "import json; print(json.load(open('$out')).get('finish_reason'))" 2>/dev/null)
  after=$(python3 -c "import json; print(f\"{json.load(open('$out'))['ended'] - $t_delete:.1f}\")" 2>/dev/null)
  # The stream outlives the pre-stop sleep: it ends in the drain, after SIGTERM.
  if [[ $reason == length ]] && python3 -c "import sys; sys.exit(not float('$after') > $PRE_STOP)"; then
    ok "kubectl delete md during a stream: it ended with finish_reason=$reason ${after}s after the delete (pre-stop ${PRE_STOP}s, then the drain)"
  else
    bad "the stream should end with finish_reason=length after the ${PRE_STOP}s pre-stop, in the drain; it ended ${after:-?}s after the delete: $(cat "$out" 2>/dev/null)"
  fi
  local kinds="deployment,replicaset,pod,service,poddisruptionbudget"
  if wait_for "[ -z \"\$(kubectl get $kinds -l app.kubernetes.io/instance=$MD -o name)\" ]" 120; then
    ok "nothing left of $MD ($kinds)"
  else
    bad "left: $(kubectl get $kinds -l app.kubernetes.io/instance=$MD -o name | tr '\n' ' ')"
  fi
}

check_uninstall() {
  helm uninstall "$RELEASE" -n "$NS" --wait --timeout 90s >/dev/null || bad "helm uninstall"
  # The operator's pod goes by the garbage collector, after helm returns. Its
  # Lease is the operator's, not the chart's: it stays, as leader election's do.
  wait_for "[ -z \"\$(kubectl -n $NS get pods -o name)\" ]" 60
  local left
  left=$(kubectl get all,serviceaccount,role,rolebinding,lease -n "$NS" -o name 2>/dev/null | grep -v -e '^serviceaccount/default$' -e '^lease\.' || true)
  left+=$(kubectl get clusterrole,clusterrolebinding -o name | grep ferrox || true)
  if kubectl get crd modeldeployments.ferrox.dev >/dev/null 2>&1 && [[ -z $left ]]; then
    ok "helm uninstall leaves the CRD and nothing else"
  else
    bad "helm uninstall: CRD $(kubectl get crd modeldeployments.ferrox.dev -o name 2>&1), left: $left"
  fi
}

run_checks() {
  check_apply
  check_pvc
  check_scale
  check_rollout
  check_restarts
  run_router_checks
  check_delete
  check_uninstall
  echo "# figures: apply -> first answer ${APPLY_TO_ANSWER:-?}s; rollout: ${ROLLOUT_SUMMARY:-?}; router: ${ROUTER_FIGURES:-?}"
}
