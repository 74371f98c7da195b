#!/bin/sh
# Debian/Ubuntu packages exod uses at run time (openblas: ~60x faster float32 on CPU) and that
# the test suite needs (systemd for the system tests, iproute2 for network namespaces, groff and
# man-db for the man page checks, python3 for the security probes that run as another user,
# chromium and its driver for the status page test, Node and npm for the coding agents the tests
# drive: scripts/agents.sh installs them from npm, g++ for mlx's CPU kernels, which the tests
# compile and a test checks).
# Installs only what is missing; needs root and apt.
# Usage: scripts/system-deps.sh run|test
set -eu
want="libopenblas0-pthread"
if [ "${1:-run}" = test ]; then
    want="$want systemd util-linux iproute2 groff-base man-db procps python3 chromium chromium-driver g++"
fi
missing=""
for p in $want; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
done
# Node from anywhere will do (nvm, NodeSource): Debian's only where there is none.
if [ "${1:-run}" = test ] && ! command -v npm >/dev/null 2>&1; then
    missing="$missing nodejs npm"
fi
[ -z "$missing" ] && exit 0
if ! command -v apt-get >/dev/null 2>&1; then
    echo "exod: not a Debian-like system; please install the equivalents of:$missing" >&2
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "exod: missing Debian packages:$missing (run: sudo apt-get install$missing)" >&2
    [ "${1:-run}" = test ] && exit 1
    exit 0
fi
echo "exod: installing$missing" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends $missing >/dev/null
