#!/usr/bin/env bash
# Builds the `vigil` binary of a tagged release (default v0.1.0) from git, once, and prints the
# path of the cached binary: target/release-builds/<tag>/vigil. The rolling-upgrade test starts
# its first cluster from it. A second run with the binary present returns at once.
#
# The tag's tree is exported with `git archive` (no work tree or branch is touched) into
# target/release-builds/<tag>/src and built there with its own Cargo.lock and its own target
# directory, so the build never invalidates the workspace's. It is a debug build, as the test
# harness uses for the current binary: the fastest to compile.
set -euo pipefail
tag="${1:-v0.1.0}"
root="$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
out="$root/target/release-builds/$tag"
bin="$out/vigil"
if [ -x "$bin" ]; then
    echo "$bin"
    exit 0
fi
git -C "$root" rev-parse --verify --quiet "refs/tags/$tag^{commit}" >/dev/null || {
    echo "build-release.sh: no tag $tag in $root" >&2
    exit 1
}
mkdir -p "$out"
rm -rf "$out/src"
mkdir "$out/src"
git -C "$root" archive --format=tar "$tag" | tar -x -C "$out/src"
# No `-p`: the package holding the `vigil` binary is the tag's default member (`vigil-agent` up to
# v0.1.0, `vigil` since).
CARGO_PROFILE_DEV_DEBUG=false cargo build --locked --bin vigil \
    --manifest-path "$out/src/Cargo.toml" --target-dir "$out/target" >&2
cp "$out/target/debug/vigil" "$bin.tmp"
mv "$bin.tmp" "$bin"
echo "$bin"
