#!/usr/bin/env bash
# Installs what the test suite needs beyond the Rust toolchain: py-consul (a real Consul client
# library) into target/pydeps, used by the compatibility test; where a Docker engine answers,
# the image and secrets of the Docker safety scenario (scripts/docker-image.sh); and headless
# Chromium with chromedriver from Debian for the web UI's browser tests (t90_ui_browser). The
# tests need neither etcd nor protoc: those are the benchmark's (scripts/install-etcd.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/docker-image.sh
if ! dpkg -s chromium chromium-driver >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq chromium chromium-driver
fi
PY_CONSUL_VERSION=1.8.0
dest=target/pydeps
if ! PYTHONPATH=$dest python3 -c "import consul, sys; sys.exit(0 if consul.__version__ == '$PY_CONSUL_VERSION' else 1)" 2>/dev/null; then
    mkdir -p "$dest"
    python3 -m pip install --quiet --disable-pip-version-check --target "$dest" "py-consul==$PY_CONSUL_VERSION"
fi
