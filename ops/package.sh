#!/usr/bin/env bash
# Builds the d3stream .deb, and with --check installs it and checks it.
#
#   ops/package.sh [--check] [BUILD_DIR]      (default BUILD_DIR: build-deb)
#
# The package is built by CPack from a Release build with the prefix /usr
# and without the tests (CMakeLists.txt: install rules and CPACK_*); its
# Depends are dpkg-shlibdeps' reading of the binary's shared libraries, so
# they name exactly the Debian libraries it links. It lands in
# BUILD_DIR/d3stream_<version>_<arch>.deb.
#
# --check (as root, or with sudo; what CI runs on its fresh Debian 12):
# `apt-get install ./d3stream_*.deb` (apt resolves the Depends), then
# /usr/bin/d3stream version, the installed unit through `systemd-analyze
# verify`, the installed example configuration through `d3stream config`,
# and the files where they belong; then the package is purged (user and
# configuration included), leaving the machine as it was unless d3stream
# was installed before, in which case --check refuses to run.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"

CHECK=0
if [ "${1:-}" = "--check" ]; then CHECK=1; shift; fi
case "${1:-}" in -h | --help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
DIR="${1:-build-deb}"

cmake -S . -B "$DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/usr \
  -DD3_TESTS=OFF -DD3_WERROR=ON >/dev/null
cmake --build "$DIR" -j "$(nproc)"
rm -f "$DIR"/d3stream_*.deb
(cd "$DIR" && cpack -G DEB >/dev/null)
DEB="$(cd "$DIR" && ls "$PWD"/d3stream_*.deb)"
echo "package: $DEB"
dpkg-deb --field "$DEB" Package Version Architecture Depends | sed 's/^/  /'
[ "$CHECK" = 1 ] || exit 0

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
if dpkg-query -W -f='${Status}' d3stream 2>/dev/null | grep -q "install ok installed"; then
  echo "package: d3stream is installed on this machine already; --check would replace it" >&2
  exit 1
fi
trap '$SUDO apt-get purge -y -q d3stream >/dev/null 2>&1 || true' EXIT
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$DEB" >/dev/null
fail() { echo "package: $*" >&2; exit 1; }
[ "$(command -v d3stream)" = /usr/bin/d3stream ] || fail "d3stream is not /usr/bin/d3stream"
/usr/bin/d3stream version | sed 's/^/  /'
UNIT=/lib/systemd/system/d3stream.service
[ -f "$UNIT" ] || fail "no $UNIT"
grep -q '^ExecStart=/usr/bin/d3stream serve' "$UNIT" || fail "$UNIT does not run /usr/bin/d3stream"
# verify: the unit's syntax, its ExecStart binary, its dependencies.
SYSTEMD_LOG_LEVEL=warning systemd-analyze verify "$UNIT" || fail "systemd-analyze verify $UNIT"
echo "  systemd-analyze verify $UNIT: ok"
getent passwd d3stream >/dev/null || fail "no d3stream user"
[ "$(stat -c %U:%G:%a /etc/d3stream/d3stream.yaml)" = root:d3stream:640 ] ||
  fail "/etc/d3stream/d3stream.yaml: $(stat -c %U:%G:%a /etc/d3stream/d3stream.yaml)"
D3STREAM_CONFIG=/etc/d3stream/d3stream.yaml /usr/bin/d3stream config serve >/dev/null ||
  fail "the installed configuration does not parse"
for f in /usr/share/d3stream/openapi.yaml /usr/share/doc/d3stream/examples/d3-nano-npu2.json; do
  [ -f "$f" ] || fail "no $f"
done
echo "package: installed, checked and purged: ok"
