# Sourced by the control-plane tests: start_etcd runs etcd from $CACHE/bin
# on 127.0.0.1:$ETCD_PORT (peers on the next port) with its data and log in
# $WORK, adds it to PIDS, and returns once it answers: the API server gives
# up on an etcd that is slow to start (a loaded machine).
start_etcd() {
  "$CACHE/bin/etcd" --data-dir "$WORK/etcd" --listen-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" --listen-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
    >"$WORK/etcd.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 120); do curl -sf "http://127.0.0.1:$ETCD_PORT/health" >/dev/null && return 0; sleep 0.5; done
  echo "etcd did not answer on $ETCD_PORT:" >&2; tail -5 "$WORK/etcd.log" >&2; return 1
}
