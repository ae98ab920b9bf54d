# Sourced by scripts that take a package from Debian bullseye (Consul 1.8.7 and its Go `api`):
# `bullseye_source` adds bullseye as an apt source pinned below every other (priority 100, so
# nothing already installed moves to it) and refreshes the index, once.
bullseye_source() {
    if [ -f /etc/apt/sources.list.d/vigil-bullseye.sources ]; then
        return
    fi
    cat > /etc/apt/sources.list.d/vigil-bullseye.sources <<'SOURCES'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bullseye
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
    printf 'Package: *\nPin: release n=bullseye\nPin-Priority: 100\n' \
        > /etc/apt/preferences.d/vigil-bullseye
    apt-get update -qq
}
