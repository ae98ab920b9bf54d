#!/usr/bin/env bash
# Installs Consul 1.8.7, the third column of the benchmark (`vigil-bench`), as Debian bullseye
# packages it (`consul` 1.8.7+dfsg1-2+b3): the bullseye archive is added as an apt source pinned
# below every other (priority 100, so nothing else on the machine moves to it), the package is
# downloaded and its one binary unpacked to /usr/local/bin/consul. Idempotent: a no-op when that
# consul is 1.8.7. Needs root. Exits 1 with a message when the package cannot be had; the
# benchmark then leaves the Consul column empty and says why.
set -euo pipefail
want=1.8.7
bin=/usr/local/bin/consul
# The first line of `consul version`. Not `| head -1`: under pipefail, head leaving early can
# kill consul with SIGPIPE (exit 141).
first_line() {
    local out
    out=$("$@")
    printf '%s\n' "${out%%$'\n'*}"
}
if [ -x "$bin" ] && [[ "$(first_line "$bin" version)" == "Consul v$want"* ]]; then
    exit 0
fi
[ "$(id -u)" -eq 0 ] || { echo "install-consul.sh: needs root" >&2; exit 1; }
# shellcheck source=scripts/bullseye-source.sh
. "$(dirname "$0")/bullseye-source.sh"
bullseye_source
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download -qq "consul=$want+dfsg1-2+b3") || {
    echo "install-consul.sh: cannot download Debian's consul $want" >&2
    exit 1
}
dpkg -x "$work"/consul_*.deb "$work/root"
install -m 0755 "$work/root/usr/bin/consul" "$bin"
got=$(first_line "$bin" version)
case "$got" in
    "Consul v$want"*) echo "install-consul.sh: $got at $bin" ;;
    *) echo "install-consul.sh: expected Consul v$want, got: $got" >&2; exit 1 ;;
esac
