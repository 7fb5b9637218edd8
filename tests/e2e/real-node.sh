#!/usr/bin/env bash
# Ferrox on a real Kubernetes node (root): the chart and the examples as a
# user runs them, every pod a real container (tests/e2e/node/node.sh says
# what the node is made of). The images are built here (scripts/build-images,
# from target/debug, stripped) and imported into the node's containerd.
#
#   tests/e2e/real-node.sh        # up, every check, down; "N passed, M failed" last
#   tests/e2e/real-node.sh up     # leaves the node up with the chart installed;
#                                 # its last line is `export KUBECONFIG=...`
#   tests/e2e/real-node.sh down   # removes everything `up` made
#
# Traffic goes only to loopback, the node's bridge address and the pods'
# addresses; every wait is bounded; down runs on every exit (trap).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT"
# shellcheck source=node/node.sh
source "$ROOT/tests/e2e/node/node.sh"
mode=${1:-test}
if ((EUID != 0)); then echo "real-node.sh: needs root (containerd, the kubelet, a bridge)" >&2; exit 1; fi
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
NS=ferrox-system
RELEASE=ferrox

if [[ $mode == down ]]; then
  node_down
  left=$(node_leftovers)
  [[ -z $left ]] || { echo "left behind: $left" >&2; exit 1; }
  exit 0
fi

T0=$(date +%s)
TOOLS="$(tests/chart/setup-tools | tail -n1)"
KUBECTL="$TOOLS/kubectl"; HELM="$TOOLS/helm"
node_build "$ROOT" || { echo "node build failed" >&2; exit 1; }
if [[ ! -x $TARGET/debug/ferrox-server || ! -x $TARGET/debug/ferrox-operator || ! -x $TARGET/debug/ferrox-router ]]; then
  cargo build -q --locked -p ferrox-server -p ferrox-operator -p ferrox-router
fi
# ferrox-operator, ferrox-router, ferrox-server, ferrox-server-smollm2.
mapfile -t IMAGES < <(FERROX_IMAGE_PROFILE=debug scripts/build-images | tail -n4)
((${#IMAGES[@]} == 4)) || { echo "build-images did not print four archives" >&2; exit 1; }
echo "# setup (builds, cached after the first run): $(($(date +%s) - T0))s"

pass=0 failed=0
ok() { echo "ok - $*"; pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; failed=$((failed + 1)); }
kubectl() { KUBECONFIG="$ADMIN_KUBECONFIG" "$KUBECTL" "$@"; }
helm() { KUBECONFIG="$ADMIN_KUBECONFIG" "$HELM" "$@"; }
wait_for() { node_wait "$1" "${2:-60}"; }
dump() {
  echo "--- pods"; kubectl get pods -A -o wide 2>&1 | tail -20
  echo "--- events"; kubectl get events -A --sort-by=.lastTimestamp 2>&1 | tail -15
  local l
  for l in kubelet containerd kube-apiserver; do echo "--- $l.log (tail)"; tail -8 "$NODE_DIR/logs/$l.log"; done
}

T_UP=$(date +%s)
trap 'node_down; left=$(node_leftovers); [[ -z $left ]] || echo "left behind: $left"' EXIT
trap "exit 130" INT TERM
node_up "$ROOT" || { dump; echo "$pass passed, 1 failed"; exit 1; }
for a in "${IMAGES[@]}"; do node_import "$a" || { echo "import of $a failed"; exit 1; }; done
ok "node Ready: etcd, kube-apiserver, controller-manager, scheduler, containerd + runc, kubelet, kube-proxy, bridge CNI ($(($(date +%s) - T_UP))s)"

helm install "$RELEASE" charts/ferrox --namespace "$NS" --create-namespace \
  --set image.repository=localhost/ferrox-operator --set image.tag=latest \
  --set router.image.repository=localhost/ferrox-router --set router.image.tag=latest \
  --set serverImage=localhost/ferrox-server-smollm2:latest --set scrapeIntervalSeconds=2 \
  >"$NODE_DIR/logs/helm.log" 2>&1 || { cat "$NODE_DIR/logs/helm.log"; bad "helm install"; }
if wait_for "kubectl -n $NS wait --for condition=Available deployment/$RELEASE --timeout 2s" 120; then
  op_pod=$(kubectl -n "$NS" get pod -l app.kubernetes.io/name=ferrox-operator -o jsonpath='{.items[0].metadata.name}')
  holder=$(kubectl -n "$NS" get lease ferrox-operator -o jsonpath='{.spec.holderIdentity}' 2>/dev/null)
  sa=$(kubectl -n "$NS" get pod "$op_pod" -o jsonpath='{.spec.serviceAccountName}')
  if wait_for "[ \"\$(kubectl -n $NS get lease ferrox-operator -o jsonpath='{.spec.holderIdentity}')\" = $op_pod ]" 60 &&
    [[ $sa == "$RELEASE" ]]; then
    ok "helm install: the operator pod $op_pod Ready from localhost/ferrox-operator, holds the Lease, as ServiceAccount $sa"
  else
    bad "operator pod $op_pod: Lease holder '$holder', ServiceAccount '$sa'"
  fi
else
  dump; bad "the operator pod is not Ready"
fi

if [[ $mode == up ]]; then
  trap - EXIT
  echo "# the node is up ($(($(date +%s) - T0))s); tests/e2e/real-node.sh down removes it"
  echo "export KUBECONFIG=$ADMIN_KUBECONFIG"
  exit 0
fi

source "$ROOT/tests/e2e/node/checks.sh"
run_checks

echo "$pass passed, $failed failed"
((failed == 0))
