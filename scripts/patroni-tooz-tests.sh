#!/usr/bin/env bash
# Runs two real Consul clients, unchanged, against `vigil agent --dev`:
# - tooz (OpenStack's coordination library): its own tooz/tests/test_coordination.py with the
#   consul driver (TOOZ_TEST_URL=consul://...). tooz 9.0.0 removed that driver, so this is
#   tooz 8.1.0, the last release with it; tests of what the driver does not implement skip.
# - Patroni: integration-tests/py/patroni_failover.py keeps a three-node PostgreSQL cluster
#   highly available through the agent (bootstrap, a leader killed with SIGKILL, rejoin,
#   switchover, graceful stop).
#
#   scripts/patroni-tooz-tests.sh           # both
#   scripts/patroni-tooz-tests.sh tooz      # one of them: tooz or patroni
#
# Needs python3 with venv (and, for Patroni, PostgreSQL 15's binaries in
# /usr/lib/postgresql/15/bin: apt-get install postgresql-15). Installs into target/clients:
# a venv for tooz and, with the system's python3 (PostgreSQL runs as the `postgres` user when
# this runs as root, and that user must be able to run the interpreter), one for Patroni.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=$ROOT/target/clients
WHICH=${1:-all}
TOOZ=8.1.0
PATRONI=4.1.5
mkdir -p "$OUT"

# VIGIL names the binary to test; by default the one `cargo build` makes.
if [ -z "${VIGIL:-}" ]; then
    (cd "$ROOT" && cargo build -q --bin vigil)
    VIGIL=$ROOT/target/debug/vigil
fi

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

run_tooz() {
    local venv=$OUT/tooz-venv
    if [ ! -x "$venv/bin/python" ]; then
        python3 -m venv "$venv"
        # The test module imports every driver it tests, whichever runs.
        "$venv/bin/pip" install -q --disable-pip-version-check "tooz==$TOOZ" py-consul \
            etcd3gw sysv-ipc pymemcache redis pytest testtools fixtures ddt
    fi
    if [ ! -d "$OUT/tooz-$TOOZ/tooz/tests" ]; then
        "$venv/bin/pip" download -q --disable-pip-version-check --no-deps --no-binary :all: \
            --dest "$OUT" "tooz==$TOOZ"
        tar -xzf "$OUT/tooz-$TOOZ.tar.gz" -C "$OUT"
    fi
    local port log=$OUT/tooz-agent.log
    port=$(free_port)
    "$VIGIL" agent --dev --node tooz-agent --http-addr "127.0.0.1:$port" \
        --rpc-addr 127.0.0.1:0 --serf-addr 127.0.0.1:0 --log-level warn > "$log" 2>&1 &
    local agent=$!
    trap 'kill $agent 2>/dev/null || true' RETURN
    for _ in $(seq 100); do
        curl -sf "http://127.0.0.1:$port/v1/status/leader" >/dev/null && break
        sleep 0.2
    done
    (cd "$OUT/tooz-$TOOZ" && TOOZ_TEST_URL=consul://127.0.0.1:$port \
        "$venv/bin/python" -m pytest -q -p no:cacheprovider -W ignore::DeprecationWarning \
        tooz/tests/test_coordination.py)
}

run_patroni() {
    local venv=$OUT/patroni-venv
    if [ ! -x "$venv/bin/patroni" ]; then
        /usr/bin/python3 -m venv "$venv"
        "$venv/bin/pip" install -q --disable-pip-version-check \
            "patroni[consul,psycopg2-binary]==$PATRONI"
    fi
    PYTHONPATH=$ROOT/integration-tests/py "$venv/bin/python" \
        "$ROOT/integration-tests/py/patroni_failover.py" "$VIGIL" "$venv/bin/patroni" \
        "$OUT/patroni-run"
}

case $WHICH in
    tooz) run_tooz ;;
    patroni) run_patroni ;;
    all) run_tooz && run_patroni ;;
    *) echo "usage: $0 [tooz|patroni]" >&2; exit 2 ;;
esac
