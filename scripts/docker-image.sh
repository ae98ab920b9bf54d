#!/usr/bin/env bash
# CI and developers: builds what the Docker scenario of the lock-safety checker needs (the static
# `vigil`, the image vigil:dev, keys and certificates: docker/build.sh) when a Docker engine
# answers; without one it says so and succeeds, and the scenario's test skips itself.
set -euo pipefail
cd "$(dirname "$0")/.."
if docker info >/dev/null 2>&1; then
  docker/build.sh
else
  echo "scripts/docker-image.sh: no Docker engine (docker info failed); not building vigil:dev," \
    "the Docker scenario of t80_safety_docker will be skipped"
fi
