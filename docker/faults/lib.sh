# Shared by the fault scripts (sourced, not run): the compose command, containers, the raft
# leader and the lock holder, and a countdown. Run the scripts from anywhere; they act on the
# compose project of the repository root (COMPOSE_PROJECT_NAME selects another copy).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

compose() {
  if docker compose version >/dev/null 2>&1; then docker compose "$@"; else docker-compose "$@"; fi
}

# ACLs deny every request without a token: what the scripts ask the cluster, and the commands
# their "Watch:" lines suggest, use the management token (docker/secrets/acl-management.token;
# only the servers have it mounted). It goes from the host's file into the environment and on
# to the command run in the node (`docker exec -e NAME` without a value passes the caller's),
# never onto a command line.
CONSUL_HTTP_TOKEN=$(cat docker/secrets/acl-management.token)
export CONSUL_HTTP_TOKEN
EXEC='CONSUL_HTTP_TOKEN=$(cat docker/secrets/acl-management.token) docker compose exec -e CONSUL_HTTP_TOKEN'

# The container of a service (empty when it does not exist).
cid() { compose ps -q "$1"; }

# Runs a command inside the first node that answers (the target of a fault may be down).
in_cluster() {
  local node id
  for node in c1 c2 c3 s1 s2 s3; do
    id=$(cid "$node") || continue
    [ -n "$id" ] || continue
    if docker exec -e CONSUL_HTTP_TOKEN "$id" "$@" 2>/dev/null; then return 0; fi
  done
  echo "no node of the cluster answers" >&2
  return 1
}

# The server leading raft (s1, s2 or s3): /v1/status/leader names its RPC address, x.x.x.1N.
# (Plain HTTP on the container's loopback, for busybox wget; the status endpoints need no token.)
leader_node() {
  local addr
  addr=$(in_cluster wget -qO- http://127.0.0.1:8500/v1/status/leader | tr -d '"')
  addr=${addr%:*}
  [ -n "$addr" ] || { echo "no leader right now" >&2; return 1; }
  echo "s$(( ${addr##*.} - 10 ))"
}

# The client node whose worker holds demo/leader (waits up to 30 s for one between handoffs).
holder_node() {
  local node i
  for i in $(seq 30); do
    node=$(in_cluster vigil lock status demo/leader --json | grep -m1 '"Node"' | cut -d'"' -f4) || true
    if [ -n "$node" ]; then echo "$node"; return 0; fi
    sleep 1
  done
  echo "nobody holds demo/leader" >&2
  return 1
}

# The compose network a container is on whose name ends in _$2, and its IP there.
network_of() { # container suffix -> "network ip"
  docker inspect -f '{{range $n, $c := .NetworkSettings.Networks}}{{$n}} {{$c.IPAddress}}{{"\n"}}{{end}}' "$1" \
    | awk -v s="_$2" 'substr($1, length($1) - length(s) + 1) == s {print $1, $2}'
}

# Undoes the fault when the script ends, however it ends (Ctrl-C during the countdown too):
# `heal_on_exit CMD...` runs CMD once.
heal_on_exit() {
  HEAL=("$@")
  trap 'if [ -n "${HEAL+x}" ]; then h=("${HEAL[@]}"); unset HEAL; "${h[@]}"; fi' EXIT
  trap 'exit 130' INT TERM
}

# Runs the heal now (and not again at exit).
heal_now() {
  local h=("${HEAL[@]}")
  unset HEAL
  "${h[@]}"
}

# Waits $1 seconds, printing the time left every 5 s, before doing what $2 says.
countdown() {
  local left=$1
  while [ "$left" -gt 0 ]; do
    echo "  ... $left s before $2"
    local step=$(( left < 5 ? left : 5 ))
    sleep "$step"
    left=$(( left - step ))
  done
  echo "==> $2"
}

# Bank decisions since $1 (a `date +%s` time): how many were accepted and rejected.
bank_summary() {
  local log
  log=$(docker logs --since "$1" "$(cid bank)" 2>&1)
  echo "bank since the fault: $(grep -c ' ACCEPT ' <<<"$log" || true) writes accepted, $(grep -c ' REJECT ' <<<"$log" || true) rejected"
  grep ' REJECT ' <<<"$log" | tail -n 3 | sed 's/^/  /' || true
}
