#!/usr/bin/env bash
# Installs what the test suite needs beyond the Rust toolchain: etcd and protoc from Debian
# (scripts/install-etcd.sh: the benchmark's etcd-client crate needs protoc to build); py-consul
# (a real Consul client library) into target/pydeps, used by the compatibility test; and, where
# a Docker engine answers, the image and secrets of the Docker safety scenario
# (scripts/docker-image.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-etcd.sh
scripts/docker-image.sh
PY_CONSUL_VERSION=1.8.0
dest=target/pydeps
if ! PYTHONPATH=$dest python3 -c "import consul, sys; sys.exit(0 if consul.__version__ == '$PY_CONSUL_VERSION' else 1)" 2>/dev/null; then
    mkdir -p "$dest"
    python3 -m pip install --quiet --disable-pip-version-check --target "$dest" "py-consul==$PY_CONSUL_VERSION"
fi
