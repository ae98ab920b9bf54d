#!/usr/bin/env bash
# Builds everything the docker-compose demo needs, without pulling any image:
#   1. statically linked `vigil` and `vigil-demo` (the fencing demo's bank and worker;
#      crt-static glibc, release)                             -> docker/rootfs/bin/
#   2. Debian's static busybox (package busybox-static)         -> docker/rootfs/bin/busybox
#   3. the gossip key and the TLS CA and certificates (s1-s3, c1-c3) -> docker/secrets/ (kept
#      if they exist; VIGIL_NEW_SECRETS=1 makes new ones)
#   4. the image vigil:dev (FROM scratch; VIGIL_IMAGE overrides the tag)
# Then: `docker compose up -d` (or `docker-compose up -d`).
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${VIGIL_IMAGE:-vigil:dev}
TARGET=x86_64-unknown-linux-gnu
ROOTFS=docker/rootfs/bin
SECRETS=docker/secrets
mkdir -p "$ROOTFS"

is_static() { # an ELF file with no program interpreter is statically linked
  [ -f "$1" ] && ! LC_ALL=C readelf -l "$1" 2>/dev/null | grep -q 'program interpreter'
}

echo "==> 1/4 static vigil and vigil-demo ($TARGET, release)"
RUSTFLAGS='-C target-feature=+crt-static' \
  cargo build --release --target "$TARGET" -p vigil-agent --bin vigil -p vigil-demo --bin vigil-demo
for name in vigil vigil-demo; do
  BIN=target/$TARGET/release/$name
  is_static "$BIN" || { echo "build.sh: $BIN is not statically linked" >&2; exit 1; }
  # Without debug sections the image is several times smaller.
  strip -o "$ROOTFS/$name" "$BIN"
done

echo "==> 2/4 static busybox (Debian's busybox-static)"
if ! is_static "$ROOTFS/busybox"; then
  # Debian's busybox-static installs a static /bin/busybox; the `busybox` package's is dynamic.
  if dpkg -s busybox-static >/dev/null 2>&1 && is_static /bin/busybox; then
    cp /bin/busybox "$ROOTFS/busybox"
  else
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    (cd "$work" && apt-get download busybox-static) || {
      echo "build.sh: refreshing the package lists (apt-get update)"
      apt-get update -qq
      (cd "$work" && apt-get download busybox-static)
    }
    dpkg-deb -x "$work"/busybox-static_*.deb "$work/root"
    cp "$work/root/bin/busybox" "$ROOTFS/busybox"
  fi
  is_static "$ROOTFS/busybox" || { echo "build.sh: no static busybox" >&2; exit 1; }
fi

echo "==> 3/4 gossip key and TLS certificates in $SECRETS"
if [ -n "${VIGIL_NEW_SECRETS:-}" ] || [ ! -s "$SECRETS/gossip.key" ]; then
  rm -rf "$SECRETS"
  mkdir -p "$SECRETS"
  vigil=$PWD/$ROOTFS/vigil
  (
    cd "$SECRETS"
    "$vigil" keygen > gossip.key
    "$vigil" tls ca create
    # `tls cert create` prints "==> Saved <cert>" and "==> Saved <cert>-key.pem".
    cert() {
      local saved
      saved=$("$vigil" tls cert create "--$1" --node "$2" | awk '/Saved/ && !/-key\.pem$/ {print $3}')
      mv "$saved" "$2.pem"
      mv "${saved%.pem}-key.pem" "$2-key.pem"
    }
    for node in s1 s2 s3; do cert server "$node"; done
    for node in c1 c2 c3; do cert client "$node"; done
  )
fi
ls "$SECRETS"

echo "==> 4/4 image $IMAGE (FROM scratch)"
docker build --tag "$IMAGE" docker
docker image ls "$IMAGE"
echo "Built. Start the demo with: docker compose up -d   (or: docker-compose up -d)"
