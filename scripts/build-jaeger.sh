#!/usr/bin/env bash
# Build (once) the Jaeger v2 binary the end-to-end tests run, and print its path.
#
# The version is pinned by the tool module tools/jaeger (go.mod `tool` directive,
# github.com/jaegertracing/jaeger v1.76.0 = Jaeger v2.13.0). `go install ...@v1.76.0`
# refuses that module because its go.mod has a replace directive; the tool module
# repeats the replace and `go build` works.
#
# The binary is cached under ${LOCKWATCH_CACHE:-$HOME/.cache/otel-lockwatch}/bin,
# keyed by version, so a second run is instant. Only the binary's path goes to
# stdout; build progress goes to stderr.
#
# Usage: scripts/build-jaeger.sh          build if missing, print the path
#        JAEGER_REBUILD=1 scripts/...     rebuild even if cached
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
module_dir="$root/tools/jaeger"
cache="${LOCKWATCH_CACHE:-$HOME/.cache/otel-lockwatch}/bin"

version="$(awk '$1 == "github.com/jaegertracing/jaeger" { print $2; exit }' "$module_dir/go.mod")"
if [[ -z "$version" ]]; then
    echo "build-jaeger: no github.com/jaegertracing/jaeger requirement in $module_dir/go.mod" >&2
    exit 1
fi
binary="$cache/jaeger-$version"

if [[ -x "$binary" && -z "${JAEGER_REBUILD:-}" ]]; then
    echo "build-jaeger: cached $binary" >&2
    echo "$binary"
    exit 0
fi

if ! command -v go >/dev/null 2>&1; then
    echo "build-jaeger: go is not on PATH; install Go >= 1.24 to build Jaeger" >&2
    exit 1
fi

mkdir -p "$cache"
tmp="$(mktemp "$cache/.jaeger-$version.XXXXXX")"
trap 'rm -f "$tmp"' EXIT

echo "build-jaeger: building github.com/jaegertracing/jaeger/cmd/jaeger $version (takes minutes cold)" >&2
start=$SECONDS
# -mod=mod: the tool module's go.sum is committed; let go fill in anything a newer
# toolchain wants without failing the build.
(cd "$module_dir" && GOFLAGS="${GOFLAGS:-} -mod=mod" go build -trimpath -ldflags "-s -w" \
    -o "$tmp" github.com/jaegertracing/jaeger/cmd/jaeger)
chmod 0755 "$tmp"
mv -f "$tmp" "$binary"
trap - EXIT
echo "build-jaeger: built $binary in $((SECONDS - start)) s" >&2
echo "$binary"
