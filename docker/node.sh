#!/bin/sh
# One node of the demo cluster (docker-compose.yml). `vigil-node server` runs a server agent.
# `vigil-node client` runs a client agent and beside it the demo worker: an endless loop of
# `vigil lock --fair demo/leader -- vigil-demo worker ...`, each round one turn of holding the
# lock and writing its fencing token to the bank, then back to the end of the queue.
# Settings come from the environment docker-compose.yml sets; the gossip key and the TLS files
# from /secrets (written by docker/build.sh).
set -eu

role=${1:?usage: vigil-node server|client}
: "${NODE:?}" "${IP:?}" "${JOIN:?}"
set -- --node "$NODE" --serf-addr "$IP:8301" --http-addr 0.0.0.0:8500 \
  --encrypt "$(cat /secrets/gossip.key)" --ca-file /secrets/vigil-agent-ca.pem \
  --cert-file "/secrets/$NODE.pem" --key-file "/secrets/$NODE-key.pem" \
  --gossip-profile "${GOSSIP_PROFILE:-lan}" --session-ttl-min "${SESSION_TTL_MIN:-10s}"
for addr in $JOIN; do set -- "$@" --join "$addr"; done

if [ "$role" = server ]; then
  exec vigil agent --server --bootstrap-expect 3 --data-dir /data --rpc-addr "$IP:8300" "$@"
fi

vigil agent "$@" &
agent=$!
lock=
stop() {
  # A graceful leave for the agent; `vigil lock` forwards the signal to the worker.
  kill -TERM $lock $agent 2>/dev/null || true
  wait
  exit 0
}
trap stop TERM INT

# Health checks through the agent's API: demo-bank (HTTP, the bank answers) and demo-worker
# (TTL, passed by the worker at each turn). Retried until the agent answers.
until vigil-demo checks --bank "${BANK:?}" >/dev/null 2>&1; do sleep 1; done
while :; do
  vigil lock --fair --ttl "${LOCK_TTL:-10s}" --lock-delay "${LOCK_DELAY:-5s}" \
    --name "demo worker on $NODE" demo/leader -- \
    vigil-demo worker --bank "$BANK" --name "$NODE" --check demo-worker \
    --writes "${WORKER_WRITES:-10}" --interval "${WORKER_INTERVAL:-1s}" &
  lock=$!
  status=0
  wait $lock || status=$?
  lock=
  if [ $status -ne 0 ]; then
    echo "vigil-node: vigil lock exited with status $status; queueing again in 1s" >&2
    sleep 1
  fi
done
