#!/usr/bin/env bash
# Runs HashiCorp's own Go `api` package tests, unchanged, against `vigil agent --dev`: Consul
# 1.8.7's `api` and `sdk/testutil` as Debian bullseye packages them, with
# integration-tests/go/consul standing in for the `consul` binary that `sdk/testutil` starts.
#
#   scripts/go-api-tests.sh              # every test; one process per test, two at a time
#   scripts/go-api-tests.sh 'Catalog'    # only tests whose name matches the regex
#   CONSUL=/path/to/consul scripts/go-api-tests.sh   # the same tests against a real Consul
#
# Needs root once (apt-get): Debian's golang-go and the Go libraries the tests import, and the
# source package from bullseye (added as an apt source pinned below every other, so nothing
# else comes from it). Results go to target/go-api/results.txt, one line per test, and each
# test's output to target/go-api/logs/. Tests of what Vigil does not build (Connect, gateways,
# intentions, config entries, the legacy ACL API, Docker checks, WAN federation, the debug
# endpoints) are listed as out of scope and not run. Two tests are run but expected to fail
# (EXPECTED-FAIL, not counted as failures; docs/consul-compatibility.md, "HashiCorp's Go api
# tests", says why).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SCRIPTS=$ROOT/scripts
OUT=$ROOT/target/go-api
GOPATH_DIR=$OUT/gopath
API=$GOPATH_DIR/src/github.com/hashicorp/consul/api
FILTER=${1:-.}

# Tests that need what Vigil does not build (README: "What Vigil does not build"):
# Connect, gateways, intentions, config entries; the legacy ACL API; Docker checks; the debug
# endpoints; WAN federation (a WAN join, the WAN keyring pool); the agent cache; coordinate
# updates.
OUT_OF_SCOPE='Connect|Gateway|Ingress|Intention|ConfigEntr|DiscoveryChain|SidecarService|UnmanagedProxy|ExposeChecks|ExternalConnectProxy|TestAPI_ACLCreateDestroy|TestAPI_ACLCloneDestroy|TestAPI_ACLInfo|TestAPI_ACLList|TestAPI_RulesTranslate|TestAPI_AgentChecks_Docker|TestAPI_Debug|TestAPI_CatalogNode$|TestAPI_CatalogNodeServiceList|TestAPI_AgentMembersOpts|TestAPI_OperatorKeyringInstallListPutRemove|TestAPI_CatalogServiceCached|TestAPI_CoordinateUpdate'

# Tests expected to fail: TestAPI_AgentServiceAddress deregisters a service ID it never
# registered, which Consul 1.8.7 answered 200 and later Consul, as Vigil, answers 404;
# TestAPI_ClientTLSOptions's certificates expired on 2022-03-19 and name their host only in the
# Common Name, so Go's own client refuses them against any server, Consul 1.8.7 included.
EXPECTED_FAIL='^(TestAPI_AgentServiceAddress|TestAPI_ClientTLSOptions)$'

if ! command -v go >/dev/null || [ ! -d /usr/share/gocode/src/github.com/hashicorp/serf ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends golang-go \
        golang-github-hashicorp-go-cleanhttp-dev golang-github-hashicorp-go-hclog-dev \
        golang-github-hashicorp-go-rootcerts-dev golang-github-hashicorp-go-uuid-dev \
        golang-github-hashicorp-serf-dev golang-github-mitchellh-go-testing-interface-dev \
        golang-github-mitchellh-mapstructure-dev golang-github-pkg-errors-dev \
        golang-github-stretchr-testify-dev golang-golang-x-sys-dev >/dev/null
fi

if [ ! -d "$API" ]; then
    if ! apt-cache madison golang-github-hashicorp-consul-dev | grep 1.8.7 >/dev/null; then
        # shellcheck source=scripts/bullseye-source.sh
        . "$SCRIPTS/bullseye-source.sh"
        bullseye_source
    fi
    mkdir -p "$OUT/deb"
    (cd "$OUT/deb" && apt-get download -qq golang-github-hashicorp-consul-dev=1.8.7+dfsg1-2 2>/dev/null)
    dpkg -x "$OUT"/deb/golang-github-hashicorp-consul-dev_*.deb "$OUT/deb/root"
    mkdir -p "$GOPATH_DIR/src/github.com/hashicorp/consul"
    cp -r "$OUT"/deb/root/usr/share/gocode/src/github.com/hashicorp/consul/{api,sdk,test} \
        "$GOPATH_DIR/src/github.com/hashicorp/consul/"
fi

export GOPATH=$GOPATH_DIR:/usr/share/gocode GO111MODULE=off GOFLAGS= GOCACHE=$OUT/gocache
(cd "$API" && go test -c -o "$OUT/api.test" .)
# CONSUL names a real `consul` binary to run the same tests against instead, for comparison
# (Debian bullseye's is `apt-get download consul=1.8.7+dfsg1-2+b3`). Otherwise VIGIL names the
# binary to test; by default the one `cargo build` makes.
if [ -n "${CONSUL:-}" ]; then
    [ "$(basename "$CONSUL")" = consul ] || { echo "CONSUL must name a file called consul" >&2; exit 2; }
    export PATH=$(cd "$(dirname "$CONSUL")" && pwd):$PATH
else
    if [ -z "${VIGIL:-}" ]; then
        (cd "$ROOT" && cargo build -q --bin vigil)
        VIGIL=$ROOT/target/debug/vigil
    fi
    export VIGIL PATH=$ROOT/integration-tests/go:$PATH
fi
mkdir -p "$OUT/logs"
: > "$OUT/results.txt"
"$OUT/api.test" -test.list "$FILTER" | while read -r name; do
    if [[ $name =~ $OUT_OF_SCOPE ]]; then
        echo "OUT-OF-SCOPE $name" >> "$OUT/results.txt"
    else
        echo "$name"
    fi
done | xargs -P 2 -I{} sh -c '
    cd "$0" && if timeout 180 "$1/api.test" -test.run "^{}\$" -test.v > "$1/logs/{}.log" 2>&1; then
        echo "PASS {}"; elif echo "{}" | grep -Eq "$2"; then echo "EXPECTED-FAIL {}";
        else echo "FAIL {}"; fi >> "$1/results.txt"' "$API" "$OUT" "$EXPECTED_FAIL"

sort -k2 "$OUT/results.txt" -o "$OUT/results.txt"
grep -v '^PASS' "$OUT/results.txt" || true
passed=$(grep -c '^PASS' "$OUT/results.txt" || true)
failed=$(grep -c '^FAIL' "$OUT/results.txt" || true)
expected=$(grep -c '^EXPECTED-FAIL' "$OUT/results.txt" || true)
skipped=$(grep -c '^OUT-OF-SCOPE' "$OUT/results.txt" || true)
echo "go api: $passed passed, $failed failed, $expected failed as expected," \
    "$skipped out of scope (logs: $OUT/logs)"
[ "$failed" -eq 0 ]
