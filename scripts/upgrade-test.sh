#!/usr/bin/env bash
# The rolling-upgrade test (integration-tests/tests/it/t94_rolling_upgrade.rs): builds the
# previous release from its git tag once (scripts/build-release.sh, cached under
# target/release-builds/), then upgrades a cluster started from it to this build under load.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build-release.sh v0.1.0 >/dev/null
cargo test -p integration-tests --test it -- --ignored --exact \
    t94_rolling_upgrade::a_rolling_upgrade_from_the_previous_release_loses_nothing
