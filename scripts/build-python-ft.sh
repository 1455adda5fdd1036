#!/usr/bin/env bash
# Build (once) a free-threaded CPython 3.13.15 (PEP 703, `--disable-gil`) from Debian's source
# pool, and print its python's path.
#
# The source is python3.13_3.13.15.orig.tar.xz (CPython 3.13.15 as released), checked against the
# SHA-256 below. It is built without PGO (7 min 33 s cold on 2 cores, niced: `nice -n 19`) into
# ${LOCKWATCH_CACHE:-$HOME/.cache/otel-lockwatch}/python-ft/3.13.15t, so a second run is instant.
# The build needs a C compiler and the headers of OpenSSL, zlib, libffi, bzip2, xz and SQLite:
# installed with Debian's apt-get when missing and we are root. Only the python's path goes to
# stdout; progress goes to stderr (the build's own output to build.log beside it).
#
# Usage: scripts/build-python-ft.sh          build if missing, print the path
#        PYTHON_FT_REBUILD=1 scripts/...    rebuild even if cached
set -euo pipefail

say() { printf 'build-python-ft: %s\n' "$*" >&2; }
fail() {
    say "error: $*"
    exit 1
}

version=3.13.15
source_url="${LOCKWATCH_DEBIAN_MIRROR:-http://deb.debian.org/debian}/pool/main/p/python3.13/python3.13_$version.orig.tar.xz"
source_sha256=1e66a7945a48390ee4c2a4268a0e4185884059a13c4aab6d148aa208deea4a76
cache="${LOCKWATCH_CACHE:-$HOME/.cache/otel-lockwatch}"
prefix="$cache/python-ft/${version}t"
python="$prefix/bin/python3.13t"

if [[ -x $python && -z ${PYTHON_FT_REBUILD:-} ]]; then
    printf '%s\n' "$python"
    exit 0
fi

deps=(gcc make libc6-dev libssl-dev zlib1g-dev libffi-dev libbz2-dev liblzma-dev libsqlite3-dev xz-utils curl)
missing=()
for p in "${deps[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -gt 0 ]]; then
    [[ $(id -u) -eq 0 ]] || fail "missing build dependencies (${missing[*]}), and not root to install them"
    say "installing Debian's ${missing[*]}"
    bash "$(dirname "${BASH_SOURCE[0]}")/apt-install.sh" "${missing[@]}" ||
        fail "could not install ${missing[*]}"
fi

work="$cache/python-ft/build"
rm -rf "$work"
mkdir -p "$work"
say "fetching $source_url"
curl -fsSL --retry 3 -o "$work/src.tar.xz" "$source_url" || fail "could not fetch $source_url"
got="$(sha256sum "$work/src.tar.xz" | cut -d' ' -f1)"
[[ $got == "$source_sha256" ]] || fail "$source_url has SHA-256 $got, not $source_sha256"
tar -xJf "$work/src.tar.xz" -C "$work" --strip-components=1

start=$SECONDS
say "building CPython $version with --disable-gil into $prefix (about 8 min on 2 cores; log: $work/build.log)"
(
    cd "$work"
    nice -n 19 ./configure --disable-gil --prefix="$prefix" --with-ensurepip=install &&
        nice -n 19 make -j"$(nproc)" &&
        nice -n 19 make altinstall
) >"$work/build.log" 2>&1 || fail "the build failed (last lines: $(tail -3 "$work/build.log" | tr '\n' ' '))"
"$python" -c 'import sys, ssl, zlib, ctypes, sqlite3; assert not sys._is_gil_enabled()' ||
    fail "$python is not a working free-threaded interpreter"
say "built in $((SECONDS - start)) s: $("$python" -VV)"
rm -rf "$work"
printf '%s\n' "$python"
