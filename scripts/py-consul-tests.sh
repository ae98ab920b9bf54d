#!/usr/bin/env bash
# Runs py-consul's own test suite (tests/api of its source release, unchanged) against
# `vigil agent --dev`: integration-tests/py-consul/conftest.py replaces py-consul's root
# conftest.py, which starts Consul in Docker, with one that starts Vigil (on 127.0.0.1:8500, as
# some tests expect; so no other agent may hold that port meanwhile).
#
#   scripts/py-consul-tests.sh            # the core, catalog, ACL and operations tests
#   scripts/py-consul-tests.sh -k kv      # extra arguments go to pytest
#
# Needs python3 with pip; installs py-consul's source release, pytest and requests into
# target/py-consul. Tests of what Vigil does not build (Connect, gateways, config entries,
# discovery chains, peering, templated policies, auth methods and binding rules, coordinate
# updates) are deselected and listed.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=$ROOT/target/py-consul
VERSION=1.8.0

if [ ! -d "$OUT/py_consul-$VERSION/tests" ]; then
    mkdir -p "$OUT"
    python3 -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
        --dest "$OUT" "py-consul==$VERSION"
    tar -xzf "$OUT/py_consul-$VERSION.tar.gz" -C "$OUT"
fi
if ! PYTHONPATH=$OUT/deps python3 -c "import pytest, requests, consul" 2>/dev/null; then
    python3 -m pip install --quiet --disable-pip-version-check --target "$OUT/deps" \
        pytest requests "py-consul==$VERSION"
fi
# VIGIL names the binary to test; by default the one `cargo build` makes.
if [ -z "${VIGIL:-}" ]; then
    (cd "$ROOT" && cargo build -q --bin vigil)
    VIGIL=$ROOT/target/debug/vigil
fi
export VIGIL

RUN=$OUT/run
rm -rf "$RUN" && mkdir -p "$RUN"
cp -r "$OUT/py_consul-$VERSION/tests" "$RUN/"
cp "$ROOT/integration-tests/py-consul/conftest.py" "$RUN/"

FILES=(kv session txn status event query catalog health agent acl operator snapshot coordinates)
OUT_OF_SCOPE=(
    test_acl_token_create_templated test_acl_auth_method_crud test_acl_binding_rule_crud
    test_agent_service_register_kind_proxy_locality test_agent_service_connect
    test_catalog_service_merge_central_config test_catalog_service_peer_unknown
    test_catalog_gateway_services test_health_service_peer test_health_connect
    test_health_ingress test_coordinate_update
)
deselect=""
for name in "${OUT_OF_SCOPE[@]}"; do
    deselect+="${deselect:+ and }not $name"
done
echo "out of scope (deselected): ${OUT_OF_SCOPE[*]}"
cd "$RUN"
PYTHONPATH=$OUT/deps python3 -m pytest -q -p no:cacheprovider \
    -k "$deselect" $(printf "tests/api/test_%s.py " "${FILES[@]}") "$@"
