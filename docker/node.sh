#!/bin/sh
# One node of the demo cluster (docker-compose.yml). `vigil-node server` runs a server agent.
# `vigil-node client` runs a client agent and beside it the demo worker: an endless loop of
# `vigil lock --fair demo/leader -- vigil-demo worker ...`, each round one turn of holding the
# lock and writing its fencing token to the bank, then back to the end of the queue.
# Settings come from the environment docker-compose.yml sets; the gossip key, the TLS files and
# the ACL token secrets from /secrets (written by docker/build.sh; each node has only its own).
#
# ACLs are on, default deny, on every agent. The servers create the management token
# (/secrets/acl-management.token) at the first leader's first term, and then make sure the
# demo's least-privilege token (/secrets/acl-demo-worker.token, policy demo-worker) exists,
# creating it with the management token. Each client waits for that token and runs
# `vigil-demo checks`, `vigil lock` and the worker with it alone. Only the servers have the
# management token's file: docker-compose.yml mounts in each container only its own secrets.
#
# The API: HTTPS on 0.0.0.0:8501 with the node's certificate (the port docker-compose.yml
# publishes on the host's 127.0.0.1), plain HTTP on the container's own 127.0.0.1:8500 only, for
# busybox wget (it speaks no TLS). Every request on either needs a token. vigil and vigil-demo
# here use HTTPS: CONSUL_HTTP_ADDR and CONSUL_CACERT come from docker-compose.yml.
set -eu

role=${1:?usage: vigil-node server|client}
: "${NODE:?}" "${IP:?}" "${JOIN:?}"

MANAGEMENT_TOKEN_FILE=/secrets/acl-management.token
DEMO_TOKEN_FILE=/secrets/acl-demo-worker.token

# The gossip key and the initial management token go in a config file (mode 0600), not on the
# command line, which `ps` shows to everyone on the host as well; so does the minimum session TTL
# (Consul's `session_ttl_min`, which no flag sets).
config=/tmp/vigil-agent.toml
(
  umask 077
  {
    echo "encrypt = \"$(cat /secrets/gossip.key)\""
    echo "session_ttl_min = \"${SESSION_TTL_MIN:-10s}\""
    if [ "$role" = server ]; then
      echo "[acl.tokens]"
      echo "initial_management = \"$(cat "$MANAGEMENT_TOKEN_FILE")\""
    fi
  } >"$config"
)

set -- --node "$NODE" --serf-addr "$IP:8301" --config "$config" \
  --http-addr 127.0.0.1:8500 --https-addr 0.0.0.0:8501 --acl-default-policy deny \
  --ca-file /secrets/vigil-agent-ca.pem \
  --cert-file "/secrets/$NODE.pem" --key-file "/secrets/$NODE-key.pem" \
  --gossip-profile "${GOSSIP_PROFILE:-lan}"
for addr in $JOIN; do set -- "$@" --join "$addr"; done

# What the demo token may do, and no more: queue for the fair lock demo/leader (`vigil lock
# --fair`: the server-side queue of that name, guarded as the key demo/leader) with a session on
# a client node, and register and pass the demo's health checks on its own node (node write on
# the client nodes c1, c2, c3).
DEMO_RULES='key "demo/leader" { policy = "write" }
session_prefix "c" { policy = "write" }
node_prefix "c" { policy = "write" }'

# No token from the environment: each command below names its own.
unset CONSUL_HTTP_TOKEN VIGIL_HTTP_TOKEN CONSUL_HTTP_TOKEN_FILE VIGIL_HTTP_TOKEN_FILE
as_management() { CONSUL_HTTP_TOKEN_FILE=$MANAGEMENT_TOKEN_FILE vigil "$@"; }
demo_token_works() {
  CONSUL_HTTP_TOKEN_FILE=$DEMO_TOKEN_FILE vigil acl token read --self >/dev/null 2>&1
}

if [ "$role" = server ]; then
  vigil agent --server --bootstrap-expect 3 --data-dir /data --rpc-addr "$IP:8300" "$@" &
  agent=$!
  trap 'kill -TERM $agent 2>/dev/null || true' TERM INT
  # Idempotent, and safe with the three servers at it together: whoever loses a race to create
  # the policy or the token fails, and the next round finds what the winner made. Retried until
  # the cluster answers (the agent starting, no leader yet, the management token not yet
  # written), for as long as the agent runs.
  rounds=0
  until demo_token_works || ! kill -0 $agent 2>/dev/null; do
    as_management acl policy read --name demo-worker >/dev/null 2>&1 ||
      as_management acl policy create --name demo-worker \
        --description "vigil-node: the demo workers and their health checks" \
        --rules "$DEMO_RULES" >/dev/null 2>&1 || true
    why=$(as_management acl token create --description "vigil-node: demo worker" \
      --policy-name demo-worker --secret "$(cat "$DEMO_TOKEN_FILE")" 2>&1 >/dev/null) || true
    demo_token_works && break
    rounds=$((rounds + 1))
    if [ $((rounds % 15)) -eq 0 ]; then
      echo "vigil-node: no demo token yet, retrying: $why" >&2
    fi
    sleep 1
  done
  # The container ends with the agent, with its status (a signal's wait returns early: wait
  # again for the agent to finish leaving).
  status=0
  wait $agent || status=$?
  while kill -0 $agent 2>/dev/null; do
    status=0
    wait $agent || status=$?
  done
  exit $status
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

# The servers create the demo token; wait for it (the cluster starting, no leader yet).
rounds=0
until demo_token_works; do
  rounds=$((rounds + 1))
  if [ $((rounds % 15)) -eq 0 ]; then
    echo "vigil-node: the demo token does not work yet; waiting for the servers to create it" >&2
  fi
  sleep 1
done
# From here on this node's demo programs act with the demo token only.
export CONSUL_HTTP_TOKEN_FILE=$DEMO_TOKEN_FILE

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
