#!/usr/bin/env bash
# CI and developers: builds what the Docker scenario of the lock-safety checker needs (the static
# `vigil` in the dev profile, the image vigil:dev, keys and certificates: docker/build.sh) when
# a Docker engine answers; without one it says so and succeeds, and the scenario's test skips
# itself.
set -euo pipefail
cd "$(dirname "$0")/.."
if docker info >/dev/null 2>&1; then
  # The tests need no optimised build; the demo's users get one from docker/build.sh.
  VIGIL_PROFILE=${VIGIL_PROFILE:-dev} docker/build.sh
else
  echo "scripts/docker-image.sh: no Docker engine (docker info failed); not building vigil:dev," \
    "the Docker scenario of t80_safety_docker will be skipped"
fi
