# Sourced by tests/e2e/real-node.sh: a one-node Kubernetes cluster on this
# machine (root), every part real: etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, a kubelet and kube-proxy (iptables mode) built from the same
# k8s.io/kubernetes module, Debian's containerd + runc, and a bridge CNI
# (Debian's containernetworking-plugins).
#
# Network: one bridge this file creates ($BRIDGE, $GW/24). Pods live in the
# network namespaces containerd creates for them; the control plane listens on
# $GW (pods must reach it through the `kubernetes` Service) and on loopback.
# Nothing is sent anywhere else.
#
# Everything it makes is under $NODE_DIR (processes' pid files, logs, state),
# plus what node_down removes by name: the bridge, the pods' netns, the
# kubepods cgroups, the KUBE-* iptables chains, /var/log/containers links and
# the sysctls the kubelet and kube-proxy change (restored from node_up's copy).

NODE_DIR=${FERROX_NODE_DIR:-/var/tmp/ferrox-node}
CACHE=${FERROX_CACHE:-$HOME/.cache/ferrox}
NODE_NAME=ferrox-node
BRIDGE=ferrox0
GW=10.244.0.1
POD_CIDR=10.244.0.0/24
SVC_CIDR=10.96.0.0/16
# Ports apart from the other control-plane tests', below the ephemeral range.
ETCD_PORT=13379 API_PORT=13443 KCM_PORT=13257 SCHED_PORT=13259
KUBELET_PORT=13250 KUBELET_HEALTHZ=13248 PROXY_HEALTHZ=13256 PROXY_METRICS=13249
SOCK="$NODE_DIR/containerd/containerd.sock"
# What the kubelet (kernel tunables) and kube-proxy (forwarding) may change.
SYSCTLS=(net/ipv4/ip_forward vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops
  kernel/keys/root_maxkeys kernel/keys/root_maxbytes net/bridge/bridge-nf-call-iptables)

node_log() { printf '# node: %s\n' "$*" >&2; }

# Runs a daemon in the background with its log and pid file under $NODE_DIR.
node_start() {
  local name=$1; shift
  "$@" >"$NODE_DIR/logs/$name.log" 2>&1 &
  echo $! >"$NODE_DIR/pids/$name"
  # node_down stops it (also from another shell, after `up`): no job notices.
  disown $!
}

node_wait() { # cmd, seconds
  local i
  for ((i = 0; i < ${2:-60} * 2; i++)); do eval "$1" >/dev/null 2>&1 && return 0; sleep 0.5; done
  return 1
}

# The binaries and the images, built once and cached (keyed by their inputs).
node_build() {
  local root=$1
  bash "$root/tests/operator/setup-apiserver.sh" all >/dev/null
  local c
  for c in kube-controller-manager kube-scheduler kubelet kube-proxy; do
    bash "$root/tests/e2e/setup-component.sh" "$c" >/dev/null
  done
  local pkgs=()
  for p in containerd runc containernetworking-plugins iptables conntrack gcc libc6-dev buildah; do
    dpkg -s "$p" >/dev/null 2>&1 || pkgs+=("$p")
  done
  if ((${#pkgs[@]})); then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
  fi
  node_pause_image "$root"
}

# The sandbox image: tests/e2e/node/pause.c, static, in an image of its own.
node_pause_image() {
  local root=$1 key dir ctr
  key=$(cat "$root/tests/e2e/node/pause.c" "$root/tests/e2e/node/node.sh" | sha256sum | cut -c1-16)
  PAUSE_ARCHIVE="$CACHE/images/ferrox-pause-$key.oci.tar"
  [[ -f $PAUSE_ARCHIVE ]] && return
  mkdir -p "$CACHE/images"
  dir=$(mktemp -d)
  gcc -static -O2 -o "$dir/pause" "$root/tests/e2e/node/pause.c"
  local bah=(buildah --root "$CACHE/buildah/root" --runroot "$CACHE/buildah/run" --storage-driver vfs)
  ctr=$("${bah[@]}" from scratch)
  "${bah[@]}" copy "$ctr" "$dir/pause" /pause >/dev/null
  "${bah[@]}" config --entrypoint '["/pause"]' --user 65535:65535 "$ctr"
  "${bah[@]}" commit --quiet --rm "$ctr" localhost/ferrox-pause:1 >/dev/null
  "${bah[@]}" push --quiet localhost/ferrox-pause:1 "oci-archive:$PAUSE_ARCHIVE.part:localhost/ferrox-pause:1"
  mv "$PAUSE_ARCHIVE.part" "$PAUSE_ARCHIVE"
  rm -rf "$dir"
}

node_certs() {
  local d="$NODE_DIR/pki"
  mkdir -p "$d"
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$d/ca.key" -out "$d/ca.crt" -days 2 \
    -subj /CN=ferrox-node-ca 2>/dev/null
  local san="subjectAltName=IP:$GW,IP:10.96.0.1,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default"
  san+=",DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  openssl req -newkey rsa:2048 -nodes -keyout "$d/apiserver.key" -out "$d/apiserver.csr" \
    -subj /CN=kube-apiserver 2>/dev/null
  openssl x509 -req -in "$d/apiserver.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial \
    -out "$d/apiserver.crt" -days 2 -extfile <(printf '%s\nextendedKeyUsage=serverAuth\n' "$san") 2>/dev/null
  # The API server's client certificate towards the kubelet (logs, port-forward).
  openssl req -newkey rsa:2048 -nodes -keyout "$d/kubelet-client.key" -out "$d/kubelet-client.csr" \
    -subj "/CN=kube-apiserver-kubelet-client/O=system:masters" 2>/dev/null
  openssl x509 -req -in "$d/kubelet-client.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial \
    -out "$d/kubelet-client.crt" -days 2 -extfile <(echo extendedKeyUsage=clientAuth) 2>/dev/null
  openssl genrsa -out "$d/sa.key" 2048 2>/dev/null
}

# A kubeconfig for one identity (each component has a token of its own).
node_kubeconfig() { # file user
  local token
  token="ferrox-$2-$(openssl rand -hex 12)"
  echo "$token,$2,$2,system:masters" >>"$NODE_DIR/pki/tokens.csv"
  cat >"$1" <<YAML
apiVersion: v1
kind: Config
clusters: [{name: node, cluster: {server: "https://$GW:$API_PORT", certificate-authority: "$NODE_DIR/pki/ca.crt"}}]
users: [{name: $2, user: {token: "$token"}}]
contexts: [{name: node, context: {cluster: node, user: $2, namespace: default}}]
current-context: node
YAML
}

node_containerd_config() {
  mkdir -p "$NODE_DIR/cni/net.d" "$NODE_DIR/containerd"
  cat >"$NODE_DIR/containerd/config.toml" <<TOML
version = 2
root = "$NODE_DIR/containerd/root"
state = "$NODE_DIR/containerd/state"
[grpc]
  address = "$SOCK"
[ttrpc]
  address = "$SOCK.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "$NODE_DIR/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/ferrox-pause:1"
  # No CAP_SYS_RESOURCE here: a negative oom_score_adj is refused even for root.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$NODE_DIR/cni/net.d"
TOML
  cat >"$NODE_DIR/cni/net.d/10-ferrox.conflist" <<JSON
{"cniVersion": "1.0.0", "name": "ferrox-node", "plugins": [
  {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "dataDir": "$NODE_DIR/cni/ipam",
            "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$GW"}]], "routes": [{"dst": "0.0.0.0/0"}]}}
]}
JSON
}

node_kubelet_config() {
  cat >"$NODE_DIR/kubelet/config.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $GW
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ
containerRuntimeEndpoint: unix://$SOCK
cgroupDriver: cgroupfs
failSwapOn: false
podCIDR: $POD_CIDR
podLogsDir: $NODE_DIR/pod-logs
maxPods: 20
clusterDomain: cluster.local
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $NODE_DIR/pki/ca.crt}
authorization: {mode: AlwaysAllow}
# A test machine's disk and memory: never evict for them, never GC images.
evictionHard: {memory.available: "50Mi", nodefs.available: "1%", imagefs.available: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
nodeStatusUpdateFrequency: 4s
syncFrequency: 10s
fileCheckFrequency: 10s
YAML
}

node_proxy_config() {
  cat >"$NODE_DIR/kube-proxy.yaml" <<YAML
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $NODE_DIR/kube-proxy.kubeconfig}
hostnameOverride: $NODE_NAME
mode: iptables
clusterCIDR: $POD_CIDR
bindAddress: 127.0.0.1
healthzBindAddress: 127.0.0.1:$PROXY_HEALTHZ
metricsBindAddress: 127.0.0.1:$PROXY_METRICS
nodePortAddresses: ["$GW/32"]
# Leave the host's conntrack sysctls and route_localnet alone.
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
iptables: {localhostNodePorts: false, syncPeriod: 5s, minSyncPeriod: 0s}
YAML
}

node_save_host() {
  mkdir -p "$NODE_DIR/host"
  local s
  for s in "${SYSCTLS[@]}"; do
    [[ -f /proc/sys/$s ]] && printf '%s %s\n' "$s" "$(cat "/proc/sys/$s")"
  done >"$NODE_DIR/host/sysctls"
  ls /var/run/netns 2>/dev/null | sort >"$NODE_DIR/host/netns" || true
  [[ -d /var/log/containers ]] && touch "$NODE_DIR/host/had-var-log-containers"
  [[ -d /var/log/pods ]] && touch "$NODE_DIR/host/had-var-log-pods"
  return 0
}

# Brings the cluster up. Needs node_build first. ADMIN_KUBECONFIG is set after.
node_up() {
  local root=$1
  [[ -e $NODE_DIR ]] && { node_log "$NODE_DIR exists: run 'real-node.sh down' first"; return 1; }
  mkdir -p "$NODE_DIR"/{logs,pids,kubelet,pod-logs}
  node_save_host
  node_certs
  ADMIN_KUBECONFIG="$NODE_DIR/admin.kubeconfig"
  local c
  for c in admin kubelet kube-proxy controller-manager scheduler; do
    node_kubeconfig "$NODE_DIR/$c.kubeconfig" "$c"
  done
  sed -i "s/^\([^,]*\),kubelet,kubelet,/\1,system:node:$NODE_NAME,kubelet,/" "$NODE_DIR/pki/tokens.csv"
  # The bridge first: the API server listens on its address.
  ip link add "$BRIDGE" type bridge && ip addr add "$GW/24" dev "$BRIDGE" && ip link set "$BRIDGE" up || return 1
  # ClusterIPs from the host leave by the bridge (kube-proxy's DNAT picks the
  # pod), not by the default route; the route goes with the bridge.
  ip route add "$SVC_CIDR" dev "$BRIDGE" src "$GW" || return 1
  # Pod -> Service -> pod on this bridge is routed by the host.
  echo 1 >/proc/sys/net/ipv4/ip_forward
  echo 1 >/proc/sys/net/bridge/bridge-nf-call-iptables

  WORK=$NODE_DIR
  # shellcheck source=../../operator/etcd.sh
  source "$root/tests/operator/etcd.sh"
  PIDS=()
  start_etcd || return 1
  echo "${PIDS[0]}" >"$NODE_DIR/pids/etcd"
  disown "${PIDS[0]}"
  node_start kube-apiserver "$CACHE/bin/kube-apiserver" --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address "$GW" --advertise-address "$GW" --secure-port "$API_PORT" \
    --tls-cert-file "$NODE_DIR/pki/apiserver.crt" --tls-private-key-file "$NODE_DIR/pki/apiserver.key" \
    --client-ca-file "$NODE_DIR/pki/ca.crt" --token-auth-file "$NODE_DIR/pki/tokens.csv" \
    --authorization-mode RBAC --service-cluster-ip-range "$SVC_CIDR" \
    --service-account-issuer https://kubernetes.default.svc --service-account-key-file "$NODE_DIR/pki/sa.key" \
    --service-account-signing-key-file "$NODE_DIR/pki/sa.key" \
    --kubelet-client-certificate "$NODE_DIR/pki/kubelet-client.crt" \
    --kubelet-client-key "$NODE_DIR/pki/kubelet-client.key" \
    --kubelet-preferred-address-types InternalIP --allow-privileged=false
  node_wait "curl -sf --cacert $NODE_DIR/pki/ca.crt https://$GW:$API_PORT/readyz -H 'Authorization: Bearer $(node_token admin)'" 120 ||
    { node_log "kube-apiserver not ready"; return 1; }
  node_start kube-controller-manager "$CACHE/bin/kube-controller-manager" \
    --kubeconfig "$NODE_DIR/controller-manager.kubeconfig" --bind-address 127.0.0.1 --secure-port "$KCM_PORT" \
    --cert-dir "$NODE_DIR/kcm-certs" --service-account-private-key-file "$NODE_DIR/pki/sa.key" \
    --root-ca-file "$NODE_DIR/pki/ca.crt" --use-service-account-credentials=false --leader-elect=false \
    --controllers '*' --configure-cloud-routes=false \
    --authentication-skip-lookup
  node_start kube-scheduler "$CACHE/bin/kube-scheduler" --kubeconfig "$NODE_DIR/scheduler.kubeconfig" \
    --authentication-kubeconfig "$NODE_DIR/scheduler.kubeconfig" --authorization-kubeconfig "$NODE_DIR/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$SCHED_PORT" --leader-elect=false
  node_containerd_config
  node_start containerd containerd --config "$NODE_DIR/containerd/config.toml"
  node_wait "ctr -a $SOCK version" 30 || { node_log "containerd not up"; return 1; }
  node_import "$PAUSE_ARCHIVE" || return 1
  node_kubelet_config
  node_start kubelet "$CACHE/bin/kubelet" --config "$NODE_DIR/kubelet/config.yaml" \
    --kubeconfig "$NODE_DIR/kubelet.kubeconfig" --root-dir "$NODE_DIR/kubelet/root" \
    --cert-dir "$NODE_DIR/kubelet/pki" --hostname-override "$NODE_NAME" --node-ip "$GW" --v 1
  node_proxy_config
  node_start kube-proxy "$CACHE/bin/kube-proxy" --config "$NODE_DIR/kube-proxy.yaml"
  node_wait "KUBECONFIG=$ADMIN_KUBECONFIG $KUBECTL wait --for condition=Ready node/$NODE_NAME --timeout 2s" 90 ||
    { node_log "node not Ready"; return 1; }
  node_wait "curl -sf http://127.0.0.1:$PROXY_HEALTHZ/healthz" 30 || { node_log "kube-proxy not healthy"; return 1; }
}

node_token() { grep ",$1,$1," "$NODE_DIR/pki/tokens.csv" | cut -d, -f1; }

# Imports an OCI archive into containerd's k8s.io namespace (the kubelet's).
node_import() {
  ctr -a "$SOCK" -n k8s.io images import --no-unpack=false --digests "$1" >/dev/null
}

# Stops everything node_up started and removes what it made, whatever state
# it is in (also a half-made node after a failed step). Reports leftovers.
node_down() {
  [[ -d $NODE_DIR ]] || return 0
  local name pid
  # The kubelet first, so it restarts nothing; then every container by cgroup.
  node_kill kube-proxy kubelet kube-scheduler kube-controller-manager
  node_kill_pods
  node_kill containerd
  pkill -9 -f "containerd-shim.*-address $SOCK" 2>/dev/null || true
  node_kill kube-apiserver etcd
  [[ -x $CACHE/bin/kube-proxy ]] && "$CACHE/bin/kube-proxy" --cleanup >/dev/null 2>&1 || true
  node_iptables_cleanup
  node_netns_cleanup
  ip link del "$BRIDGE" 2>/dev/null || true
  node_cgroup_cleanup
  # Mounts under the node's folder (kubelet volumes, sandbox shm, rootfs), deepest first.
  findmnt -rn -o TARGET | grep "^$NODE_DIR/" | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
  node_restore_sysctls
  node_logs_cleanup
  rm -rf "$NODE_DIR"
  [[ ! -e $NODE_DIR ]] || node_log "could not remove $NODE_DIR"
}

# SIGTERM to each named daemon, SIGKILL to what is still up 5 s later.
node_kill() {
  local name pids=() pid i
  for name in "$@"; do
    pid=$(cat "$NODE_DIR/pids/$name" 2>/dev/null) || continue
    pids+=("$pid")
    rm -f "$NODE_DIR/pids/$name"
  done
  ((${#pids[@]})) || return 0
  kill "${pids[@]}" 2>/dev/null
  for ((i = 0; i < 20; i++)); do
    local alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    ((alive)) || return 0
    sleep 0.25
  done
  kill -9 "${pids[@]}" 2>/dev/null || true
}

node_cgroup_dirs() { find /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods -depth -type d 2>/dev/null; }

node_kill_pods() {
  local d p i
  for ((i = 0; i < 10; i++)); do
    local any=0
    while read -r d; do
      [[ -f $d/cgroup.procs ]] || continue
      while read -r p; do [[ -n $p ]] && { kill -9 "$p" 2>/dev/null; any=1; }; done <"$d/cgroup.procs"
    done < <(node_cgroup_dirs)
    ((any)) || break
    sleep 0.5
  done
}

node_cgroup_cleanup() {
  local d i
  for ((i = 0; i < 10; i++)); do
    node_cgroup_dirs | while read -r d; do rmdir "$d" 2>/dev/null || true; done
    [[ -z $(node_cgroup_dirs) ]] && return 0
    node_kill_pods; sleep 0.5
  done
  node_log "kubepods cgroups left: $(node_cgroup_dirs | head -3 | tr '\n' ' ')"
}

node_netns_cleanup() {
  local n
  [[ -f $NODE_DIR/host/netns ]] || return 0
  for n in $(ls /var/run/netns 2>/dev/null | sort | comm -13 "$NODE_DIR/host/netns" -); do
    [[ $n == cni-* ]] && ip netns delete "$n" 2>/dev/null
  done
  rm -rf /var/lib/cni/results/ferrox-node-* 2>/dev/null || true
}

# The kubelet's canary chains and anything kube-proxy's --cleanup left.
node_iptables_cleanup() {
  local ipt table chain
  for ipt in iptables ip6tables; do
    command -v "$ipt" >/dev/null || continue
    for table in filter nat mangle; do
      # Rules of built-in chains that jump to KUBE-* first, then the chains.
      "$ipt" -t "$table" -S 2>/dev/null | grep -E '^-A [A-Z]+ .*-j KUBE-' | grep -vE '^-A KUBE-' |
        while read -r rule; do eval "$ipt -t $table ${rule/-A/-D}" 2>/dev/null || true; done
      for chain in $("$ipt" -t "$table" -S 2>/dev/null | awk '/^-N KUBE-/{print $2}'); do
        "$ipt" -t "$table" -F "$chain" 2>/dev/null || true
      done
      for chain in $("$ipt" -t "$table" -S 2>/dev/null | awk '/^-N KUBE-/{print $2}'); do
        "$ipt" -t "$table" -X "$chain" 2>/dev/null || true
      done
    done
  done
}

node_restore_sysctls() {
  local s v
  [[ -f $NODE_DIR/host/sysctls ]] || return 0
  while read -r s v; do
    [[ $(cat "/proc/sys/$s" 2>/dev/null) == "$v" ]] || echo "$v" >"/proc/sys/$s" 2>/dev/null || true
  done <"$NODE_DIR/host/sysctls"
}

node_logs_cleanup() {
  local l
  for l in /var/log/containers/*; do
    [[ -L $l && $(readlink "$l") == "$NODE_DIR"/* ]] && rm -f "$l"
  done
  [[ -f $NODE_DIR/host/had-var-log-containers ]] || rmdir /var/log/containers 2>/dev/null || true
  [[ -f $NODE_DIR/host/had-var-log-pods ]] || rmdir /var/log/pods 2>/dev/null || true
}

# What node_down should have removed and did not (empty when clean).
node_leftovers() {
  [[ -e $NODE_DIR ]] && echo "dir $NODE_DIR"
  ip link show "$BRIDGE" >/dev/null 2>&1 && echo "bridge $BRIDGE"
  ip link show type veth 2>/dev/null | grep -q "master $BRIDGE" && echo "veth on $BRIDGE"
  [[ -n $(node_cgroup_dirs) ]] && echo "cgroups kubepods"
  findmnt -rn -o TARGET | grep -q "^$NODE_DIR" && echo "mounts under $NODE_DIR"
  iptables-save 2>/dev/null | grep -q 'KUBE-' && echo "iptables KUBE-* rules"
  pgrep -f "$NODE_DIR" >/dev/null && echo "processes naming $NODE_DIR"
  return 0
}
