#!/usr/bin/env bash
# Builds everything the docker-compose demo needs, without pulling any image:
#   1. statically linked `vigil` and `vigil-demo` (the fencing demo's bank and worker;
#      crt-static glibc; release, or VIGIL_PROFILE=dev for the test suite's image, which
#      builds in about half the time)                         -> docker/rootfs/bin/
#   2. Debian's static busybox (package busybox-static)         -> docker/rootfs/bin/busybox
#   3. the gossip key, the TLS CA and certificates (s1-s3, c1-c3) and the ACL token secrets
#      (acl-management.token: the initial management token; acl-demo-worker.token: the demo
#      workers' least-privilege token) -> docker/secrets/ (each kept if it exists;
#      VIGIL_NEW_SECRETS=1 makes new ones; secrets 0600). docker-compose.yml mounts into each
#      container only the files it needs, never the CA key.
#   4. the image vigil:dev (FROM scratch; VIGIL_IMAGE overrides the tag)
# Then: `docker compose up -d` (or `docker-compose up -d`).
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${VIGIL_IMAGE:-vigil:dev}
TARGET=x86_64-unknown-linux-gnu
ROOTFS=docker/rootfs/bin
SECRETS=docker/secrets
mkdir -p "$ROOTFS"

# Greps below read all their input (`>/dev/null`, not `-q`): under pipefail, grep -q leaving at
# its first match can kill the writer with SIGPIPE and fail the pipeline.
is_static() { # an ELF file with no program interpreter is statically linked
  [ -f "$1" ] && ! LC_ALL=C readelf -l "$1" 2>/dev/null | grep 'program interpreter' >/dev/null
}

PROFILE=${VIGIL_PROFILE:-release}
case $PROFILE in
  release) OUT=release ;;
  dev) OUT=debug ;;
  *) echo "build.sh: VIGIL_PROFILE must be release or dev, not $PROFILE" >&2; exit 1 ;;
esac
echo "==> 1/4 static vigil and vigil-demo ($TARGET, $PROFILE)"
RUSTFLAGS='-C target-feature=+crt-static' \
  cargo build --profile "$PROFILE" --target "$TARGET" -p vigil --bin vigil -p vigil-demo --bin vigil-demo
for name in vigil vigil-demo; do
  BIN=target/$TARGET/$OUT/$name
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

echo "==> 3/4 gossip key, TLS certificates and ACL tokens in $SECRETS"
vigil=$PWD/$ROOTFS/vigil
# `tls cert create` prints "==> Saved <cert>" and "==> Saved <cert>-key.pem".
cert() { # server|client node, in $SECRETS
  local saved
  saved=$("$vigil" tls cert create "--$1" --node "$2" | awk '/Saved/ && !/-key\.pem$/ {print $3}')
  mv -f "$saved" "$2.pem"
  mv -f "${saved%.pem}-key.pem" "$2-key.pem"
}
if [ -n "${VIGIL_NEW_SECRETS:-}" ] || [ ! -s "$SECRETS/gossip.key" ]; then
  rm -rf "$SECRETS"
  mkdir -p "$SECRETS"
  (
    cd "$SECRETS"
    (umask 077 && "$vigil" keygen > gossip.key)
    "$vigil" tls ca create
    for node in s1 s2 s3; do cert server "$node"; done
    for node in c1 c2 c3; do cert client "$node"; done
  )
elif command -v openssl >/dev/null; then
  # Client certificates made before they named 127.0.0.1 cannot serve HTTPS to clients on
  # 127.0.0.1 (in the container and through the published ports): issue those again, same CA.
  (
    cd "$SECRETS"
    for node in s1 s2 s3 c1 c2 c3; do
      if ! openssl x509 -in "$node.pem" -noout -ext subjectAltName 2>/dev/null |
        grep 'IP Address:127\.0\.0\.1' >/dev/null; then
        case $node in s*) role=server ;; *) role=client ;; esac
        echo "build.sh: $node.pem does not name 127.0.0.1; issuing it again"
        cert "$role" "$node"
      fi
    done
  )
else
  echo "build.sh: no openssl to check that the certificates name 127.0.0.1 (VIGIL_NEW_SECRETS=1 remakes them)" >&2
fi
# ACL token secrets (UUIDs, as Consul's SecretIDs), kept if they exist: the servers' initial
# management token, and the fixed secret of the demo workers' token (docker/node.sh creates the
# token with it).
for name in acl-management acl-demo-worker; do
  if [ ! -s "$SECRETS/$name.token" ]; then
    (umask 077 && cat /proc/sys/kernel/random/uuid > "$SECRETS/$name.token")
  fi
done
ls "$SECRETS"

echo "==> 4/4 image $IMAGE (FROM scratch)"
docker build --tag "$IMAGE" docker
docker image ls "$IMAGE"
echo "Built. Start the demo with: docker compose up -d   (or: docker-compose up -d)"
