#!/usr/bin/env bash
# Installs what storebroker needs on a fresh Debian machine, only what is missing, then resolves the Swift
# packages. Safe to run again. Sourced by demo.sh and test.sh.
set -euo pipefail

# System packages the project builds, tests or benchmarks with (D-Bus and SQLite development files, a
# private bus for tests, python3-dbus and python3-gi for the listener example, systemd-socket-activate and setpriv for the
# socket-activation and other-user tests, gcc for the test engines the tests compile with cc, libglib2.0-bin for
# gdbus in the introspection test, libpq-dev for the postgres engine and postgresql for the private servers its
# tests start; Debian's own cluster, if the package starts one, is never used).
PACKAGES=(pkg-config libsqlite3-dev libdbus-1-dev dbus-daemon dbus-bin python3 python3-dbus python3-gi systemd util-linux
    gcc libglib2.0-bin libpq-dev postgresql)

missing=()
for package in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$package")
    fi
done
if ((${#missing[@]} > 0)); then
    echo "setup: installing ${missing[*]}"
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if ! command -v swift >/dev/null 2>&1; then
    if [ -x /opt/swift/usr/bin/swift ]; then
        export PATH="/opt/swift/usr/bin:$PATH"
    else
        echo "setup: no Swift toolchain found (Swift 6.0 or newer is needed)" >&2
        exit 1
    fi
fi

cd "$(dirname "${BASH_SOURCE[0]}")/.."
swift package resolve >/dev/null
