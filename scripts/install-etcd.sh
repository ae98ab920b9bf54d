#!/usr/bin/env bash
# Installs what the benchmark (`vigil-bench`) needs beyond the Rust toolchain, from Debian:
# etcd 3.4 (`etcd-server`), the cluster Vigil is compared with, and `protoc`
# (`protobuf-compiler`) with protobuf's well-known types (`libprotobuf-dev`), which the
# etcd-client crate's build script compiles its protocol with. Idempotent: a quick
# no-op when all are installed. Works as root, or through sudo when there is one. Fails when the
# etcd it finds is not 3.4, the version the benchmark's report names and was measured with.
set -euo pipefail
check_etcd_version() {
    local got
    # Not `| head -1`: under pipefail, head leaving early can kill etcd with SIGPIPE (exit 141).
    got=$(etcd --version)
    got=${got%%$'\n'*}
    case "$got" in
        "etcd Version: 3.4."*) ;;
        *) echo "install-etcd.sh: the benchmark compares with etcd 3.4, found: $got" >&2; exit 1 ;;
    esac
}
packages=()
command -v etcd >/dev/null || packages+=(etcd-server)
command -v protoc >/dev/null || packages+=(protobuf-compiler)
[ -f /usr/include/google/protobuf/descriptor.proto ] || packages+=(libprotobuf-dev)
if [ ${#packages[@]} -eq 0 ]; then
    check_etcd_version
    exit 0
fi
if [ "$(id -u)" -eq 0 ]; then
    as_root=(env)
elif command -v sudo >/dev/null; then
    as_root=(sudo env)
else
    echo "install-etcd.sh: need root or sudo to install ${packages[*]}" >&2
    exit 1
fi
"${as_root[@]}" DEBIAN_FRONTEND=noninteractive apt-get update -qq
"${as_root[@]}" DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${packages[@]}" >/dev/null
check_etcd_version
